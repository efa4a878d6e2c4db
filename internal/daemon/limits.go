package daemon

import (
	"context"
	"fmt"
	"sync"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// Host limits (nook serve --max-sandboxes, --max-memory): a request that
// would go over one is refused (errdefs.ErrLimit, HTTP 429) rather than
// slow the host down for every sandbox.
//
// The count is of every sandbox record (any state, creating included);
// the memory is the committed memory: the MemoryBytes of the sandboxes
// that hold host RAM (creating, running, or paused in RAM: a container's
// freeze); one paused to disk, stopped, failed or being destroyed holds
// none. Both are kept in memory, in step with the records (every write of
// a record goes through the Manager's insertSandbox, updateSandbox,
// commitSandbox and deleteSandbox), and rebuilt from the store at the
// daemon's start: no request lists the sandboxes.
//
// What adds to them (a create, each fork, a start, a resume from disk, a
// rollback of a sandbox paused to disk) first reserves under the ledger's
// mutex, before any backend work, so that parallel requests never go over
// together; the reservation becomes the record's (commit) in the same
// step, or is released if the request fails.
type ledger struct {
	mu         sync.Mutex
	maxN       int   // 0: no limit
	maxMem     int64 // 0: no limit
	held       map[string]int64
	committed  int64 // the sum of held
	pendingN   int   // reserved and not yet recorded
	pendingMem int64
}

func newLedger(maxN int, maxMem int64) *ledger {
	return &ledger{maxN: maxN, maxMem: maxMem, held: map[string]int64{}}
}

// reservation is room taken for a request under way: n sandboxes and mem
// bytes of memory. Its zero value (and nil) reserves nothing.
type reservation struct {
	l   *ledger
	n   int
	mem int64
}

// reserve takes room for n new sandboxes and mem bytes of memory, or
// refuses with an ErrLimit naming the limit and the figures. verb says
// what the request does with a sandbox of mem bytes ("creating", "starting").
func (l *ledger) reserve(n int, mem int64, verb string) (*reservation, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if exist := len(l.held) + l.pendingN; n > 0 && l.maxN > 0 && exist+n > l.maxN {
		being := ""
		if l.pendingN > 0 {
			being = fmt.Sprintf(", %d of them being created", l.pendingN)
		}
		count := fmt.Sprintf("%d sandboxes exist", exist)
		if exist == 1 {
			count = "1 sandbox exists"
		}
		return nil, errdefs.Limit("host limit reached: %s%s (nook serve --max-sandboxes %d)", count, being, l.maxN)
	}
	if used := l.committed + l.pendingMem; mem > 0 && l.maxMem > 0 && used+mem > l.maxMem {
		return nil, errdefs.Limit("host limit reached: %s this %s sandbox would commit %s of memory, over --max-memory %s (%s committed)",
			verb, core.FormatBytes(mem), core.FormatBytes(used+mem), core.FormatBytes(l.maxMem), core.FormatBytes(used))
	}
	l.pendingN += n
	l.pendingMem += mem
	return &reservation{l: l, n: n, mem: mem}, nil
}

// releaseLocked gives back what r holds; a second call does nothing.
func (r *reservation) releaseLocked() {
	if r == nil || r.l == nil {
		return
	}
	r.l.pendingN -= r.n
	r.l.pendingMem -= r.mem
	r.l = nil
}

// release gives back the room of a request that failed (or recorded its
// sandbox otherwise); after a commit it does nothing.
func (r *reservation) release() {
	if r == nil || r.l == nil {
		return
	}
	l := r.l
	l.mu.Lock()
	defer l.mu.Unlock()
	r.releaseLocked()
}

// commit records that sandbox id's record exists and holds mem bytes of
// RAM, and ends r (nil: none) in the same step.
func (l *ledger) commit(r *reservation, id string, mem int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r != nil && r.l == l {
		r.releaseLocked()
	}
	l.committed += mem - l.held[id]
	l.held[id] = mem
}

// remove forgets a deleted record.
func (l *ledger) remove(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.committed -= l.held[id]
	delete(l.held, id)
}

// holding is the RAM sandbox id's record holds, and whether it is known.
func (l *ledger) holding(id string) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	mem, ok := l.held[id]
	return mem, ok
}

// use is how many sandbox records exist and the memory they commit.
func (l *ledger) use() (n int, committed int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held), l.committed
}

// rebuild sets the ledger to the records the store has (the daemon's
// start; nothing is under way).
func (m *Manager) rebuildLedger(ctx context.Context) error {
	sbs, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	l := m.limits
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held, l.committed = make(map[string]int64, len(sbs)), 0
	for _, sb := range sbs {
		mem := m.holds(sb)
		l.held[sb.ID] = mem
		l.committed += mem
	}
	return nil
}

// holds is the host RAM a sandbox in its recorded state holds: its memory
// while it is being created, runs, or is paused in RAM (its backend does
// not say it is paused to disk); none otherwise.
func (m *Manager) holds(sb *core.Sandbox) int64 {
	switch sb.State {
	case core.StateCreating, core.StateRunning:
		return sb.MemoryBytes
	case core.StatePaused:
		if r, ok := m.backends[sb.Isolation].(core.RAMPauser); ok && !r.PausedInRAM(sb.ID) {
			return 0
		}
		return sb.MemoryBytes
	}
	return 0
}

// reserveRAM reserves the memory of a sandbox that holds no RAM now (a
// resume from disk, a start), refusing what would go over --max-memory;
// nil (nothing reserved) if it already holds its memory.
func (m *Manager) reserveRAM(sb *core.Sandbox, verb string) (*reservation, error) {
	if held, ok := m.limits.holding(sb.ID); ok && held > 0 {
		return nil, nil
	}
	return m.limits.reserve(0, sb.MemoryBytes, verb)
}

// insertSandbox records a new sandbox; its reservation r becomes the record's.
func (m *Manager) insertSandbox(ctx context.Context, sb *core.Sandbox, r *reservation) error {
	if err := m.store.InsertSandbox(ctx, sb); err != nil {
		return err
	}
	m.limits.commit(r, sb.ID, m.holds(sb))
	return nil
}

// updateSandbox records a sandbox's new state (and what it holds).
func (m *Manager) updateSandbox(ctx context.Context, sb *core.Sandbox) error {
	return m.commitSandbox(ctx, sb, nil)
}

// commitSandbox is updateSandbox ending reservation r in the same step.
func (m *Manager) commitSandbox(ctx context.Context, sb *core.Sandbox, r *reservation) error {
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		return err
	}
	m.limits.commit(r, sb.ID, m.holds(sb))
	return nil
}

// deleteSandbox removes a sandbox's record.
func (m *Manager) deleteSandbox(ctx context.Context, id string) error {
	if err := m.store.DeleteSandbox(ctx, id); err != nil {
		return err
	}
	m.limits.remove(id)
	m.secrets.forget(id)
	return nil
}
