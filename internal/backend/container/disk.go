package container

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/fsutil"
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
// Why an image and not project quotas: quotas need the data directory's
// filesystem mounted with prjquota, which the host's root is not; an
// image per sandbox needs nothing of the host but loop devices, is one
// unmount and one file to clean up, and its limit cannot be lost by a
// file moving between directories. Snapshots copy from the image into
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

// makeDisk makes sandbox id's disk image of size bytes: a sparse file
// with an ext4 filesystem, its inode tables left for the kernel to
// initialise lazily (never zeroed on the host: see mountDisk).
func (b *Backend) makeDisk(ctx context.Context, id string, size int64) error {
	img := b.diskImage(id)
	tmp := img + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("make the sandbox's disk image: %w", err)
	}
	// mkfs.ext4 of a file reads the host's whole mount table (is it
	// mounted?), which grows with every sandbox; of a block device it
	// only opens the device exclusively. So: through a loop device,
	// which detaches when closed (autoclear).
	loop, err := attachLoop(f)
	if err != nil {
		os.Remove(tmp)
		return err
	}
	// -m 0: no blocks reserved for root (the sandbox's processes are root).
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=0:0", loop.Name()).CombinedOutput()
	loop.Close()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("mkfs.ext4 of the sandbox's %s disk: %w: %s", core.FormatBytes(size), err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, img); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// mountDisk mounts sandbox id's disk image at its disk directory, unless
// it is mounted there already.
func (b *Backend) mountDisk(id string) error {
	mnt := b.diskMount(id)
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if mounted, err := fsutil.IsMountPoint(mnt); err != nil || mounted {
		return err
	}
	img, err := os.OpenFile(b.diskImage(id), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("the sandbox's disk: %w", err)
	}
	defer img.Close()
	loop, err := attachLoop(img)
	if err != nil {
		return err
	}
	// The mount holds the device; autoclear detaches it with the unmount.
	defer loop.Close()
	// discard: what the sandbox deletes goes back to the host.
	// noinit_itable: the kernel does not zero the inode tables in the
	// background (uninit_bg makes that unneeded), so they take no host space.
	if err := unix.Mount(loop.Name(), mnt, "ext4", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOATIME, "discard,noinit_itable"); err != nil {
		return fmt.Errorf("mount the sandbox's disk (%s on %s): %w", b.diskImage(id), loop.Name(), err)
	}
	// Root's alone: the sandbox's directory is searchable (userns.go),
	// and the upper directory holds the sandbox's files as they are.
	if err := os.Chmod(mnt, 0o700); err != nil {
		unmount(mnt)
		return err
	}
	return nil
}

// attachLoop attaches the file img to a free loop device, with autoclear:
// the device detaches when nothing holds it any more (no open file, no mount).
func attachLoop(img *os.File) (*os.File, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("loop devices: %w", err)
	}
	defer ctl.Close()
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("find a free loop device: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("loop device %d: %w", n, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO}}
		copy(cfg.Info.File_name[:], img.Name())
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		// Another process took the device between the two calls.
		if !errors.Is(err, unix.EBUSY) || attempt == 20 {
			return nil, fmt.Errorf("attach %s to loop device %d: %w", img.Name(), n, err)
		}
	}
}

// unmountDisk unmounts sandbox id's disk and waits (a few seconds at
// most) for its loop device to detach: the kernel detaches an autoclear
// device in the background after the last close.
func (b *Backend) unmountDisk(id string) error {
	mnt := b.diskMount(id)
	mounted, err := fsutil.IsMountPoint(mnt)
	if errors.Is(err, unix.ENOENT) || err == nil && !mounted {
		return nil
	}
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		return err
	}
	if err := unmount(mnt); err != nil {
		return err
	}
	backing := fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", unix.Major(st.Dev), unix.Minor(st.Dev))
	deadline := time.Now().Add(5 * time.Second)
	for wait := 100 * time.Microsecond; ; wait = min(2*wait, 20*time.Millisecond) {
		f, err := os.ReadFile(backing)
		if err != nil || !strings.HasPrefix(string(f), b.diskImage(id)) {
			return nil
		}
		if time.Now().After(deadline) {
			b.cfg.Log.Warn("the sandbox's loop device is still attached after its disk was unmounted (it detaches when nothing holds it)", "sandbox", id, "device", backing)
			return nil
		}
		time.Sleep(wait)
	}
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
