package warmpool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"
)

// fakeClock is a Clock that moves only when Advance says so, and fires
// the timers due then, in the caller's goroutine.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		return was
	}
}

// Advance moves the clock by d and runs the timers due, earliest first.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	keep := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case t.stopped:
		case !t.at.After(c.now):
			t.stopped = true
			due = append(due, t)
		default:
			keep = append(keep, t)
		}
	}
	c.timers = keep
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		t.f()
	}
}

// fakeBackend starts and destroys numbered sandboxes and remembers it.
// With gated set, each start waits for a release.
type fakeBackend struct {
	t     *testing.T
	gated bool
	gate  chan struct{}
	pool  *Pool[int]
	max   int // ready + starting must never exceed it

	mu        sync.Mutex
	next      int
	started   []string
	destroyed map[string]int
	inFlight  int
	peakLoad  int // the most starts in flight at once
	fail      error
	// holdDestroys, when set, makes each destroy wait for a receive.
	holdDestroys chan struct{}
}

func newFake(t *testing.T, opts Options, gated bool) *fakeBackend {
	f := &fakeBackend{t: t, gated: gated, gate: make(chan struct{}), destroyed: map[string]int{}}
	f.max = opts.Size
	if opts.Max != nil {
		f.max = max(opts.Max(""), opts.Size)
	}
	f.pool = New(opts, f.start, f.destroy, func(string, error) {})
	t.Cleanup(func() { f.pool.Shutdown(context.Background()) })
	return f
}

