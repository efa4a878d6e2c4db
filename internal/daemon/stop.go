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
// at once, in the background (the reaper and other sandboxes do not wait
// for its boot), and stays running; one that reboots maxReboots times
// within rebootWindow, or that does not come back, is left stopped with
// the reason, for `nook start`.

const (
	maxReboots   = 5
	rebootWindow = 10 * time.Minute
)

// reboots remembers each sandbox's recent guest reboots (this daemon's
// life only: enough to catch a loop), and which it is starting again.
type reboots struct {
	mu sync.Mutex
	at map[string][]time.Time
	// starting: the sandboxes being started again, each with a channel
	// closed when that ends.
	starting map[string]chan struct{}
}

// begin marks sandbox id as being started again after a reboot; false if
// it already is.
func (r *reboots) begin(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.starting == nil {
		r.starting = map[string]chan struct{}{}
	}
	if r.starting[id] != nil {
		return false
	}
	r.starting[id] = make(chan struct{})
	return true
}

func (r *reboots) end(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch := r.starting[id]; ch != nil {
		close(ch)
		delete(r.starting, id)
	}
}

// pending is closed when sandbox id's start after a reboot ends; nil
// when none is under way.
func (r *reboots) pending(id string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch := r.starting[id]; ch != nil {
		return ch
	}
	return nil
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
	return m.stopFor(ctx, name, "", api.EventStopped)
}

// stopFor is Stop, recording why (the TTL; "" for a request), and
// publishing event (stopped, or the TTL's expired) once it is recorded.
func (m *Manager) stopFor(ctx context.Context, name, reason, event string) (*core.Sandbox, error) {
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
	if err := m.updateSandbox(cctx, sb); err != nil {
		return nil, err
	}
	m.log.Info("sandbox stopped", "sandbox", name, "reason", reason)
	m.emitTransition(ctx, event, sb)
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
	room, err := m.reserveRAM(sb, "starting")
	if err != nil {
		return nil, err
	}
	defer room.release()
	if err := m.startLocked(context.WithoutCancel(ctx), sb, st, room); err != nil {
		return nil, err
	}
	m.resumed(sb)
	m.log.Info("sandbox started", "sandbox", name)
	m.emit(ctx, api.EventStarted, sb, "")
	return sb, nil
}

// startLocked boots a stopped sandbox and records it running, ending the
// reservation of its memory, room (nil: none); the caller holds its name's lock.
func (m *Manager) startLocked(ctx context.Context, sb *core.Sandbox, st core.Stopper, room *reservation) error {
	m.dropAgent(sb.ID)
	if err := st.Start(ctx, sb); err != nil {
		return fmt.Errorf("start sandbox %s: %w", sb.Name, err)
	}
	if err := m.waitAgent(ctx, sb); err != nil {
		return fmt.Errorf("start sandbox %s: %w", sb.Name, err)
	}
	if err := m.startService(ctx, sb); err != nil {
		return fmt.Errorf("start sandbox %s: %w", sb.Name, err)
	}
	sb.State, sb.Reason = core.StateRunning, ""
	return m.commitSandbox(ctx, sb, room)
}

// halted records what a sandbox recorded running or paused, and found
// stopped on the host, stopped for: a stop or a guest power off makes it
// stopped; a guest reboot has it started again in the background (it
// stays running meanwhile). It reports whether the sandbox runs (or is
// coming back). The caller holds the sandbox's name lock, and cur is its
// record; the status is read again under it.
func (m *Manager) halted(ctx context.Context, cur *core.Sandbox) bool {
	st, err := m.stopper(cur)
	if err != nil {
		return false
	}
	rs, err := m.backends[cur.Isolation].Status(ctx, cur)
	switch {
	case err != nil || rs.State == core.RuntimeRunning || rs.State == core.RuntimeSaved:
		return true // it changed meanwhile
	case rs.State != core.RuntimeStopped:
		return false
	case rs.Halt == core.HaltReboot:
		if m.reboots.begin(cur.ID) {
			m.dropAgent(cur.ID)
			go m.reboot(context.WithoutCancel(ctx), cur.Name, cur.ID, st)
		}
		return true
	case rs.Halt == core.HaltPoweroff:
		cur.State, cur.Reason = core.StateStopped, "powered off by its guest"
	default: // a stop the record missed
		cur.State = core.StateStopped
	}
	m.recordStopped(ctx, cur)
	return false
}

