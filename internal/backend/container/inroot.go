package container

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/poll"
)

// The agent listens, and logs, inside the sandbox's own root (CRIU can
// checkpoint nothing that lives in the host's namespaces). The host
// reaches both through the overlay it mounted, never following a link the
// sandbox made.
const (
	agentSocketInSandbox = "/.nook/agent.sock"
	agentLogInSandbox    = "/.nook/agent.log"
)

// openInRoot opens name inside directory root as if root were "/": no
// symlink is followed and no path leaves root or crosses a mount.
func openInRoot(root, name string, flags int) (*os.File, error) {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, strings.TrimPrefix(name, "/"), &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(root, name), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(root, name)), nil
}

// dialInRoot connects to the unix socket name inside root: it opens the
// socket's inode (O_PATH) safely, then connects through /proc/self/fd.
func dialInRoot(ctx context.Context, root, name string) (net.Conn, error) {
	f, err := openInRoot(root, name, unix.O_PATH)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%s in the sandbox is not a socket", name)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
}

// tailInRoot is the end of the regular file name inside root, for error messages.
func tailInRoot(root, name string) string {
	f, err := openInRoot(root, name, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	return strings.TrimSpace(fsutil.TailFile(f, 2000))
}

// dialAgent connects to the agent of sandbox id, waiting (while alive
// says its init runs) for the agent to listen: a container's agent binds
// its socket a few milliseconds after runc starts it.
func (b *Backend) dialAgent(ctx context.Context, id string, alive func() bool) (net.Conn, error) {
	// A container started by an earlier nook listens on a host path.
	if _, err := os.Stat(b.socket(id)); err == nil {
		var d net.Dialer
		return d.DialContext(ctx, "unix", b.socket(id))
	}
	var conn net.Conn
	var last error
	err := poll.Until(ctx, poll.Options{Timeout: 10 * time.Second, Max: 50 * time.Millisecond}, func() (bool, error) {
		conn, last = dialInRoot(ctx, b.rootfs(id), agentSocketInSandbox)
		if last == nil || !errors.Is(last, unix.ENOENT) && !errors.Is(last, unix.ECONNREFUSED) || !alive() {
			return true, nil
		}
		return false, nil
	})
	switch {
	case err == nil && last == nil:
		return conn, nil
	case err == nil || errors.Is(err, poll.ErrTimeout):
		return nil, fmt.Errorf("the sandbox's agent: %w", last)
	}
	return nil, fmt.Errorf("the sandbox's agent: %w (%w)", err, last)
}
