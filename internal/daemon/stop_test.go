package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// A stopped sandbox keeps its files, name and environment; calls on it
// say how to start it; started, it runs again.
func TestStopStart(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "halt", Env: map[string]string{"X": "y"}}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "halt") })
	runToExit(t, m, "halt", "sh", "-c", "echo kept > /root/kept")
	sb, err := m.Stop(ctx, "halt")
	if err != nil || sb.State != core.StateStopped {
		t.Fatalf("stop: %+v %v", sb, err)
	}
	if _, err := m.Stop(ctx, "halt"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("stop of a stopped sandbox: %v", err)
	}
	if _, err := m.Exec(ctx, "halt", api.ExecRequest{Cmd: []string{"true"}}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "nook start halt") {
		t.Fatalf("exec on a stopped sandbox: %v", err)
	}
	// The reaper leaves it stopped.
	m.reapOnce(ctx)
	if sb, _ := m.Get(ctx, "halt"); sb.State != core.StateStopped {
		t.Fatalf("after a reap: %s", sb.State)
	}
	if sb, err = m.Start(ctx, "halt"); err != nil || sb.State != core.StateRunning {
		t.Fatalf("start: %+v %v", sb, err)
	}
	if _, err := m.Start(ctx, "halt"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("start of a running sandbox: %v", err)
	}
	if got := execOutput(t, m, "halt", "sh", "-c", "cat /root/kept; echo $X; hostname"); got != "kept\ny\nhalt\n" {
		t.Fatalf("after start: %q", got)
	}
	// Paused, then stopped.
	if _, err := m.Pause(ctx, "halt"); err != nil {
		t.Fatal(err)
	}
	if sb, err = m.Stop(ctx, "halt"); err != nil || sb.State != core.StateStopped {
		t.Fatalf("stop a paused sandbox: %+v %v", sb, err)
	}
	if _, err := m.Start(ctx, "halt"); err != nil {
		t.Fatal(err)
	}
	if got := execOutput(t, m, "halt", "cat", "/root/kept"); got != "kept\n" {
		t.Fatalf("after pause, stop, start: %q", got)
	}
}

// A stop the record missed (the daemon died between the backend's stop
// and its record) is recorded when the daemon next looks.
func TestStopRecordMissed(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: "halt2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "halt2") })
	m.dropAgent(sb.ID)
	if err := m.backends[sb.Isolation].(core.Stopper).Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	m.reapOnce(ctx)
	if sb, _ := m.Get(ctx, "halt2"); sb.State != core.StateStopped {
		t.Fatalf("a stop the record missed: %s (%s)", sb.State, sb.Reason)
	}
}

// A start a crash cut short (the sandbox runs, its record says stopped):
// the record wins, and the reaper stops it.
func TestStartCutShort(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "halt3"}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "halt3") })
	sb, err := m.Stop(ctx, "halt3")
	if err != nil {
		t.Fatal(err)
	}
	b := m.backends[sb.Isolation]
	if err := b.(core.Stopper).Start(ctx, sb); err != nil {
		t.Fatal(err)
	}
	m.reapOnce(ctx)
	if rs, err := b.Status(ctx, sb); err != nil || rs.State != core.RuntimeStopped {
		t.Fatalf("a sandbox recorded stopped runs on: %+v %v", rs, err)
	}
	if _, err := m.Start(ctx, "halt3"); err != nil {
		t.Fatal(err)
	}
}

// on_expire stop: the TTL stops the sandbox and keeps it.
func TestOnExpireStop(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: "stopper", OnExpire: "stop"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "stopper") })
	expireNow(t, m, sb)
	m.reapOnce(ctx)
	m.reapOnce(ctx)
	sb, err = m.Get(ctx, "stopper")
	if err != nil || sb.State != core.StateStopped || !sb.Expired || !strings.Contains(sb.Reason, "TTL ran out") {
		t.Fatalf("expired with on_expire stop: %+v %v", sb, err)
	}
	if _, err := m.Start(ctx, "stopper"); err != nil {
		t.Fatal(err)
	}
	m.reapOnce(ctx)
	if sb, _ = m.Get(ctx, "stopper"); sb.State != core.StateRunning {
		t.Fatalf("started after it expired: %s", sb.State)
	}
}

