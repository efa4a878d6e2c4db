package store

import (
	"context"
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
	if got.State != core.StateRunning || !got.ExpiresAt.Equal(sb.ExpiresAt) || got.Env["A"] != "b" || string(got.BackendState) != `{"pid":1}` || got.CPUs != 1.5 {
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
}
