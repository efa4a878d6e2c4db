package container

import (
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/nsthread"
)

// A container's network namespace is the backend's, not runc's: a file
// in the sandbox's directory holds it (a bind mount of the namespace), and
// the spec names it. It outlives the container, so a rollback restarts
// the container in the same network, and a checkpointed container keeps
// its interface, address and TCP peers while it holds no process; CRIU
// treats it as external and leaves it alone.

// netnsFile is where sandbox id's network namespace is held.
func (b *Backend) netnsFile(id string) string { return b.dir(id) + "/netns" }

// isNetns reports whether path holds a network namespace (after a reboot
// the file is there, the namespace is not).
func isNetns(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.NSFS_MAGIC
}

// ensureNetns makes the network namespace at path, loopback up, unless
// path holds one already. made says whether it is new (and so needs its
// network attached).
func ensureNetns(path string) (made bool, err error) {
	if isNetns(path) {
		return false, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return false, err
	}
	f.Close()
	// This thread enters the new namespace and is never used again (nsthread).
	err = nsthread.Run(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("new network namespace: %w", err)
		}
		if err := unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("hold network namespace at %s: %w", path, err)
		}
		return setLoopbackUp()
	})
	if err != nil {
		removeNetns(path)
		return false, err
	}
	return true, nil
}

// setLoopbackUp brings up lo in the calling thread's network namespace.
func setLoopbackUp() error {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("sandbox loopback: %w", err)
	}
	return nil
}

// removeNetns lets go of the namespace at path (it ends once no process
// is in it) and removes the file.
func removeNetns(path string) error {
	if err := unmount(path); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