// execOutput runs cmd in a sandbox and returns its stdout.
func execOutput(t *testing.T, m *Manager, name string, cmd ...string) string {
	t.Helper()
	p, err := m.Exec(context.Background(), name, api.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var out strings.Builder
	for {
		kind, b, err := p.Next()
		if err != nil {
			t.Fatal(err)
		}
		switch kind {
		case api.FrameStdout:
			out.Write(b)
		case api.FrameExit:
			return out.String()
		}
	}
}

// expireNow makes sb's TTL run out a second ago.
func expireNow(t *testing.T, m *Manager, sb *core.Sandbox) {
	t.Helper()
	sb.ExpiresAt = time.Now().Add(-time.Second)
	if err := m.store.UpdateSandbox(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
}

// After the host restarted, a sandbox that ran is recorded stopped (its
// disk is there), not failed, and starts again; after a plain daemon
// restart, one that died is failed as before.
func TestHostRestartStops(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: "power-cut"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	runToExit(t, m, "power-cut", "sh", "-c", "echo kept > /root/kept && sync")
	// What a host restart leaves: nothing runs, and no stop was recorded.
	m.dropAgent(sb.ID)
	if err := m.backends[sb.Isolation].(core.Stopper).Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(m.cfg.DataDir, "sandboxes", sb.ID, "stopped")); err != nil {
		t.Fatal(err)
	}
	m.Close()
	if err := os.WriteFile(filepath.Join(m.cfg.DataDir, "host-boot-id"), []byte("another-boot\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m2, err := New(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Destroy(ctx, "power-cut"); m2.Close() })
	if sb, err := m2.Get(ctx, "power-cut"); err != nil || sb.State != core.StateStopped || sb.Reason != "the host restarted" {
		t.Fatalf("after a host restart: %+v %v", sb, err)
	}
	if _, err := m2.Start(ctx, "power-cut"); err != nil {
		t.Fatal(err)
	}
	if got := execOutput(t, m2, "power-cut", "cat", "/root/kept"); got != "kept\n" {
		t.Fatalf("after a host restart and a start: %q", got)
	}
	// The boot is recorded: a daemon restart on the same boot finds a
	// sandbox that died failed, not stopped.
	m2.dropAgent(sb.ID)
	if err := m2.backends[sb.Isolation].(core.Stopper).Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(m.cfg.DataDir, "sandboxes", sb.ID, "stopped"))
	m2.Close()
	m3, err := New(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m3.Close()
	if sb, err := m3.Get(ctx, "power-cut"); err != nil || sb.State != core.StateFailed {
		t.Fatalf("a sandbox that died on the same boot: %+v %v", sb, err)
	}
	m3.Destroy(ctx, "power-cut")
}

// The reaper marks a stopped sandbox, and one paused to disk, at rest
// and skips their look on later ticks; any operation on the sandbox (it
// takes the name's lock) makes the next tick look again.
func TestReaperRests(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "rest1"}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "rest1") })
	atRest := func() bool {
		sb, err := m.store.GetSandbox(ctx, "rest1")
		if err != nil {
			t.Fatal(err)
		}
		return m.atRest.is(sb)
	}
	if _, err := m.Stop(ctx, "rest1"); err != nil {
		t.Fatal(err)
	}
	m.reapOnce(ctx)
	if !atRest() {
		t.Fatal("a stopped sandbox is not at rest after a reap")
	}
	if _, err := m.Start(ctx, "rest1"); err != nil {
		t.Fatal(err)
	}
	if atRest() {
		t.Fatal("a started sandbox is still at rest")
	}
	m.reapOnce(ctx)
	if atRest() {
		t.Fatal("a running sandbox is at rest")
	}
	sb, err := m.Pause(ctx, "rest1")
	if err != nil {
		t.Fatal(err)
	}
	m.reapOnce(ctx)
	rs, err := m.backends[sb.Isolation].Status(ctx, sb)
	if err != nil {
		t.Fatal(err)
	}
	if saved := rs.State == core.RuntimeSaved; atRest() != saved {
		t.Fatalf("paused (%s), at rest %v", rs.State, atRest())
	}
	// A record the reaper did not mark (the one after a resume) is looked at.
	if _, err := m.Resume(ctx, "rest1"); err != nil {
		t.Fatal(err)
	}
	if atRest() {
		t.Fatal("a resumed sandbox is at rest")
	}
}
