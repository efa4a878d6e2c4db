package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// TestSandboxCacheMatchesTable: after every kind of write (and writes
// racing each other), what the store answers from memory is what its
// table holds, read with SQL; a caller changing an answer changes
// nothing the next caller sees.
func TestSandboxCacheMatchesTable(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "nook.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A write before the first read: the load reads it.
	if err := s.InsertSandbox(ctx, sample("id0", "zero")); err != nil {
		t.Fatal(err)
	}
	check := func(step string) {
		t.Helper()
		want, err := s.query(ctx, `ORDER BY created_at, name`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := s.ListSandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(want) == 0 {
			want = nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: the store answers\n%+v\nits table holds\n%+v", step, got, want)
		}
		for _, sb := range want {
			byName, err := s.GetSandbox(ctx, sb.Name)
			if err != nil || !reflect.DeepEqual(byName, sb) {
				t.Fatalf("%s: GetSandbox(%s) = %+v, %v", step, sb.Name, byName, err)
			}
			byID, err := s.GetSandboxByID(ctx, sb.ID)
			if err != nil || !reflect.DeepEqual(byID, sb) {
				t.Fatalf("%s: GetSandboxByID(%s) = %+v, %v", step, sb.ID, byID, err)
			}
		}
		at := time.Now().Add(90 * time.Minute)
		wantExp, err := s.query(ctx, `WHERE expires_at <= ? AND state != ? AND expired = 0 ORDER BY expires_at, id`, at.UnixNano(), string(core.StateDestroying))
		if err != nil {
			t.Fatal(err)
		}
		gotExp, err := s.Expired(ctx, at)
		if err != nil {
			t.Fatal(err)
		}
		if len(wantExp) == 0 {
			wantExp = nil
		}
		if !reflect.DeepEqual(gotExp, wantExp) {
			t.Fatalf("%s: Expired answers %+v, the table %+v", step, gotExp, wantExp)
		}
	}
	check("loaded")

	a := sample("id1", "one")
	a.Labels = map[string]string{"k": "v"}
	a.Volumes = []core.VolumeMount{{Name: "data", Target: "/data"}}
	if err := s.InsertSandbox(ctx, a); err != nil {
		t.Fatal(err)
	}
	check("insert")
	if err := s.InsertSandbox(ctx, sample("id9", "one")); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("a taken name: %v", err)
	}
	check("a refused insert")
	if _, err := s.GetSandboxByID(ctx, "id9"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("the refused sandbox is found: %v", err)
	}

	a.State, a.Reason, a.BackendState = core.StateRunning, "why", []byte(`{"pid":2}`)
	a.ExpiresAt = a.ExpiresAt.Add(time.Hour)
	if err := s.UpdateSandbox(ctx, a); err != nil {
		t.Fatal(err)
	}
	check("update")
	if err := s.UpdateSandbox(ctx, sample("nope", "nope")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("update of no sandbox: %v", err)
	}
	if err := s.SetSandboxRepo(ctx, "id1", core.Repo{URL: "https://example.com/r.git", Path: "/r", Commit: "abc"}); err != nil {
		t.Fatal(err)
	}
	check("repo")

	got, _ := s.GetSandbox(ctx, "one")
	got.Labels["k"], got.Env["A"], got.Volumes[0].Target, got.BackendState[0] = "changed", "changed", "/changed", 'X'
	got.State = core.StateStopped
	check("a caller changed its copy")

	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb := sample(fmt.Sprintf("r%d", i), fmt.Sprintf("race-%d", i))
			if err := s.InsertSandbox(ctx, sb); err != nil {
				t.Error(err)
				return
			}
			sb.State = core.StatePaused
			if err := s.UpdateSandbox(ctx, sb); err != nil {
				t.Error(err)
			}
			if i%2 == 0 {
				if err := s.DeleteSandbox(ctx, sb.ID); err != nil {
					t.Error(err)
				}
			}
			if _, err := s.ListSandboxes(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	check("racing writes")

	if err := s.DeleteSandbox(ctx, "id1"); err != nil {
		t.Fatal(err)
	}
	check("delete")
	if _, err := s.GetSandbox(ctx, "one"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}
