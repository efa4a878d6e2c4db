package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
)

var _ core.Snapshotter = (*Backend)(nil)

// Snapshots. A snapshot is a directory in LayersDir:
//
//	disk.qcow2  the vm's top disk layer at the time: the vm goes on in a
//	            new empty qcow2 layer on top of it. Of a paused vm, a hard
//	            link of its top (no QEMU has it open); of a running vm, a
//	            copy made while the guest is stopped for the save, never
//	            the file its QEMU holds open for writing (see Snapshot)
//	mem.state   the whole guest (RAM and devices), as a pause writes it
//	meta.json   the machine it was (vCPUs, RAM, kernel), for forks
//
// Layers chain through qcow2 backing files (a snapshot's disk backs onto
// the previous one, down to the template snapshot's disk and the
// template's image), so a chain of snapshots costs what changed between
// them, never full copies. The directory is written as NAME.tmp and
// renamed; the vm's head.json is committed after that (see pause.go), so
// a crash leaves the old vm or the new one, and at worst a layer no
// record names, which GC removes once nothing uses it.

func (b *Backend) layerDir(snapID string) string { return filepath.Join(b.cfg.LayersDir, snapID) }

func validSnapID(id string) error {
	if id == "" || strings.ContainsAny(id, "/.") {
		return errdefs.Invalid("bad snapshot id %q", id)
	}
	return nil
}

// Snapshot implements core.Snapshotter.
func (b *Backend) Snapshot(ctx context.Context, sb *core.Sandbox, snapID string, _ core.SnapshotOptions) (core.SnapshotInfo, error) {
	id := sb.ID
	if err := validSnapID(snapID); err != nil {
		return core.SnapshotInfo{}, err
	}
	defer b.operate(id)()
	b.gcMu.RLock()
	defer b.gcMu.RUnlock()
	dir := b.dir(id)
	layer := b.layerDir(snapID)
	tmp := layer + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return core.SnapshotInfo{}, err
	}
	defer os.RemoveAll(tmp)
	st, live := b.running(id)
	h := b.readHead(id)
	start := time.Now()
	switch {
	case live:
		if err := b.saveTo(ctx, id, filepath.Join(tmp, "mem.state")); err != nil {
			return core.SnapshotInfo{}, err
		}
	case h.Resume != "":
		if err := linkOrCopy(h.resumePath(dir), filepath.Join(tmp, "mem.state")); err != nil {
			return core.SnapshotInfo{}, err
		}
	default:
		return core.SnapshotInfo{}, errdefs.Precondition("the vm is neither running nor paused")
	}
	cont := func() {
		if live {
			b.recoverLocked(id) // the save is not committed: the vm continues
		}
	}
	// A paused vm's top layer is no QEMU's: the snapshot takes it (a hard
	// link). A running vm's QEMU holds its top open for writing, and goes
	// on holding it (as the new top's backing) for as long as it runs, and
	// a guest that takes its QEMU over can write through that descriptor:
	// the snapshot's disk, which rollbacks and forks start from, is a copy,
	// a new inode no QEMU has open, made now that the guest is stopped
	// (and its disk flushed) for the save.
	disk := filepath.Join(tmp, "disk.qcow2")
	saved := time.Now()
	var err error
	if live {
		err = copyLayer(filepath.Join(dir, h.Disk), disk)
	} else {
		err = linkOrCopy(filepath.Join(dir, h.Disk), disk)
	}
	if err != nil {
		cont()
		return core.SnapshotInfo{}, err
	}
	b.cfg.Log.Debug("vm snapshot", "sandbox", id, "live", live, "save", saved.Sub(start), "disk", time.Since(saved))
	meta := st
	meta.PID, meta.StartTime, meta.Saved = 0, 0, false
	if err := fsutil.WriteJSONAtomic(filepath.Join(tmp, "meta.json"), meta); err != nil {
		cont()
		return core.SnapshotInfo{}, err
	}
	if err := fsutil.WriteJSONAtomic(filepath.Join(tmp, "chain.json"), h.Chain); err != nil {
		cont()
		return core.SnapshotInfo{}, err
	}
	if err := os.Rename(tmp, layer); err != nil {
		cont()
		return core.SnapshotInfo{}, err
	}
	syncDir(b.cfg.LayersDir)
	newDisk := "disk-" + randHex(4) + ".qcow2"
	if err := b.qemuImgCreate(ctx, filepath.Join(layer, "disk.qcow2"), "qcow2", filepath.Join(dir, newDisk)); err != nil {
		cont()
		return core.SnapshotInfo{}, err
	}
	chain := b.layerChain(snapID)
	restarted := false
	if !live {
		// Paused: it stays paused, on the new layer.
		if err := b.writeHead(id, head{Disk: newDisk, Chain: chain, Resume: h.Resume}); err != nil {
			return core.SnapshotInfo{}, err
		}
		os.Remove(filepath.Join(dir, h.Disk))
	} else if r, err := b.goOn(ctx, id, st, h.Disk, head{Disk: newDisk, Chain: chain, Resume: filepath.Join(layer, "mem.state")}); err != nil {
		return core.SnapshotInfo{}, err
	} else {
		restarted = r
	}
	if live {
		// From the save's QMP stop to the cont (or the restart): the
		// guest stood still this long (make bench reads it).
		b.cfg.Log.Debug("vm snapshot taken", "sandbox", id, "guest_stopped", time.Since(start))
	}
	return core.SnapshotInfo{Memory: true, SizeBytes: b.SnapshotUsage(snapID), Restarted: restarted}, nil
}

