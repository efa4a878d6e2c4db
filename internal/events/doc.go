// Package events is the daemon's event bus: the sandbox lifecycle's
// transitions (created, paused, paused-by-idle, expired, failed,
// forked, rolled-back, ...; api.EventTypes), published by the daemon's
// Manager and streamed by GET /v1/events and `nook events`.
//
// Publish never blocks and starts no goroutine: under one mutex it stores
// the event in a ring of the most recent ones (RingSize), so a new
// subscriber can replay what happened since a time, and hands it to each
// matching subscriber's buffered channel. A subscriber whose buffer is
// full is dropped: its channel gets one last api.EventLagged event and is
// closed, so a slow reader (a stalled HTTP client) costs the daemon
// nothing but its buffer and learns that it lost events. Each buffer has
// one slot kept for that last event, and only Publish sends, under the
// mutex, so the send never waits.
//
// Events live in memory only: they start afresh with the daemon (Seq
// restarts from 1). The sandboxes' records in the database stay the
// truth; events say when they changed.
package events
