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

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

var _ core.Pauser = (*Backend)(nil)

// A paused vm is saved to disk: QMP stop, the guest's whole memory and
// device state migrated into paused.state (written to a temporary file,
// synced, renamed), the disk flushed, and QEMU ended, so that it holds no
// CPU and no RAM. Resume starts a QEMU on the same disk and loads the
// state: every process, open file and connection in the guest goes on.
//
// The sandbox's QEMU (its PID and start time) is recorded in run.json in
// its directory, because a resume starts a new one.

const pausedState = "paused.state"

// PauseKind implements core.Pauser.
func (b *Backend) PauseKind() string {
	return "saved: memory and devices written to disk and QEMU stopped (no CPU, no RAM)"
}

func (b *Backend) runFile(id string) string { return filepath.Join(b.dir(id), "run.json") }

// running returns the sandbox's live QEMU, from run.json.
func (b *Backend) running(id string) (state, bool) {
	var st state
	data, err := os.ReadFile(b.runFile(id))
	if err != nil || json.Unmarshal(data, &st) != nil {
		return st, false
	}
	return st, st.PID > 0 && procStartTime(st.PID) == st.StartTime
}

func (b *Backend) writeRun(id string, st state) error {
	data, _ := json.Marshal(st)
	tmp := b.runFile(id) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, b.runFile(id))
}

// Paused implements core.Pauser.
func (b *Backend) Paused(ctx context.Context, id string) (bool, error) {
	if _, err := os.Stat(filepath.Join(b.dir(id), pausedState)); err != nil {
		return false, nil
	}
	_, live := b.running(id)
	return !live, nil
}

// Pause implements core.Pauser.
func (b *Backend) Pause(ctx context.Context, id string) error {
	st, live := b.running(id)
	if !live {
		if _, err := os.Stat(filepath.Join(b.dir(id), pausedState)); err == nil {
			return nil // already saved
		}
		return errdefs.Precondition("the vm is not running")
	}
	mon, err := dialQMP(ctx, filepath.Join(b.dir(id), "qmp.sock"))
	if err != nil {
		return err
	}
	defer mon.close()
	final := filepath.Join(b.dir(id), pausedState)
	tmp := final + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	// Always on, so that resume knows what to expect; this sandbox's RAM is
	// private (share=off), so all of it goes into the state either way.
	err = mon.setIgnoreShared()
	if err == nil {
		err = mon.saveState(ctx, f)
	}
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if err != nil {
		mon.run("cont", nil, nil) // leave it running, as it was
		return fmt.Errorf("save the vm: %w", err)
	}
	if err := os.Rename(tmp, final); err != nil {
		mon.run("cont", nil, nil)
		return err
	}
	syncDir(b.dir(id))
	// The state is safe on disk: end QEMU (stop already flushed the disk).
	mon.run("quit", nil, nil)
	if !waitGone(st.PID, 10*time.Second) {
		syscall.Kill(st.PID, syscall.SIGKILL)
		waitGone(st.PID, 5*time.Second)
	}
	return nil
}

// Resume implements core.Pauser.
func (b *Backend) Resume(ctx context.Context, id string) error {
	if _, live := b.running(id); live {
		return nil
	}
	statePath := filepath.Join(b.dir(id), pausedState)
	fi, err := os.Stat(statePath)
	if err != nil {
		return errdefs.Precondition("the vm has no saved state to resume from")
	}
	if avail := memAvailable(); avail > 0 && avail < fi.Size()+(256<<20) {
		return errdefs.Exhausted("not enough free memory to resume the vm: it needs about %s, the host has %s available",
			core.FormatBytes(fi.Size()+(256<<20)), core.FormatBytes(avail))
	}
	var st state
	data, err := os.ReadFile(b.runFile(id))
	if err != nil {
		return fmt.Errorf("the paused vm's record: %w", err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return err
	}
	k, err := b.ensureKernel(ctx)
	if err != nil {
		return err
	}
	if k.Hash != st.KernelHash {
		return errdefs.Precondition("the vm was paused with another guest kernel or agent (%s), which this nook no longer has", st.KernelHash)
	}
	dir := b.dir(id)
	m := machine{Accel: st.Accel, CPUs: st.CPUs, MemoryMiB: st.MemoryMiB, Kernel: k, TSCKHz: st.TSCKHz}
	l := launch{machine: m, Disk: filepath.Join(dir, "disk.qcow2"), AgentSock: filepath.Join(dir, "agent.sock"),
		QMPSock: filepath.Join(dir, "qmp.sock"), ConsoleLog: filepath.Join(dir, "console.log"), Incoming: true}
	if b.cfg.Net != nil {
		if l.Tap, err = b.cfg.Net.AttachTap(ctx, id); err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}
	os.Remove(l.AgentSock)
	os.Remove(l.QMPSock)
	proc, err := b.start(ctx, &core.Sandbox{ID: id, CPUs: st.CPULimit, MemoryBytes: st.MemoryMiB << 20}, l)
	if err != nil {
		return err
	}
	fail := func(err error) error {
		select {
		case <-proc.exited:
			err = fmt.Errorf("%w (QEMU %s)", err, proc.status)
		default:
			syscall.Kill(proc.pid, syscall.SIGKILL)
			<-proc.exited
		}
		if l := lastLines(readTail(proc.log), 3); l != "" {
			err = fmt.Errorf("%w (QEMU: %s)", err, l)
		}
		return err
	}
	mon, err := proc.monitor(ctx)
	if err != nil {
		return fail(err)
	}
	defer mon.close()
	f, err := os.Open(statePath)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	if err := mon.setIgnoreShared(); err != nil {
		return fail(err)
	}
	if err := mon.loadState(ctx, f); err != nil {
		return fail(fmt.Errorf("restore the paused vm: %w%s", err, b.consoleTail(dir)))
	}
	st.PID, st.StartTime = proc.pid, procStartTime(proc.pid)
	if err := b.writeRun(id, st); err != nil {
		return fail(err)
	}
	// Running again: the saved state is history now.
	if err := os.Remove(statePath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func waitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for procStartTime(pid) != 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

func memAvailable() int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var kb int64
	for _, line := range strings.Split(string(data), "\n") {
		if n, _ := fmt.Sscanf(line, "MemAvailable: %d kB", &kb); n == 1 {
			return kb << 10
		}
	}
	return 0
}