// goOn lets a vm whose snapshot was just taken (its guest stopped since
// the save) go on, on the new top layer that next names, with the
// snapshot's state as next.Resume.
//
// The head names the snapshot's state first: a crash from then on ends
// this QEMU, and the vm starts again from the snapshot, which is exactly
// where its guest is. Then QEMU's copy-on-write switch puts the new layer
// under the running guest, the head drops the state, and the guest goes
// on: it stopped only for the save, the disk copy and the switch. In
// this QEMU the new layer's backing is the old top (oldDisk, which it
// keeps open and no longer writes); in the head, and so in any later
// start, it is the snapshot's copy of it, made while the guest was
// stopped: the same bytes, so the new layer reads the same over either.
// Should the switch fail, the vm starts again from the snapshot in a new
// QEMU instead (restarted). Once the head names the snapshot, the snapshot is taken
// whatever happens next: what fails after that is logged, and the next
// operation's recovery finishes it.
func (b *Backend) goOn(ctx context.Context, id string, st state, oldDisk string, next head) (restarted bool, err error) {
	dir := b.dir(id)
	if err := b.writeHead(id, next); err != nil {
		b.recoverLocked(id) // not committed: the vm continues as it was
		return false, err
	}
	ctx = context.WithoutCancel(ctx)
	if err := b.switchTop(ctx, id, filepath.Join(dir, next.Disk)); err != nil {
		b.cfg.Log.Warn("the copy-on-write switch of a snapshot failed: starting the vm again from the snapshot", "sandbox", id, "err", err)
		if err := b.commitSaved(ctx, id, st, next, oldDisk); err != nil {
			return true, err
		}
		if err := b.startSaved(ctx, id, st); err != nil {
			// Taken all the same: the vm is saved at the snapshot, and the
			// next resume starts it from there.
			b.cfg.Log.Error("a vm did not start again from its snapshot", "sandbox", id, "err", err)
		}
		return true, nil
	}
	running := next
	running.Resume = ""
	if err := b.writeHead(id, running); err != nil {
		b.cfg.Log.Error("record a vm's new disk layer after its snapshot (it starts again from the snapshot)", "sandbox", id, "err", err)
		return false, nil
	}
	os.Remove(filepath.Join(dir, oldDisk))
	// The guest goes on, then the record says so: a crash in between
	// leaves run.json saying "saved" with no state committed, and the
	// recovery continues a running guest, which is harmless.
	mon, err := dialQMP(ctx, filepath.Join(dir, "qmp.sock"))
	if err == nil {
		err = mon.run("cont", nil, nil)
		mon.close()
	}
	if err != nil {
		b.cfg.Log.Error("continue a vm after its snapshot (the next operation on it does)", "sandbox", id, "err", err)
		return false, nil
	}
	st.Saved = false
	if err := b.writeRun(id, st); err != nil {
		b.cfg.Log.Error("record a vm running after its snapshot", "sandbox", id, "err", err)
	}
	return false, nil
}

