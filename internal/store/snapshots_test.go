package store

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

func openTemp(t *testing.T) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nook.db")
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func snap(id, sandboxID, name, parent string, at int) *core.Snapshot {
	return &core.Snapshot{ID: id, SandboxID: sandboxID, Name: name, Parent: parent,
		CreatedAt: time.Unix(1_700_000_000+int64(at), 123), SizeBytes: int64(at) << 20, Memory: at%2 == 0}
}

func head(t *testing.T, s *Store, sandboxID string) string {
	t.Helper()
	h, err := s.SnapshotHead(context.Background(), sandboxID)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func names(sns []*core.Snapshot) string {
	var out []string
	for _, sn := range sns {
		out = append(out, sn.Name)
	}
	return strings.Join(out, ",")
}

// Snapshots round-trip and persist, each becomes its sandbox's head, a
// name is unique within a sandbox (not across sandboxes), and a failed
// insert changes nothing.
func TestSnapshotsInsertAndHead(t *testing.T) {
	ctx := context.Background()
	s, path := openTemp(t)
	for _, sb := range []*core.Sandbox{sample("sb1", "one"), sample("sb2", "two")} {
		if err := s.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	if h := head(t, s, "sb1"); h != "" {
		t.Fatalf("head before any snapshot: %q", h)
	}
	a := snap("snap-a", "sb1", "a", "", 1)
	if err := s.InsertSnapshot(ctx, a); err != nil {
		t.Fatal(err)
	}
	if h := head(t, s, "sb1"); h != "snap-a" {
		t.Fatalf("head after the first snapshot: %q", h)
	}
	if err := s.InsertSnapshot(ctx, snap("snap-b", "sb1", "b", "snap-a", 2)); err != nil {
		t.Fatal(err)
	}
	if h := head(t, s, "sb1"); h != "snap-b" {
		t.Fatalf("head after the second snapshot: %q", h)
	}

	// The same name in the same sandbox: already exists, and neither the
	// record nor the head changes.
	err := s.InsertSnapshot(ctx, snap("snap-c", "sb1", "a", "snap-b", 3))
	if !errors.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), "--name") {
		t.Fatalf("duplicate snapshot name: %v", err)
	}
	if h := head(t, s, "sb1"); h != "snap-b" {
		t.Fatalf("a refused snapshot moved the head to %q", h)
	}
	if _, err := s.GetSnapshot(ctx, "sb1", "snap-c"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("a refused snapshot was recorded: %v", err)
	}
	// The same name in another sandbox is fine.
	if err := s.InsertSnapshot(ctx, snap("snap-x", "sb2", "a", "", 4)); err != nil {
		t.Fatal(err)
	}
	if h := head(t, s, "sb2"); h != "snap-x" {
		t.Fatalf("other sandbox's head: %q", h)
	}
	if h := head(t, s, "sb1"); h != "snap-b" {
		t.Fatalf("another sandbox's snapshot moved this head to %q", h)
	}

	// A rollback or fork sets the head explicitly.
	if err := s.SetSnapshotHead(ctx, "sb1", "snap-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSnapshotHead(ctx, "sb3", "snap-b"); err != nil { // a fork, before any snapshot of its own
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if h := head(t, s, "sb1"); h != "snap-a" {
		t.Fatalf("head after reopen: %q", h)
	}
	if h := head(t, s, "sb3"); h != "snap-b" {
		t.Fatalf("fork's head after reopen: %q", h)
	}
	got, err := s.GetSnapshot(ctx, "sb1", "a")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != a.ID || got.SandboxID != a.SandboxID || got.Name != a.Name || got.Parent != a.Parent ||
		!got.CreatedAt.Equal(a.CreatedAt) || got.SizeBytes != a.SizeBytes || got.Memory != a.Memory {
		t.Fatalf("round trip: %+v, want %+v", got, a)
	}
	if l, err := s.ListSnapshots(ctx, "sb1"); err != nil || names(l) != "a,b" {
		t.Fatalf("list sb1: %s %v", names(l), err)
	}
	if l, err := s.ListSnapshots(ctx, "sb2"); err != nil || names(l) != "a" || l[0].ID != "snap-x" {
		t.Fatalf("list sb2: %s %v", names(l), err)
	}
	if l, err := s.ListSnapshots(ctx, ""); err != nil || len(l) != 3 {
		t.Fatalf("list all: %s %v", names(l), err)
	}
	if l, err := s.ListSnapshots(ctx, "nobody"); err != nil || len(l) != 0 {
		t.Fatalf("list of a sandbox without snapshots: %s %v", names(l), err)
	}
}

// GetSnapshot takes an ID (of any sandbox's snapshot: the manager refuses
// another sandbox's) or a name within the given sandbox; an ID wins over
// a name that happens to equal it.
func TestGetSnapshotByNameOrID(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	for _, sn := range []*core.Snapshot{
		snap("id-1", "sb1", "first", "", 1),
		snap("id-2", "sb2", "first", "", 2),
		snap("id-3", "sb2", "id-1", "id-2", 3), // a name that is another snapshot's ID
	} {
		if err := s.InsertSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ sandbox, ref, want string }{
		{"sb1", "first", "id-1"},
		{"sb2", "first", "id-2"},
		{"sb1", "id-2", "id-2"}, // by ID, even from another sandbox
		{"", "id-1", "id-1"},
		{"sb2", "id-1", "id-1"}, // the ID, not sb2's snapshot named "id-1"
	} {
		got, err := s.GetSnapshot(ctx, c.sandbox, c.ref)
		if err != nil || got.ID != c.want {
			t.Errorf("GetSnapshot(%q, %q) = %+v, %v; want %s", c.sandbox, c.ref, got, err, c.want)
		}
	}
	for _, c := range []struct{ sandbox, ref string }{
		{"sb3", "first"}, // a name only counts within its sandbox
		{"sb1", "nope"},
		{"", "first"},
		{"sb1", ""},
	} {
		_, err := s.GetSnapshot(ctx, c.sandbox, c.ref)
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "nook snapshots") {
			t.Errorf("GetSnapshot(%q, %q): %v, want a not-found that says how to list them", c.sandbox, c.ref, err)
		}
	}
}

