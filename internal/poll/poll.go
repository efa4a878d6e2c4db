// Package poll waits for a condition that nothing announces (a process
// gone, a cgroup empty enough to remove, a loop device detached, a QEMU
// migration ended): it asks again and again, with a backoff, until the
// condition holds, the condition fails, the context ends or the wait's
// bound passes. The daemon's polling waits go through Until, so that
// every one of them is bounded and none spins: the first asks come
// quickly (most of these conditions hold within a millisecond or two)
// and later ones further apart.
package poll

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrTimeout is what Until's error wraps when its Timeout passed.
var ErrTimeout = errors.New("timed out")

// Options bound a wait and pace its asks.
type Options struct {
	// Timeout bounds the wait (0: only the context does).
	Timeout time.Duration
	// Min is the wait before the second ask, doubled after each ask up
	// to Max (defaults: 1ms and 50ms).
	Min, Max time.Duration
}

// Until calls done until it reports true (Until returns nil) or an error
// (returned as it is), the context ends (its error), or Timeout passes
// (an error wrapping ErrTimeout). done is called at least once, even
// with a context already ended.
func Until(ctx context.Context, o Options, done func() (bool, error)) error {
	wait, most := o.Min, o.Max
	if wait <= 0 {
		wait = time.Millisecond
	}
	if most <= 0 {
		most = 50 * time.Millisecond
	}
	most = max(most, wait)
	var deadline time.Time
	if o.Timeout > 0 {
		deadline = time.Now().Add(o.Timeout)
	}
	var t *time.Timer
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		d := wait
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return fmt.Errorf("%w after %s", ErrTimeout, o.Timeout)
			}
			d = min(d, left)
		}
		if t == nil {
			t = time.NewTimer(d)
			defer t.Stop()
		} else {
			t.Reset(d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, most)
	}
}
