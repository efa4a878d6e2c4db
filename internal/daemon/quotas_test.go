package daemon

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/backend/vm"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/store"
	"github.com/nookhq/nook/internal/testutil"
)

// storeManager is a Manager with only a store: enough for quotas and
// idempotency keys, without root.
func storeManager(t *testing.T) *Manager {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "nook.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return &Manager{store: st, log: slog.New(slog.DiscardHandler), limits: newLedger(0, 0), quotas: newQuotaLedger(), idem: newIdempotency()}
}

func insertBox(t *testing.T, m *Manager, id string, cpus float64, mem int64) {
	t.Helper()
	now := time.Now()
	sb := &core.Sandbox{ID: id, Name: "box-" + id, Template: "base", TemplateID: "t", Isolation: api.IsolationContainer, State: core.StateRunning,
		CPUs: cpus, MemoryBytes: mem, DiskBytes: 1 << 30, PidsLimit: 10, Env: map[string]string{}, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := m.store.InsertSandbox(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
}

// Parallel reservations of one token at its limit: exactly the allowed
// number pass; recorded sandboxes count once; a removal frees room; other
// tokens and the host are not limited by it.
func TestQuotaReserve(t *testing.T) {
	m := storeManager(t)
	ctx := context.Background()
	tok, err := m.CreateToken(ctx, api.CreateTokenRequest{Name: "ci", Quotas: &api.TokenQuotas{MaxSandboxes: 3, MaxMemory: "3G", MaxSnapshots: 1, MaxTTL: "1h"}})
	if err != nil {
		t.Fatal(err)
	}
	if tok.Quotas == nil || tok.Quotas.MaxMemory != "3G" || tok.Quotas.MaxTTL != "1h" {
		t.Fatalf("created token's quotas: %+v", tok.Quotas)
	}
	tctx := WithTokenID(WithCreator(ctx, "ci"), tok.ID)
	one := store.Usage{Sandboxes: 1, CPUs: 1, MemoryBytes: 512 << 20}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var won []*quotaReservation
	refused := 0
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := m.reserveQuota(tctx, tok.ID, one, "creating this sandbox")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won = append(won, r)
			case errors.Is(err, errdefs.ErrLimit):
				refused++
			default:
				t.Errorf("reserve: %v", err)
			}
		}()
	}
	wg.Wait()
	if len(won) != 3 || refused != 17 {
		t.Fatalf("%d reserved, %d refused; want 3 and 17", len(won), refused)
	}
	// Recorded: counted once (store), not again as pending.
	for i, r := range won {
		id := fmt.Sprint("s", i)
		insertBox(t, m, id, 1, 512<<20)
		if err := m.recordOwner(ctx, r, id); err != nil {
			t.Fatal(err)
		}
		r.release() // after the commit: nothing
	}
	if len(m.quotas.pending) != 0 {
		t.Fatalf("pending left: %+v", m.quotas.pending)
	}
	_, err = m.reserveQuota(tctx, tok.ID, one, "creating this sandbox")
	if want := "token ci: 3 of 3 sandboxes in use (--max-sandboxes 3)"; err == nil || err.Error() != want {
		t.Fatalf("4th: %v, want %q", err, want)
	}
	if err := m.store.DeleteSandbox(ctx, "s0"); err != nil {
		t.Fatal(err)
	}
	// Room for one sandbox, not two (a fork of two checks both first).
	_, err = m.reserveQuota(tctx, tok.ID, store.Usage{Sandboxes: 2}, "forking 2 sandboxes")
	if want := "token ci: 2 of 3 sandboxes in use; forking 2 sandboxes needs 2 (--max-sandboxes 3)"; err == nil || err.Error() != want {
		t.Fatalf("two: %v, want %q", err, want)
	}
	// Room for a sandbox, but not for 2G of memory (1G in use of 3G).
	_, err = m.reserveQuota(tctx, tok.ID, store.Usage{Sandboxes: 1, MemoryBytes: 2560 << 20}, "creating this sandbox")
	if want := "token ci: 1G of 3G memory in use; creating this sandbox needs 2.5G more (--max-memory 3G)"; err == nil || err.Error() != want {
		t.Fatalf("memory: %v, want %q", err, want)
	}
	r, err := m.reserveQuota(tctx, tok.ID, one, "creating this sandbox")
	if err != nil {
		t.Fatalf("after a removal: %v", err)
	}
	r.release()
	// Snapshots of its sandboxes count against it.
	sr, err := m.reserveQuota(tctx, tok.ID, store.Usage{Snapshots: 1}, "this snapshot")
	if err != nil {
		t.Fatal(err)
	}
	if err := sr.commit(func() error {
		return m.store.InsertSnapshot(ctx, &core.Snapshot{ID: "snap-1", SandboxID: "s1", Name: "one", CreatedAt: time.Now()})
	}); err != nil {
		t.Fatal(err)
	}
	_, err = m.reserveQuota(tctx, tok.ID, store.Usage{Snapshots: 1}, "this snapshot")
	if want := "token ci: 1 of 1 snapshots in use (--max-snapshots 1)"; err == nil || err.Error() != want {
		t.Fatalf("snapshots: %v, want %q", err, want)
	}
	// The listing shows quotas and use.
	ts, err := m.Tokens(ctx)
	if err != nil || len(ts) != 1 {
		t.Fatal(ts, err)
	}
	if u := ts[0].Usage; u == nil || u.Sandboxes != 2 || u.MemoryBytes != 1<<30 || u.Snapshots != 1 || ts[0].Quotas.MaxSandboxes != 3 {
		t.Fatalf("token ls: %+v %+v", ts[0].Quotas, ts[0].Usage)
	}
	// Another token, and the host, are not held by ci's quotas.
	other, err := m.CreateToken(ctx, api.CreateTokenRequest{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		r, err := m.reserveQuota(ctx, other.ID, one, "creating this sandbox")
		if err != nil {
			t.Fatal(err)
		}
		defer r.release()
	}
	if r, err := m.reserveQuota(ctx, "", one, "x"); err != nil || r != nil {
		t.Fatalf("host: %v %v", r, err)
	}
	// A token made again under the same name starts from nothing.
	if err := m.RevokeToken(ctx, tok.ID); err != nil {
		t.Fatal(err)
	}
	again, err := m.CreateToken(ctx, api.CreateTokenRequest{Name: "ci", Quotas: &api.TokenQuotas{MaxSandboxes: 1}})
	if err != nil {
		t.Fatal(err)
	}
	r, err = m.reserveQuota(WithTokenID(WithCreator(ctx, "ci"), again.ID), again.ID, one, "creating this sandbox")
	if err != nil {
		t.Fatalf("a new token named ci is held by the old one's sandboxes: %v", err)
	}
	r.release()
}

