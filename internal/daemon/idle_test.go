package daemon

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
)

// A call that arrives while the reaper pauses a sandbox waits for the
// pause; a call made after the reaper looked stops the pause.
func TestIdleTrackerHandshake(t *testing.T) {
	tr := newIdleTracker()
	tr.touch("a")
	seen := tr.sb["a"].lastActive
	if ch := tr.use("a"); ch != nil {
		t.Fatal("use of an idle sandbox waits")
	}
	if tr.beginPause("a", seen) {
		t.Fatal("paused a sandbox used after the reaper looked")
	}
	seen = tr.sb["a"].lastActive
	if !tr.beginPause("a", seen) {
		t.Fatal("could not pause an unused sandbox")
	}
	ch := tr.use("a")
	if ch == nil {
		t.Fatal("a call during the pause does not wait")
	}
	if !tr.sb["a"].lastActive.Equal(seen) {
		t.Fatal("a call waiting for the pause restarted the clock")
	}
	tr.prune(map[string]bool{})
	if tr.sb["a"] == nil {
		t.Fatal("pruned a sandbox being paused")
	}
	tr.endPause("a")
	select {
	case <-ch:
	default:
		t.Fatal("the pause ended, but the call still waits")
	}
	if tr.use("a") != nil {
		t.Fatal("use after the pause waits")
	}
	tr.prune(map[string]bool{})
	if len(tr.sb) != 0 {
		t.Fatal("prune kept a sandbox that is gone")
	}
}

// reapUntil runs the reaper until cond holds, or fails after d.
func reapUntil(t *testing.T, m *Manager, d time.Duration, what string, cond func(*core.Sandbox) bool, name string) *core.Sandbox {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(d)
	for {
		m.reapOnce(ctx)
		sb, err := m.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if cond(sb) {
			return sb
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (state %s)", what, d, sb.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// reapFor runs the reaper for d and fails if the sandbox stops running.
func reapFor(t *testing.T, m *Manager, d time.Duration, what, name string) {
	t.Helper()
	ctx := context.Background()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		m.reapOnce(ctx)
		if sb, err := m.Get(ctx, name); err != nil || sb.State != core.StateRunning {
			t.Fatalf("%s: sandbox %v, %v", what, sb.State, err)
		}
	}
}

func runToExit(t *testing.T, m *Manager, name string, cmd ...string) {
	t.Helper()
	p, err := m.Exec(context.Background(), name, api.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for {
		kind, _, err := p.Next()
		if err != nil {
			t.Fatal(err)
		}
		if kind == api.FrameExit {
			return
		}
	}
}

func isPaused(sb *core.Sandbox) bool { return sb.State == core.StatePaused }

// An idle sandbox is paused; one with an exec in progress or a background
// process is not; a call wakes it and restarts its clock.
func TestIdlePause(t *testing.T) {
	m, _ := newManager(t)
	m.cfg.MinIdlePause = time.Second
	ctx := context.Background()
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "dozy", IdlePause: "1s"}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "dozy") })
	sb := reapUntil(t, m, 10*time.Second, "idle pause", isPaused, "dozy")
	if sb.Reason != "idle for 1s" || m.View(sb).IdlePause != "1s" {
		t.Fatalf("paused sandbox: reason %q, view %+v", sb.Reason, m.View(sb))
	}

	// A foreground exec in progress keeps it awake (and wakes it).
	p, err := m.Exec(ctx, "dozy", api.ExecRequest{Cmd: []string{"sleep", "3"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb, _ := m.Get(ctx, "dozy"); sb.State != core.StateRunning || sb.Reason != "" {
		t.Fatalf("after exec: %s %q", sb.State, sb.Reason)
	}
	reapFor(t, m, 2500*time.Millisecond, "foreground exec in progress", "dozy")
	for {
		kind, _, err := p.Next()
		if err != nil || kind == api.FrameExit {
			break
		}
	}
	p.Close()

	// So does a background process.
	bg, err := m.Exec(ctx, "dozy", api.ExecRequest{Cmd: []string{"sleep", "600"}, Background: true})
	if err != nil {
		t.Fatal(err)
	}
	reapFor(t, m, 2500*time.Millisecond, "background process", "dozy")
	if err := m.Signal(ctx, "dozy", bg.PID, "KILL"); err != nil {
		t.Fatal(err)
	}
	reapUntil(t, m, 10*time.Second, "idle pause after the background process ended", isPaused, "dozy")

	// A call wakes it and restarts the clock, at some point during the
	// call: measure from its start.
	woke := time.Now()
	runToExit(t, m, "dozy", "true")
	reapUntil(t, m, 10*time.Second, "idle pause after a call", isPaused, "dozy")
	if d := time.Since(woke); d < time.Second {
		t.Fatalf("paused %s after a call, within its idle pause of 1s", d)
	}
}

// With on_expire pause, an expired sandbox is paused and kept; a call
// wakes it without it expiring again; a new TTL clears the mark.
func TestOnExpirePause(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: "keeper", OnExpire: "pause"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "keeper") })
	if v := m.View(sb); v.OnExpire != "pause" || v.IdlePause != "" {
		t.Fatalf("view: %+v", v)
	}
	expireNow(t, m, sb)
	m.reapOnce(ctx)
	m.reapOnce(ctx)
	sb, err = m.Get(ctx, "keeper")
	if err != nil {
		t.Fatalf("expired sandbox with on_expire pause is gone: %v", err)
	}
	if sb.State != core.StatePaused || !sb.Expired || !strings.Contains(sb.Reason, "TTL ran out") {
		t.Fatalf("expired: state %s, expired %v, reason %q", sb.State, sb.Expired, sb.Reason)
	}
	runToExit(t, m, "keeper", "true")
	m.reapOnce(ctx)
	if sb, _ = m.Get(ctx, "keeper"); sb.State != core.StateRunning || !sb.Expired {
		t.Fatalf("after a call: state %s, expired %v", sb.State, sb.Expired)
	}
	if sb, err = m.SetTTL(ctx, "keeper", "1h"); err != nil || sb.Expired {
		t.Fatalf("new TTL: %+v %v", sb, err)
	}
}
