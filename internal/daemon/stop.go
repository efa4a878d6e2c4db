package daemon

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// A sandbox is stopped by `nook stop`, by its TTL (on_expire stop), or by
// its own guest powering off: its processes end and its memory is freed,
// its disk, network, policy and exposed ports stay. `nook start` starts it
// again (a vm boots from its disk). A guest that reboots is started again
// at once and stays running; one that reboots maxReboots times within
// rebootWindow is stopped as a reboot loop, and failed.

const (
	maxReboots   = 5
	rebootWindow = time.Minute
)

// reboots remembers each sandbox's recent guest reboots (this daemon's
// life only: enough to catch a loop).
type reboots struct {
	mu sync.Mutex
	at map[string][]time.Time
}

// add records a reboot of sandbox id now and reports how many fell within
// rebootWindow.
func (r *reboots) add(id string, now time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at = map[string][]time.Time{}
	}
	recent := r.at[id][:0]
	for _, t := range r.at[id] {
		if now.Sub(t) < rebootWindow {
			recent = append(recent, t)
		}
	}
	r.at[id] = append(recent, now)
	return len(r.at[id])
}

// forget drops a destroyed sandbox's reboots.
func (r *reboots) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.at, id)
}

// last is sandbox id's last guest reboot seen by this daemon.
func (r *reboots) last(id string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ts := r.at[id]; len(ts) > 0 {
		return ts[len(ts)-1]
	}
	return time.Time{}
}

func (m *Manager) stopper(sb *core.Sandbox) (core.Stopper, error) {
	b, err := m.backend(sb.Isolation)
	if err != nil {
		return nil, err
	}
	st, ok := b.(core.Stopper)
	if !ok || !b.Capabilities().Stop {
		return nil, errdefs.Precondition("the %s backend cannot stop sandboxes", sb.Isolation)
	}
	return st, nil
}

// Stop stops a running or paused sandbox: its processes end, its memory
// (a pause's too) is freed, its disk is kept for a start.
func (m *Manager) Stop(ctx context.Context, name string) (*core.Sandbox, error) {
	return m.stopFor(ctx, name, "")
}

// stopFor is Stop, recording why (the TTL; "" for a request).
func (m *Manager) stopFor(ctx context.Context, name, reason string) (*core.Sandbox, error) {
	sb, unlock, err := m.lockSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	st, err := m.stopper(sb)
	if err != nil {
		return nil, err
	}
	if sb.State == core.StateStopped {
		return nil, errdefs.Precondition("sandbox %s is already stopped: start it with `nook start %s`", name, name)
	}
	if err := core.CheckTransition(sb.State, core.StateStopped); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	cctx := context.WithoutCancel(ctx)
	if sb.State == core.StateRunning {
		// What the guest has not written yet is written: a stop on
		// request loses nothing a sync keeps.
		if c, err := m.agentFor(sb); err == nil {
			sctx, cancel := context.WithTimeout(cctx, 10*time.Second)
			if err := syncGuest(sctx, c); err != nil {
				m.log.Warn("sync a sandbox's files before its stop", "sandbox", name, "err", err)
			}
			cancel()
		}
	}
	m.dropAgent(sb.ID)
	// The backend first: a crash before the record leaves it stopped on
	// the host and running in the record, and checkHealth records it.
	if err := st.Stop(cctx, sb.ID); err != nil {
		return nil, fmt.Errorf("stop sandbox %s: %w", name, err)
	}
	sb.State, sb.Reason = core.StateStopped, reason
	if err := m.store.UpdateSandbox(cctx, sb); err != nil {
		return nil, err
	}
	m.log.Info("sandbox stopped", "sandbox", name, "reason", reason)
	return sb, nil
}

// Start starts a stopped sandbox again: afresh on its disk, with its
// identity, network and policy.
func (m *Manager) Start(ctx context.Context, name string) (*core.Sandbox, error) {
	sb, unlock, err := m.lockSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	st, err := m.stopper(sb)
	if err != nil {
		return nil, err
	}
	if sb.State != core.StateStopped {
		return nil, errdefs.Precondition("sandbox %s is %s, not stopped", name, sb.State)
	}
	if err := m.startLocked(context.WithoutCancel(ctx), sb, st); err != nil {
		return nil, err
	}
	m.resumed(sb)
	m.log.Info("sandbox started", "sandbox", name)
	return sb, nil
}

