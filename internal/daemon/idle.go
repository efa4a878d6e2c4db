package daemon

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// Idle pause and pause on expiry.
//
// A running sandbox with an idle pause is paused by the reaper once, for
// that long, it has been idle:
//
//   - no API call used it: every call that goes through runningAgent
//     (exec, files, processes, attach, signals, terminals) counts, as do
//     create and resume; calls that only read the record (inspect, ls) do not;
//   - no request to its agent was open at any reaper tick (a foreground
//     exec, an attached terminal or process, a transfer, a file watch);
//   - its cgroups used under idleCPU of one CPU on average;
//   - and, asked last, its agent runs no process started through nook
//     (background commands and terminals).
//
// The clock starts again whenever one of these is seen, and when the
// daemon starts. A call that arrives while the reaper is pausing the
// sandbox waits for the pause and then wakes it, so no call ever reaches a
// frozen sandbox.

// idleCPU is the share of one CPU below which a sandbox counts as idle.
// A vm's cgroup holds its QEMU, whose emulated idle guest itself costs
// about 3.5% of a CPU under TCG (measured): vms get idleCPUVM.
const (
	idleCPU   = 0.02
	idleCPUVM = 0.10
)

// idleTracker keeps, per sandbox ID, when it was last seen in use.
type idleTracker struct {
	mu sync.Mutex
	sb map[string]*idleState
}

type idleState struct {
	lastActive time.Time
	// CPU usage at cpuAt, the first tick after lastActive: the idle
	// window's CPU is measured from there.
	cpuAt   time.Time
	cpu     time.Duration
	pausing chan struct{} // while the reaper pauses it: calls wait for it to close
	warned  bool          // a problem with it was logged once
}

func newIdleTracker() *idleTracker { return &idleTracker{sb: map[string]*idleState{}} }

func (t *idleTracker) state(id string, now time.Time) *idleState {
	s := t.sb[id]
	if s == nil {
		s = &idleState{lastActive: now}
		t.sb[id] = s
	}
	return s
}

// touch restarts a sandbox's idle clock.
func (t *idleTracker) touch(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	s := t.state(id, now)
	s.lastActive, s.cpuAt = now, time.Time{}
}

// use restarts the idle clock for an API call about to use the sandbox.
// While the reaper is pausing the sandbox it does not, and returns a
// channel closed once the pause is done: the caller waits, then wakes it.
func (t *idleTracker) use(id string) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	s := t.state(id, now)
	if s.pausing != nil {
		return s.pausing
	}
	s.lastActive, s.cpuAt = now, time.Time{}
	return nil
}

// beginPause marks the sandbox as being paused, unless it was used since
// seen (its lastActive when the reaper decided).
func (t *idleTracker) beginPause(id string, seen time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sb[id]
	if s == nil || !s.lastActive.Equal(seen) || s.pausing != nil {
		return false
	}
	s.pausing = make(chan struct{})
	return true
}

func (t *idleTracker) endPause(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s := t.sb[id]; s != nil && s.pausing != nil {
		close(s.pausing)
		s.pausing = nil
	}
}

// warnOnce reports whether nothing was logged yet about the sandbox's idle
// pause not working, so that the reaper logs it once, not every tick.
func (t *idleTracker) warnOnce(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.state(id, time.Now())
	first := !s.warned
	s.warned = true
	return first
}

// prune forgets sandboxes that no longer exist.
func (t *idleTracker) prune(keep map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, s := range t.sb {
		if !keep[id] && s.pausing == nil {
			delete(t.sb, id)
		}
	}
}

// pauser returns the backend's Pauser if it can pause.
func pauser(b core.Backend) (core.Pauser, bool) {
	p, ok := b.(core.Pauser)
	return p, ok && b.Capabilities().Pause
}

