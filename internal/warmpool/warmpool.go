// Package warmpool keeps sandboxes started ahead of demand, per key (a
// template build, and for vms the machine shape too), for the backends
// that implement core.WarmPool. A create takes one (TakeWarm), records the
// sandbox under its ID, and the backend's Create claims it (Claimed).
package warmpool

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"
)

// Item is a warm sandbox.
type Item[T any] struct {
	ID  string
	Key string
	Val T // what the backend needs to claim it
}

// Pool is a set of warm sandboxes.
type Pool[T any] struct {
	size    int
	start   func(ctx context.Context, key string) (Item[T], error)
	destroy func(ctx context.Context, id string) error
	onError func(key string, err error)

	mu      sync.Mutex
	ready   map[string][]Item[T] // by key
	claimed map[string]Item[T]   // taken, not yet claimed by Create; by ID
	wanted  map[string]bool      // keys to keep warm
	retired map[string]bool      // drained keys, never warmed again
	filling map[string]bool
	closed  bool
	wg      sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
}

// New returns a pool keeping size sandboxes per wanted key; start makes
// one, destroy removes one, onError hears about starts that failed.
func New[T any](size int, start func(ctx context.Context, key string) (Item[T], error),
	destroy func(ctx context.Context, id string) error, onError func(key string, err error)) *Pool[T] {
	ctx, cancel := context.WithCancel(context.Background())
	return &Pool[T]{size: size, start: start, destroy: destroy, onError: onError,
		ready: map[string][]Item[T]{}, claimed: map[string]Item[T]{}, wanted: map[string]bool{},
		retired: map[string]bool{}, filling: map[string]bool{}, ctx: ctx, cancel: cancel}
}

// Take reserves a warm sandbox of key and returns its ID.
func (p *Pool[T]) Take(key string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ws := p.ready[key]
	if len(ws) == 0 {
		return "", false
	}
	w := ws[len(ws)-1]
	p.ready[key] = ws[:len(ws)-1]
	p.claimed[w.ID] = w
	p.fillLocked(key)
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
	if p.retired[key] {
		return // a create of a build a rebuild replaced
	}
	p.wanted[key] = true
	p.fillLocked(key)
}

func (p *Pool[T]) fillLocked(key string) {
	if p.size <= 0 || p.closed || p.filling[key] || !p.wanted[key] || len(p.ready[key]) >= p.size {
		return
	}
	p.filling[key] = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			p.mu.Lock()
			if p.closed || !p.wanted[key] || len(p.ready[key]) >= p.size {
				p.filling[key] = false
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			w, err := p.start(p.ctx, key)
			p.mu.Lock()
			if err != nil {
				p.filling[key] = false
				p.mu.Unlock()
				if p.ctx.Err() == nil && p.onError != nil {
					p.onError(key, err)
				}
				return
			}
			if p.closed || !p.wanted[key] {
				p.mu.Unlock()
				p.destroy(context.Background(), w.ID)
				continue
			}
			p.ready[key] = append(p.ready[key], w)
			p.mu.Unlock()
		}
	}()
}

// Drain destroys the warm sandboxes of every key that starts with prefix,
// and never warms those keys again.
func (p *Pool[T]) Drain(ctx context.Context, prefix string) error {
	p.mu.Lock()
	var victims []Item[T]
	// A key may be wanted with its first sandbox still starting:
	// unwanted, that sandbox is destroyed when it is ready.
	for k := range p.wanted {
		if strings.HasPrefix(k, prefix) {
			delete(p.wanted, k)
			p.retired[k] = true
		}
	}
	for k, ws := range p.ready {
		if strings.HasPrefix(k, prefix) {
			victims = append(victims, ws...)
			delete(p.ready, k)
		}
	}
	p.mu.Unlock()
	return p.destroyAll(ctx, victims)
}

// Shutdown stops refilling and destroys every warm sandbox.
func (p *Pool[T]) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
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
	for _, ws := range p.ready {
		victims = append(victims, ws...)
	}
	for _, w := range p.claimed {
		victims = append(victims, w)
	}
	p.ready, p.claimed = map[string][]Item[T]{}, map[string]Item[T]{}
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
	return len(p.ready[key])
}
