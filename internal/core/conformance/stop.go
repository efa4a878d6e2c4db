package conformance

import (
	"context"
	"strings"
	"testing"

	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
)

// testStopStart runs for backends that can stop: a stopped sandbox has
// no process and reads as stopped (twice, and across a running one's
// pause); started, it runs afresh on the same files, its background
// processes gone.
func testStopStart(t *testing.T, h Harness) {
	st, ok := h.Backend.(core.Stopper)
	if !ok || !h.Backend.Capabilities().Stop {
		t.Skip("the backend cannot stop sandboxes (Capabilities.Stop is false)")
	}
	s := Create(t, h, "conf-stop")
	ctx := context.Background()
	s.Sh(t, "echo kept > /root/kept && sync")
	if _, err := s.Agent.Start(ctx, &agent.ExecRequest{Argv: []string{"sleep", "1000"}}); err != nil {
		t.Fatal(err)
	}
	s.Agent.Close()
	if err := st.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		rs, err := h.Backend.Status(ctx, s.Sandbox)
		if err != nil || rs.State != core.RuntimeStopped || rs.Halt != core.HaltStopped {
			t.Fatalf("a stopped sandbox's status: %+v %v", rs, err)
		}
	}
	if err := st.Stop(ctx, s.ID); err != nil {
		t.Fatalf("stopping a stopped sandbox: %v", err)
	}
	if err := st.Start(ctx, s.Sandbox); err != nil {
		t.Fatal(err)
	}
	if rs, err := h.Backend.Status(ctx, s.Sandbox); err != nil || rs.State != core.RuntimeRunning {
		t.Fatalf("a started sandbox's status: %+v %v", rs, err)
	}
	// As the daemon does after a start: the agent is configured again.
	if err := s.Agent.Configure(ctx, &agent.ConfigureRequest{Hostname: s.Name, Env: s.Env}); err != nil {
		t.Fatalf("the started sandbox's agent: %v", err)
	}
	if got := s.Sh(t, "cat /root/kept"); got != "kept\n" {
		t.Fatalf("after a start /root/kept reads %q", got)
	}
	if got := s.Sh(t, "pgrep -x sleep || echo none"); strings.TrimSpace(got) != "none" {
		t.Fatalf("a process outlived the stop: %q", got)
	}
	// A pause, then a stop: the pause's saved memory is dropped.
	if p, ok := h.Backend.(core.Pauser); ok && h.Backend.Capabilities().Pause {
		s.Agent.Close()
		if err := p.Pause(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		if err := st.Stop(ctx, s.ID); err != nil {
			t.Fatalf("stop a paused sandbox: %v", err)
		}
		if rs, err := h.Backend.Status(ctx, s.Sandbox); err != nil || rs.State != core.RuntimeStopped {
			t.Fatalf("a paused, then stopped sandbox's status: %+v %v", rs, err)
		}
		if err := st.Start(ctx, s.Sandbox); err != nil {
			t.Fatal(err)
		}
		if err := s.Agent.Configure(ctx, &agent.ConfigureRequest{Hostname: s.Name, Env: s.Env}); err != nil {
			t.Fatalf("the started sandbox's agent: %v", err)
		}
		if got := s.Sh(t, "cat /root/kept"); got != "kept\n" {
			t.Fatalf("after a pause, stop and start /root/kept reads %q", got)
		}
	}
	// A stopped sandbox is destroyed like any other (Create's cleanup checks for leaks).
	s.Agent.Close()
	if err := st.Stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}
