package events

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
)

// RingSize is how many recent events a Bus keeps for replay.
const RingSize = 1024

// DefaultBuffer is how many events a subscriber may fall behind by
// before it is dropped.
const DefaultBuffer = 256

// Filter selects events; its zero value selects all.
type Filter struct {
	Sandbox   string   // by sandbox name
	SandboxID string   // by sandbox ID (a sandbox token's scope)
	Types     []string // any of these types
}

// Match reports whether f selects e. A lagged event always matches: it
// is the subscription's own.
func (f Filter) Match(e api.Event) bool {
	if e.Type == api.EventLagged {
		return true
	}
	if f.Sandbox != "" && e.Sandbox != f.Sandbox {
		return false
	}
	if f.SandboxID != "" && e.SandboxID != f.SandboxID {
		return false
	}
	return len(f.Types) == 0 || slices.Contains(f.Types, e.Type)
}

// Bus publishes events to subscribers. The zero value is ready to use.
type Bus struct {
	mu   sync.Mutex
	ring []api.Event // the last RingSize events; next is the oldest once full
	next int
	seq  int64
	subs map[*Sub]struct{}
	now  func() time.Time // for tests
}

// Sub is one subscription. Read C until it is closed: by Close, or by
// the bus after a last api.EventLagged event.
type Sub struct {
	C      <-chan api.Event
	ch     chan api.Event
	size   int
	filter Filter
	bus    *Bus
}

// Publish stamps e with the next Seq (and the time, if e has none) and
// hands it to the ring and to every matching subscriber, never waiting.
func (b *Bus) Publish(e api.Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seq++
	e.Seq = b.seq
	if e.Time.IsZero() {
		e.Time = b.time()
	}
	e.Time = e.Time.UTC()
	if len(b.ring) < RingSize {
		b.ring = append(b.ring, e)
	} else {
		b.ring[b.next] = e
		b.next = (b.next + 1) % RingSize
	}
	for s := range b.subs {
		if !s.filter.Match(e) {
			continue
		}
		if len(s.ch) >= s.size {
			// Full: the kept slot takes the last word.
			s.ch <- api.Event{Seq: e.Seq, Time: e.Time, Type: api.EventLagged,
				Reason: "this reader fell behind and events were lost: subscribe again, with since, to go on"}
			b.drop(s)
			continue
		}
		s.ch <- e
	}
}

func (b *Bus) time() time.Time {
	if b.now != nil {
		return b.now()
	}
	return time.Now()
}

// Subscribe returns the recent events f selects at or after since (none
// for a zero since), oldest first, and a subscription to the events
// published from then on: none is missed or seen twice between the two.
// buffer is how far the subscriber may fall behind (<= 0: DefaultBuffer).
// The caller must Close the subscription.
func (b *Bus) Subscribe(since time.Time, f Filter, buffer int) ([]api.Event, *Sub) {
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	ch := make(chan api.Event, buffer+1) // +1: the lagged event's slot
	s := &Sub{C: ch, ch: ch, size: buffer, filter: f, bus: b}
	b.mu.Lock()
	defer b.mu.Unlock()
	var replay []api.Event
	if !since.IsZero() {
		for i := range len(b.ring) {
			e := b.ring[(b.next+i)%len(b.ring)]
			if !e.Time.Before(since) && f.Match(e) {
				replay = append(replay, e)
			}
		}
	}
	if b.subs == nil {
		b.subs = map[*Sub]struct{}{}
	}
	b.subs[s] = struct{}{}
	return replay, s
}

// Close ends the subscription; C is closed (if the bus did not already).
// It is safe to call more than once.
func (s *Sub) Close() {
	s.bus.mu.Lock()
	defer s.bus.mu.Unlock()
	if _, ok := s.bus.subs[s]; ok {
		s.bus.drop(s)
	}
}

// drop removes s and closes its channel; b.mu is held.
func (b *Bus) drop(s *Sub) {
	delete(b.subs, s)
	close(s.ch)
}

// Subscribers is how many subscriptions are open.
func (b *Bus) Subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

// ParseSince reads a since: a duration back from now ("10m", "2h") or a
// time (RFC 3339). "" is the zero time: no replay.
func ParseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, errdefs.Invalid("since %q is negative: give how far back, e.g. 10m", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, errdefs.Invalid("since %q is neither a duration (10m, 2h) nor a time (RFC 3339, 2026-11-27T21:30:00Z)", s)
	}
	return t, nil
}

// CheckTypes refuses an event type nook does not have.
func CheckTypes(types []string) error {
	for _, t := range types {
		if !slices.Contains(api.EventTypes, t) {
			return errdefs.Invalid("event type %q is not known: use one of %s", t, strings.Join(api.EventTypes, ", "))
		}
	}
	return nil
}