// switchTop gives the vm's live QEMU the new top layer disk.
func (b *Backend) switchTop(ctx context.Context, id, disk string) error {
	f, err := os.OpenFile(disk, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	mon, err := dialQMP(ctx, filepath.Join(b.dir(id), "qmp.sock"))
	if err != nil {
		return err
	}
	defer mon.close()
	return mon.switchTop(f, "top-"+randHex(4))
}

// Rollback implements core.Snapshotter: the vm's current state is
// discarded and it starts from the snapshot's.
func (b *Backend) Rollback(ctx context.Context, sb *core.Sandbox, snapID string) error {
	id := sb.ID
	if err := validSnapID(snapID); err != nil {
		return err
	}
	defer b.operate(id)()
	b.gcMu.RLock()
	defer b.gcMu.RUnlock()
	layer := b.layerDir(snapID)
	if _, err := os.Stat(filepath.Join(layer, "meta.json")); err != nil {
		return errdefs.NotFound("snapshot %s has no saved vm", snapID)
	}
	dir := b.dir(id)
	st, live := b.running(id)
	h := b.readHead(id)
	newDisk := "disk-" + randHex(4) + ".qcow2"
	if err := b.qemuImgCreate(ctx, filepath.Join(layer, "disk.qcow2"), "qcow2", filepath.Join(dir, newDisk)); err != nil {
		return err
	}
	next := head{Disk: newDisk, Chain: b.layerChain(snapID), Resume: filepath.Join(layer, "mem.state")}
	if live {
		if err := b.commitSaved(ctx, id, st, next, h.Disk); err != nil {
			return err
		}
	} else {
		if err := b.writeHead(id, next); err != nil {
			return err
		}
		os.Remove(filepath.Join(dir, h.Disk))
		if p := h.resumePath(dir); p != "" && strings.HasPrefix(p, dir+string(filepath.Separator)) {
			os.Remove(p)
		}
	}
	if st.KernelHash == "" {
		if err := fsutil.ReadJSON(filepath.Join(layer, "meta.json"), &st); err != nil {
			return err
		}
	}
	return b.startSaved(ctx, id, st)
}

// Fork implements core.Snapshotter: a new vm, sb, starts from the
// snapshot on a layer of its own.
func (b *Backend) Fork(ctx context.Context, sb *core.Sandbox, snapID string) (err error) {
	if err := validSnapID(snapID); err != nil {
		return err
	}
	b.gcMu.RLock()
	defer b.gcMu.RUnlock()
	layer := b.layerDir(snapID)
	var st state
	if err := fsutil.ReadJSON(filepath.Join(layer, "meta.json"), &st); err != nil {
		return errdefs.NotFound("snapshot %s has no saved vm", snapID)
	}
	dir := b.dir(sb.ID)
	if err := os.MkdirAll(b.cfg.StateDir, 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			b.Destroy(context.WithoutCancel(ctx), sb.ID)
		}
	}()
	disk := "disk-" + randHex(4) + ".qcow2"
	if err := b.qemuImgCreate(ctx, filepath.Join(layer, "disk.qcow2"), "qcow2", filepath.Join(dir, disk)); err != nil {
		return err
	}
	st.CPULimit, st.Boot = sb.CPUs, "fork"
	if err := b.writeRun(sb.ID, st); err != nil {
		return err
	}
	if err := b.writeHead(sb.ID, head{Disk: disk, Chain: b.layerChain(snapID), Resume: filepath.Join(layer, "mem.state")}); err != nil {
		return err
	}
	if err := b.startSaved(ctx, sb.ID, st); err != nil {
		return err
	}
	st, _ = b.readRun(sb.ID)
	sb.BackendState, _ = json.Marshal(st)
	return nil
}

