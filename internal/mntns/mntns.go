// Package mntns starts programs in a small mount namespace of their own.
//
// Every mount the daemon makes for a sandbox (a container's disk, its
// overlay root, the bind mounts that hold its namespaces) is in the
// daemon's mount namespace, and a runtime started there pays for all of
// them: `runc run` copies the whole mount table into the container's new
// namespace, reads /proc/self/mountinfo several times before pivot_root
// and detaches the old root's mounts after it. With 1,000 sandboxes that
// is 4,000 mounts, and those costs made a cold create 2-3x slower than
// with 10.
//
// A Base is a private copy of the daemon's mount namespace made once,
// without the mounts a caller hides (a backend's sandbox directories)
// and without namespace files (nsfs): what a runtime needs of the host
// (/, /proc, /sys, cgroupfs, /dev, the binaries and the bundle's files)
// and nothing that grows with the sandboxes. Start runs a program in a
// fresh copy of it into which the caller's mounts (a sandbox's root and
// namespace files) are cloned at the same paths with open_tree(2) and
// move_mount(2): the program sees the host's base mounts and its own
// sandbox's, whatever the number of sandboxes.
//
// The base is held by a file descriptor only: nothing is mounted to keep
// it, and it ends with the process. It sees the host's mounts as they
// were when it was made (later ones do not propagate into a private
// copy): a path a program needs that a mount made since covers must be
// among its binds.
//
// The namespace switches happen on a locked OS thread that the runtime
// then discards: unshare(CLONE_FS) lets that one thread join another
// mount namespace (setns refuses a thread that shares its filesystem
// attributes), and the child inherits the thread's namespace.
package mntns

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/nsthread"
)

// Base is the mount namespace programs start from.
type Base struct {
	ns *os.File // the namespace (nsfs); the only thing that holds it
}

// New makes a base namespace: a private copy of the caller's mount
// namespace without the mounts below any of hide (a mount at hide
// itself, a disk for the sandboxes, stays: what is below lives on it)
// and without any namespace file mounts.
func New(hide ...string) (*Base, error) {
	var ns *os.File
	err := nsthread.Run(func() error {
		if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("unshare the mount namespace: %w", err)
		}
		// Private: nothing the host mounts from now on appears here.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make the base namespace private: %w", err)
		}
		drop, err := mountsToDrop(hide)
		if err != nil {
			return err
		}
		// Children after their parents in mountinfo: the last first.
		for i := len(drop) - 1; i >= 0; i-- {
			if err := unix.Unmount(drop[i], unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
				return fmt.Errorf("unmount %s in the base namespace: %w", drop[i], err)
			}
		}
		f, err := os.Open("/proc/thread-self/ns/mnt")
		if err != nil {
			return err
		}
		ns = f
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &Base{ns: ns}, nil
}

// mountsToDrop lists, in mountinfo order, the mount points of the
// calling thread's namespace that are under one of hide or are nsfs.
func mountsToDrop(hide []string) ([]string, error) {
	f, err := os.Open("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var drop []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		point, fstype, ok := parseMountinfo(sc.Text())
		if !ok {
			continue
		}
		if fstype == "nsfs" || under(point, hide) {
			drop = append(drop, point)
		}
	}
	return drop, sc.Err()
}

// parseMountinfo returns a mountinfo line's mount point (unescaped) and
// filesystem type.
func parseMountinfo(line string) (point, fstype string, ok bool) {
	pre, post, found := strings.Cut(line, " - ")
	f, g := strings.Fields(pre), strings.Fields(post)
	if !found || len(f) < 5 || len(g) < 1 {
		return "", "", false
	}
	return unescape(f[4]), g[0], true
}

// unescape undoes mountinfo's octal escapes (\040 for a space, ...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) && isOctal(s[i+1:i+4]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '7' {
			return false
		}
	}
	return s[0] <= '3'
}

// under reports whether p is strictly below one of dirs.
func under(p string, dirs []string) bool {
	for _, d := range dirs {
		if d = filepath.Clean(d); strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

// Start starts cmd in a new mount namespace, a copy of the base, with each
// of binds (a path of the caller's namespace: a mount point, a directory
// or a file) cloned to the same path. The paths must exist in the base
// (a directory or file of a filesystem the base has), as mount points
// do. cmd is started, not waited for.
func (b *Base) Start(cmd *exec.Cmd, binds ...string) error {
	trees := make([]int, 0, len(binds))
	defer func() {
		for _, fd := range trees {
			unix.Close(fd)
		}
	}()
	for _, p := range binds {
		fd, err := unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			return fmt.Errorf("clone the mount at %s: %w", p, err)
		}
		trees = append(trees, fd)
	}
	return nsthread.Run(func() error {
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare the thread's filesystem attributes: %w", err)
		}
		if err := unix.Setns(int(b.ns.Fd()), unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("enter the base mount namespace: %w", err)
		}
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("copy the base mount namespace: %w", err)
		}
		for i, fd := range trees {
			if err := unix.MoveMount(fd, "", unix.AT_FDCWD, binds[i], unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
				return fmt.Errorf("mount %s in the program's namespace: %w", binds[i], err)
			}
		}
		return cmd.Start()
	})
}
