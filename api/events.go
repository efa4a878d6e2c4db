package api

import "time"

// Event types: the sandbox lifecycle's transitions, as GET /v1/events
// streams them.
const (
	EventCreated       = "created"        // a create finished: the sandbox runs
	EventStarted       = "started"        // a stopped sandbox was started (or a rebooted guest again)
	EventStopped       = "stopped"        // stopped on request, or found stopped (reason: its guest powered off, the host restarted); a TTL's stop is expired
	EventPaused        = "paused"         // paused on request (or found saved to disk: reason)
	EventPausedByIdle  = "paused-by-idle" // paused by the daemon after its idle pause (reason: idle for ...)
	EventResumed       = "resumed"        // resumed on request, or woken by a call
	EventExpired       = "expired"        // its TTL ran out (reason: what was done: destroyed, paused or stopped)
	EventDestroyed     = "destroyed"      // removed, with everything it had on the host
	EventFailed        = "failed"         // it died outside nook (reason)
	EventForked        = "forked"         // made as a fork (sandbox: the fork; reason: from what)
	EventRolledBack    = "rolled-back"    // put back to a snapshot (reason: which)
	EventSnapshotTaken = "snapshot-taken" // a snapshot was taken (reason: its name)
	// EventLagged ends a stream whose reader fell too far behind: events
	// were lost; subscribe again (with since) to go on.
	EventLagged = "lagged"
)

// EventTypes are the event types a filter may name.
var EventTypes = []string{EventCreated, EventStarted, EventStopped, EventPaused, EventPausedByIdle, EventResumed,
	EventExpired, EventDestroyed, EventFailed, EventForked, EventRolledBack, EventSnapshotTaken, EventLagged}

// Event is one line of GET /v1/events (NDJSON).
type Event struct {
	// Seq numbers the daemon's events from 1 (since it started): a
	// reader that sees a gap lost events.
	Seq       int64     `json:"seq"`
	Time      time.Time `json:"time"`
	Type      string    `json:"type"`
	Sandbox   string    `json:"sandbox,omitempty"`    // its name
	SandboxID string    `json:"sandbox_id,omitempty"` // its ID
	Template  string    `json:"template,omitempty"`
	Isolation string    `json:"isolation,omitempty"`
	Reason    string    `json:"reason,omitempty"` // why, or a detail (a snapshot's name, a fork's source)
	// Actor is who asked: a token's name, "host" (the unix socket without
	// a token), or "nook" (the daemon on its own: reaper, idle pause, TTL).
	Actor string `json:"actor,omitempty"`
}

// LogHeader names, in the answer of GET /v1/sandboxes/{name}/logs, the
// log it streams: agent or console.
const LogHeader = "Nook-Log"
