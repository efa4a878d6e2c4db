package daemon

import (
	"bytes"
	"context"
	"sync"

	"github.com/nookhq/nook/internal/core"
)

// atRest remembers the sandboxes the reaper found at rest: recorded
// stopped with nothing running, or paused to disk with the saved state
// there. Nothing changes such a sandbox but an operation that takes its
// name's lock, and lockName forgets it, so until then the reaper's ticks
// skip it: a host of mostly stopped or idle-paused sandboxes costs the
// reaper a list of the records and a map lookup each, not a Status (tens
// of µs, 2-3% of a core at 1,000; TestReapCost measures it).
//
// A mark is made only under the sandbox's lock, after a Status taken
// under that lock, so no operation can slip between what was seen and
// the mark. The record is kept with it: one the reaper lists that differs
// (another ID, state or backend state) is looked at again.
type atRest struct {
	mu sync.Mutex
	m  map[string]*core.Sandbox // by name
}

func (a *atRest) mark(sb *core.Sandbox) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m == nil {
		a.m = map[string]*core.Sandbox{}
	}
	a.m[sb.Name] = &core.Sandbox{ID: sb.ID, State: sb.State, BackendState: bytes.Clone(sb.BackendState)}
}

func (a *atRest) forget(name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.m, name)
}

// is reports whether sb's record is the one marked at rest.
func (a *atRest) is(sb *core.Sandbox) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.m[sb.Name]
	return ok && r.ID == sb.ID && r.State == sb.State && bytes.Equal(r.BackendState, sb.BackendState)
}

// restSaved looks again, under the lock, at a sandbox recorded paused
// whose Status said it is saved to disk, and marks it at rest if so.
func (m *Manager) restSaved(ctx context.Context, b core.Backend, sb *core.Sandbox) {
	unlock := m.lockName(sb.Name)
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, sb.Name)
	if err != nil || cur.ID != sb.ID || cur.State != core.StatePaused {
		return
	}
	if rs, err := b.Status(ctx, cur); err == nil && rs.State == core.RuntimeSaved && !rs.Restarted {
		m.atRest.mark(cur)
	}
}
