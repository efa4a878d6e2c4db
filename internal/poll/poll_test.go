package poll

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestUntil(t *testing.T) {
	ctx := context.Background()
	n := 0
	if err := Until(ctx, Options{Timeout: time.Second}, func() (bool, error) { n++; return n == 5, nil }); err != nil || n != 5 {
		t.Fatalf("held at the 5th ask: %v after %d asks", err, n)
	}

	boom := errors.New("boom")
	if err := Until(ctx, Options{}, func() (bool, error) { return false, boom }); err != boom {
		t.Fatalf("a failing condition: %v", err)
	}

	start, asks := time.Now(), 0
	err := Until(ctx, Options{Timeout: 60 * time.Millisecond, Min: time.Millisecond, Max: 8 * time.Millisecond}, func() (bool, error) { asks++; return false, nil })
	if took := time.Since(start); !errors.Is(err, ErrTimeout) || took < 60*time.Millisecond || took > 2*time.Second {
		t.Fatalf("never holds: %v after %s", err, took)
	}
	// 1+2+4+8+8+... ms: a dozen asks or so, not a spin and not one.
	if asks < 5 || asks > 60 {
		t.Fatalf("%d asks in 60ms with a backoff from 1 to 8ms", asks)
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	asks = 0
	if err := Until(cctx, Options{}, func() (bool, error) { asks++; return false, nil }); !errors.Is(err, context.Canceled) || asks != 1 {
		t.Fatalf("an ended context: %v after %d asks", err, asks)
	}
	if err := Until(cctx, Options{}, func() (bool, error) { return true, nil }); err != nil {
		t.Fatalf("a condition that holds at once, with an ended context: %v", err)
	}
}