// --max-ttl: a longer TTL asked for is refused, a default one lowered.
func TestQuotaTTL(t *testing.T) {
	m := storeManager(t)
	ctx := context.Background()
	tok, err := m.CreateToken(ctx, api.CreateTokenRequest{Name: "short", Quotas: &api.TokenQuotas{MaxTTL: "30m"}})
	if err != nil {
		t.Fatal(err)
	}
	tctx := WithTokenID(WithCreator(ctx, "short"), tok.ID)
	if _, err := m.capTTL(tctx, 2*time.Hour, true, ""); err == nil || !errors.Is(err, errdefs.ErrLimit) || err.Error() != "token short: ttl 2h is over its --max-ttl 30m" {
		t.Fatalf("longer ttl: %v", err)
	}
	if d, err := m.capTTL(tctx, time.Hour, false, ""); err != nil || d != 30*time.Minute {
		t.Fatalf("default ttl: %v %v", d, err)
	}
	if d, err := m.capTTL(tctx, 10*time.Minute, true, ""); err != nil || d != 10*time.Minute {
		t.Fatalf("shorter ttl: %v %v", d, err)
	}
	if d, err := m.capTTL(ctx, 48*time.Hour, true, ""); err != nil || d != 48*time.Hour {
		t.Fatalf("host: %v %v", d, err)
	}
	for _, q := range []api.TokenQuotas{{MaxSandboxes: -1}, {MaxMemory: "lots"}, {MaxTTL: "10s"}} {
		if _, err := m.CreateToken(ctx, api.CreateTokenRequest{Quotas: &q}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("quotas %+v: %v", q, err)
		}
	}
}