// idleSettings validates a create's idle pause and on-expire setting
// against its backend. Without idle_pause, the daemon's default applies
// where the backend can pause.
func (m *Manager) idleSettings(req api.CreateSandboxRequest, b core.Backend) (time.Duration, string, error) {
	_, canPause := pauser(b)
	idle := m.cfg.IdlePause
	if !canPause {
		idle = 0
	}
	if req.IdlePause != "" {
		d, err := core.ParseIdlePause(req.IdlePause, m.cfg.MinIdlePause)
		if err != nil {
			return 0, "", err
		}
		if d > 0 && !canPause {
			return 0, "", errdefs.Invalid("the %s backend cannot pause sandboxes: omit --idle-pause", req.Isolation)
		}
		idle = d
	}
	onExpire, err := core.ValidateOnExpire(req.OnExpire)
	if err != nil {
		return 0, "", err
	}
	if onExpire == core.OnExpirePause && !canPause {
		return 0, "", errdefs.Invalid("the %s backend cannot pause sandboxes: use --on-expire destroy", req.Isolation)
	}
	if st, ok := b.(core.Stopper); onExpire == core.OnExpireStop && (!ok || st == nil || !b.Capabilities().Stop) {
		return 0, "", errdefs.Invalid("the %s backend cannot stop sandboxes: use --on-expire destroy", req.Isolation)
	}
	return idle, onExpire, nil
}

// streams returns how many requests to the sandbox's agent are open.
func (m *Manager) streams(id string) int {
	m.mu.Lock()
	c := m.agents[id]
	m.mu.Unlock()
	if c == nil {
		return 0
	}
	return c.Streams()
}

// pauseIdle pauses the running sandboxes that have been idle for their
// idle pause. sbs is every sandbox, as the reaper listed them.
func (m *Manager) pauseIdle(ctx context.Context, sbs []*core.Sandbox) {
	keep := make(map[string]bool, len(sbs))
	for _, sb := range sbs {
		keep[sb.ID] = true
		if sb.State == core.StateRunning && sb.IdlePause > 0 {
			m.checkIdle(ctx, sb)
		}
	}
	m.idle.prune(keep)
}

