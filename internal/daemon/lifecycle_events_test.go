package daemon

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/events"
	"github.com/nookhq/nook/internal/poll"
	"github.com/nookhq/nook/internal/procfs"
)

// eventsSince is what the Manager's bus published about sandbox name
// at or after since, as "type reason (actor)" lines.
func eventsSince(m *Manager, since time.Time, name string) []string {
	replay, sub := m.SubscribeEvents(since, events.Filter{Sandbox: name})
	sub.Close()
	var out []string
	for _, e := range replay {
		out = append(out, fmt.Sprintf("%s %s (%s)", e.Type, e.Reason, e.Actor))
	}
	return out
}

func wantEvents(t *testing.T, m *Manager, since time.Time, name string, want ...string) {
	t.Helper()
	if got := eventsSince(m, since, name); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events of %s:\n%s\nwant:\n%s", name, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// refuseState makes the database refuse to record any sandbox in state
// (a trigger, as a full disk or I/O error would) until the returned
// func is called.
func refuseState(t *testing.T, m *Manager, state core.State) func() {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+filepath.Join(m.cfg.DataDir, "nook.db")+"?_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec(`CREATE TRIGGER test_refuse BEFORE UPDATE ON sandboxes WHEN NEW.state = '` + string(state) + `'
		BEGIN SELECT RAISE(ABORT, 'test: write refused'); END`); err != nil {
		t.Fatal(err)
	}
	undo := func() {
		if _, err := db.Exec(`DROP TRIGGER IF EXISTS test_refuse`); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(undo)
	return undo
}

// killInit kills sb's container init from outside nook and waits until
// it is gone.
func killInit(t *testing.T, sb *core.Sandbox) {
	t.Helper()
	pid, start := recordedInit(t, sb)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := poll.Until(context.Background(), poll.Options{Timeout: 10 * time.Second}, func() (bool, error) {
		return procfs.StartTime(pid) != start, nil
	}); err != nil {
		t.Fatalf("the killed init still runs: %v", err)
	}
}

// An expired sandbox's event comes once its destroy is recorded: not
// on each reap while the database refuses it, and not before.
func TestExpiredEventOnceDestroyRecorded(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: "short"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "short") })
	t0 := time.Now()
	expireNow(t, m, sb)
	allow := refuseState(t, m, core.StateDestroying)
	m.reapOnce(ctx)
	m.reapOnce(ctx)
	if cur, err := m.Get(ctx, "short"); err != nil || cur.State != core.StateRunning {
		t.Fatalf("with the destroy refused: %+v %v", cur, err)
	}
	wantEvents(t, m, t0, "short")
	allow()
	m.reapOnce(ctx)
	wantEvents(t, m, t0, "short", "expired destroyed (nook)", "destroyed  (nook)")
}

// A sandbox found dead is published failed once, when that is recorded:
// not on each health check while the database refuses it.
func TestFailedEventOnceRecorded(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: "dies"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "dies") })
	t0 := time.Now()
	killInit(t, sb)
	allow := refuseState(t, m, core.StateFailed)
	m.reapOnce(ctx)
	m.reapOnce(ctx)
	wantEvents(t, m, t0, "dies")
	allow()
	m.reapOnce(ctx)
	got := eventsSince(m, t0, "dies")
	if len(got) != 1 || !strings.HasPrefix(got[0], "failed ") || !strings.HasSuffix(got[0], "(nook)") {
		t.Fatalf("events: %q", got)
	}
	m.reapOnce(ctx)
	if got := eventsSince(m, t0, "dies"); len(got) != 1 {
		t.Fatalf("events after another reap: %q", got)
	}
}

// A TTL's stop or pause is published by the stop or pause itself: a new
// TTL set between it and the expired mark does not swallow it, and a
// plain expiry publishes one event.
func TestTTLStopAndPausePublished(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	for _, c := range []struct{ onExpire, state string }{{"stop", "stopped"}, {"pause", "paused"}} {
		name := "ttl-" + c.onExpire
		sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: name, TTL: "1h", OnExpire: c.onExpire}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Destroy(ctx, name) })
		// The reaper read the record as expired; `nook ttl` has set a new
		// TTL since (the stored record's hour).
		t0 := time.Now()
		stale := *sb
		stale.ExpiresAt = time.Now().Add(-time.Second)
		if c.onExpire == "stop" {
			m.expireStop(byNook(ctx), &stale)
		} else {
			m.expirePause(byNook(ctx), &stale)
		}
		cur, err := m.Get(ctx, name)
		if err != nil || string(cur.State) != c.state || cur.Expired {
			t.Fatalf("%s: %+v %v", name, cur, err)
		}
		wantEvents(t, m, t0, name, "expired "+c.state+" (nook)")
	}
	// A plain expiry: one event, the stop's.
	sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: "ttl-plain", OnExpire: "stop"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "ttl-plain") })
	t0 := time.Now()
	expireNow(t, m, sb)
	m.reapOnce(ctx)
	if cur, err := m.Get(ctx, "ttl-plain"); err != nil || cur.State != core.StateStopped || !cur.Expired {
		t.Fatalf("after its TTL: %+v %v", cur, err)
	}
	wantEvents(t, m, t0, "ttl-plain", "expired stopped (nook)")
}

// nook's own pause publishes its event within the pause (under the
// sandbox's lock), so no resume waiting for that lock can publish first.
func TestIdlePauseEventWithinPause(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "dozy"}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "dozy") })
	t0 := time.Now()
	if _, err := m.pauseFor(byNook(ctx), "dozy", "idle for 1m", api.EventPausedByIdle); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, m, t0, "dozy", "paused-by-idle idle for 1m (nook)")
	if _, err := m.Resume(WithCreator(ctx, "alice"), "dozy"); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, m, t0, "dozy", "paused-by-idle idle for 1m (nook)", "resumed  (alice)")
}

// A sandbox found dead by a caller's request is failed by nook, not by
// the caller; and one found dead at start is published too (replayed by
// since).
func TestFailedEventActorNook(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	alice := WithCreator(ctx, "alice")
	replaced := false // m2's cleanup removes them once it replaced m
	for _, name := range []string{"dead-call", "dead-start"} {
		sb, err := m.Create(alice, api.CreateSandboxRequest{Name: name}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if !replaced {
				m.Destroy(ctx, name)
			}
		})
		killInit(t, sb)
	}
	t0 := time.Now()
	sb, err := m.Get(ctx, "dead-call")
	if err != nil {
		t.Fatal(err)
	}
	m.dropAgent(sb.ID)
	if err := m.agentError(alice, sb, io.EOF); err == nil || sb.State != core.StateFailed {
		t.Fatalf("agent error of a dead sandbox: %v (%s)", err, sb.State)
	}
	got := eventsSince(m, t0, "dead-call")
	if len(got) != 1 || !strings.HasPrefix(got[0], "failed ") || !strings.HasSuffix(got[0], "(nook)") {
		t.Fatalf("events: %q", got)
	}
	m.Close()
	m2, err := New(ctx, m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	replaced = true
	t.Cleanup(func() { m2.Destroy(ctx, "dead-call"); m2.Destroy(ctx, "dead-start"); m2.Close() })
	got = eventsSince(m2, t0, "dead-start")
	if len(got) != 1 || !strings.HasPrefix(got[0], "failed ") || !strings.HasSuffix(got[0], "(nook)") {
		t.Fatalf("events of reconcile: %q", got)
	}
}
