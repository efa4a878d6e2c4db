package conformance

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
)

// testPause runs for backends that can pause: a paused sandbox's
// processes make no progress and do not answer; resumed, the same
// processes go on where they were.
func testPause(t *testing.T, h Harness) {
	p, ok := h.Backend.(core.Pauser)
	if !ok || !h.Backend.Capabilities().Pause {
		t.Skip("the backend cannot pause (Capabilities.Pause is false)")
	}
	s := Create(t, h, "conf-pause")
	ctx := context.Background()
	pid, err := s.Agent.Start(ctx, &agent.ExecRequest{Argv: []string{"sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.02; done"}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	// A pause to disk ends the host's connections to the agent: callers
	// close theirs first (the daemon does).
	s.Agent.Close()
	if err := p.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Pause(ctx, s.ID); err != nil {
		t.Fatalf("pausing a paused sandbox: %v", err)
	}
	if paused, err := p.Paused(ctx, s.ID); err != nil || !paused {
		t.Fatalf("Paused = %v, %v", paused, err)
	}
	// Nothing inside runs: the agent does not answer.
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	start := time.Now()
	_, err = s.Agent.Ping(pctx)
	cancel()
	if err == nil {
		t.Fatal("a paused sandbox answered")
	}
	// A caller's deadline holds against a sandbox that cannot answer.
	if waited := time.Since(start); waited > 3*time.Second {
		t.Fatalf("a request with a 300ms deadline took %v to give up", waited)
	}
	s.Agent.Close() // the timed-out request broke the session
	// Frozen in place (running) or saved to disk (saved): either way intact.
	if st, err := h.Backend.Status(ctx, s.Sandbox); err != nil || (st.State != core.RuntimeRunning && st.State != core.RuntimeSaved) {
		t.Fatalf("a paused sandbox's status: %v %v", st.State, err)
	}
	if err := p.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Resume(ctx, s.ID); err != nil {
		t.Fatalf("resuming a running sandbox: %v", err)
	}
	before := strings.TrimSpace(s.Sh(t, "cat /tmp/count"))
	time.Sleep(200 * time.Millisecond)
	after := strings.TrimSpace(s.Sh(t, "cat /tmp/count"))
	if before == after {
		t.Fatalf("the counter did not go on after resume (%s)", after)
	}
	ps, err := s.Agent.Processes(ctx)
	if err != nil || len(ps) != 1 || ps[0].PID != pid || !ps[0].Running {
		t.Fatalf("the background process did not survive the pause: %+v %v", ps, err)
	}
	// A paused sandbox is destroyed like any other (Create's cleanup checks for leaks).
	s.Agent.Close()
	if err := p.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}
