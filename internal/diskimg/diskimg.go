// Package diskimg makes and mounts the ext4 image files that give a
// container sandbox its disk and a volume its size: a sparse file with
// an ext4 filesystem, loop-mounted with discard (what is deleted goes
// back to the host) and autoclear (the loop device goes with the
// unmount, and one a crash left unmounted with its last close). A loop
// device nook is done with is removed (LOOP_CTL_REMOVE), not kept for
// the next attach: the kernel would keep one per disk ever mounted at
// once, each a cost to every sysinfo(2) on the host. The removal runs on
// a goroutine (a block device takes the kernel tens of milliseconds to
// delete), off a destroy's path; Settle waits for it. The device mkfs
// used is kept: the mount that follows a Make takes it again.
//
// Why an image and not project quotas: quotas need the data directory's
// filesystem mounted with prjquota, which the host's root is not; an
// image needs nothing of the host but loop devices, is one unmount and
// one file to clean up, and its limit cannot be lost by a file moving
// between directories. A writer past the size, or past the inodes (one
// per 16 KiB, one per 4 KiB below 512 MiB), gets ENOSPC; the host and
// everything else keep their space.
package diskimg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/poll"
)

// Make makes the image img of size bytes: a sparse file with an ext4
// filesystem, its inode tables left for the kernel to initialise lazily
// (never zeroed on the host: see Mount), written to a temporary name
// and renamed. what names it in errors ("the sandbox's disk").
func Make(ctx context.Context, img string, size int64, what string) error {
	tmp := img + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("make %s's image: %w", what, err)
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
		removeLoopLater(loop.Name())
		os.Remove(tmp)
		return fmt.Errorf("mkfs.ext4 of %s (%d MiB): %w: %s", what, size>>20, err, strings.TrimSpace(string(out)))
	}
	if err := os.Rename(tmp, img); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// Mount mounts the image img at mnt (made 0700 if missing, and 0700
// once mounted: root's alone), unless something is mounted there already.
func Mount(img, mnt, what string) error {
	if err := os.Mkdir(mnt, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if mounted, err := fsutil.IsMountPoint(mnt); err != nil || mounted {
		return err
	}
	f, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	loop, err := attachLoop(f)
	if err != nil {
		return err
	}
	// The mount holds the device; autoclear detaches it with the unmount.
	defer loop.Close()
	// discard: what is deleted goes back to the host. noinit_itable: the
	// kernel does not zero the inode tables in the background
	// (uninit_bg makes that unneeded), so they take no host space.
	if err := unix.Mount(loop.Name(), mnt, "ext4", unix.MS_NODEV|unix.MS_NOSUID|unix.MS_NOATIME, "discard,noinit_itable"); err != nil {
		return fmt.Errorf("mount %s (%s on %s): %w", what, img, loop.Name(), err)
	}
	if err := os.Chmod(mnt, 0o700); err != nil {
		Unmount(mnt)
		return err
	}
	return nil
}

// Unmounted unmounts mnt (the image img's mount) if it is mounted, and
// waits (a few seconds at most) for its loop device to detach: the
// kernel detaches an autoclear device in the background after the last
// close. It reports whether the device was still attached at the end.
func Unmounted(mnt, img string) (stillAttached bool, err error) {
	mounted, err := fsutil.IsMountPoint(mnt)
	if errors.Is(err, unix.ENOENT) || err == nil && !mounted {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		return false, err
	}
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	dev, _ := os.Readlink(sys) // .../block/loopN
	if err := Unmount(mnt); err != nil {
		return false, err
	}
	err = poll.Until(context.Background(), poll.Options{Timeout: 5 * time.Second, Min: 100 * time.Microsecond, Max: 20 * time.Millisecond}, func() (bool, error) {
		f, err := os.ReadFile(sys + "/loop/backing_file")
		return err != nil || !strings.HasPrefix(string(f), img), nil
	})
	if errors.Is(err, poll.ErrTimeout) {
		return true, nil
	}
	if dev != "" {
		removeLoopLater("/dev/" + filepath.Base(dev))
	}
	return false, nil
}

// removing counts the removeLoop calls under way; idle is closed when
// the count drops to zero (nil while it is zero). Not a WaitGroup: a
// removal may start while Settle waits (a destroy still running as the
// daemon stops), which a WaitGroup forbids.
var removing struct {
	sync.Mutex
	n    int
	idle chan struct{}
}

// removeLoopLater is removeLoop on a goroutine of its own: the kernel
// takes tens of milliseconds to delete a block device (del_gendisk: 33
// ms each on this project's test machines), which a sandbox's destroy
// need not wait for. Settle waits for them.
func removeLoopLater(path string) {
	removing.Lock()
	if removing.n == 0 {
		removing.idle = make(chan struct{})
	}
	removing.n++
	removing.Unlock()
	go func() {
		removeLoop(path)
		removing.Lock()
		defer removing.Unlock()
		if removing.n--; removing.n == 0 {
			close(removing.idle)
			removing.idle = nil
		}
	}()
}

// Settle waits, up to timeout, until no loop device is being removed, so
// that a daemon that stops (or a test that checks) leaves none half
// removed; it reports whether none is.
func Settle(timeout time.Duration) bool {
	removing.Lock()
	idle := removing.idle
	removing.Unlock()
	if idle == nil {
		return true
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return false
	}
}

// removeLoop deletes the loop device at path (/dev/loopN) if it is free:
// no file attached and nobody holding it open. The kernel keeps a device
// made for a sandbox's disk after the disk is gone, so a host that once
// had 1,000 sandboxes would keep 1,000 devices, and every block device
// costs each sysinfo(2) (which every bash start calls) a step. Best
// effort: a device another attach took meanwhile is busy and stays
// (attachLoop retries one removed under it).
func removeLoop(path string) {
	num, ok := strings.CutPrefix(path, "/dev/loop")
	n, err := strconv.Atoi(num)
	if !ok || err != nil {
		return
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer ctl.Close()
	unix.IoctlSetInt(int(ctl.Fd()), unix.LOOP_CTL_REMOVE, n)
}

// Unmount unmounts target until nothing is mounted there (stacked
// mounts), waiting out a busy one briefly and detaching it lazily at last.
func Unmount(target string) error {
	err := poll.Until(context.Background(), poll.Options{Timeout: 500 * time.Millisecond, Max: 10 * time.Millisecond}, func() (bool, error) {
		for range 50 { // stacked mounts: unmount until none is left
			err := unix.Unmount(target, 0)
			switch {
			case err == nil:
			case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
				return true, nil // not a mount point (any more)
			case errors.Is(err, unix.EBUSY):
				return false, nil
			default:
				return false, fmt.Errorf("unmount %s: %w", target, err)
			}
		}
		return false, nil
	})
	if !errors.Is(err, poll.ErrTimeout) {
		return err
	}
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount %s: %w", target, err)
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
			// Removed (removeLoop) between the two calls: ask again.
			if (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENODEV)) && attempt < 20 {
				continue
			}
			return nil, fmt.Errorf("loop device %d: %w", n, err)
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd()), Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO}}
		copy(cfg.Info.File_name[:], img.Name())
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		// Another process took the device between the two calls, or
		// removed it.
		if !(errors.Is(err, unix.EBUSY) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENODEV)) || attempt == 20 {
			return nil, fmt.Errorf("attach %s to loop device %d: %w", img.Name(), n, err)
		}
	}
}