// --max-ttl holds whoever sets a sandbox's TTL: the owner's cap binds
// another token and the host (told only that the owner's cap refused it),
// and a caller's own smaller cap binds it on a sandbox it does not own.
func TestQuotaTTLOwner(t *testing.T) {
	m := storeManager(t)
	ctx := context.Background()
	tokenCtx := func(name string, q *api.TokenQuotas) context.Context {
		tok, err := m.CreateToken(ctx, api.CreateTokenRequest{Name: name, Quotas: q})
		if err != nil {
			t.Fatal(err)
		}
		return WithTokenID(WithCreator(ctx, name), tok.ID)
	}
	owner := tokenCtx("owner", &api.TokenQuotas{MaxTTL: "30m"})
	other := tokenCtx("other", nil)
	tiny := tokenCtx("tiny", &api.TokenQuotas{MaxTTL: "10m"})
	insertBox(t, m, "s1", 1, 1<<30)
	if err := m.store.SetSandboxOwner(ctx, "s1", tokenIDFrom(owner)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		who  string
		ctx  context.Context
		ttl  string
		want string // "" passes
	}{
		{"another token", other, "2h", "ttl 2h is over the --max-ttl of the sandbox's owner"},
		{"the host", ctx, "2h", "ttl 2h is over the --max-ttl of the sandbox's owner"},
		{"the owner", owner, "2h", "token owner: ttl 2h is over its --max-ttl 30m"},
		{"a token with a smaller cap", tiny, "20m", "token tiny: ttl 20m is over its --max-ttl 10m"},
		{"another token", other, "30m", ""},
		{"a token with a smaller cap", tiny, "10m", ""},
	} {
		sb, err := m.SetTTL(c.ctx, "box-s1", c.ttl)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: ttl %s: %v", c.who, c.ttl, err)
		case c.want == "":
			if left := time.Until(sb.ExpiresAt); left > 30*time.Minute {
				t.Errorf("%s: ttl %s: %v left", c.who, c.ttl, left)
			}
		case !errors.Is(err, errdefs.ErrLimit) || err.Error() != c.want:
			t.Errorf("%s: ttl %s: %v, want %q", c.who, c.ttl, err, c.want)
		}
	}
}

