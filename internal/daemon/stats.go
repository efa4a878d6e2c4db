package daemon

import (
	"context"
	"errors"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// Observer is told what the daemon does, for its metrics
// (internal/metrics implements it; Config.Observer).
type Observer interface {
	// Operation is called as each create, exec (its start), pause,
	// resume, snapshot and fork returns: op names it, d is how long it
	// took, and category is its error's (an api.Code*, "internal" for
	// one of no category), "" if it succeeded.
	Operation(op string, d time.Duration, category string)
	// Denied counts n refusals of a kind (deniedConnection, deniedDNS)
	// for a reason (network.Reason*, egress.Reason*, dns.Reason*).
	Denied(kind, reason string, n int)
}

// The kinds of refusal Observer.Denied counts.
const (
	deniedConnection = "connection"
	deniedDNS        = "dns"
)

// The operations Observer.Operation times.
const (
	opCreate   = "create"
	opExec     = "exec"
	opPause    = "pause"
	opResume   = "resume"
	opSnapshot = "snapshot"
	opFork     = "fork"
)

// observe reports an operation that started at start and ended with
// *err: call it deferred, `defer m.observe(opX, time.Now(), &err)`.
func (m *Manager) observe(op string, start time.Time, err *error) {
	if m.cfg.Observer == nil {
		return
	}
	cat := ""
	if *err != nil {
		cat = ErrorCategory(*err)
	}
	m.cfg.Observer.Operation(op, time.Since(start), cat)
}

func (n *sandboxNets) countDenied(kind, reason string, count int) {
	if n.obs != nil && count > 0 {
		n.obs.Denied(kind, reason, count)
	}
}

// ErrorCategory names err's category as the API's error codes do
// (api.Code*): "internal" for an error of no category.
func ErrorCategory(err error) string {
	switch {
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return api.CodeInvalidArgument
	case errors.Is(err, errdefs.ErrNotFound):
		return api.CodeNotFound
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return api.CodePermissionDenied
	case errors.Is(err, errdefs.ErrAlreadyExists):
		return api.CodeAlreadyExists
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return api.CodeFailedPrecondition
	case errors.Is(err, errdefs.ErrResourceExhausted):
		return api.CodeResourceExhausted
	case errors.Is(err, errdefs.ErrLimit):
		return api.CodeLimitReached
	case errors.Is(err, errdefs.ErrUnavailable), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return api.CodeUnavailable
	default:
		return "internal"
	}
}

// readStats reads what sandbox sb uses now (CPUPercent is left 0: it
// takes two samples, SampleStats). Its backend reads CPU, memory, disk
// and processes (core.StatsReader), the network manager its interface's
// bytes; what cannot be read is left 0 (a sandbox being destroyed).
func (m *Manager) readStats(sb *core.Sandbox) api.SandboxStats {
	s := api.SandboxStats{
		Name: sb.Name, ID: sb.ID, State: string(sb.State), Isolation: sb.Isolation, Time: time.Now(),
		CPUs: sb.CPUs, MemoryLimitBytes: sb.MemoryBytes, DiskLimitBytes: sb.DiskBytes,
	}
	if r, ok := m.backends[sb.Isolation].(core.StatsReader); ok {
		if st, err := r.ReadStats(sb); err == nil {
			s.CPUSeconds = st.CPU.Seconds()
			s.MemoryBytes, s.DiskBytes, s.Pids = st.MemoryBytes, st.DiskBytes, st.Pids
			if st.DiskLimit > 0 {
				s.DiskLimitBytes = st.DiskLimit
			}
		} else {
			m.log.Debug("read sandbox stats", "sandbox", sb.Name, "err", err)
		}
	}
	if m.net != nil {
		if rx, tx, err := m.net.mgr.Counters(sb.ID); err == nil {
			s.NetRxBytes, s.NetTxBytes = rx, tx
		}
	}
	return s
}

// AllStats reads what every sandbox uses now (CPUPercent 0), for the
// metrics, which count CPU seconds. It stops between sandboxes when ctx
// ends (the scrape's timeout), with ctx's error.
func (m *Manager) AllStats(ctx context.Context) ([]api.SandboxStats, error) {
	sbs, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.SandboxStats, 0, len(sbs))
	for _, sb := range sbs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		out = append(out, m.readStats(sb))
	}
	return out, nil
}

// WarmPools reports every backend's warm pools.
func (m *Manager) WarmPools() []api.WarmPool {
	var out []api.WarmPool
	for _, iso := range []string{api.IsolationContainer, api.IsolationVM} {
		if wp, ok := m.backends[iso].(core.WarmPool); ok {
			out = append(out, wp.WarmPools()...)
		}
	}
	return out
}

// StatsInterval is how far apart SampleStats's samples are: the window
// of each sample's CPUPercent.
const StatsInterval = time.Second

// SampleStats reads the stats of the sandboxes list returns every
// interval and calls emit with each sample but the first, which only
// starts the CPU clock: CPUPercent is the CPU used since the sandbox's
// previous sample. It returns after the first emit if once is set, else
// when emit fails, list fails or ctx ends (nil then: it stops between
// sandboxes, so a client gone in the middle of a sample costs no more).
func (m *Manager) SampleStats(ctx context.Context, list func(context.Context) ([]*core.Sandbox, error), interval time.Duration, once bool, emit func([]api.SandboxStats) error) error {
	prev := map[string]api.SandboxStats{}
	t := time.NewTicker(interval)
	defer t.Stop()
	for first := true; ; first = false {
		sbs, err := list(ctx)
		if err != nil {
			return err
		}
		cur := make([]api.SandboxStats, 0, len(sbs))
		next := make(map[string]api.SandboxStats, len(sbs))
		for _, sb := range sbs {
			if ctx.Err() != nil {
				return nil
			}
			s := m.readStats(sb)
			if p, ok := prev[s.ID]; ok {
				s.CPUPercent = cpuPercent(p, s)
			}
			next[s.ID] = s
			cur = append(cur, s)
		}
		prev = next
		if !first {
			if err := emit(cur); err != nil {
				return err
			}
			if once {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// cpuPercent is the CPU used between two samples of one sandbox, in
// percent of one CPU.
func cpuPercent(prev, cur api.SandboxStats) float64 {
	span := cur.Time.Sub(prev.Time).Seconds()
	used := cur.CPUSeconds - prev.CPUSeconds
	if span <= 0 || used <= 0 {
		return 0
	}
	return 100 * used / span
}