// startLocked boots a stopped sandbox and records it running; the caller
// holds its name's lock.
func (m *Manager) startLocked(ctx context.Context, sb *core.Sandbox, st core.Stopper) error {
	m.dropAgent(sb.ID)
	if err := st.Start(ctx, sb); err != nil {
		return fmt.Errorf("start sandbox %s: %w", sb.Name, err)
	}
	if err := m.waitAgent(ctx, sb); err != nil {
		return fmt.Errorf("start sandbox %s: %w", sb.Name, err)
	}
	sb.State, sb.Reason = core.StateRunning, ""
	return m.store.UpdateSandbox(ctx, sb)
}

// halted records what a sandbox recorded running or paused, and found
// stopped on the host, stopped for: a stop or a guest power off makes it
// stopped; a guest reboot starts it again (it stays running) unless it
// loops. It reports whether the sandbox runs. The caller holds the
// sandbox's name lock, and cur is its record.
func (m *Manager) halted(ctx context.Context, cur *core.Sandbox, rs core.RuntimeStatus) bool {
	st, err := m.stopper(cur)
	switch {
	case err != nil:
		return false
	case rs.Halt == core.HaltReboot:
		if m.reboot(ctx, cur, st) {
			return true
		}
	case rs.Halt == core.HaltPoweroff:
		cur.State, cur.Reason = core.StateStopped, "powered off by its guest"
	default: // a stop the record missed
		cur.State = core.StateStopped
	}
	if err := m.store.UpdateSandbox(ctx, cur); err != nil {
		m.log.Error("record a stopped sandbox", "sandbox", cur.Name, "err", err)
	}
	m.dropAgent(cur.ID)
	m.log.Info("sandbox stopped", "sandbox", cur.Name, "state", cur.State, "reason", cur.Reason)
	return false
}

// syncGuest runs sync(1) in a sandbox and waits for it.
func syncGuest(ctx context.Context, c *agent.Client) error {
	p, err := c.Exec(ctx, &agent.ExecRequest{Argv: []string{"sync"}})
	if err != nil {
		return err
	}
	defer p.Close()
	for {
		kind, _, err := p.Next()
		if err != nil {
			return err
		}
		if kind == api.FrameExit {
			return nil
		}
	}
}

// expireStop handles the TTL of an on_expire=stop sandbox running out:
// it is stopped (unless it is already) and marked expired, and does not
// expire again until a new TTL is set (starting it meanwhile is fine).
func (m *Manager) expireStop(ctx context.Context, sb *core.Sandbox) {
	reason := "its TTL ran out; set a new one with `nook ttl " + sb.Name + " DURATION`"
	if sb.State == core.StateRunning || sb.State == core.StatePaused {
		if _, err := m.stopFor(ctx, sb.Name, reason); err != nil && !gone(err) {
			m.log.Error("stop expired sandbox; retrying", "sandbox", sb.Name, "err", err)
			return
		}
	}
	m.markExpired(ctx, sb, core.StateStopped, reason)
}

// reboot starts a sandbox whose guest rebooted again, as often as the
// guest reboots while it boots, until that makes a loop. It reports
// whether the sandbox runs; if not, cur says why.
func (m *Manager) reboot(ctx context.Context, cur *core.Sandbox, st core.Stopper) bool {
	b := m.backends[cur.Isolation]
	for {
		if n := m.reboots.add(cur.ID, time.Now()); n >= maxReboots {
			cur.State, cur.Reason = core.StateFailed, fmt.Sprintf("its guest rebooted %d times within %s: stopped as a reboot loop", n, rebootWindow)
			return false
		}
		m.log.Info("sandbox rebooted by its guest: starting it again", "sandbox", cur.Name)
		err := m.startLocked(ctx, cur, st)
		if err == nil {
			return true
		}
		// The guest may have rebooted, or powered off, again as it booted.
		rs, serr := b.Status(ctx, cur)
		switch {
		case serr == nil && rs.State == core.RuntimeStopped && rs.Halt == core.HaltReboot:
			continue
		case serr == nil && rs.State == core.RuntimeStopped && rs.Halt == core.HaltPoweroff:
			cur.State, cur.Reason = core.StateStopped, "powered off by its guest"
		default:
			cur.State, cur.Reason = core.StateFailed, "its guest rebooted, and it did not start again: "+err.Error()
		}
		return false
	}
}
