// Command nook-agent runs inside every sandbox, as its PID 1 (or, in a vm
// that boots systemd, as a systemd unit): it reaps orphans when it is the
// init and serves the sandbox's side of exec and files to the daemon.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/agent/guestinit"
	"github.com/nookhq/nook/internal/agent/guestvol"
)

func main() {
	// The SSH endpoint's SFTP server, run as the login user (agent.SFTPServerMain).
	if len(os.Args) == 2 && os.Args[1] == agent.SFTPServerArg {
		os.Exit(agent.SFTPServerMain())
	}
	// A container's agent has no stdio of the host's (so that CRIU can
	// checkpoint it): it logs to a file in its own root.
	if path := os.Getenv("NOOK_AGENT_LOG"); path != "" {
		if err := logTo(path); err != nil {
			fmt.Fprintln(os.Stderr, "nook-agent:", err)
			os.Exit(1)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	guest := guestinit.IsGuest() // asked before Boot leaves the initramfs and its marker
	if guest {
		guestinit.UpAndOff()
		// PID 1 of a vm guest, still in the initramfs: move into the root
		// disk, then serve over virtio-serial.
		if err := guestinit.Boot(); err != nil {
			fmt.Fprintln(os.Stderr, "nook-agent: boot:", err)
			os.Exit(1)
		}
		// Asked to boot systemd: it becomes PID 1 and starts the agent
		// as a unit (this process is replaced).
		if guestinit.WantsSystemd() {
			err := guestinit.ExecSystemd()
			fmt.Fprintln(os.Stderr, "nook-agent: cannot boot systemd, the agent stays the init:", err)
		}
	}
	ln, err := listener()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nook-agent:", err)
		os.Exit(1)
	}
	pid1 := os.Getpid() == 1
	srv := agent.NewServer(log, pid1, pid1 || guestinit.IsSystemdAgent())
	if guest || guestinit.IsSystemdAgent() {
		srv.SetVolumes(guestvol.New()) // a vm's volumes are FUSE mounts the agent serves
	}
	if err := srv.Serve(context.Background(), ln); err != nil {
		fmt.Fprintln(os.Stderr, "nook-agent:", err)
		os.Exit(1)
	}
}

// listener is the socket the daemon connects to: an inherited listening
// socket (NOOK_AGENT_LISTEN_FD, containers), a path (NOOK_AGENT_LISTEN), or
// in a vm guest (its init, or started by its systemd) the virtio-serial port.
func listener() (net.Listener, error) {
	if (os.Getpid() == 1 || guestinit.IsSystemdAgent()) && os.Getenv("NOOK_AGENT_LISTEN_FD") == "" && os.Getenv("NOOK_AGENT_LISTEN") == "" {
		port, err := guestinit.FindPort(guestinit.PortName, 10*time.Second)
		if err != nil {
			return nil, err
		}
		return guestinit.ListenPort(port), nil
	}
	if fdStr := os.Getenv("NOOK_AGENT_LISTEN_FD"); fdStr != "" {
		fd, err := strconv.Atoi(fdStr)
		if err != nil {
			return nil, fmt.Errorf("NOOK_AGENT_LISTEN_FD=%q is not a file descriptor", fdStr)
		}
		f := os.NewFile(uintptr(fd), "agent-listener")
		ln, err := net.FileListener(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("inherited listener: %w", err)
		}
		return ln, nil
	}
	if path := os.Getenv("NOOK_AGENT_LISTEN"); path != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		os.Remove(path)
		return net.Listen("unix", path)
	}
	return nil, fmt.Errorf("set NOOK_AGENT_LISTEN_FD or NOOK_AGENT_LISTEN")
}

// logTo makes path (created 0600, appended to) the agent's stdout and
// stderr, and its stdin /dev/null.
func logTo(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("agent log: %w", err)
	}
	defer f.Close()
	for _, fd := range []int{1, 2} {
		if err := unix.Dup3(int(f.Fd()), fd, 0); err != nil {
			return fmt.Errorf("agent log: %w", err)
		}
	}
	return nil
}