func (m *Manager) checkIdle(ctx context.Context, sb *core.Sandbox) {
	b, ok := m.backends[sb.Isolation]
	if !ok {
		return
	}
	if _, ok := pauser(b); !ok {
		if m.idle.warnOnce(sb.ID) {
			m.log.Warn("sandbox has an idle pause, but its backend cannot pause: it stays running", "sandbox", sb.Name, "isolation", sb.Isolation)
		}
		return
	}
	if m.streams(sb.ID) > 0 {
		m.idle.touch(sb.ID)
		return
	}
	now := time.Now()
	m.idle.mu.Lock()
	s := m.idle.state(sb.ID, now)
	seen, cpuAt, cpuBase := s.lastActive, s.cpuAt, s.cpu
	m.idle.mu.Unlock()
	// The CPU baseline is taken at the first tick of the idle window.
	if cpuAt.IsZero() || now.Sub(seen) < sb.IdlePause {
		if cpuAt.IsZero() {
			if usage, err := cgroups.CPUUsage(m.cfg.CgroupParent, sb.ID); err == nil {
				m.idle.mu.Lock()
				if s := m.idle.sb[sb.ID]; s != nil && s.lastActive.Equal(seen) {
					s.cpuAt, s.cpu = now, usage
				}
				m.idle.mu.Unlock()
			} else if m.idle.warnOnce(sb.ID) {
				m.log.Warn("read sandbox CPU usage: it is not paused while idle", "sandbox", sb.Name, "err", err)
			}
		}
		return
	}
	usage, err := cgroups.CPUUsage(m.cfg.CgroupParent, sb.ID)
	if err != nil {
		return // logged when the baseline was taken
	}
	limit := idleCPU
	if sb.Isolation == api.IsolationVM {
		limit = idleCPUVM
	}
	if span := now.Sub(cpuAt); span > 0 && float64(usage-cpuBase)/float64(span) >= limit {
		m.idle.touch(sb.ID)
		return
	}
	// Last, ask the agent for processes started through nook.
	c, err := m.agentFor(sb)
	if err != nil {
		return
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	ps, err := c.Processes(actx)
	cancel()
	if err != nil {
		m.log.Warn("list processes of an idle sandbox: it stays running", "sandbox", sb.Name, "err", err)
		m.idle.touch(sb.ID)
		return
	}
	for _, proc := range ps {
		if proc.Running && !proc.Passive {
			m.idle.touch(sb.ID)
			return
		}
	}
	m.idlePause(ctx, sb, seen)
}

// idlePause pauses an idle sandbox, unless it was used since seen.
func (m *Manager) idlePause(ctx context.Context, sb *core.Sandbox, seen time.Time) {
	if !m.idle.beginPause(sb.ID, seen) {
		return
	}
	defer m.idle.endPause(sb.ID)
	// A call that passed runningAgent before beginPause restarted the
	// clock, so beginPause failed; a request still open from before is seen here.
	if m.streams(sb.ID) > 0 {
		m.idle.touch(sb.ID)
		return
	}
	idleFor := core.FormatDuration(sb.IdlePause)
	if _, err := m.pauseFor(ctx, sb.Name, "idle for "+idleFor, api.EventPausedByIdle); err != nil {
		if gone(err) {
			return // no longer running (destroyed, paused or failed meanwhile)
		}
		m.log.Error("pause idle sandbox", "sandbox", sb.Name, "err", err)
		m.idle.touch(sb.ID) // try again after another idle window, not every tick
		return
	}
	m.log.Info("sandbox paused: idle", "sandbox", sb.Name, "idle_pause", idleFor)
}

// expirePause handles the TTL of an on_expire=pause sandbox running out:
// the sandbox is paused and marked expired, and does not expire again
// until a new TTL is set (waking it up meanwhile is fine).
func (m *Manager) expirePause(ctx context.Context, sb *core.Sandbox) {
	reason := "its TTL ran out; set a new one with `nook ttl " + sb.Name + " DURATION`"
	done := false // paused here: pauseFor published expired
	if sb.State == core.StateRunning {
		if _, ok := pauser(m.backends[sb.Isolation]); !ok {
			m.log.Error("sandbox expired with on_expire pause, but its backend cannot pause: it stays running", "sandbox", sb.Name)
		} else if _, err := m.pauseFor(ctx, sb.Name, reason, api.EventExpired); err != nil && !gone(err) {
			m.log.Error("pause expired sandbox; retrying", "sandbox", sb.Name, "err", err)
			return
		} else {
			done = err == nil
		}
	}
	m.markExpired(ctx, sb, core.StatePaused, reason, !done)
}

// markExpired records that sb's TTL ran out and it was kept (paused or
// stopped: kept, with reason, if it is in that state), so that it does
// not expire again until a new TTL is set. The pause or stop that kept
// it published expired; publish says none did (it was kept as it was).
func (m *Manager) markExpired(ctx context.Context, sb *core.Sandbox, kept core.State, reason string, publish bool) {
	unlock := m.lockName(sb.Name)
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, sb.Name)
	// A new TTL set meanwhile wins.
	if err != nil || cur.ID != sb.ID || cur.Expired || cur.ExpiresAt.After(time.Now()) {
		return
	}
	cur.Expired = true
	if cur.State == kept {
		cur.Reason = reason
	}
	if err := m.updateSandbox(ctx, cur); err != nil {
		m.log.Error("mark sandbox expired", "sandbox", sb.Name, "err", err)
		return
	}
	m.log.Info("sandbox expired: kept, not destroyed", "sandbox", sb.Name, "on_expire", cur.OnExpire, "state", cur.State)
	if publish {
		m.emit(ctx, api.EventExpired, cur, string(cur.State))
	}
}

// gone reports whether a pause failed because the sandbox is no longer
// there or no longer running.
func gone(err error) bool {
	return errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrFailedPrecondition)
}

// resumed restarts a resumed sandbox's idle clock.
func (m *Manager) resumed(sb *core.Sandbox) { m.idle.touch(sb.ID) }
