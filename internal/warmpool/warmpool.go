// Package warmpool keeps sandboxes started ahead of demand, per key (a
// template build, and for vms the machine shape too), for the backends
// that implement core.WarmPool. A create takes one (TakeWarm), records the
// sandbox under its ID, and the backend's Create claims it (Claimed).
//
// How many a key keeps: its target, which follows demand between a floor
// and a cap. The floor is the pool's size (nook serve --warm-pool); the
// cap (Options.Max, per key) is the backend's memory budget: containers
// cost a few MB each (nook serve --warm-pool-max), a vm holds its RAM and
// keeps the size. Every Take counts as demand, a hit or a miss (nothing
// ready). The burst at a take is how many takes of its key the last
// BurstWindow (2 s) saw, itself included; the target is the largest burst
// of the last QuietPeriod (1 min), raised to the floor and cut to the cap.
// So 10 parallel creates raise the target to 10 at once (the next such
// burst finds 10 ready), a steady 3 creates a second keeps it at 6, and
// once no burst that large came for a minute the target falls back (to
// the largest burst still within the minute, in the end to the floor):
// the ready sandboxes above it are destroyed then.
//
// Refill: whenever a wanted key has fewer sandboxes ready or starting than
// its target, more start, at most Options.Parallel at once per key
// (default: the host's CPUs). Ready plus starting never exceeds the
// target, hence never the cap. The refill a take asks for starts
// Options.RefillDelay later (the backends: DefaultRefillDelay), so that
// the sandbox just taken runs its first commands without a cold start
// beside them: on a small host a start takes every core for a few
// hundred milliseconds, and an agent's first command comes within a few
// milliseconds of its create.
//
// Nothing outlives Drain and Shutdown: a sandbox whose start was in flight
// is destroyed when its start ends (the key no longer wanted, or the pool
// closed). Drain waits for the starts of the keys it drains, Shutdown (at
// most 30 s) for every start.
package warmpool

import (
	"context"
	"errors"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nookhq/nook/api"
)

// Item is a warm sandbox.
type Item[T any] struct {
	ID  string
	Key string
	Val T // what the backend needs to claim it
}

// Options shape a Pool. Zero fields take the defaults.
type Options struct {
	// Size is how many sandboxes each wanted key keeps ready at least (0
	// or less: none, and the pool does nothing).
	Size int
	// Max is a key's cap: its target never exceeds it. nil, or below
	// Size: Size (the pool does not grow).
	Max func(key string) int
	// Parallel is how many sandboxes of one key may be starting at once;
	// default runtime.NumCPU().
	Parallel int
	// RefillDelay is how long after a take its refill starts (0: at once).
	RefillDelay time.Duration
	// Clock measures demand; default the real one.
	Clock Clock
}

// DefaultRefillDelay is the backends' Options.RefillDelay.
const DefaultRefillDelay = 100 * time.Millisecond

// Stats are a key's figures.
type Stats struct {
	Key      string
	Ready    int // started, waiting for a create
	Starting int
	Stopping int   // ready ones above a fallen target, being destroyed
	Target   int   // what the pool fills to now
	Min      int   // the floor of Target (Options.Size, within Max)
	Max      int   // the cap of Target
	Hits     int64 // takes that found one ready, since the pool began
	Misses   int64 // takes that found none
}

// Pool is a set of warm sandboxes.
type Pool[T any] struct {
	opts    Options
	start   func(ctx context.Context, key string) (Item[T], error)
	destroy func(ctx context.Context, id string) error
	onError func(key string, err error)

	mu      sync.Mutex
	keys    map[string]*keyState[T]
	claimed map[string]Item[T] // taken, not yet claimed by Create; by ID
	retired map[string]bool    // drained keys, never warmed again
	closed  bool
	// changed is closed (and replaced) whenever a start ends.
	changed chan struct{}
	wg      sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
}

// keyState is what a pool holds and knows of one key.
type keyState[T any] struct {
	ready     []Item[T] // oldest first
	starting  int
	stopping  int  // decayed ones still being destroyed
	wanted    bool // kept warm
	demand    demand
	hits      int64
	misses    int64
	stopTimer func() bool // the pending decay; nil: none
	refill    func() bool // the pending refill after a take; nil: none
}

