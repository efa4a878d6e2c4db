package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/core"
)

// With CRIU configured, a container's snapshot has its memory too: the
// container is frozen, dumped with --leave-running beside the copy of its
// upper directory, and thawed, so a rollback or a fork brings its
// processes back as they stood. The images are in
//
//	<SnapshotDir>/<snapID>/memory/   CRIU's images (inventory.img and the rest)
//
// written inside the snapshot's .tmp directory, so they are committed
// with its layer by the same rename. A snapshot of a sandbox paused to
// disk links its checkpoint's images. A rollback restores TCP connections
// as a resume does (one whose peer moved on gets a reset from it); a fork
// brings them back closed, since it has another address, and gets its
// own hostname in the restored UTS namespace.

// memoryDir is where snapshot snapID's images are.
func (b *Backend) memoryDir(snapID string) string {
	return filepath.Join(b.layerDir(snapID), "memory")
}

// snapshotMemory returns snapshot snapID's images for start, or nil when
// it has none or this backend has no CRIU to restore them with (the
// sandbox then starts afresh on the snapshot's files).
func (b *Backend) snapshotMemory(snapID string, lock *os.File, tcpClose bool) *memoryImages {
	dir := b.memoryDir(snapID)
	if _, err := os.Stat(filepath.Join(dir, "inventory.img")); err != nil {
		return nil
	}
	if b.cfg.CRIU == "" {
		b.cfg.Log.Warn("snapshot has the sandbox's memory but CRIU is not configured: starting its processes afresh", "snapshot", snapID)
		return nil
	}
	return &memoryImages{dir: dir, lock: lock, tcpClose: tcpClose}
}

// restoreSnapshot is the end of start for a snapshot with memory: the
// container's processes come back from mem's images in the mounted root
// and network namespace start prepared.
func (b *Backend) restoreSnapshot(ctx context.Context, sb *core.Sandbox, mem *memoryImages) error {
	id := sb.ID
	if err := checkMemory(mem.dir, "restoring the snapshot", 0); err != nil {
		return err
	}
	lock := mem.lock
	if lock == nil {
		l, err := b.lockCRIU(ctx, id)
		if err != nil {
			return err
		}
		defer l.Close()
		lock = l
	}
	// A snapshot of a sandbox without a user namespace (made before
	// them) cannot be restored into one: its processes start afresh.
	if m, err := b.readIDMap(id); err == nil && m.enabled() {
		if imgs, _ := filepath.Glob(filepath.Join(mem.dir, "userns-*.img")); len(imgs) == 0 {
			return restoreError{errors.New("the snapshot's processes ran without a user namespace, and this sandbox has one")}
		}
	}
	start := time.Now()
	if err := b.runcRestore(ctx, id, lock, mem.dir, mem.tcpClose); err != nil {
		return restoreError{fmt.Errorf("the snapshot's processes: %w", err)}
	}
	restored := time.Now()
	st, err := b.recordInit(id)
	if err != nil {
		return err
	}
	sb.BackendState = st
	init, err := b.lookupInit(id)
	if err != nil {
		return err
	}
	// The UTS namespace came back with the snapshot's hostname, which
	// the sandbox (no CAP_SYS_ADMIN) cannot change.
	if err := setHostname(init.PID, sb.Name); err != nil {
		return fmt.Errorf("set the restored sandbox's hostname: %w", err)
	}
	b.cfg.Log.Debug("restore from snapshot", "sandbox", id, "criu", restored.Sub(start), "total", time.Since(start))
	return nil
}

// restoreError is a restore CRIU could not do.
type restoreError struct{ error }

func (e restoreError) Unwrap() error { return e.error }

// linkImages makes dst hold the images of src: hard links (images are
// never written once committed), copies across filesystems.
func linkImages(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		err := os.Link(from, to)
		if errors.Is(err, unix.EXDEV) {
			var fi os.FileInfo
			if fi, err = e.Info(); err == nil {
				err = copyFile(from, to, fi.Sys().(*syscall.Stat_t))
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}
