package container

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/diskimg"
)

// A container's disk is its own ext4 filesystem: a sparse image file
// beside its other files (<StateDir>/<id>/disk.img), made when the
// sandbox is (mkfs.ext4, about 40 ms; the warm pool makes them ahead for
// the default size), loop-mounted at <StateDir>/<id>/disk, and holding
// the overlay's upper/ and work/ (and a rollback's upper.old/). A sandbox
// that writes past its size, or creates more files than its inodes (one
// per 16 KiB, one per 4 KiB below 512 MiB), gets ENOSPC, and the host
// and other sandboxes keep their space: the image grows on the host only
// as the sandbox writes, and gives back what it deletes (mounted with
// discard, which punches holes in the image).
//
// The image is made and mounted by internal/diskimg (which says why an
// image and not project quotas). Snapshots copy from the image into
// the snapshot store (links are made only within the store), and
// rollbacks keep both upper directories in the image.
//
// The loop device is set up with autoclear: it goes with the unmount
// (Destroy), and a daemon killed before it mounted leaves none. Mounts
// outlive the daemon, so a sandbox it re-adopts keeps its disk; Destroy,
// and reconcile's destroy of an orphan, unmount it. A sandbox created by
// a nook before this (an upper/ beside its files, no image) keeps its
// unlimited disk.

const (
	// DefaultDisk is a container's disk when the request names none.
	DefaultDisk = 10 << 30
	// MinDisk is the smallest disk a container may ask for: ext4's
	// metadata and journal take about 5 MiB of a small one.
	MinDisk = 64 << 20
)

func (b *Backend) diskImage(id string) string { return filepath.Join(b.dir(id), "disk.img") }
func (b *Backend) diskMount(id string) string { return filepath.Join(b.dir(id), "disk") }

// upperBase is the directory holding sandbox id's upper/, work/ and
// upper.old/: its disk, or (created by an earlier nook) its directory.
func (b *Backend) upperBase(id string) string {
	if _, err := os.Stat(b.diskImage(id)); err == nil {
		return b.diskMount(id)
	}
	return b.dir(id)
}

// diskSize is the size of sb's disk: its request, to the MiB below, or the default.
func diskSize(sb *core.Sandbox) int64 {
	if sb.DiskBytes <= 0 {
		return DefaultDisk
	}
	return max(sb.DiskBytes&^(1<<20-1), MinDisk)
}

// makeDisk makes sandbox id's disk image of size bytes (diskimg.Make).
func (b *Backend) makeDisk(ctx context.Context, id string, size int64) error {
	return diskimg.Make(ctx, b.diskImage(id), size, "the sandbox's "+core.FormatBytes(size)+" disk")
}

// mountDisk mounts sandbox id's disk image at its disk directory, unless
// it is mounted there already. The mount is root's alone: the sandbox's
// directory is searchable (userns.go), and the upper directory holds the
// sandbox's files as they are.
func (b *Backend) mountDisk(id string) error {
	return diskimg.Mount(b.diskImage(id), b.diskMount(id), "the sandbox's disk")
}

// unmountDisk unmounts sandbox id's disk and waits (a few seconds at
// most) for its loop device to detach.
func (b *Backend) unmountDisk(id string) error {
	attached, err := diskimg.Unmounted(b.diskMount(id), b.diskImage(id))
	if attached {
		b.cfg.Log.Warn("the sandbox's loop device is still attached after its disk was unmounted (it detaches when nothing holds it)", "sandbox", id)
	}
	return err
}

// mountsUnder lists the mount points at or under dir: each directory
// the walk meets is asked (statx) whether it is the root of a mount, and
// a mount is not walked into. It costs the directories under dir, not the
// host's mount table (/proc/self/mountinfo grows with every sandbox).
func mountsUnder(dir string) ([]string, error) {
	var found []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		var stx unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, 0, &stx); err != nil {
			return fmt.Errorf("statx %s: %w", path, err)
		}
		if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 {
			return fmt.Errorf("statx %s: the kernel does not say whether it is a mount point", path)
		}
		if stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
			found = append(found, path)
			return fs.SkipDir
		}
		return nil
	})
	return found, err
}

// removeSandboxDir removes a sandbox's directory, and refuses while
// anything is still mounted under it: a removal would walk into the
// mount (a leaked bind of a template would lose the template's files).
func removeSandboxDir(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(mounts) > 0 {
		return fmt.Errorf("not removing %s: still mounted under it: %s", dir, strings.Join(mounts, ", "))
	}
	return os.RemoveAll(dir)
}
