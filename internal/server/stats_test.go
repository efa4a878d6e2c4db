package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/poll"
)

// A sandbox's stats follow the sandbox, not its name: once it is gone
// and another sandbox has the name, the list fails and the stream ends.
func TestStatsFollowSandbox(t *testing.T) {
	cur := &core.Sandbox{ID: "id-1", Name: "web"}
	get := func(_ context.Context, name string) (*core.Sandbox, error) {
		if cur == nil || name != cur.Name {
			return nil, errdefs.NotFound("no sandbox %s", name)
		}
		return cur, nil
	}
	list := sameSandbox(get, "web", "id-1")
	if sbs, err := list(context.Background()); err != nil || len(sbs) != 1 || sbs[0].ID != "id-1" {
		t.Fatalf("the sandbox itself: %v, %v", sbs, err)
	}
	cur = &core.Sandbox{ID: "id-2", Name: "web"} // destroyed, the name reused
	if sbs, err := list(context.Background()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("after the name went to another sandbox: %v, %v; want not found", sbs, err)
	}
	cur = nil
	if _, err := list(context.Background()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the sandbox gone: %v", err)
	}
}

// The daemon serves at most maxStats stats requests at once: past it,
// 429 limit_reached; a stream that ends gives its place back.
func TestStatsLimit(t *testing.T) {
	s := &Server{m: &daemon.Manager{}, log: slog.New(slog.DiscardHandler)}
	none := func(context.Context) ([]*core.Sandbox, error) { return nil, nil }
	serve := func(ctx context.Context, query string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		s.serveStats(rec, httptest.NewRequestWithContext(ctx, "GET", "/v1/stats"+query, nil), none, func(st []api.SandboxStats) any { return st })
		return rec
	}
	waitServing := func(n int32) {
		t.Helper()
		if err := poll.Until(context.Background(), poll.Options{Timeout: 10 * time.Second}, func() (bool, error) {
			return s.statsServing.Load() == n, nil
		}); err != nil {
			t.Fatalf("%d stats requests served, want %d: %v", s.statsServing.Load(), n, err)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range maxStats {
		wg.Go(func() { serve(ctx, "?stream=true") })
	}
	waitServing(maxStats)
	for _, q := range []string{"?stream=true", ""} {
		if rec := serve(context.Background(), q); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), api.CodeLimitReached) {
			t.Errorf("stats%s past %d streams: %d %s; want 429 %s", q, maxStats, rec.Code, rec.Body, api.CodeLimitReached)
		}
	}
	cancel() // the clients go
	wg.Wait()
	waitServing(0)
	if rec := serve(context.Background(), ""); rec.Code != http.StatusOK {
		t.Errorf("stats once the streams ended: %d %s", rec.Code, rec.Body)
	}
	waitServing(0)
}