// A quota refusal on behalf of another token (a snapshot of its
// sandbox, by a sandbox token, another admin token or the host) names
// neither that token nor its figures; the token itself gets them.
func TestQuotaRefusalForOthers(t *testing.T) {
	m := storeManager(t)
	ctx := context.Background()
	tok, err := m.CreateToken(ctx, api.CreateTokenRequest{Name: "secret-team", Quotas: &api.TokenQuotas{MaxSnapshots: 1}})
	if err != nil {
		t.Fatal(err)
	}
	insertBox(t, m, "s1", 1, 1<<30)
	if err := m.store.SetSandboxOwner(ctx, "s1", tok.ID); err != nil {
		t.Fatal(err)
	}
	if err := m.store.InsertSnapshot(ctx, &core.Snapshot{ID: "snap-1", SandboxID: "s1", Name: "one", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for who, c := range map[string]context.Context{
		"another token (the sandbox's own, an admin's)": WithTokenID(WithCreator(ctx, "other"), "tok-other"),
		"the host": ctx,
	} {
		_, err := m.reserveQuota(c, tok.ID, store.Usage{Snapshots: 1}, "this snapshot")
		if want := "the sandbox's owner has reached its --max-snapshots quota"; !errors.Is(err, errdefs.ErrLimit) || err.Error() != want {
			t.Errorf("%s: %v, want %q", who, err, want)
		}
	}
	_, err = m.reserveQuota(WithTokenID(WithCreator(ctx, "secret-team"), tok.ID), tok.ID, store.Usage{Snapshots: 1}, "this snapshot")
	if want := "token secret-team: 1 of 1 snapshots in use (--max-snapshots 1)"; err == nil || err.Error() != want {
		t.Errorf("the owner: %v, want %q", err, want)
	}
}

// A sandbox that names no disk counts what it gets: a vm its backend's
// default image (Capabilities.DefaultDiskBytes), and a fork of a vm
// whose record names none (made before vms stated their default) that
// same default, not nothing.
func TestQuotaDefaultDisk(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	b, err := m.backend(api.IsolationVM)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Capabilities().DefaultDiskBytes; got != vm.MinDisk {
		t.Fatalf("the vm backend's default disk is %s; a vm gets %s", core.FormatBytes(got), core.FormatBytes(vm.MinDisk))
	}
	tok, err := m.CreateToken(ctx, api.CreateTokenRequest{Name: "small-disk", Quotas: &api.TokenQuotas{MaxDisk: "4G"}})
	if err != nil {
		t.Fatal(err)
	}
	tctx := WithTokenID(WithCreator(ctx, "small-disk"), tok.ID)
	// A fork of a vm recorded with no disk.
	now := time.Now()
	old := &core.Sandbox{ID: newID(), Name: "old-vm", Template: "base", TemplateID: "t", Isolation: api.IsolationVM, State: core.StateRunning,
		CPUs: 1, MemoryBytes: 512 << 20, PidsLimit: 10, Env: map[string]string{}, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := m.store.InsertSandbox(ctx, old); err != nil {
		t.Fatal(err)
	}
	_, err = m.Fork(tctx, "old-vm", "", 1, "")
	if want := "token small-disk: 0 of 4G disk in use; forking 1 sandboxes needs 8G more (--max-disk 4G)"; !errors.Is(err, errdefs.ErrLimit) || err.Error() != want {
		t.Fatalf("fork of a vm with no disk recorded: %v, want %q", err, want)
	}
	if m.diskOf(old) != vm.MinDisk {
		t.Fatalf("a fork of it would record %s of disk", core.FormatBytes(m.diskOf(old)))
	}
	// A vm create without --disk: refused before anything is made.
	if ok, why, _ := b.Available(ctx); !ok {
		testutil.Missing(t, "the vm backend: %s", why)
	}
	sb, err := m.Create(tctx, api.CreateSandboxRequest{Isolation: api.IsolationVM, Memory: "512M"}, nil)
	if err == nil {
		m.Destroy(ctx, sb.Name)
	}
	if want := "token small-disk: 0 of 4G disk in use; creating this sandbox needs 8G more (--max-disk 4G)"; !errors.Is(err, errdefs.ErrLimit) || err.Error() != want {
		t.Fatalf("vm create without --disk: %v, want %q", err, want)
	}
}

// A Dockerfile build's RUN steps are the daemon's own sandboxes: a token
// whose --max-ttl is under the steps' TTL and whose --max-sandboxes is
// full still builds, and the steps count against none of its quotas.
func TestQuotaBuildSteps(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	tok, err := m.CreateToken(ctx, api.CreateTokenRequest{Name: "builder", Quotas: &api.TokenQuotas{MaxSandboxes: 1, MaxTTL: "1h"}})
	if err != nil {
		t.Fatal(err)
	}
	tctx := WithTokenID(WithCreator(ctx, "builder"), tok.ID)
	own, err := m.Create(tctx, api.CreateSandboxRequest{Memory: "128M", TTL: "30m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, own.Name) })
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	df := []byte("FROM base\nRUN echo built >/built\n")
	tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(df))})
	tw.Write(df)
	tw.Close()
	name := testutil.RandomName("quota-build-")
	var progress bytes.Buffer
	_, err = m.BuildDockerfile(tctx, name, api.DockerfileBuild{}, &tarball, BuildOptions{Progress: &progress})
	t.Cleanup(func() { m.RemoveTemplate(ctx, name) })
	if err != nil {
		t.Fatalf("a build with a RUN step as a token with --max-ttl 1h and its --max-sandboxes full: %v\n%s", err, progress.String())
	}
	if u, err := m.store.TokenUsage(ctx, tok.ID); err != nil || u.Sandboxes != 1 {
		t.Fatalf("the token's use after the build: %+v %v; want its one sandbox", u, err)
	}
}