func (f *fakeBackend) start(ctx context.Context, key string) (Item[int], error) {
	for _, s := range f.pool.Stats() {
		if s.Ready+s.Starting > f.max || s.Target > f.max {
			f.t.Errorf("key %s: %d ready, %d starting, target %d: above the cap %d", s.Key, s.Ready, s.Starting, s.Target, f.max)
		}
	}
	f.mu.Lock()
	f.inFlight++
	f.peakLoad = max(f.peakLoad, f.inFlight)
	err := f.fail
	f.mu.Unlock()
	if f.gated {
		select {
		case <-f.gate:
		case <-time.After(10 * time.Second):
			err = errors.New("never released")
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inFlight--
	if err != nil {
		return Item[int]{}, err
	}
	f.next++
	id := fmt.Sprintf("w%d", f.next)
	f.started = append(f.started, id)
	return Item[int]{ID: id, Key: key, Val: f.next}, nil
}

func (f *fakeBackend) destroy(ctx context.Context, id string) error {
	if f.holdDestroys != nil {
		select {
		case <-f.holdDestroys:
		case <-time.After(10 * time.Second):
			f.t.Errorf("destroy of %s never released", id)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Contains(f.started, id) {
		f.t.Errorf("destroy of %s, never started", id)
	}
	f.destroyed[id]++
	return nil
}

// release lets n gated starts finish.
func (f *fakeBackend) release(n int) {
	for range n {
		select {
		case f.gate <- struct{}{}:
		case <-time.After(10 * time.Second):
			f.t.Fatal("no start waiting to be released")
		}
	}
}

// stats returns key's figures.
func (f *fakeBackend) stats(key string) Stats {
	for _, s := range f.pool.Stats() {
		if s.Key == key {
			return s
		}
	}
	return Stats{Key: key}
}

// waitFor waits (10 s at most) until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (f *fakeBackend) waitReady(key string, n int) {
	f.t.Helper()
	waitFor(f.t, fmt.Sprintf("%d ready of %s", n, key), func() bool {
		s := f.stats(key)
		return s.Ready == n && s.Starting == 0
	})
}

// checkAllDestroyedOnce checks every started sandbox was destroyed, once,
// except those named in kept.
func (f *fakeBackend) checkAllDestroyedOnce(kept ...string) {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range f.started {
		want := 1
		if slices.Contains(kept, id) {
			want = 0
		}
		if got := f.destroyed[id]; got != want {
			f.t.Errorf("%s destroyed %d times, want %d", id, got, want)
		}
	}
}

func capAt(n int) func(string) int { return func(string) int { return n } }

func burst(p *Pool[int], key string, n int) (taken []string) {
	for range n {
		if id, ok := p.Take(key); ok {
			taken = append(taken, id)
		}
	}
	return taken
}

func TestMissesAreCounted(t *testing.T) {
	f := newFake(t, Options{Size: 2, Clock: newFakeClock()}, false)
	if _, ok := f.pool.Take("a"); ok {
		t.Fatal("a take from an empty pool found a sandbox")
	}
	if s := f.stats("a"); s.Misses != 1 || s.Hits != 0 || s.Ready != 0 || s.Starting != 0 {
		t.Fatalf("after a miss of a key nobody wants: %+v", s)
	}
	f.pool.Want("a")
	f.waitReady("a", 2)
	if _, ok := f.pool.Take("a"); !ok {
		t.Fatal("no sandbox with 2 ready")
	}
	f.waitReady("a", 2)
	if s := f.stats("a"); s.Hits != 1 || s.Misses != 1 || s.Target != 2 || s.Max != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// A burst of takes raises the target to the burst, and the pool refills to it.
func TestTargetRisesAfterBurst(t *testing.T) {
	clock := newFakeClock()
	f := newFake(t, Options{Size: 2, Max: capAt(16), Parallel: 4, Clock: clock}, true)
	f.pool.Want("a")
	f.release(2)
	f.waitReady("a", 2)
	taken := burst(f.pool, "a", 10)
	f.release(10)
	if len(taken) != 2 {
		t.Fatalf("%d of 10 takes found a sandbox, want 2", len(taken))
	}
	s := f.stats("a")
	if s.Target != 10 || s.Hits != 2 || s.Misses != 8 {
		t.Fatalf("after a burst of 10: %+v", s)
	}
	f.waitReady("a", 10)
	// The next burst of 10 finds them all.
	clock.Advance(5 * time.Second)
	if got := burst(f.pool, "a", 10); len(got) != 10 {
		t.Fatalf("%d of the second burst's 10 takes found a sandbox", len(got))
	}
	f.release(10)
	f.waitReady("a", 10)
	// Takes spread wider than the window do not add up.
	g := newFake(t, Options{Size: 2, Max: capAt(16), Clock: clock}, false)
	g.pool.Want("b")
	for range 10 {
		g.pool.Take("b")
		clock.Advance(BurstWindow)
	}
	if s := g.stats("b"); s.Target != 2 {
		t.Fatalf("takes a window apart raised the target: %+v", s)
	}
}

// The target never exceeds the cap, however large the burst.
func TestTargetCapped(t *testing.T) {
	f := newFake(t, Options{Size: 2, Max: capAt(5), Parallel: 8, Clock: newFakeClock()}, false)
	f.pool.Want("a")
	f.waitReady("a", 2)
	burst(f.pool, "a", 50)
	if s := f.stats("a"); s.Target != 5 || s.Max != 5 {
		t.Fatalf("after a burst of 50: %+v", s)
	}
	f.waitReady("a", 5)
	// Without a cap above it, the size is the cap: no growth.
	g := newFake(t, Options{Size: 2, Max: capAt(1), Clock: newFakeClock()}, false)
	g.pool.Want("a")
	g.waitReady("a", 2)
	burst(g.pool, "a", 10)
	g.waitReady("a", 2)
	if s := g.stats("a"); s.Target != 2 || s.Max != 2 {
		t.Fatalf("a pool capped below its size: %+v", s)
	}
}

// A large deficit starts sandboxes in parallel, never more at once than
// Parallel, and never more than the target in all.
func TestRefillParallelBounded(t *testing.T) {
	f := newFake(t, Options{Size: 1, Max: capAt(12), Parallel: 3, Clock: newFakeClock()}, true)
	f.pool.Want("a")
	if s := f.stats("a"); s.Starting != 1 {
		t.Fatalf("want with size 1: %+v", s)
	}
	burst(f.pool, "a", 12)
	if s := f.stats("a"); s.Starting != 3 || s.Target != 12 {
		t.Fatalf("after a burst of 12: %+v, want 3 starting", s)
	}
	for released := 0; released < 12; released++ {
		waitFor(t, "the starts to begin", func() bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.inFlight == min(3, 12-released)
		})
		f.release(1)
		waitFor(t, "the next start", func() bool {
			s := f.stats("a")
			return s.Ready == released+1 && s.Starting == min(3, 12-released-1)
		})
	}
	f.waitReady("a", 12)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.peakLoad != 3 {
		t.Fatalf("at most %d starts ran at once, want 3", f.peakLoad)
	}
	if len(f.started) != 12 {
		t.Fatalf("%d started, want 12", len(f.started))
	}
}

// After a quiet period the target falls back to the size, and the ready
// sandboxes above it (the oldest) are destroyed.
func TestDecayAfterQuietPeriod(t *testing.T) {
	clock := newFakeClock()
	f := newFake(t, Options{Size: 2, Max: capAt(16), Parallel: 4, Clock: clock}, false)
	f.pool.Want("a")
	f.waitReady("a", 2)
	burst(f.pool, "a", 10)
	f.waitReady("a", 10)
	clock.Advance(30 * time.Second)
	// A smaller burst half a minute later: 4 hits, refilled.
	if got := burst(f.pool, "a", 4); len(got) != 4 {
		t.Fatalf("%d of 4 takes found a sandbox, with 10 ready", len(got))
	}
	f.waitReady("a", 10)
	clock.Advance(QuietPeriod - 30*time.Second - time.Millisecond)
	if s := f.stats("a"); s.Target != 10 || s.Ready != 10 {
		t.Fatalf("before the quiet period ended: %+v", s)
	}
	f.pool.mu.Lock()
	var oldest []string // the 6 left of the first refill
	for _, w := range f.pool.keys["a"].ready[:6] {
		oldest = append(oldest, w.ID)
	}
	f.pool.mu.Unlock()
	clock.Advance(time.Millisecond) // the burst of 10 is a minute old
	if s := f.stats("a"); s.Target != 4 || s.Ready != 4 {
		t.Fatalf("a minute after the burst of 10, with one of 4 since: %+v", s)
	}
	f.mu.Lock()
	for _, id := range oldest {
		if f.destroyed[id] != 1 {
			t.Errorf("%s, among the oldest, destroyed %d times", id, f.destroyed[id])
		}
	}
	f.mu.Unlock()
	clock.Advance(30 * time.Second)
	if s := f.stats("a"); s.Target != 2 || s.Ready != 2 {
		t.Fatalf("a minute after the last burst: %+v", s)
	}
	f.pool.Shutdown(context.Background())
	f.checkAllDestroyedOnce() // the taken too: never claimed
}

// While a decay destroys the sandboxes above the fallen target, Stats
// counts them as stopping (what a benchmark waits out before it measures
// an idle daemon), and no longer once they are gone.
func TestStoppingWhileDecayDestroys(t *testing.T) {
	clock := newFakeClock()
	f := newFake(t, Options{Size: 1, Max: capAt(8), Parallel: 4, Clock: clock}, false)
	f.pool.Want("a")
	f.waitReady("a", 1)
	burst(f.pool, "a", 4)
	f.waitReady("a", 4)
	f.holdDestroys = make(chan struct{})
	defer close(f.holdDestroys) // the shutdown's destroys pass
	go clock.Advance(QuietPeriod)
	waitFor(t, "3 stopping", func() bool { s := f.stats("a"); return s.Stopping == 3 && s.Ready == 1 && s.Target == 1 })
	for range 3 {
		f.holdDestroys <- struct{}{}
	}
	waitFor(t, "none stopping", func() bool { return f.stats("a").Stopping == 0 })
}

// A start that fails stops that starter (no busy loop); a later Want
// tries again.
func TestStartErrors(t *testing.T) {
	f := newFake(t, Options{Size: 2, Clock: newFakeClock()}, false)
	f.fail = errors.New("no")
	f.pool.Want("a")
	waitFor(t, "the failed starts to end", func() bool { return f.stats("a").Starting == 0 })
	f.mu.Lock()
	f.fail = nil
	f.mu.Unlock()
	f.pool.Want("a")
	f.waitReady("a", 2)
}

// Drain with starts in flight returns once they ended, and every sandbox
// of the drained keys is destroyed exactly once; other keys stay.
func TestDrainWithStartsInFlight(t *testing.T) {
	f := newFake(t, Options{Size: 2, Max: capAt(8), Parallel: 2, Clock: newFakeClock()}, true)
	f.pool.Want("tpl/a")
	f.pool.Want("other/b")
	f.release(4)
	f.waitReady("tpl/a", 2)
	f.waitReady("other/b", 2)
	taken := burst(f.pool, "tpl/a", 8) // 2 hits; 2 start, 4 wait for a free starter
	if s := f.stats("tpl/a"); s.Starting != 2 || s.Ready != 0 {
		t.Fatalf("after the burst: %+v", s)
	}
	f.release(1)
	waitFor(t, "one ready", func() bool { return f.stats("tpl/a").Ready == 1 })
	drained := make(chan error)
	go func() { drained <- f.pool.Drain(context.Background(), "tpl/") }()
	waitFor(t, "the ready one destroyed", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.destroyed) == 1
	})
	select {
	case err := <-drained:
		t.Fatalf("drain returned (%v) with 2 starts in flight", err)
	default:
	}
	f.release(2)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	f.pool.Want("tpl/a")
	if n := f.pool.Ready("tpl/a"); n != 0 || len(f.pool.Stats()) != 1 {
		t.Fatalf("a drained key is warm again: %d ready, %+v", n, f.pool.Stats())
	}
	if _, ok := f.pool.Take("tpl/a"); ok {
		t.Fatal("a take of a drained key found a sandbox")
	}
	var kept []string
	f.mu.Lock()
	for _, id := range f.started {
		if f.destroyed[id] == 0 {
			kept = append(kept, id)
		}
	}
	f.mu.Unlock()
	if len(kept) != 2+len(taken) {
		t.Fatalf("%d sandboxes left, want the 2 of other/b and the %d taken", len(kept), len(taken))
	}
	f.checkAllDestroyedOnce(kept...)
}

// Shutdown with starts in flight leaves nothing: ready, taken but not
// claimed, and still starting sandboxes are all destroyed exactly once.
func TestShutdownWithStartsInFlight(t *testing.T) {
	f := newFake(t, Options{Size: 2, Max: capAt(8), Parallel: 2, Clock: newFakeClock()}, true)
	f.pool.Want("a")
	f.pool.Want("b")
	f.release(4)
	f.waitReady("a", 2)
	f.waitReady("b", 2)
	taken := burst(f.pool, "a", 6)
	if len(taken) != 2 {
		t.Fatalf("%d taken", len(taken))
	}
	claimed, ok := f.pool.Claimed(taken[0])
	if !ok || claimed.ID != taken[0] {
		t.Fatalf("claimed %+v %v", claimed, ok)
	}
	f.release(1)
	waitFor(t, "one ready", func() bool { return f.stats("a").Ready == 1 })
	shut := make(chan error)
	go func() { shut <- f.pool.Shutdown(context.Background()) }()
	// Starts that began before the shutdown end after it; the pool
	// destroys what they made and starts no more.
	waitFor(t, "the pool closed", func() bool {
		f.pool.mu.Lock()
		defer f.pool.mu.Unlock()
		return f.pool.closed
	})
	f.release(2)
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
	f.pool.Want("a")
	if _, ok := f.pool.Take("b"); ok || f.stats("a").Starting != 0 {
		t.Fatal("a closed pool hands out or starts sandboxes")
	}
	f.checkAllDestroyedOnce(taken[0]) // claimed: the backend's now
}

// The starts a shutdown cancels are not errors, and leave nothing.
func TestShutdownCancelsStarts(t *testing.T) {
	var errs []error
	var mu sync.Mutex
	started := make(chan struct{}, 2)
	p := New(Options{Size: 2, Clock: newFakeClock()}, func(ctx context.Context, key string) (Item[int], error) {
		started <- struct{}{}
		<-ctx.Done()
		return Item[int]{}, ctx.Err()
	}, func(context.Context, string) error {
		t.Error("destroy of a sandbox never started")
		return nil
	}, func(_ string, err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	})
	p.Want("a")
	<-started
	<-started
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(errs) != 0 {
		t.Fatalf("errors reported: %v", errs)
	}
}

func TestDisabled(t *testing.T) {
	f := newFake(t, Options{Size: 0, Max: capAt(16), Clock: newFakeClock()}, false)
	f.pool.Want("a")
	burst(f.pool, "a", 10)
	if len(f.started) != 0 || len(f.pool.Stats()) != 0 {
		t.Fatalf("a pool of size 0 started %d, stats %+v", len(f.started), f.pool.Stats())
	}
}

// TestRefillDelay: a take's refill starts RefillDelay later, once for all
// the takes meanwhile; a drain or shutdown cancels a pending refill.
func TestRefillDelay(t *testing.T) {
	clock := newFakeClock()
	f := newFake(t, Options{Size: 2, RefillDelay: 100 * time.Millisecond, Clock: clock}, false)
	f.pool.Want("a")
	f.waitReady("a", 2) // the first fill is at once
	if len(burst(f.pool, "a", 2)) != 2 {
		t.Fatal("2 ready, fewer taken")
	}
	clock.Advance(99 * time.Millisecond)
	if s := f.stats("a"); s.Ready != 0 || s.Starting != 0 || len(f.started) != 2 {
		t.Fatalf("before the refill delay passed: %+v, %d started", s, len(f.started))
	}
	clock.Advance(time.Millisecond)
	f.waitReady("a", 2)
	f.mu.Lock()
	started := len(f.started)
	f.mu.Unlock()
	if started != 4 {
		t.Fatalf("%d started, want 4 (one refill for both takes)", started)
	}

	// A drain with a refill pending: nothing starts afterwards.
	f.pool.Take("a")
	if err := f.pool.Drain(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	f.mu.Lock()
	started = len(f.started)
	f.mu.Unlock()
	if s := f.stats("a"); started != 4 || s.Starting != 0 {
		t.Fatalf("after a drain, a pending refill started: %+v, %d started", s, started)
	}

	// A shutdown with a refill pending.
	f.pool.Want("b")
	f.waitReady("b", 2)
	f.pool.Take("b")
	if err := f.pool.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	f.mu.Lock()
	started = len(f.started)
	f.mu.Unlock()
	if started != 6 {
		t.Fatalf("after a shutdown, a pending refill started: %d started, want 6", started)
	}
	f.checkAllDestroyedOnce() // the taken ones too: never claimed, the shutdown destroys them
}
