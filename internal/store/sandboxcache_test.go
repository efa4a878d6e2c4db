package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/poll"
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

// Writes that queue while one commits are committed as one group: each
// of them succeeds or fails alone (a name taken fails its own insert
// only), the rows and the cache hold exactly the ones that succeeded,
// and the group survives a reopen (it was committed, not just cached).
func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "nook.db")
	s := openLoaded(t, path)
	for _, id := range []string{"taken", "kept"} {
		if err := s.InsertSandbox(ctx, sample("id-"+id, id)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.ListSandboxes(ctx); err != nil { // the cache, loaded
		t.Fatal(err)
	}
	const n = 12
	errs := make([]error, n)
	queued(t, s, n, func(i int) {
		switch {
		case i == 5: // a name in use: fails alone
			errs[i] = s.InsertSandbox(ctx, sample("id-dup", "kept"))
		case i == 7: // an update of a sandbox that does not exist
			errs[i] = s.UpdateSandbox(ctx, sample("id-missing", "missing"))
		case i == 9:
			errs[i] = s.DeleteSandbox(ctx, "id-taken")
		default:
			errs[i] = s.InsertSandbox(ctx, sample(fmt.Sprintf("id%d", i), fmt.Sprintf("n%d", i)))
		}
	})
	if s.sbs.groups != 1 {
		t.Errorf("%d transactions of a group committed, want the 12 writes in 1", s.sbs.groups)
	}
	for i, err := range errs {
		switch i {
		case 5:
			if !errors.Is(err, errdefs.ErrAlreadyExists) {
				t.Errorf("insert of a taken name: %v, want already exists", err)
			}
		case 7:
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("update of a missing sandbox: %v, want not found", err)
			}
		default:
			if err != nil {
				t.Errorf("write %d: %v", i, err)
			}
		}
	}
	want := map[string]bool{"id-kept": true}
	for i := range n {
		if i != 5 && i != 7 && i != 9 {
			want[fmt.Sprintf("id%d", i)] = true
		}
	}
	names := func(s *Store) map[string]bool {
		t.Helper()
		sbs, err := s.ListSandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, sb := range sbs {
			got[sb.ID] = true
		}
		return got
	}
	rows, err := s.query(ctx, ``)
	if err != nil {
		t.Fatal(err)
	}
	inTable := map[string]bool{}
	for _, sb := range rows {
		inTable[sb.ID] = true
	}
	if got := names(s); !reflect.DeepEqual(got, want) || !reflect.DeepEqual(inTable, want) {
		t.Fatalf("cache %v, table %v; want %v", got, inTable, want)
	}
	s.Close()
	s2, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got := names(s2); !reflect.DeepEqual(got, want) {
		t.Fatalf("after a reopen: %v; want %v", got, want)
	}
}

// queued runs write(0..n-1) on goroutines while it holds the store's
// write lock, as a commit under way would, and lets go once all n are
// queued behind it; it returns when all have returned.
func queued(t *testing.T, s *Store, n int, write func(i int)) {
	t.Helper()
	s.sbs.write.Lock()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			write(i)
		}()
	}
	k := 0
	err := poll.Until(context.Background(), poll.Options{Timeout: 10 * time.Second}, func() (bool, error) {
		s.sbs.qmu.Lock()
		k = len(s.sbs.queue)
		s.sbs.qmu.Unlock()
		return k == n, nil
	})
	s.sbs.write.Unlock()
	if err != nil {
		t.Fatalf("%d of %d writes queued: %v", k, n, err)
	}
	wg.Wait()
}

// A write whose failure takes the group's transaction with it (SQLite
// rolls all of it back on an I/O error or an interrupt; here the write
// does it itself) fails alone: the group's other writes are committed
// one by one, and the table and the cache hold them.
func TestGroupCommitRolledBack(t *testing.T) {
	ctx := context.Background()
	s := openLoaded(t, filepath.Join(t.TempDir(), "nook.db"))
	defer s.Close()
	if _, err := s.ListSandboxes(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 6
	errs := make([]error, n)
	broken := errors.New("the disk went away")
	queued(t, s, n, func(i int) {
		if i == 2 {
			errs[i] = s.written(ctx, "x", func(ctx context.Context, ex execer) error {
				if _, err := ex.ExecContext(ctx, `ROLLBACK`); err != nil {
					return err
				}
				return broken
			})
			return
		}
		errs[i] = s.InsertSandbox(ctx, sample(fmt.Sprintf("id%d", i), fmt.Sprintf("n%d", i)))
	})
	for i, err := range errs {
		if i == 2 && !errors.Is(err, broken) || i != 2 && err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
	rows, err := s.query(ctx, ``)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.ListSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != n-1 || len(got) != n-1 {
		t.Fatalf("%d rows, %d cached; want %d", len(rows), len(got), n-1)
	}
	if s.sbs.groups != 0 {
		t.Errorf("%d group transactions committed, want none", s.sbs.groups)
	}
	// The connection is usable: the next write commits.
	if err := s.InsertSandbox(ctx, sample("after", "after")); err != nil {
		t.Fatal(err)
	}
}

// openLoaded opens the store at path with its sandbox cache loaded.
func openLoaded(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.ListSandboxes(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// A write's then runs once it is committed and never for a write that
// failed, in a group or alone: a then that ran for a failed removal
// would forget a subnet still recorded as in use.
func TestThenOnlyAfterCommit(t *testing.T) {
	ctx := context.Background()
	s := openLoaded(t, filepath.Join(t.TempDir(), "nook.db"))
	defer s.Close()
	failed := errors.New("refused")
	write := func(fail bool, ran *atomic.Int32) *pendingWrite {
		return &pendingWrite{
			write: func(ctx context.Context, ex execer) error {
				if _, err := ex.ExecContext(ctx, `SELECT 1`); err != nil {
					return err
				}
				if fail {
					return failed
				}
				return nil
			},
			then: func() { ran.Add(1) },
		}
	}
	const n = 6
	ran := make([]atomic.Int32, n)
	errs := make([]error, n)
	queued(t, s, n, func(i int) { errs[i] = s.commit(ctx, write(i%2 == 1, &ran[i])) })
	var alone atomic.Int32
	aloneErr := s.commit(ctx, write(true, &alone))
	for i := range n {
		fail := i%2 == 1
		if fail != errors.Is(errs[i], failed) || !fail && errs[i] != nil {
			t.Errorf("write %d: %v", i, errs[i])
		}
		if want := int32(1); fail {
			if ran[i].Load() != 0 {
				t.Errorf("write %d failed, and its then ran", i)
			}
		} else if ran[i].Load() != want {
			t.Errorf("write %d was committed, and its then ran %d times", i, ran[i].Load())
		}
	}
	if s.sbs.groups != 1 {
		t.Errorf("%d group transactions, want 1", s.sbs.groups)
	}
	if !errors.Is(aloneErr, failed) || alone.Load() != 0 {
		t.Errorf("a failed write alone: %v, its then ran %d times", aloneErr, alone.Load())
	}
}
