package store

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

func sample(id, name string) *core.Sandbox {
	now := time.Now().Truncate(time.Millisecond)
	return &core.Sandbox{ID: id, Name: name, Template: "base", TemplateID: "base-1", Isolation: "container",
		State: core.StateCreating, CPUs: 1.5, MemoryBytes: 1 << 30, PidsLimit: 100, Env: map[string]string{"A": "b"},
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), BackendState: []byte(`{"pid":1}`)}
}

func TestSandboxesPersistAcrossReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "nook.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	sb := sample("id1", "one")
	sb.Labels = map[string]string{"team": "a", "ünïcode key": "x=y"}
	if err := s.InsertSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSandbox(ctx, sample("id2", "one")); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	sb.State = core.StateRunning
	sb.ExpiresAt = sb.ExpiresAt.Add(time.Hour)
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, _ := s.SchemaVersion(ctx); v != len(migrations) {
		t.Fatalf("schema version %d", v)
	}
	got, err := s.GetSandbox(ctx, "one")
	if err != nil {
		t.Fatal(err)
	}
	if got.State != core.StateRunning || !got.ExpiresAt.Equal(sb.ExpiresAt) || got.Env["A"] != "b" || string(got.BackendState) != `{"pid":1}` || got.CPUs != 1.5 ||
		len(got.Labels) != 2 || got.Labels["ünïcode key"] != "x=y" {
		t.Fatalf("round trip: %+v", got)
	}
	exp, err := s.Expired(ctx, sb.ExpiresAt.Add(time.Second))
	if err != nil || len(exp) != 1 {
		t.Fatalf("expired: %v %v", exp, err)
	}
	if n, _ := s.CountByTemplate(ctx, "base-1"); n != 1 {
		t.Fatalf("count by template: %d", n)
	}
	if err := s.DeleteSandbox(ctx, "id1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSandbox(ctx, "one"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestRefusesNewerSchema(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "nook.db")
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`PRAGMA user_version = 999`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := Open(ctx, path); err == nil {
		t.Fatal("opened a database from a newer nook")
	}
}

func TestTokens(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "nook.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.InsertToken(ctx, Token{ID: "t1", Hash: []byte("h"), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if tk, err := s.TokenByHash(ctx, []byte("h")); err != nil || tk.ID != "t1" {
		t.Fatalf("%v %v", tk, err)
	}
	if _, err := s.TokenByHash(ctx, []byte("x")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatal(err)
	}
	if err := s.DeleteToken(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteToken(ctx, "t1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	if err := s.InsertToken(ctx, Token{ID: "t2", Hash: []byte("h2"), CreatedAt: time.Now(), Scope: "sandbox:box", SandboxID: "sb1", ExpiresAt: exp}); err != nil {
		t.Fatal(err)
	}
	if tk, err := s.TokenByHash(ctx, []byte("h2")); err != nil || tk.Scope != "sandbox:box" || tk.SandboxID != "sb1" || !tk.ExpiresAt.Equal(exp) {
		t.Fatalf("%+v %v", tk, err)
	}
	if ts, err := s.ListTokens(ctx); err != nil || len(ts) != 1 || ts[0].Scope != "sandbox:box" || ts[0].Hash != nil {
		t.Fatalf("%+v %v", ts, err)
	}
}

// Tokens made before scopes and expiry keep working as they did: admin,
// never expiring.
func TestMigrateTokenScope(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "nook.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(migrations[0] + `; PRAGMA user_version = 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO tokens (id, name, hash, created_at) VALUES ('old', 'ci', x'01', 1)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tk, err := s.TokenByHash(ctx, []byte{1})
	if err != nil || tk.ID != "old" || tk.Scope != "admin" || !tk.ExpiresAt.IsZero() {
		t.Fatalf("%+v %v", tk, err)
	}
}

// A database of schema 1 (before idle pause) is migrated in place: its
// sandboxes keep everything and get the defaults (never idle-pause, destroy on expiry).
func TestMigrateIdlePause(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "nook.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(migrations[0] + `; PRAGMA user_version = 1`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO sandboxes (id, name, template, template_id, isolation, state, cpus, memory_bytes, disk_bytes, pids_limit, created_at, expires_at)
		VALUES ('id1', 'old', 'base', 'base-1', 'container', 'running', 1, 1024, 0, 10, 1, 2)`); err != nil {
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
	if sb.IdlePause != 0 || sb.OnExpire != core.OnExpireDestroy || sb.Expired || sb.ExpiresAt.UnixNano() != 2 {
		t.Fatalf("migrated sandbox: %+v", sb)
	}
}

// Idle pause and on-expire round-trip; a sandbox paused at expiry is no
// longer listed as expired, until a new TTL clears the mark.
func TestIdlePauseAndExpiry(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "nook.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sb := sample("id1", "keeper")
	sb.IdlePause, sb.OnExpire = 10*time.Minute, core.OnExpirePause
	if err := s.InsertSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "keeper")
	if err != nil || got.IdlePause != 10*time.Minute || got.OnExpire != core.OnExpirePause || got.Expired {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	later := sb.ExpiresAt.Add(time.Second)
	if exp, err := s.Expired(ctx, later); err != nil || len(exp) != 1 {
		t.Fatalf("expired: %v %v", exp, err)
	}
	got.Expired, got.State = true, core.StatePaused
	if err := s.UpdateSandbox(ctx, got); err != nil {
		t.Fatal(err)
	}
	if exp, err := s.Expired(ctx, later); err != nil || len(exp) != 0 {
		t.Fatalf("a sandbox paused at expiry is listed as expired again: %v %v", exp, err)
	}
	if got, _ = s.GetSandbox(ctx, "keeper"); !got.Expired {
		t.Fatalf("expired mark lost: %+v", got)
	}
}