// New returns a pool; start makes a sandbox, destroy removes one, onError
// hears about starts that failed.
func New[T any](opts Options, start func(ctx context.Context, key string) (Item[T], error),
	destroy func(ctx context.Context, id string) error, onError func(key string, err error)) *Pool[T] {
	if opts.Parallel <= 0 {
		opts.Parallel = runtime.NumCPU()
	}
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Pool[T]{opts: opts, start: start, destroy: destroy, onError: onError,
		keys: map[string]*keyState[T]{}, claimed: map[string]Item[T]{}, retired: map[string]bool{},
		changed: make(chan struct{}), ctx: ctx, cancel: cancel}
}

// Take reserves a warm sandbox of key and returns its ID. Every call
// counts as demand for key, whether it finds one or not.
func (p *Pool[T]) Take(key string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.opts.Size <= 0 || p.closed || p.retired[key] {
		return "", false
	}
	k := p.stateLocked(key)
	k.demand.record(p.opts.Clock.Now(), p.maxLocked(key))
	defer p.refillLocked(key, k)
	defer p.armDecayLocked(key, k)
	if len(k.ready) == 0 {
		k.misses++
		return "", false
	}
	k.hits++
	w := k.ready[len(k.ready)-1]
	k.ready = k.ready[:len(k.ready)-1]
	p.claimed[w.ID] = w
	return w.ID, true
}

// Claimed returns (and forgets) the sandbox Take reserved under id.
func (p *Pool[T]) Claimed(id string) (Item[T], bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.claimed[id]
	delete(p.claimed, id)
	return w, ok
}

// Want asks for warm sandboxes of key, started in the background.
func (p *Pool[T]) Want(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.opts.Size <= 0 || p.closed || p.retired[key] {
		return // a create of a build a rebuild replaced
	}
	p.stateLocked(key).wanted = true
	p.fillLocked(key)
}

func (p *Pool[T]) stateLocked(key string) *keyState[T] {
	k := p.keys[key]
	if k == nil {
		k = &keyState[T]{}
		p.keys[key] = k
	}
	return k
}

// maxLocked is key's cap, never below the pool's size.
func (p *Pool[T]) maxLocked(key string) int {
	if p.opts.Max == nil {
		return p.opts.Size
	}
	return max(p.opts.Max(key), p.opts.Size)
}

// targetLocked is how many sandboxes key keeps warm now (see the package doc).
func (p *Pool[T]) targetLocked(key string, k *keyState[T]) int {
	burst, _ := k.demand.peak(p.opts.Clock.Now())
	return min(max(burst, p.opts.Size), p.maxLocked(key))
}

// fillLocked starts what key lacks of its target, within the bound on
// parallel starts.
func (p *Pool[T]) fillLocked(key string) {
	k := p.keys[key]
	if p.opts.Size <= 0 || p.closed || k == nil || !k.wanted {
		return
	}
	n := min(p.targetLocked(key, k)-len(k.ready)-k.starting, p.opts.Parallel-k.starting)
	for ; n > 0; n-- {
		k.starting++
		p.wg.Add(1)
		go p.startOne(key, k)
	}
}

// refillLocked fills key after a take: RefillDelay later, once for any
// number of takes meanwhile.
func (p *Pool[T]) refillLocked(key string, k *keyState[T]) {
	if p.opts.RefillDelay <= 0 {
		p.fillLocked(key)
		return
	}
	if k.refill != nil || p.closed {
		return
	}
	k.refill = p.opts.Clock.AfterFunc(p.opts.RefillDelay, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		k.refill = nil
		if p.keys[key] == k {
			p.fillLocked(key)
		}
	})
}

// stopTimersLocked cancels k's pending decay and refill.
func (k *keyState[T]) stopTimersLocked() {
	for _, stop := range []*func() bool{&k.stopTimer, &k.refill} {
		if *stop != nil {
			(*stop)()
			*stop = nil
		}
	}
}

// startOne starts a sandbox of key and keeps it, or destroys it if the
// pool no longer wants it.
func (p *Pool[T]) startOne(key string, k *keyState[T]) {
	defer p.wg.Done()
	w, err := p.start(p.ctx, key)
	p.mu.Lock()
	if err != nil {
		p.startEndedLocked(k)
		p.mu.Unlock()
		if p.ctx.Err() == nil && p.onError != nil {
			p.onError(key, err)
		}
		return
	}
	if !p.closed && k.wanted && p.keys[key] == k && len(k.ready) < p.targetLocked(key, k) {
		k.ready = append(k.ready, w)
		p.startEndedLocked(k)
		p.fillLocked(key)
		p.mu.Unlock()
		return
	}
	// Closed, drained, or above a target that fell meanwhile.
	p.mu.Unlock()
	p.destroy(context.Background(), w.ID)
	p.mu.Lock()
	p.startEndedLocked(k)
	p.mu.Unlock()
}

