package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
)

// A container snapshot is its disk (a copy of its upper directory) and,
// with CRIU configured, its memory (memory.go). Without memory, a rollback
// or a fork starts the sandbox's processes afresh on the snapshot's files.
//
// Files:
//
//	<SnapshotDir>/<snapID>/layer       the copied upper directory (read-only by convention)
//	<SnapshotDir>/<snapID>/chain.json  the layers below it ({template, layers})
//	<SnapshotDir>/<snapID>/memory/     CRIU's images of its processes, if it has them
//	<StateDir>/<id>/chain.json         the layers under the sandbox's upper directory
//	<StateDir>/<id>/manifest.json      what its upper held at its last snapshot
//
// A layer is written under <snapID>.tmp and renamed into place when
// complete; the daemon records the snapshot after that. A crash leaves a
// .tmp or an unrecorded layer, which GC removes.

var _ core.Snapshotter = (*Backend)(nil)

// chain is what a root filesystem is stacked from.
type chain struct {
	Template string   `json:"template"` // template build ID: its rootfs is at the bottom
	Layers   []string `json:"layers"`   // snapshot IDs, topmost first
}

func (b *Backend) layerDir(snapID string) string { return filepath.Join(b.cfg.SnapshotDir, snapID) }

func validSnapID(snapID string) error {
	if snapID == "" || strings.ContainsAny(snapID, "/.,:") {
		return errdefs.Invalid("bad snapshot id %q", snapID)
	}
	return nil
}

// RefersToSnapshots implements core.SnapshotReferrer: what GC reads of a
// sandbox names a snapshot.
func (b *Backend) RefersToSnapshots(id string) bool {
	c, err := b.sandboxChain(id)
	if err != nil && !errors.Is(err, os.ErrNotExist) || len(c.Layers) > 0 {
		return true
	}
	for _, f := range []string{"manifest.json", "rollback.json"} {
		if _, err := os.Lstat(filepath.Join(b.dir(id), f)); !errors.Is(err, os.ErrNotExist) {
			return true
		}
	}
	return false
}

// sandboxChain is the chain under a sandbox's upper directory.
func (b *Backend) sandboxChain(id string) (chain, error) {
	var c chain
	err := fsutil.ReadJSON(filepath.Join(b.dir(id), "chain.json"), &c)
	return c, err
}

// snapshotChain is the whole chain a snapshot's files are seen through:
// its own layer on top of the chain it was taken over.
func (b *Backend) snapshotChain(snapID string) (chain, error) {
	if err := validSnapID(snapID); err != nil {
		return chain{}, err
	}
	var c chain
	if err := fsutil.ReadJSON(filepath.Join(b.layerDir(snapID), "chain.json"), &c); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return chain{}, errdefs.NotFound("snapshot %s has no files on this host", snapID)
		}
		return chain{}, err
	}
	c.Layers = append([]string{snapID}, c.Layers...)
	return c, nil
}

// lowerDirs turns a chain into overlay lower directories, topmost first.
func (b *Backend) lowerDirs(c chain) ([]string, error) {
	dirs, _, err := b.lowerDirsN(c)
	return dirs, err
}

// lowerDirsN is lowerDirs, and how many of the lowers (the last ones)
// are the template's.
func (b *Backend) lowerDirsN(c chain) ([]string, int, error) {
	var tpl []string
	if b.cfg.TemplateLayers != nil {
		var err error
		if tpl, err = b.cfg.TemplateLayers(c.Template); err != nil {
			return nil, 0, err
		}
	}
	if tpl == nil {
		rootfs, err := b.cfg.TemplateRootfs(c.Template)
		if err != nil {
			return nil, 0, err
		}
		tpl = []string{rootfs}
	}
	dirs := make([]string, 0, len(c.Layers)+len(tpl))
	for _, l := range c.Layers {
		d := filepath.Join(b.layerDir(l), "layer")
		if _, err := os.Stat(d); err != nil {
			return nil, 0, fmt.Errorf("snapshot layer %s: %w", l, err)
		}
		dirs = append(dirs, d)
	}
	return append(dirs, tpl...), len(tpl), nil
}

