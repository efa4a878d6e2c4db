package container

import (
	"context"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/core/conformance"
)

// A daemon killed during a freeze (a pause, or a snapshot's copy) leaves
// its `runc pause` running, and under load that runc can freeze the
// container after the restarted daemon looked at it: the sandbox was
// recorded running, so nothing thawed it and every call to it hung.
// Paused waits for the lock that runc holds, and sees the freeze.
func TestPausedWaitsForAnOrphanFreeze(t *testing.T) {
	b, h := newTestBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "orphan-freeze")
	// The dead daemon's runc pause, started but not yet frozen.
	orphan, err := b.lockCRIU(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer orphan.Close() // a failure must not leave the destroy waiting for it
	b2 := twin(b)
	type result struct {
		paused bool
		err    error
	}
	done := make(chan result, 1)
	go func() {
		p, err := b2.Paused(ctx, s.ID)
		done <- result{p, err}
	}()
	select {
	case r := <-done:
		t.Fatalf("Paused did not wait for the runc still at work: paused %v, %v", r.paused, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	// Its freeze lands, then it exits.
	if err := b.runc(ctx, s.ID, "pause", s.ID); err != nil {
		t.Fatal(err)
	}
	orphan.Close()
	if r := <-done; r.err != nil || !r.paused {
		t.Fatalf("after the orphan's freeze: paused %v, %v", r.paused, r.err)
	}
	// So the restart's alignment resumes it, and it answers.
	if err := b2.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if got := s.Sh(t, "echo back"); got != "back\n" {
		t.Fatalf("after the resume: %q", got)
	}
}
