package events

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
)

// recv reads the next event of s, failing after a bound.
func recv(t *testing.T, s *Sub) (api.Event, bool) {
	t.Helper()
	select {
	case e, ok := <-s.C:
		return e, ok
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5s")
		return api.Event{}, false
	}
}

func TestPublishOrderAndFilter(t *testing.T) {
	var b Bus
	_, all := b.Subscribe(time.Time{}, Filter{}, 0)
	defer all.Close()
	_, one := b.Subscribe(time.Time{}, Filter{Sandbox: "a", Types: []string{api.EventPaused, api.EventDestroyed}}, 0)
	defer one.Close()
	_, byID := b.Subscribe(time.Time{}, Filter{SandboxID: "id-b"}, 0)
	defer byID.Close()
	for _, e := range []api.Event{
		{Type: api.EventCreated, Sandbox: "a", SandboxID: "id-a"},
		{Type: api.EventPaused, Sandbox: "a", SandboxID: "id-a"},
		{Type: api.EventPaused, Sandbox: "b", SandboxID: "id-b"},
		{Type: api.EventDestroyed, Sandbox: "a", SandboxID: "id-a"},
	} {
		b.Publish(e)
	}
	for i := int64(1); i <= 4; i++ {
		if e, _ := recv(t, all); e.Seq != i || e.Time.IsZero() || e.Time.Location() != time.UTC {
			t.Fatalf("event %d: %+v", i, e)
		}
	}
	for _, want := range []int64{2, 4} {
		if e, _ := recv(t, one); e.Seq != want || e.Sandbox != "a" {
			t.Fatalf("filtered: got %+v, want seq %d", e, want)
		}
	}
	if e, _ := recv(t, byID); e.Seq != 3 {
		t.Fatalf("by ID: %+v", e)
	}
	for _, s := range []*Sub{all, one, byID} {
		select {
		case e := <-s.C:
			t.Fatalf("unexpected event %+v", e)
		default:
		}
	}
}

func TestReplaySince(t *testing.T) {
	var b Bus
	now := time.Date(2026, 11, 27, 21, 0, 0, 0, time.UTC)
	b.now = func() time.Time { return now }
	// More than the ring holds: the oldest are forgotten.
	for range RingSize + 10 {
		now = now.Add(time.Second)
		b.Publish(api.Event{Type: api.EventCreated, Sandbox: "s"})
	}
	replay, s := b.Subscribe(now.Add(-4*time.Second), Filter{}, 0)
	defer s.Close()
	if len(replay) != 5 || replay[0].Seq != RingSize+6 || replay[4].Seq != RingSize+10 {
		t.Fatalf("replay of the last 5s: %d events, %+v", len(replay), replay)
	}
	replay2, s2 := b.Subscribe(time.Unix(1, 0), Filter{}, 0)
	defer s2.Close()
	if len(replay2) != RingSize || replay2[0].Seq != 11 {
		t.Fatalf("replay of everything: %d events from seq %d, want %d from 11", len(replay2), replay2[0].Seq, RingSize)
	}
	if r, s3 := b.Subscribe(time.Time{}, Filter{}, 0); len(r) != 0 {
		t.Fatalf("no since, yet %d replayed", len(r))
	} else {
		s3.Close()
	}
	// Nothing is lost or seen twice between the replay and the subscription.
	b.Publish(api.Event{Type: api.EventDestroyed, Sandbox: "s"})
	if e, _ := recv(t, s); e.Seq != RingSize+11 {
		t.Fatalf("after the replay: %+v", e)
	}
}

// A subscriber that does not read is dropped once its buffer is full,
// with a last lagged event, and Publish never waits for it.
func TestSlowSubscriberDropped(t *testing.T) {
	var b Bus
	_, slow := b.Subscribe(time.Time{}, Filter{}, 4)
	defer slow.Close()
	_, fast := b.Subscribe(time.Time{}, Filter{}, 0)
	defer fast.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100 {
			b.Publish(api.Event{Type: api.EventCreated})
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Publish blocked on a slow subscriber")
	}
	if n := b.Subscribers(); n != 1 {
		t.Fatalf("%d subscribers, want the fast one only", n)
	}
	var got []api.Event
	for e := range slow.C {
		got = append(got, e)
	}
	if len(got) != 5 || got[3].Seq != 4 || got[4].Type != api.EventLagged {
		t.Fatalf("slow subscriber got %+v, want 4 events then lagged", got)
	}
	for i := int64(1); i <= 100; i++ {
		if e, ok := recv(t, fast); !ok || e.Seq != i {
			t.Fatalf("fast subscriber: %+v (open %v), want seq %d", e, ok, i)
		}
	}
	slow.Close() // after the bus dropped it: no panic
}

func TestCloseAndNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	var b Bus
	var subs []*Sub
	for range 50 {
		_, s := b.Subscribe(time.Time{}, Filter{}, 2)
		subs = append(subs, s)
	}
	for range 1000 {
		b.Publish(api.Event{Type: api.EventCreated})
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Fatalf("%d goroutines after publishing, %d before: the bus must start none", n, before)
	}
	for _, s := range subs {
		s.Close()
		s.Close()
		if _, ok := <-drain(s); ok {
			t.Fatal("channel still open after Close")
		}
	}
	if n := b.Subscribers(); n != 0 {
		t.Fatalf("%d subscribers left after Close", n)
	}
}

// drain reads s's channel to its end and returns a closed channel then.
func drain(s *Sub) <-chan api.Event {
	for range s.C {
	}
	return s.C
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 11, 27, 21, 30, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"":                     {},
		"10m":                  now.Add(-10 * time.Minute),
		"2026-11-27T20:00:00Z": time.Date(2026, 11, 27, 20, 0, 0, 0, time.UTC),
	} {
		got, err := ParseSince(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"-5m", "yesterday", "2026-11-27"} {
		if _, err := ParseSince(in, now); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseSince(%q): %v, want invalid", in, err)
		}
	}
	if err := CheckTypes([]string{"created", "paused-by-idle"}); err != nil {
		t.Error(err)
	}
	if err := CheckTypes([]string{"created", "exploded"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("unknown type: %v", err)
	}
}