// Deleting a snapshot moves every head that pointed at it to its parent
// (possibly none), and leaves other heads alone.
func TestDeleteSnapshotMovesHeads(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	a, b := snap("a", "sb1", "a", "", 1), snap("b", "sb1", "b", "a", 2)
	for _, sn := range []*core.Snapshot{a, b} {
		if err := s.InsertSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	// Two forks of b, and one of a.
	for sb, h := range map[string]string{"fork1": "b", "fork2": "b", "fork3": "a"} {
		if err := s.SetSnapshotHead(ctx, sb, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteSnapshot(ctx, b); err != nil {
		t.Fatal(err)
	}
	for sb, want := range map[string]string{"sb1": "a", "fork1": "a", "fork2": "a", "fork3": "a"} {
		if h := head(t, s, sb); h != want {
			t.Errorf("head of %s after deleting b: %q, want %q", sb, h, want)
		}
	}
	if _, err := s.GetSnapshot(ctx, "sb1", "b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted snapshot found: %v", err)
	}
	// The name is free again.
	if err := s.InsertSnapshot(ctx, snap("b2", "sb1", "b", "a", 3)); err != nil {
		t.Fatalf("reuse of a deleted snapshot's name: %v", err)
	}
	if err := s.SetSnapshotHead(ctx, "sb1", "a"); err != nil {
		t.Fatal(err)
	}
	// Deleting the root leaves its dependants with no head ("").
	if err := s.DeleteSnapshot(ctx, a); err != nil {
		t.Fatal(err)
	}
	for _, sb := range []string{"sb1", "fork1", "fork3"} {
		if h := head(t, s, sb); h != "" {
			t.Errorf("head of %s after deleting the root: %q", sb, h)
		}
	}
	if l, _ := s.ListSnapshots(ctx, "sb1"); names(l) != "b" {
		t.Fatalf("left: %s", names(l))
	}
	// Deleting what is already gone is not an error.
	if err := s.DeleteSnapshot(ctx, a); err != nil {
		t.Fatalf("second delete: %v", err)
	}
}

// A sandbox's snapshots and head go with its record, and only its.
func TestSnapshotsGoWithTheSandbox(t *testing.T) {
	ctx := context.Background()
	s, _ := openTemp(t)
	for _, sb := range []*core.Sandbox{sample("sb1", "one"), sample("sb2", "two")} {
		if err := s.InsertSandbox(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	for _, sn := range []*core.Snapshot{snap("a", "sb1", "a", "", 1), snap("b", "sb1", "b", "a", 2), snap("c", "sb2", "c", "", 3)} {
		if err := s.InsertSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.SetSnapshotHead(ctx, "sb2", "b"); err != nil { // sb2 rolled back onto sb1's b (as a fork would be)
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	if l, err := s.ListSnapshots(ctx, "sb1"); err != nil || len(l) != 0 {
		t.Fatalf("snapshots outlived their sandbox: %s %v", names(l), err)
	}
	if h := head(t, s, "sb1"); h != "" {
		t.Fatalf("head outlived its sandbox: %q", h)
	}
	if l, err := s.ListSnapshots(ctx, ""); err != nil || names(l) != "c" {
		t.Fatalf("other sandbox's snapshots: %s %v", names(l), err)
	}
	// The trigger removes the sandbox's own head only.
	if h := head(t, s, "sb2"); h != "b" {
		t.Fatalf("other sandbox's head: %q", h)
	}
	// Its names are free for a new sandbox with the same ID.
	if err := s.InsertSnapshot(ctx, snap("a2", "sb1", "a", "", 4)); err != nil {
		t.Fatal(err)
	}
}

// A database from before snapshots (schema 3, with a sandbox and its
// network record) is migrated in place: the sandbox keeps everything, it
// has no snapshots, and the new tables and trigger work.
func TestMigrateSnapshots(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "nook.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range migrations[:3] {
		if _, err := db.Exec(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(`PRAGMA user_version = 3`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO sandboxes (id, name, template, template_id, isolation, state, cpus, memory_bytes, disk_bytes, pids_limit, created_at, expires_at, idle_pause, on_expire)
		VALUES ('id1', 'old', 'base', 'base-1', 'vm', 'paused', 1, 1024, 0, 10, 1, 2, 600000000000, 'pause')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO sandbox_net (id, subnet, policy) VALUES ('id1', '10.89.0.0/30', '{}')`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, _ := s.SchemaVersion(ctx); v != len(migrations) {
		t.Fatalf("schema version %d", v)
	}
	sb, err := s.GetSandbox(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != core.StatePaused || sb.IdlePause != 10*time.Minute || sb.OnExpire != core.OnExpirePause || sb.Isolation != "vm" {
		t.Fatalf("migrated sandbox: %+v", sb)
	}
	if l, err := s.ListSnapshots(ctx, "id1"); err != nil || len(l) != 0 {
		t.Fatalf("snapshots of a migrated sandbox: %s %v", names(l), err)
	}
	if h := head(t, s, "id1"); h != "" {
		t.Fatalf("head of a migrated sandbox: %q", h)
	}
	if err := s.InsertSnapshot(ctx, snap("s1", "id1", "first", "", 1)); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSnapshot(ctx, snap("s2", "id1", "first", "s1", 2)); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("unique name after migration: %v", err)
	}
	if h := head(t, s, "id1"); h != "s1" {
		t.Fatalf("head after migration: %q", h)
	}
	// Both triggers (schema 3's and 4's) fire.
	if err := s.DeleteSandbox(ctx, "id1"); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.ListSnapshots(ctx, ""); len(l) != 0 {
		t.Fatalf("snapshots outlived a migrated sandbox: %s", names(l))
	}
	if h := head(t, s, "id1"); h != "" {
		t.Fatalf("head outlived a migrated sandbox: %q", h)
	}
	if _, ok, err := s.GetNet(ctx, "id1"); err != nil || ok {
		t.Fatalf("network record outlived a migrated sandbox: %v %v", ok, err)
	}
}
