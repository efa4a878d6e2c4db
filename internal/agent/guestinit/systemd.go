//go:build linux

package guestinit

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A vm booted with SystemdArg on its kernel command line runs systemd as
// PID 1: the agent, PID 1 from the initramfs, switches to the root disk
// (Boot), copies itself to AgentPath, installs its unit as a runtime unit
// (RuntimeUnitDir, nothing on the sandbox's disk changes), and execs
// systemd. systemd then starts the agent as nook-agent.service before
// sysinit.target, with GuestEnv set so that it serves the virtio-serial
// port as the guest's agent without being PID 1.
const (
	SystemdArg = "nook.init=systemd"
	// GuestEnv tells an agent started by the guest's systemd what it is.
	GuestEnv = "NOOK_AGENT_GUEST=systemd"
	// AgentPath is where the agent runs from under systemd (tmpfs /run).
	AgentPath = "/run/nook/nook-agent"
	// RuntimeUnitDir is systemd's runtime unit directory (in /run).
	RuntimeUnitDir = "/run/systemd/system"
	// SystemdPath is the init systemd-sysv links /sbin/init to.
	SystemdPath = "/lib/systemd/systemd"
)

// agentUnit runs the agent under systemd. It is ordered before
// sysinit.target (no default dependencies: it answers as early as an
// agent that is PID 1); it is restarted whenever it ends, however often
// (no start limit), and survives isolating another target; the commands
// it starts live in its cgroup and outlive it if it restarts
// (KillMode=process); an out-of-memory kill of one of them stops nothing
// else (OOMPolicy=continue). No OOMScoreAdjust: its commands would
// inherit it.
const agentUnit = `# Written by nook-agent at boot: the nook daemon's way into this sandbox.
[Unit]
Description=nook agent (the nook daemon's way into this sandbox)
DefaultDependencies=no
Before=sysinit.target
StartLimitIntervalSec=0
IgnoreOnIsolate=yes

[Service]
Environment=` + GuestEnv + `
ExecStart=` + AgentPath + `
Restart=always
RestartSec=100ms
KillMode=process
OOMPolicy=continue
TasksMax=infinity
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=sysinit.target
`

// masked are units a sandbox never wants: consoles nobody can type on (a
// vm's serial console is a log file), and apt's daily timers, which would
// take the dpkg lock from under an agent's apt-get at random.
var masked = []string{"serial-getty@ttyS0.service", "getty@tty1.service", "apt-daily.timer", "apt-daily-upgrade.timer"}

// WantsSystemd reports whether the kernel command line asks for systemd.
func WantsSystemd() bool {
	cmdline, _ := os.ReadFile("/proc/cmdline")
	for _, f := range strings.Fields(string(cmdline)) {
		if f == SystemdArg {
			return true
		}
	}
	return false
}

// IsSystemdAgent reports whether this agent was started by a guest's systemd.
func IsSystemdAgent() bool {
	k, v, _ := strings.Cut(GuestEnv, "=")
	return os.Getenv(k) == v
}

// ExecSystemd hands PID 1 to the root disk's systemd, after Boot. It
// returns only if it could not (no systemd on the disk: the caller stays
// the init).
func ExecSystemd() error {
	bin := SystemdPath
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("the root disk has no systemd (%s): %w", bin, err)
	}
	if err := installAgent(); err != nil {
		return err
	}
	// systemd finds /dev, /proc, /sys, /run and the cgroup2 hierarchy
	// mounted (Boot did) and keeps them.
	return unix.Exec(bin, []string{bin}, []string{"TERM=linux"})
}

// installAgent copies the running agent to AgentPath and writes its unit,
// its sysinit.target want and the masks into RuntimeUnitDir.
func installAgent() error {
	if err := os.MkdirAll(filepath.Dir(AgentPath), 0o700); err != nil {
		return err
	}
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(AgentPath, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o700)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return fmt.Errorf("copy the agent to %s: %w", AgentPath, err)
	}
	if err := dst.Close(); err != nil {
		return err
	}
	wants := filepath.Join(RuntimeUnitDir, "sysinit.target.wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(RuntimeUnitDir, "nook-agent.service"), []byte(agentUnit), 0o644); err != nil {
		return err
	}
	links := map[string]string{filepath.Join(wants, "nook-agent.service"): "../nook-agent.service"}
	for _, u := range masked {
		links[filepath.Join(RuntimeUnitDir, u)] = "/dev/null"
	}
	for link, target := range links {
		if err := os.Symlink(target, link); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	return nil
}
