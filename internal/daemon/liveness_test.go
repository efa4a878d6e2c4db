package daemon

import (
	"context"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/procfs"
)

func recordedInit(t *testing.T, sb *core.Sandbox) (pid int, start uint64) {
	t.Helper()
	var st struct {
		PID       int    `json:"pid"`
		StartTime uint64 `json:"start_time"`
	}
	if err := json.Unmarshal(sb.BackendState, &st); err != nil || st.PID <= 0 {
		t.Fatalf("backend state %q: %v", sb.BackendState, err)
	}
	return st.PID, st.StartTime
}

// With the reaper's fast path, a container whose init was killed is still
// recorded failed on the next tick, and its memory is no longer committed.
func TestReaperNoticesKilledInit(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: "victim", Memory: "256M"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "victim") })
	lv := m.backends[sb.Isolation].(core.Liveness)
	if !lv.Alive(sb) {
		t.Fatal("a running container is not alive")
	}
	m.reapOnce(ctx)
	if cur, _ := m.Get(ctx, "victim"); cur.State != core.StateRunning {
		t.Fatalf("after a reap: %s", cur.State)
	}
	pid, start := recordedInit(t, sb)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); procfs.StartTime(pid) == start; {
		if time.Now().After(deadline) {
			t.Fatal("the killed init still runs after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if lv.Alive(sb) {
		t.Fatal("a killed init is alive")
	}
	m.reapOnce(ctx)
	cur, err := m.Get(ctx, "victim")
	if err != nil || cur.State != core.StateFailed || cur.Reason == "" {
		t.Fatalf("after its init was killed and a reap: %+v %v", cur, err)
	}
	if info := m.Info(ctx); info.CommittedMemoryBytes != 0 {
		t.Fatalf("a failed sandbox commits %d", info.CommittedMemoryBytes)
	}
}

// A rollback replaces a container's init: Alive is false for the record
// that names the old one (the reaper then looks closer, finds it running
// and records the new init), and true for the record the rollback wrote.
// A resume from disk records its new init too.
func TestAliveAfterRollback(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	before, err := m.Create(ctx, api.CreateSandboxRequest{Name: "rolled"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "rolled") })
	lv := m.backends[before.Isolation].(core.Liveness)
	if _, err := m.Snapshot(ctx, "rolled", "s1"); err != nil {
		t.Fatal(err)
	}
	if before, err = m.Get(ctx, "rolled"); err != nil {
		t.Fatal(err)
	}
	after, err := m.Rollback(ctx, "rolled", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if lv.Alive(before) {
		t.Fatal("Alive holds for the init a rollback replaced")
	}
	if !lv.Alive(after) {
		t.Fatal("Alive does not hold for the init the rollback started")
	}
	// A record that missed the new init (as one written by an older nook
	// after a resume from disk): the reaper looks closer and records it.
	stale := *after
	stale.BackendState = before.BackendState
	if err := m.store.UpdateSandbox(ctx, &stale); err != nil {
		t.Fatal(err)
	}
	m.reapOnce(ctx)
	cur, err := m.Get(ctx, "rolled")
	if err != nil || cur.State != core.StateRunning || !lv.Alive(cur) {
		t.Fatalf("after a reap of a stale record: %+v %v (alive %v)", cur, err, err == nil && lv.Alive(cur))
	}
	// Paused (to disk where CRIU is there) and resumed: the record names
	// the init that runs.
	if _, err := m.Pause(ctx, "rolled"); err != nil {
		t.Fatal(err)
	}
	m.reapOnce(ctx)
	if cur, _ := m.Get(ctx, "rolled"); cur.State != core.StatePaused {
		t.Fatalf("paused, after a reap: %s", cur.State)
	}
	if _, err := m.Resume(ctx, "rolled"); err != nil {
		t.Fatal(err)
	}
	if cur, err = m.Get(ctx, "rolled"); err != nil || !lv.Alive(cur) {
		t.Fatalf("resumed (%s): the record does not name the running init: %+v %v", m.pauseMode, cur, err)
	}
}