// Snapshot implements core.Snapshotter: the container is frozen while its
// processes are dumped (with CRIU) and its upper directory is copied (a
// paused one stays paused).
func (b *Backend) Snapshot(ctx context.Context, sb *core.Sandbox, snapID string, opts core.SnapshotOptions) (core.SnapshotInfo, error) {
	if err := validSnapID(snapID); err != nil {
		return core.SnapshotInfo{}, err
	}
	id := sb.ID
	if err := validID(id); err != nil {
		return core.SnapshotInfo{}, err
	}
	// Not while Status finishes an interrupted rollback of it, nor while
	// the runc of an earlier daemon's checkpoint or restore runs on.
	unlock := b.rollbacks.Lock(id)
	defer unlock()
	var lock *os.File
	if b.cfg.CRIU != "" {
		l, err := b.lockSettled(ctx, id)
		if err != nil {
			return core.SnapshotInfo{}, err
		}
		defer l.Close()
		lock = l
	}
	paused, err := b.frozen(id)
	if b.checkpointed(id) {
		paused, err = true, nil // nothing runs: no freeze needed
	}
	if err != nil {
		return core.SnapshotInfo{}, fmt.Errorf("sandbox %s is not running (%w): only a running or paused sandbox can be snapshotted", id, err)
	}
	// Its memory: the images of a pause to disk, or a dump of a running
	// container (one frozen in RAM stays frozen: its snapshot is of the
	// disk, since a dump may have to let it run a moment).
	memory, dump := false, false
	release := func() {}
	if b.cfg.CRIU != "" && !b.checkpointed(id) && !paused {
		if opts.Quiesce == nil {
			dump = true
		} else if r, ok := opts.Quiesce(); ok {
			release, dump = r, true
		} else {
			b.cfg.Log.Info("snapshot of the disk only: requests to the sandbox are in flight, and its memory cannot be saved without ending them", "sandbox", id)
		}
	}
	defer func() { release() }()
	b.gcMu.RLock()
	defer b.gcMu.RUnlock()
	base, err := b.sandboxChain(id)
	if errors.Is(err, os.ErrNotExist) && sb.TemplateID != "" {
		if _, serr := os.Stat(filepath.Join(b.upperBase(id), "upper")); serr == nil {
			// Created by a nook without snapshots: its upper lies right over the template.
			base, err = chain{Template: sb.TemplateID}, nil
		}
	}
	if err != nil {
		return core.SnapshotInfo{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	m, err := b.readIDMap(id)
	if err != nil {
		return core.SnapshotInfo{}, err
	}
	var prev *manifest
	if err := fsutil.ReadJSON(filepath.Join(b.dir(id), "manifest.json"), &prev); err != nil && !errors.Is(err, os.ErrNotExist) {
		b.cfg.Log.Warn("previous snapshot manifest unreadable: copying every file", "sandbox", id, "err", err)
		prev = nil
	}
	if err := os.MkdirAll(b.cfg.SnapshotDir, 0o700); err != nil {
		return core.SnapshotInfo{}, err
	}
	final := b.layerDir(snapID)
	tmp := final + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return core.SnapshotInfo{}, err
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return core.SnapshotInfo{}, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	prevLayer := ""
	if prev != nil && validSnapID(prev.Snapshot) == nil {
		prevLayer = filepath.Join(b.layerDir(prev.Snapshot), "layer")
	}
	if _, err := os.Stat(b.diskImage(id)); err == nil {
		if err := b.mountDisk(id); err != nil { // paused to disk across a reboot
			return core.SnapshotInfo{}, err
		}
	}
	upper := filepath.Join(b.upperBase(id), "upper")
	if _, err := os.Stat(b.rootfs(id)); err != nil {
		return core.SnapshotInfo{}, fmt.Errorf("sandbox %s has no root filesystem: %w", id, err)
	}
	// Flushed before the freeze (most of the work) and again frozen: a
	// page written back is write-protected, so the next write through a
	// shared mapping moves its file's ctime (see fileKey).
	if err := fsutil.Syncfs(upper); err != nil {
		return core.SnapshotInfo{}, err
	}
	memDir := filepath.Join(tmp, "memory")
	if b.cfg.CRIU != "" && b.checkpointed(id) {
		if err := linkImages(b.checkpointDir(id), memDir); err != nil {
			return core.SnapshotInfo{}, fmt.Errorf("keep the paused sandbox's memory: %w", err)
		}
		memory = true
	}
	frozen := time.Now()
	thawed := paused
	thaw := func() error {
		if thawed {
			return nil
		}
		thawed = true
		err := b.unfreeze(context.WithoutCancel(ctx), id)
		if err != nil {
			b.thaw(id) // straight in the cgroup
			if p, perr := b.frozen(id); perr == nil && !p {
				err = nil
			}
		}
		b.cfg.Log.Debug("snapshot freeze", "sandbox", id, "duration", time.Since(frozen))
		return err
	}
	if !paused {
		if err := b.freeze(ctx, id, lock); err != nil {
			return core.SnapshotInfo{}, err
		}
		defer thaw()
	}
	if dump {
		if err := clearDir(memDir); err != nil {
			return core.SnapshotInfo{}, err
		}
		if derr := b.dump(ctx, id, lock, memDir); derr != nil {
			// Still a snapshot of the disk; the log says why not more.
			b.cfg.Log.Warn("snapshot of the disk only: its processes could not be saved", "sandbox", id, "err", derr)
			if err := os.RemoveAll(memDir); err != nil {
				return core.SnapshotInfo{}, err
			}
			if p, _ := b.frozen(id); !p {
				if err := b.freeze(ctx, id, lock); err != nil {
					return core.SnapshotInfo{}, err
				}
			}
		} else {
			memory = true
		}
	}
	if err := fsutil.Syncfs(upper); err != nil {
		return core.SnapshotInfo{}, err
	}
	next, err := copyLayer(upper, filepath.Join(tmp, "layer"), prev, prevLayer, m.Base)
	terr := thaw()
	release() // the agent takes requests again
	release = func() {}
	if terr != nil {
		return core.SnapshotInfo{}, fmt.Errorf("thaw the sandbox after its snapshot: %w", terr)
	}
	if err != nil {
		return core.SnapshotInfo{}, fmt.Errorf("copy the sandbox's files: %w", err)
	}
	next.Snapshot = snapID
	if memory {
		if err := syncFiles(memDir); err != nil {
			return core.SnapshotInfo{}, err
		}
	}
	if err := fsutil.WriteJSONAtomic(filepath.Join(tmp, "chain.json"), base); err != nil {
		return core.SnapshotInfo{}, err
	}
	if err := fsutil.Syncfs(tmp); err != nil {
		return core.SnapshotInfo{}, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return core.SnapshotInfo{}, err
	}
	ok = true
	fsutil.SyncDir(b.cfg.SnapshotDir)
	// Only now may the next snapshot share this one's files.
	if err := fsutil.WriteJSONAtomic(filepath.Join(b.dir(id), "manifest.json"), next); err != nil {
		b.cfg.Log.Warn("save snapshot manifest: the next snapshot copies every file", "sandbox", id, "err", err)
	}
	return core.SnapshotInfo{Memory: memory, SizeBytes: layerUsage(final)}, nil
}

// Rollback implements core.Snapshotter: the container is stopped, its
// upper directory set aside (until the new state runs; the old one is
// started again if the new one cannot), and it starts again over the
// snapshot's chain with sb's identity and limits: its processes restored
// from the snapshot's memory if it has them, afresh otherwise.
func (b *Backend) Rollback(ctx context.Context, sb *core.Sandbox, snapID string) error {
	unlock := b.rollbacks.Lock(sb.ID)
	defer unlock()
	lock, err := b.lockCRIU(ctx, sb.ID)
	if err != nil {
		return err
	}
	defer lock.Close()
	return b.rollbackLocked(ctx, sb, snapID, lock, false)
}

// maxLayers is how many lower layers the kernel stacks in one overlay.
const maxLayers = 500

// rollbackLocked is Rollback; the caller holds the sandbox's rollbacks
// and CRIU locks. finishing: it completes one a crash interrupted (the
// sandbox is half-way, and must not be refused).
func (b *Backend) rollbackLocked(ctx context.Context, sb *core.Sandbox, snapID string, lock *os.File, finishing bool) error {
	b.gcMu.RLock()
	defer b.gcMu.RUnlock()
	if err := validID(sb.ID); err != nil {
		return err
	}
	dir := b.dir(sb.ID)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	c, err := b.snapshotChain(snapID)
	if err != nil {
		return err
	}
	// Everything the new state needs is there before the old one goes.
	if _, err := b.lowerDirs(c); err != nil {
		return err
	}
	if len(c.Layers) >= maxLayers {
		return errdefs.Precondition("snapshot %s sits on %d layers, and the kernel stacks at most %d: roll back to an older snapshot", snapID, len(c.Layers), maxLayers)
	}
	mem := b.snapshotMemory(snapID, lock, false)
	if mem != nil && !finishing {
		// Refused before anything stops; the sandbox's own memory is freed first.
		if err := checkMemory(mem.dir, "rolling back to "+snapID, cgroups.MemoryUsage(b.cfg.CgroupParent, sb.ID)); err != nil {
			return err
		}
	}
	// The state to go back to if the new one cannot start: the one a
	// rollback a crash interrupted recorded, or the sandbox's.
	var pending pendingRollback
	old, err := b.sandboxChain(sb.ID)
	if fsutil.ReadJSON(filepath.Join(dir, "rollback.json"), &pending) == nil && pending.Old != nil {
		old, err = *pending.Old, nil
	} else if errors.Is(err, os.ErrNotExist) {
		old, err = chain{Template: sb.TemplateID}, nil
	}
	if err != nil {
		return err
	}
	// From here a crash before the new container runs leaves this
	// marker, and Status finishes the rollback.
	if err := fsutil.WriteJSONAtomic(filepath.Join(dir, "rollback.json"), pendingRollback{Snapshot: snapID, Old: &old}); err != nil {
		return err
	}
	checkpointed := b.checkpointed(sb.ID)
	if err := b.stop(ctx, sb.ID); err != nil {
		os.Remove(filepath.Join(dir, "rollback.json"))
		return err
	}
	// The old upper directory is kept until the new container runs. One
	// already there is the old state of a rollback a crash interrupted,
	// and the current one a half-made new state.
	if _, err := os.Stat(b.diskImage(sb.ID)); err == nil {
		if err := b.mountDisk(sb.ID); err != nil {
			os.Remove(filepath.Join(dir, "rollback.json"))
			return err
		}
	}
	// Within the sandbox's disk: the new state must fit beside the old.
	base := b.upperBase(sb.ID)
	upper, kept := filepath.Join(base, "upper"), filepath.Join(base, "upper.old")
	if _, serr := os.Stat(kept); serr == nil {
		err = os.RemoveAll(upper)
	} else {
		err = os.Rename(upper, kept)
	}
	if err != nil {
		return err
	}
	for _, d := range []string{filepath.Join(base, "work"), filepath.Join(dir, "manifest.json")} {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	if err := b.start(ctx, sb, c, false, mem); err != nil {
		// Back to the old state: running, or paused to disk as it was.
		rerr := errors.Join(os.RemoveAll(upper), os.RemoveAll(filepath.Join(base, "work")), os.Rename(kept, upper))
		if checkpointed {
			if rerr == nil {
				rerr = fsutil.WriteJSONAtomic(filepath.Join(dir, "chain.json"), old)
			}
			os.Remove(filepath.Join(dir, "rollback.json"))
			if rerr != nil {
				return fmt.Errorf("%w; and the sandbox's files could not be put back: %v", err, rerr)
			}
			return fmt.Errorf("%w (the sandbox is still paused to disk as it was before the rollback)", err)
		}
		if rerr == nil {
			rerr = b.start(ctx, sb, old, false, nil)
		}
		os.Remove(filepath.Join(dir, "rollback.json"))
		if rerr != nil {
			return fmt.Errorf("%w; and the sandbox could not start again as it was: %v", err, rerr)
		}
		return fmt.Errorf("%w (the sandbox runs again on its files from before the rollback, its processes started afresh)", err)
	}
	// The processes of a pause to disk are of the old state.
	if err := b.dropCheckpoint(sb.ID); err != nil {
		return err
	}
	if err := os.RemoveAll(kept); err != nil {
		return err
	}
	return os.Remove(filepath.Join(dir, "rollback.json"))
}

// pendingRollback marks a rollback begun and not finished.
type pendingRollback struct {
	Snapshot string `json:"snapshot"`
	Old      *chain `json:"old,omitempty"` // the chain under upper.old
}

// finishRollback completes a rollback a crash interrupted, if there is
// one, and reports whether it started the container again. The caller
// holds the sandbox's rollbacks and CRIU locks.
func (b *Backend) finishRollback(ctx context.Context, sb *core.Sandbox, running bool, lock *os.File) (bool, error) {
	var p pendingRollback
	path := filepath.Join(b.dir(sb.ID), "rollback.json")
	if err := fsutil.ReadJSON(path, &p); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	if running { // the crash came after the new container started
		return false, errors.Join(os.RemoveAll(filepath.Join(b.upperBase(sb.ID), "upper.old")), os.Remove(path))
	}
	b.cfg.Log.Info("finishing an interrupted rollback", "sandbox", sb.ID, "snapshot", p.Snapshot)
	if err := b.rollbackLocked(ctx, sb, p.Snapshot, lock, true); err != nil {
		return false, fmt.Errorf("finish the rollback to %s: %w", p.Snapshot, err)
	}
	return true, nil
}

// Fork implements core.Snapshotter: a new container over the snapshot's
// chain, its processes restored from the snapshot's memory if it has them.
func (b *Backend) Fork(ctx context.Context, sb *core.Sandbox, snapID string) error {
	b.gcMu.RLock()
	defer b.gcMu.RUnlock()
	c, err := b.snapshotChain(snapID)
	if err != nil {
		return err
	}
	if c.Template != sb.TemplateID {
		return fmt.Errorf("snapshot %s is of template build %s, not %s", snapID, c.Template, sb.TemplateID)
	}
	return b.start(ctx, sb, c, true, b.snapshotMemory(snapID, nil, true))
}

// SnapshotUsage implements core.Snapshotter.
func (b *Backend) SnapshotUsage(snapID string) int64 {
	if validSnapID(snapID) != nil {
		return 0
	}
	return layerUsage(b.layerDir(snapID))
}

// GC implements core.Snapshotter: it removes layers that are not kept and
// that no sandbox's chain (nor a kept layer's chain) uses, and unfinished ones.
func (b *Backend) GC(ctx context.Context, keep []string) error {
	b.gcMu.Lock()
	defer b.gcMu.Unlock()
	used := map[string]bool{}
	for _, id := range keep {
		used[id] = true
	}
	ids, err := b.List(ctx)
	if err != nil {
		return err
	}
	// A layer is removed only when nothing could use it: any sandbox
	// file GC cannot read stops it.
	for _, id := range ids {
		c, err := b.sandboxChain(id)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		for _, l := range c.Layers {
			used[l] = true
		}
		// A sandbox's last snapshot stays while its manifest names it:
		// the daemon records a snapshot only after the backend took it,
		// and the next snapshot shares its unchanged files.
		var m manifest
		if err := fsutil.ReadJSON(filepath.Join(b.dir(id), "manifest.json"), &m); err == nil {
			used[m.Snapshot] = true
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
		// So do both sides of an interrupted rollback.
		var p pendingRollback
		if err := fsutil.ReadJSON(filepath.Join(b.dir(id), "rollback.json"), &p); err == nil {
			used[p.Snapshot] = true
			if p.Old != nil {
				for _, l := range p.Old.Layers {
					used[l] = true
				}
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	for snap := range used {
		if c, err := b.snapshotChain(snap); err == nil {
			for _, l := range c.Layers {
				used[l] = true
			}
		}
	}
	return fsutil.RemoveUnused(b.cfg.SnapshotDir, used)
}