func (p *Pool[T]) startEndedLocked(k *keyState[T]) {
	k.starting--
	close(p.changed)
	p.changed = make(chan struct{})
}

// armDecayLocked sets a timer for when key's raised target falls.
func (p *Pool[T]) armDecayLocked(key string, k *keyState[T]) {
	if k.stopTimer != nil || p.closed {
		return
	}
	now := p.opts.Clock.Now()
	burst, until := k.demand.peak(now)
	if burst <= p.opts.Size {
		return
	}
	k.stopTimer = p.opts.Clock.AfterFunc(until.Sub(now), func() { p.decay(key, k) })
}

// decay lowers key's target once its peak burst expired, and destroys the
// ready sandboxes above it, oldest first.
func (p *Pool[T]) decay(key string, k *keyState[T]) {
	p.mu.Lock()
	k.stopTimer = nil
	if p.closed || p.keys[key] != k {
		p.mu.Unlock()
		return
	}
	var victims []Item[T]
	if excess := len(k.ready) - p.targetLocked(key, k); excess > 0 {
		victims = append(victims, k.ready[:excess]...)
		k.ready = append([]Item[T](nil), k.ready[excess:]...)
	}
	p.armDecayLocked(key, k)
	k.stopping += len(victims)
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	err := p.destroyAll(context.Background(), victims)
	p.mu.Lock()
	k.stopping -= len(victims)
	p.mu.Unlock()
	if err != nil && p.onError != nil {
		p.onError(key, err)
	}
}

// Drain destroys the warm sandboxes of every key that starts with prefix,
// those still starting included (it waits for their starts, within ctx),
// and never warms those keys again.
func (p *Pool[T]) Drain(ctx context.Context, prefix string) error {
	p.mu.Lock()
	var victims []Item[T]
	var drained []*keyState[T]
	for key, k := range p.keys {
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		// Unwanted, a sandbox still starting is destroyed when it is ready.
		k.wanted = false
		k.stopTimersLocked()
		victims = append(victims, k.ready...)
		k.ready = nil
		p.retired[key] = true
		delete(p.keys, key)
		drained = append(drained, k)
	}
	p.mu.Unlock()
	err := p.destroyAll(ctx, victims)
	return errors.Join(err, p.waitStarts(ctx, drained))
}

// waitStarts waits until no sandbox of ks is starting.
func (p *Pool[T]) waitStarts(ctx context.Context, ks []*keyState[T]) error {
	for {
		p.mu.Lock()
		n := 0
		for _, k := range ks {
			n += k.starting
		}
		changed := p.changed
		p.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Shutdown stops refilling and destroys every warm sandbox.
func (p *Pool[T]) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	for _, k := range p.keys {
		k.stopTimersLocked()
	}
	p.mu.Unlock()
	p.cancel()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
	p.mu.Lock()
	var victims []Item[T]
	for _, k := range p.keys {
		victims = append(victims, k.ready...)
		k.ready = nil
	}
	for _, w := range p.claimed {
		victims = append(victims, w)
	}
	p.claimed = map[string]Item[T]{}
	p.mu.Unlock()
	return p.destroyAll(ctx, victims)
}

func (p *Pool[T]) destroyAll(ctx context.Context, ws []Item[T]) error {
	var errs []error
	for _, w := range ws {
		if err := p.destroy(ctx, w.ID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Ready returns how many warm sandboxes of key are ready.
func (p *Pool[T]) Ready(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if k := p.keys[key]; k != nil {
		return len(k.ready)
	}
	return 0
}

// Stats returns the figures of every key the pool knows, by key.
func (p *Pool[T]) Stats() []Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Stats, 0, len(p.keys))
	for key, k := range p.keys {
		out = append(out, Stats{Key: key, Ready: len(k.ready), Starting: k.starting, Stopping: k.stopping,
			Target: p.targetLocked(key, k), Min: min(p.opts.Size, p.maxLocked(key)), Max: p.maxLocked(key), Hits: k.hits, Misses: k.misses})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// Report returns the pool's figures as the API shows them.
func (p *Pool[T]) Report(isolation string) []api.WarmPool {
	var out []api.WarmPool
	for _, s := range p.Stats() {
		out = append(out, api.WarmPool{Isolation: isolation, Key: s.Key, Ready: s.Ready, Starting: s.Starting, Stopping: s.Stopping,
			Target: s.Target, Min: s.Min, Max: s.Max, Hits: s.Hits, Misses: s.Misses})
	}
	return out
}
