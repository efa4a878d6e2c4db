package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/procfs"
)

var _ core.Stopper = (*Backend)(nil)

// A vm is a machine: stopped (`nook stop`, or its guest powered off) it
// has no QEMU and no RAM, and its disk stays; started, it boots from that
// disk, cold, as a machine powered on does. A guest that reboots is
// started again the same way by the daemon.
//
// The file "stopped" in the vm's directory records a stop, so that the
// vm reads as stopped (not crashed) across daemon restarts. What the
// guest asked for is read from its serial console: the guest kernel's
// last words before QEMU (run with -no-reboot) ended are "reboot: Power
// down" or "reboot: System halted" for a power off or halt, "reboot:
// Restarting system" or "sysrq: Resetting" for a reboot. Every start
// writes bootMark to the console log first, so only the current boot's
// words count. The guest can write anything there: what it gains is
// telling a crash apart from a reboot or a power off of its own machine.

// bootMark opens each boot's part of a vm's console log.
const bootMark = "--- nook: boot ---"

func (b *Backend) stoppedFile(id string) string { return filepath.Join(b.dir(id), "stopped") }

// Stop implements core.Stopper: a systemd guest is powered off (its
// services stopped, for up to shutdownGrace; the daemon has had every
// guest sync before a stop), then QEMU is asked to quit (it flushes its
// disk layers), killed if it does not, and a pause's saved state is
// dropped.
func (b *Backend) Stop(ctx context.Context, id string) error {
	defer b.operate(id)()
	dir := b.dir(id)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	// Recorded first: from here a crash leaves it stopped, and a start
	// boots it from its disk.
	if err := fsutil.WriteFileAtomic(b.stoppedFile(id), nil); err != nil {
		return err
	}
	if st, live := b.readRun(id); live {
		b.shutdownGuest(ctx, id, st)
		b.quit(ctx, id, st.PID)
	}
	if pid := qemuPID(dir); pid > 0 {
		syscall.Kill(pid, syscall.SIGKILL)
		if !waitGone(pid, 5*time.Second) {
			return fmt.Errorf("the vm's QEMU (pid %d) did not end", pid)
		}
	}
	h := b.readHead(id)
	if h.Resume != "" {
		statePath := h.resumePath(dir)
		h.Resume = ""
		if err := b.writeHead(id, h); err != nil {
			return err
		}
		if strings.HasPrefix(statePath, dir+string(filepath.Separator)) {
			os.Remove(statePath)
		}
	}
	st, _ := b.readRun(id)
	st.PID, st.StartTime, st.Saved = 0, 0, false
	return b.writeRun(id, st)
}

// shutdownGrace bounds a systemd guest's power off in Stop.
const shutdownGrace = 30 * time.Second

// shutdownGuest has a running systemd guest power off (QEMU exits when
// it has), waited for up to shutdownGrace. An agent guest has no services
// to stop (the daemon's stop has synced its disks already). A guest that
// does not answer is left to quit.
func (b *Backend) shutdownGuest(ctx context.Context, id string, st state) {
	if st.Init != api.InitSystemd {
		return
	}
	sock := filepath.Join(b.dir(id), "agent.sock")
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, _, code, err := guestOutput(actx, sock, "systemctl poweroff --no-block"); err != nil || code != 0 {
		b.cfg.Log.Warn("vm guest did not take the power off: stopping it", "sandbox", id, "exit", code, "err", err)
		return
	}
	if !waitGone(st.PID, shutdownGrace) {
		b.cfg.Log.Warn("vm guest did not power off in time: stopping it", "sandbox", id, "grace", shutdownGrace)
	}
}

// quit asks a live QEMU to quit, and kills it if it has not within a few
// seconds.
func (b *Backend) quit(ctx context.Context, id string, pid int) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if mon, err := dialQMP(qctx, filepath.Join(b.dir(id), "qmp.sock")); err == nil {
		mon.run("quit", nil, nil)
		mon.close()
	}
	if !waitGone(pid, 5*time.Second) {
		syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid, 5*time.Second)
	}
}

// Start implements core.Stopper: the vm boots afresh from its disk (a
// cold boot of the kernel it was created with) with its shape, init,
// network and QEMU user. It waits until the guest's agent answers, and a
// systemd guest until systemd has started its services (bounded: one
// that does not is logged, not failed).
func (b *Backend) Start(ctx context.Context, sb *core.Sandbox) error {
	defer b.operate(sb.ID)()
	if err := b.boot(ctx, sb.ID); err != nil {
		return err
	}
	if st, live := b.readRun(sb.ID); live {
		sb.BackendState, _ = json.Marshal(st)
	}
	return nil
}

// boot is Start with the vm's lock held.
func (b *Backend) boot(ctx context.Context, id string) error {
	dir := b.dir(id)
	// The boot's part of the console log begins here: what the guest said
	// before (a reboot, a power off) no longer counts, even if this boot
	// fails before QEMU runs.
	if err := markBoot(filepath.Join(dir, "console.log")); err != nil {
		return err
	}
	if _, live := b.running(id); live {
		// Running already (a start a crash cut short): not stopped.
		if err := os.Remove(b.stoppedFile(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	st, _ := b.readRun(id)
	if st.MemoryMiB == 0 {
		return fmt.Errorf("the vm's record (run.json) is missing")
	}
	if pid := qemuPID(dir); pid > 0 { // a start a crash cut short
		syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid, 5*time.Second)
	}
	k, err := b.stateKernel(ctx, st)
	if err != nil {
		return err
	}
	h := b.readHead(id)
	if h.Resume != "" {
		return errdefs.Precondition("the vm is paused (saved to disk): resume it, or stop it first")
	}
	m := machine{Accel: b.accel, CPUs: st.CPUs, MemoryMiB: st.MemoryMiB, Kernel: k, TSCKHz: tscKHz(), Init: st.Init}
	proc, l, err := b.relaunch(ctx, id, st, h, m, false)
	if err != nil {
		return err
	}
	st.PID, st.StartTime, st.Saved = proc.pid, procfs.StartTime(proc.pid), false
	st.Accel, st.Boot, st.Kernel, st.KernelHash, st.TSCKHz = m.Accel, "cold", k.Release, k.Hash, m.TSCKHz
	if err := b.writeRun(id, st); err != nil {
		syscall.Kill(proc.pid, syscall.SIGKILL)
		return err
	}
	if err := b.waitBoot(ctx, proc, l.AgentSock, dir); err != nil {
		syscall.Kill(proc.pid, syscall.SIGKILL)
		<-proc.exited
		return err
	}
	b.servicesUp(ctx, id, l.AgentSock, m)
	if err := os.Remove(b.stoppedFile(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// markBoot appends bootMark to a console log.
func markBoot(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "\n%s\n", bootMark)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// guestHalt reads, from the end of a vm's console log, what its guest
// asked for in the current boot: core.HaltPoweroff, core.HaltReboot, or
// "" (nothing: it crashed, or it runs).
func guestHalt(console string) string {
	if i := strings.LastIndex(console, bootMark); i >= 0 {
		console = console[i+len(bootMark):]
	}
	lines := strings.Split(strings.TrimRight(console, "\n"), "\n")
	for i := len(lines) - 1; i >= 0 && i >= len(lines)-5; i-- {
		switch l := lines[i]; {
		case strings.Contains(l, "reboot: Power down"), strings.Contains(l, "reboot: System halted"):
			return core.HaltPoweroff
		case strings.Contains(l, "reboot: Restarting system"), strings.Contains(l, "sysrq: Resetting"):
			return core.HaltReboot
		}
	}
	return ""
}
