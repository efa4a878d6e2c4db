package daemon

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func newManager(t *testing.T) (*Manager, testutil.HostResources) {
	t.Helper()
	return newManagerWith(t, nil)
}

// newManagerWith is newManager with the config changed by mod first.
func newManagerWith(t *testing.T, mod func(*Config)) (*Manager, testutil.HostResources) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireRunc(t)
	testutil.BaseTemplate(t)
	root := filepath.Join(testutil.TempRoot(t), testutil.RandomName("m"))
	cfg := Config{
		DataDir: filepath.Join(root, "data"), RunDir: filepath.Join(root, "run"), TemplatesDir: testutil.TemplatesDir(),
		AgentBinary: testutil.AgentBinary(t), CgroupParent: testutil.RandomName("nook-mgr-"), Log: slog.New(slog.DiscardHandler),
	}
	testutil.CleanupCgroupParent(t, cfg.CgroupParent)
	if mod != nil {
		mod(&cfg)
	}
	m, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, testutil.HostResources{StateDir: filepath.Join(cfg.DataDir, "sandboxes"), RuncRoot: filepath.Join(cfg.RunDir, "runc"), CgroupParent: cfg.CgroupParent}
}

// The reaper destroys a sandbox whose TTL ran out, and leaves the rest.
func TestReaperDestroysExpired(t *testing.T) {
	m, res := newManager(t)
	ctx := context.Background()
	old, err := m.Create(ctx, api.CreateSandboxRequest{Name: "old"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	young, err := m.Create(ctx, api.CreateSandboxRequest{Name: "young", TTL: "2h"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "young") })
	expireNow(t, m, old)
	m.reapOnce(ctx)
	if _, err := m.Get(ctx, "old"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("expired sandbox still there: %v", err)
	}
	if leaks := res.Leaks(old.ID); len(leaks) > 0 {
		t.Fatalf("reaper left: %v", leaks)
	}
	if sb, err := m.Get(ctx, "young"); err != nil || sb.State != core.StateRunning {
		t.Fatalf("young sandbox: %+v %v", sb, err)
	}
	_ = young
}

// A destroy interrupted by a crash (state destroying) is finished by the next start.
func TestRestartFinishesInterruptedDestroy(t *testing.T) {
	m, res := newManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: "half-gone"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sb.State = core.StateDestroying
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	m.Close()
	m2, err := New(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if _, err := m2.Get(ctx, "half-gone"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("interrupted destroy not finished: %v", err)
	}
	if leaks := res.Leaks(sb.ID); len(leaks) > 0 {
		t.Fatalf("left: %v", leaks)
	}
}

// Lifecycle operations on one name are serialized: concurrent destroys of
// one sandbox succeed once and report not found otherwise.
func TestConcurrentDestroy(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "race"}, nil); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		go func() { errs <- m.Destroy(ctx, "race") }()
	}
	ok := 0
	for i := 0; i < 4; i++ {
		err := <-errs
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, errdefs.ErrNotFound):
			t.Errorf("concurrent destroy: %v", err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d destroys succeeded", ok)
	}
}

// Calls that all find a sandbox paused all wake it: none fails because
// another woke it first.
func TestConcurrentCallsWakePausedSandbox(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "sleepy"}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "sleepy") })
	if _, err := m.Pause(ctx, "sleepy"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Pause(ctx, "sleepy"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("second pause: %v", err)
	}
	errs := make(chan error, 6)
	for i := 0; i < 6; i++ {
		go func() {
			p, err := m.Exec(ctx, "sleepy", api.ExecRequest{Cmd: []string{"true"}})
			if err == nil {
				for {
					kind, _, rerr := p.Next()
					if rerr != nil || kind == api.FrameExit {
						err = rerr
						break
					}
				}
				p.Close()
			}
			errs <- err
		}()
	}
	for i := 0; i < 6; i++ {
		if err := <-errs; err != nil {
			t.Errorf("exec on a paused sandbox: %v", err)
		}
	}
	if sb, _ := m.Get(ctx, "sleepy"); sb.State != core.StateRunning {
		t.Fatalf("state %s after the calls", sb.State)
	}
	if _, err := m.Resume(ctx, "sleepy"); !errors.Is(err, errdefs.ErrFailedPrecondition) || err.Error() != "sandbox sleepy is not paused" {
		t.Fatalf("resume of a running sandbox: %v", err)
	}
}

// A read-only caller reads a running sandbox, but never wakes a paused
// one: that would run the code an admin stopped (and reset its idle clock).
func TestEscapeReadOnlyNoWake(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "napping"}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "napping") })
	look := LookOnly(ctx)
	if _, err := m.StatFile(look, "napping", "/etc/hostname"); err != nil {
		t.Fatalf("read-only stat of a running sandbox: %v", err)
	}
	if _, err := m.Pause(ctx, "napping"); err != nil {
		t.Fatal(err)
	}
	for what, call := range map[string]func() error{
		"stat":      func() error { _, err := m.StatFile(look, "napping", "/etc/hostname"); return err },
		"list":      func() error { _, err := m.ListFiles(look, "napping", "/", false, 10); return err },
		"processes": func() error { _, err := m.Processes(look, "napping"); return err },
	} {
		if err := call(); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "read-only token cannot wake it") {
			t.Errorf("read-only %s of a paused sandbox: %v", what, err)
		}
	}
	if sb, _ := m.Get(ctx, "napping"); sb.State != core.StatePaused {
		t.Fatalf("a read-only call woke the sandbox: %s", sb.State)
	}
	// An admin's call still wakes it.
	if _, err := m.StatFile(ctx, "napping", "/etc/hostname"); err != nil {
		t.Fatalf("admin stat of a paused sandbox: %v", err)
	}
}
