package e2b

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
)

// E2B's snapshots, forks and metrics over nook's. An E2B snapshot is a
// template a create starts from; nook's is a sandbox's own, which a fork
// starts from: its E2B ID is SANDBOX:SNAPSHOT, and a create from that
// template is a fork of it.

// snapshotID is a nook snapshot's E2B ID.
func snapshotID(sn *core.Snapshot) string { return sn.Sandbox + ":" + sn.Name }

// parseSnapshotID splits an E2B snapshot ID (or a template name that is
// one) into its sandbox and snapshot.
func parseSnapshotID(id string) (sandbox, snapshot string, ok bool) {
	sandbox, snapshot, ok = strings.Cut(id, ":")
	return sandbox, snapshot, ok && sandbox != "" && snapshot != ""
}

type snapshotView struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// createSnapshot is POST /sandboxes/{id}/snapshots: a snapshot of the
// sandbox (its memory too where the backend keeps it), named as asked.
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, _ daemon.Scope) {
	var req struct {
		Name string `json:"name"`
	}
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sn, err := s.m.Snapshot(r.Context(), r.PathValue("id"), req.Name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotView{SnapshotID: snapshotID(sn), Names: []string{snapshotID(sn)}})
}

// listSnapshots is GET /snapshots: the snapshots of one sandbox
// (sandboxID) or of every sandbox the key sees, optionally by name, in
// one page.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, sc daemon.Scope) {
	q := r.URL.Query()
	all, err := s.visible(r.Context(), sc)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []snapshotView{}
	for _, sb := range all {
		if id := q.Get("sandboxID"); id != "" && id != sb.Name {
			continue
		}
		list, err := s.m.Snapshots(r.Context(), sb.Name)
		if err != nil {
			continue // gone meanwhile
		}
		for _, sn := range list {
			if n := q.Get("name"); n != "" && n != sn.Name && n != snapshotID(sn) {
				continue
			}
			out = append(out, snapshotView{SnapshotID: snapshotID(sn), Names: []string{snapshotID(sn)}})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteTemplate is DELETE /templates/{id}, which the SDKs' deleteSnapshot
// calls: a snapshot's ID removes the snapshot; nook's templates are not
// removed through E2B's API.
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request, sc daemon.Scope) {
	sandbox, snapshot, ok := parseSnapshotID(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusForbidden, "templates are removed with nook template rm on the host, not through E2B's API")
		return
	}
	if sc.Kind == daemon.ScopeSandbox && sandbox != sc.Sandbox {
		writeError(w, http.StatusNotFound, fmt.Sprintf("snapshot %q not found", r.PathValue("id")))
		return
	}
	if err := s.m.DeleteSnapshot(r.Context(), sandbox, snapshot); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// forkResult is one entry of POST /sandboxes/{id}/fork's answer.
type forkResult struct {
	Sandbox *sandboxView `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

// fork is POST /sandboxes/{id}/fork: count copies of the sandbox as it is
// now (nook's fork: a snapshot taken in place, the sandbox going on),
// each living timeout seconds (default the parent's TTL).
func (s *Server) fork(w http.ResponseWriter, r *http.Request, sc daemon.Scope) {
	if sc.Kind == daemon.ScopeSandbox { // a fork makes sandboxes: an admin's, as in nook's API
		writeError(w, http.StatusForbidden, "this API key is for sandbox "+sc.Sandbox+" alone: it cannot fork it")
		return
	}
	var req struct {
		Timeout *int `json:"timeout"`
		Count   int  `json:"count"`
	}
	if err := decodeBody(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	forks, err := s.m.Fork(r.Context(), r.PathValue("id"), "", max(req.Count, 1), newName())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]forkResult, 0, len(forks))
	for _, sb := range forks {
		if req.Timeout != nil && *req.Timeout > 0 {
			if nsb, err := s.m.SetTTL(r.Context(), sb.Name, ttlOf(*req.Timeout)); err == nil {
				sb = nsb
			}
		}
		v := s.view(sb)
		out = append(out, forkResult{Sandbox: &v})
	}
	writeJSON(w, http.StatusOK, out)
}

// createFromSnapshot answers a create whose template is a snapshot's ID:
// a fork of that snapshot.
func (s *Server) createFromSnapshot(w http.ResponseWriter, r *http.Request, sandbox, snapshot string, timeout int) {
	forks, err := s.m.Fork(r.Context(), sandbox, snapshot, 1, newName())
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("template %s:%s not found: %v", sandbox, snapshot, err))
			return
		}
		s.fail(w, r, err)
		return
	}
	sb := forks[0]
	if nsb, err := s.m.SetTTL(r.Context(), sb.Name, ttlOf(timeout)); err == nil {
		sb = nsb
	}
	writeJSON(w, http.StatusCreated, s.view(sb))
}

// sandboxMetric is E2B's SandboxMetric.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metrics is GET /sandboxes/{id}/metrics: one sample, now: the CPU its
// processes used since the last sample the edge took of it (since it
// started, the first time), its memory, and its disk's size (nook does
// not read the disk's use from the host).
func (s *Server) metrics(w http.ResponseWriter, r *http.Request, _ daemon.Scope) {
	sb, err := s.m.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	now := time.Now()
	m := sandboxMetric{Timestamp: now.UTC(), TimestampUnix: now.Unix(), CPUCount: max(1, int(sb.CPUs+0.5)),
		MemTotal: sb.MemoryBytes, DiskTotal: sb.DiskBytes}
	if sb.State == core.StateRunning {
		cpu, mem, err := s.m.Usage(r.Context(), sb.Name)
		if err == nil {
			m.MemUsed = mem
			m.CPUUsedPct = s.cpuPct(sb, cpu, now)
		}
	}
	writeJSON(w, http.StatusOK, []sandboxMetric{m})
}

// cpuPct is the share of its CPUs a sandbox used between its previous
// sample (or its start) and now, in percent.
func (s *Server) cpuPct(sb *core.Sandbox, cpu time.Duration, now time.Time) float64 {
	s.samplesMu.Lock()
	prev, ok := s.samples[sb.ID]
	if s.samples == nil {
		s.samples = map[string]cpuSample{}
	}
	if len(s.samples) > 4096 {
		clear(s.samples)
	}
	s.samples[sb.ID] = cpuSample{cpu: cpu, at: now}
	s.samplesMu.Unlock()
	if !ok || cpu < prev.cpu {
		prev = cpuSample{at: sb.CreatedAt}
	}
	wall := now.Sub(prev.at)
	if wall <= 0 || sb.CPUs <= 0 {
		return 0
	}
	return min(100, 100*float64(cpu-prev.cpu)/(float64(wall)*sb.CPUs))
}

// cpuSample is a sandbox's CPU time when a metric was last taken.
type cpuSample struct {
	cpu time.Duration
	at  time.Time
}