// recordStopped records cur as it is now (stopped or failed).
func (m *Manager) recordStopped(ctx context.Context, cur *core.Sandbox) {
	m.dropAgent(cur.ID)
	if err := m.updateSandbox(ctx, cur); err != nil {
		// Not recorded: the next health check tries again, and publishes.
		m.log.Error("record a stopped sandbox", "sandbox", cur.Name, "err", err)
		return
	}
	m.log.Info("sandbox stopped", "sandbox", cur.Name, "state", cur.State, "reason", cur.Reason)
	m.emit(ctx, api.EventStopped, cur, cur.Reason)
}

// reboot starts sandbox name (id) again after its guest rebooted, as
// often as the guest reboots while it boots, until that makes a loop;
// then, or if it does not come back, it is left stopped with the reason.
func (m *Manager) reboot(ctx context.Context, name, id string, st core.Stopper) {
	defer m.reboots.end(id)
	unlock := m.lockName(name)
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, name)
	if err != nil || cur.ID != id || cur.State != core.StateRunning {
		return // destroyed, stopped or paused meanwhile
	}
	b := m.backends[cur.Isolation]
	for {
		if n := m.reboots.add(id, time.Now()); n >= maxReboots {
			cur.Reason = fmt.Sprintf("its guest rebooted %d times within %s: stopped as a reboot loop; start it with `nook start %s`", n, rebootWindow, name)
			break
		}
		m.log.Info("sandbox rebooted by its guest: starting it again", "sandbox", name)
		err := m.startLocked(ctx, cur, st, nil) // recorded running: it holds its memory
		if err == nil {
			m.emit(ctx, api.EventStarted, cur, "its guest rebooted")
			return
		}
		// The guest may have rebooted, or powered off, again as it booted.
		if rs, serr := b.Status(ctx, cur); serr == nil && rs.State == core.RuntimeStopped && rs.Halt == core.HaltReboot {
			continue
		} else if serr == nil && rs.State == core.RuntimeStopped && rs.Halt == core.HaltPoweroff {
			cur.Reason = "powered off by its guest"
		} else {
			cur.Reason = "its guest rebooted, and it did not start again: " + err.Error()
		}
		break
	}
	// Nothing of it runs on (a boot that did not answer), and it waits,
	// stopped, for `nook start`.
	if err := st.Stop(ctx, id); err != nil {
		m.log.Error("stop a sandbox that did not come back from its reboot", "sandbox", name, "err", err)
	}
	cur.State = core.StateStopped
	m.recordStopped(ctx, cur)
}

// alignStopped ends what runs of a sandbox recorded stopped (a start a
// crash cut short before its record): the record is the truth.
func (m *Manager) alignStopped(ctx context.Context, sb *core.Sandbox) {
	st, err := m.stopper(sb)
	if err != nil {
		return
	}
	unlock := m.lockName(sb.Name)
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, sb.Name)
	if err != nil || cur.ID != sb.ID || cur.State != core.StateStopped {
		return
	}
	rs, err := m.backends[cur.Isolation].Status(ctx, cur)
	if err != nil {
		return
	}
	if rs.State == core.RuntimeStopped || rs.State == core.RuntimeAbsent {
		m.atRest.mark(cur) // under the lock: nothing runs until a holder starts it
		return
	}
	m.log.Warn("a sandbox recorded stopped runs (a start was cut short): stopping it", "sandbox", cur.Name)
	m.dropAgent(cur.ID)
	if err := st.Stop(ctx, cur.ID); err != nil {
		m.log.Error("stop a sandbox recorded stopped", "sandbox", cur.Name, "err", err)
	}
}

// syncGuest runs sync(1) in a sandbox and waits for it, for no longer
// than ctx allows.
func syncGuest(ctx context.Context, c *agent.Client) error {
	p, err := c.Exec(ctx, &agent.ExecRequest{Argv: []string{"sync"}})
	if err != nil {
		return err
	}
	defer p.Close()
	// The stream's reads do not see ctx: closing it ends a sync the guest
	// never finishes (a dead mount).
	defer context.AfterFunc(ctx, func() { p.Close() })()
	for {
		kind, _, err := p.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
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
	done := false // stopped here: stopFor published expired
	if sb.State == core.StateRunning || sb.State == core.StatePaused {
		_, err := m.stopFor(ctx, sb.Name, reason, api.EventExpired)
		if err != nil && !gone(err) {
			m.log.Error("stop expired sandbox; retrying", "sandbox", sb.Name, "err", err)
			return
		}
		done = err == nil
	}
	m.markExpired(ctx, sb, core.StateStopped, reason, !done)
}
