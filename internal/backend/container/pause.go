package container

import (
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
)

var _ core.Pauser = (*Backend)(nil)

// A pause either freezes the container (the cgroup freezer: no CPU, its
// memory kept in RAM) or, with CRIU configured, checkpoints it to disk and
// ends it (no CPU, no RAM; checkpoint.go).

// PauseKind implements core.Pauser.
func (b *Backend) PauseKind(id string) string {
	if b.checkpointed(id) {
		return "checkpointed: processes saved to disk by CRIU and ended (no CPU, no RAM)"
	}
	return "frozen: processes stopped by the cgroup freezer, memory kept in RAM, no CPU"
}

// PausedInRAM implements core.RAMPauser: a checkpointed container holds
// no RAM; a frozen one does.
func (b *Backend) PausedInRAM(id string) bool { return !b.checkpointed(id) }

// Paused implements core.Pauser. It first waits for a runc that holds
// the sandbox's lock (a pause, checkpoint or restore an earlier daemon
// began, which runs on after that daemon died): a freeze landing after
// this look would leave a sandbox recorded running frozen for good.
func (b *Backend) Paused(ctx context.Context, id string) (bool, error) {
	_, release, err := b.waitCRIU(ctx, id)
	if err != nil {
		return false, err
	}
	release()
	if b.checkpointed(id) {
		return true, nil
	}
	return b.frozen(id)
}

// Pause implements core.Pauser.
func (b *Backend) Pause(ctx context.Context, id string) error {
	if b.cfg.CRIU != "" {
		// Not while Status finishes an interrupted checkpoint or restore,
		// nor while one an earlier daemon began runs on.
		unlock := b.rollbacks.Lock(id)
		defer unlock()
		lock, err := b.lockSettled(ctx, id)
		if err != nil {
			return err
		}
		defer lock.Close()
		return b.checkpoint(ctx, id, lock)
	}
	if frozen, err := b.frozen(id); err == nil && frozen {
		return nil
	}
	return b.freeze(ctx, id, nil)
}

// lockSettled takes the sandbox's CRIU lock and settles what a crash
// left. A rollback a crash interrupted, which Status could not finish,
// is refused: the sandbox's files are half-way.
func (b *Backend) lockSettled(ctx context.Context, id string) (*os.File, error) {
	lock, err := b.lockCRIU(ctx, id)
	if err != nil {
		return nil, err
	}
	var p pendingRollback
	if err := fsutil.ReadJSON(filepath.Join(b.dir(id), "rollback.json"), &p); err == nil {
		lock.Close()
		return nil, errdefs.Precondition("sandbox %s is in the middle of a rollback to %s that a crash interrupted and that could not be finished: roll it back again", id, p.Snapshot)
	}
	if err := b.settleCheckpoint(ctx, id); err != nil {
		lock.Close()
		return nil, err
	}
	return lock, nil
}

// Resume implements core.Pauser.
func (b *Backend) Resume(ctx context.Context, id string) error {
	if b.checkpointed(id) {
		unlock := b.rollbacks.Lock(id)
		defer unlock()
		lock, err := b.lockSettled(ctx, id)
		if err != nil {
			return err
		}
		defer lock.Close()
		if b.checkpointed(id) {
			return b.restore(ctx, id, lock)
		}
	}
	if frozen, err := b.frozen(id); err == nil && !frozen {
		return nil
	}
	return b.unfreeze(ctx, id)
}

// freezerState reads the sandbox's freezer cgroup: FROZEN, FREEZING or THAWED.
func (b *Backend) freezerState(id string) (string, error) {
	return cgroups.FreezerState(b.cfg.CgroupParent, id)
}

// thaw unfreezes a sandbox's cgroup directly, for when runc no longer
// knows the container (a kill of frozen processes waits for the thaw).
func (b *Backend) thaw(id string) { cgroups.Thaw(b.cfg.CgroupParent, id) }

// frozen reports whether the container's cgroup is frozen (or freezing).
func (b *Backend) frozen(id string) (bool, error) {
	st, err := b.freezerState(id)
	return st == "FROZEN" || st == "FREEZING", err
}

// freeze stops the container's processes with `runc pause`. The runc
// inherits the sandbox's lock (lock, if the caller holds it, else taken
// here), so that a daemon started after this one died waits for a freeze
// still under way before it looks at the freezer (Paused).
func (b *Backend) freeze(ctx context.Context, id string, lock *os.File) error {
	if lock == nil {
		l, release, err := b.waitCRIU(ctx, id)
		if err != nil {
			return err
		}
		defer release()
		lock = l
	}
	var files []*os.File
	if lock != nil {
		files = []*os.File{lock}
	}
	// runc gives up on a freezer still FREEZING after its own short
	// retries, and thaws: on a loaded host that can take longer (seen
	// under two test packages at once), so it is asked again.
	for attempt := 1; ; attempt++ {
		err := b.runcFiles(ctx, id, files, "pause", id)
		if err == nil || attempt == freezeTries || !strings.Contains(err.Error(), "unable to freeze") || ctx.Err() != nil {
			return err
		}
		b.cfg.Log.Warn("runc could not freeze the sandbox in time; trying again", "sandbox", id, "attempt", attempt)
	}
}

// freezeTries is how many times a freeze runc gave up on is tried.
const freezeTries = 4

// unfreeze continues them with `runc resume`.
func (b *Backend) unfreeze(ctx context.Context, id string) error {
	return b.runc(ctx, id, "resume", id)
}