// SnapshotUsage implements core.Snapshotter: the disk a snapshot's own
// files take (its layer and its memory), not what it shares.
func (b *Backend) SnapshotUsage(snapID string) int64 {
	var n int64
	for _, f := range []string{"disk.qcow2", "mem.state"} {
		if fi, err := os.Stat(filepath.Join(b.layerDir(snapID), f)); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
	}
	return n
}

// GC implements core.Snapshotter: it removes snapshot layers that are not
// kept (the daemon's records) and that no vm's disk chain or saved state
// uses, and unfinished ones.
func (b *Backend) GC(ctx context.Context, keep []string) error {
	// No snapshot, rollback or fork is between writing a layer and
	// recording it (in a head) while GC decides.
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
	for _, id := range ids {
		h := b.readHead(id)
		if p := h.resumePath(b.dir(id)); p != "" {
			if snap, ok := b.layerOf(p); ok {
				used[snap] = true
			}
		}
		for _, l := range h.Chain {
			if snap, ok := b.layerOf(l.Path); ok {
				used[snap] = true
			}
		}
	}
	// Kept layers keep the layers below them.
	for snap := range used {
		for _, l := range b.layerChain(snap) {
			if s, ok := b.layerOf(l.Path); ok {
				used[s] = true
			}
		}
	}
	return fsutil.RemoveUnused(b.cfg.LayersDir, used)
}

// RefersToSnapshots implements core.SnapshotReferrer: what GC reads of a
// vm (its head) names a file of a snapshot's.
func (b *Backend) RefersToSnapshots(id string) bool {
	data, err := os.ReadFile(filepath.Join(b.dir(id), "head.json"))
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	var h head
	if err != nil || json.Unmarshal(data, &h) != nil {
		return true
	}
	if _, ok := b.layerOf(h.resumePath(b.dir(id))); ok {
		return true
	}
	for _, l := range h.Chain {
		if _, ok := b.layerOf(l.Path); ok {
			return true
		}
	}
	return false
}

// layerOf returns the snapshot a file in LayersDir belongs to.
func (b *Backend) layerOf(path string) (string, bool) {
	rel, err := filepath.Rel(b.cfg.LayersDir, path)
	if err != nil || strings.HasPrefix(rel, "..") || !strings.Contains(rel, string(filepath.Separator)) {
		return "", false
	}
	return strings.SplitN(rel, string(filepath.Separator), 2)[0], true
}

// layerChain is the backing chain of a disk that starts at snapshot
// snapID's layer: the layer itself, then what its chain.json records.
func (b *Backend) layerChain(snapID string) []layerRef {
	var below []layerRef
	fsutil.ReadJSON(filepath.Join(b.layerDir(snapID), "chain.json"), &below)
	return append([]layerRef{{Path: filepath.Join(b.layerDir(snapID), "disk.qcow2"), Format: "qcow2"}}, below...)
}

// copyLayer copies the disk layer src to a new file dst (created, not
// replaced) and syncs it: the data in kernel copies (copy_file_range,
// which Go's io.Copy between files uses), extent by extent, so that the
// holes of a sparse image stay holes.
func copyLayer(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(dst)
		}
	}()
	size := fi.Size()
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // a hole to the end
		}
		if err != nil {
			return fmt.Errorf("copy %s: seek data: %w", src, err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("copy %s: seek hole: %w", src, err)
		}
		if _, err := in.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if n, err := io.Copy(out, io.LimitReader(in, hole-data)); err != nil {
			return fmt.Errorf("copy %s: %w", src, err)
		} else if n != hole-data {
			return fmt.Errorf("copy %s: it changed while it was copied", src)
		}
		off = hole
	}
	if err := out.Truncate(size); err != nil {
		return err
	}
	return out.Sync()
}

// linkOrCopy hard-links src to dst, copying where a link cannot be made.
func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	return copyFile(src, dst)
}
