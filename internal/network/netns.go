package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNetns runs fn on an OS thread that has joined the network namespace ns,
// for what netlink handles cannot do: sysctls under /proc/sys/net, tun
// ioctls and sockets. Sockets created by fn stay in ns. fn runs on a
// fresh goroutine locked to its thread; if the thread cannot return to its
// namespace it is left locked, and the runtime discards it.
func inNetns(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave netns: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// writeSysctl writes a value under /proc/sys in the calling thread's
// network namespace. name uses slashes: "net/ipv4/ip_forward".
func writeSysctl(name, value string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", name), []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", strings.ReplaceAll(name, "/", "."), value, err)
	}
	return nil
}

// createNetns creates a network namespace, disables IPv6 in it and
// bind-mounts it at path so that it outlives this process's references and
// runc can join it by path. It returns a handle the caller closes.
func createNetns(path string) (netns.NsHandle, error) {
	type result struct {
		h   netns.NsHandle
		err error
	}
	resc := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			resc <- result{err: fmt.Errorf("get current netns: %w", err)}
			return
		}
		defer orig.Close()
		h, cerr := func() (netns.NsHandle, error) {
			if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return 0, fmt.Errorf("unshare netns: %w", err)
			}
			for _, s := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/default/disable_ipv6"} {
				if err := writeSysctl(s, "1"); err != nil && !errors.Is(err, os.ErrNotExist) {
					return 0, err
				}
			}
			f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
			if err != nil {
				return 0, fmt.Errorf("create netns mount point: %w", err)
			}
			f.Close()
			src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
			if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
				os.Remove(path)
				return 0, fmt.Errorf("bind-mount netns at %s: %w", path, err)
			}
			h, err := netns.Get()
			if err != nil {
				removeNetns(path)
				return 0, fmt.Errorf("open new netns: %w", err)
			}
			return h, nil
		}()
		if err := netns.Set(orig); err != nil {
			// The thread stays locked and dies with this goroutine.
			if cerr == nil {
				h.Close()
				removeNetns(path)
			}
			resc <- result{err: errors.Join(cerr, fmt.Errorf("return to netns: %w", err))}
			return
		}
		runtime.UnlockOSThread()
		resc <- result{h: h, err: cerr}
	}()
	r := <-resc
	return r.h, r.err
}

// removeNetns unmounts and removes a bind-mounted namespace; a missing one
// is not an error.
func removeNetns(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// isNetnsMount reports whether path is a bind-mounted network namespace.
func isNetnsMount(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}
