package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/metrics"
)

// listenMetrics listens on addr for `serve --metrics-listen` and points
// the metrics at the daemon.
func listenMetrics(addr string, mx *metrics.Metrics, m *daemon.Manager) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	mx.Watch(m)
	return l, nil
}

// sandboxStats serves GET /v1/sandboxes/{name}/stats: one sample (CPU
// over daemon.StatsInterval), or with stream=true one a second, as
// NDJSON, until the client goes or the sandbox does.
func (s *Server) sandboxStats(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	sb, err := s.m.Get(r.Context(), name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// The scope was checked against the sandbox the name held then: a
	// sandbox token's must still be it.
	if sc := callerFrom(r.Context()).scope; sc.Kind == daemon.ScopeSandbox && sb.ID != sc.SandboxID {
		s.fail(w, r, fmt.Errorf("this token was made for an earlier sandbox named %s, which was destroyed: %w", name, errdefs.ErrPermissionDenied))
		return
	}
	s.serveStats(w, r, sameSandbox(s.m.Get, name, sb.ID), func(st []api.SandboxStats) any { return st[0] })
}

// sameSandbox lists the sandbox named name as long as it is the one of
// ID id: once that sandbox is gone, even if another now has its name,
// it fails (not found) and the stream ends.
func sameSandbox(get func(context.Context, string) (*core.Sandbox, error), name, id string) func(context.Context) ([]*core.Sandbox, error) {
	return func(ctx context.Context) ([]*core.Sandbox, error) {
		sb, err := get(ctx, name)
		if err != nil {
			return nil, err
		}
		if sb.ID != id {
			return nil, errdefs.NotFound("sandbox %s is gone (another sandbox has its name now)", name)
		}
		return []*core.Sandbox{sb}, nil
	}
}

// allStats serves GET /v1/stats: every sandbox the caller may see, as
// sandboxStats serves one (a list per sample).
func (s *Server) allStats(w http.ResponseWriter, r *http.Request) {
	scope := callerFrom(r.Context()).scope
	list := func(ctx context.Context) ([]*core.Sandbox, error) {
		sbs, err := s.m.List(ctx)
		if err != nil {
			return nil, err
		}
		out := sbs[:0]
		for _, sb := range sbs {
			// A sandbox token sees only its sandbox.
			if scope.Kind != daemon.ScopeSandbox || sb.ID == scope.SandboxID {
				out = append(out, sb)
			}
		}
		return out, nil
	}
	s.serveStats(w, r, list, func(st []api.SandboxStats) any { return st })
}

// maxStats bounds the stats requests (streams and single samples) the
// daemon serves at once: each reads its sandboxes every second, and any
// token, read-only ones too, may ask. Past it, 429 limit_reached.
const maxStats = 16

func (s *Server) serveStats(w http.ResponseWriter, r *http.Request, list func(context.Context) ([]*core.Sandbox, error), shape func([]api.SandboxStats) any) {
	stream, err := queryBool(r, "stream")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if s.statsServing.Add(1) > maxStats {
		s.statsServing.Add(-1)
		s.fail(w, r, errdefs.Limit("the daemon serves at most %d stats requests at once (streams included): end one, or try again later", maxStats))
		return
	}
	defer s.statsServing.Add(-1)
	if !stream {
		var sample []api.SandboxStats
		err := s.m.SampleStats(r.Context(), list, daemon.StatsInterval, true, func(st []api.SandboxStats) error {
			sample = st
			return nil
		})
		if err == nil && sample == nil {
			err = r.Context().Err() // the client went
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, shape(sample))
		return
	}
	w.Header().Set("Content-Type", ndjsonContentType)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if rc.Flush() != nil {
		return
	}
	enc := json.NewEncoder(w)
	// The stream ends when the client goes (a write fails or the context
	// ends) or the sandbox is gone (list fails): nothing more to say.
	_ = s.m.SampleStats(r.Context(), list, daemon.StatsInterval, false, func(st []api.SandboxStats) error {
		if err := enc.Encode(shape(st)); err != nil {
			return err
		}
		return rc.Flush()
	})
}
