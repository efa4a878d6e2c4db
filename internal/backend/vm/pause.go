package vm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/poll"
	"github.com/nookhq/nook/internal/procfs"
)

var _ core.Pauser = (*Backend)(nil)

// A vm's directory holds its disks, logs, sockets and two small records:
//
//   - head.json: which disk file is the vm's current top layer, and (when
//     the vm is saved) which state file a start must load. Every change
//     of either (pause, snapshot, rollback, fork) writes the new files
//     under fresh names first and then replaces head.json (write, sync,
//     rename): that rename is the commit point, so a daemon killed at
//     any moment leaves the old or the new vm, never a mix.
//   - run.json: the live QEMU (PID and start time) and the machine it was
//     started as, since a resume starts a new QEMU.
//
// A paused vm is saved to disk: QMP stop, the guest's whole memory and
// device state migrated into a state file, head.json pointing at it, and
// QEMU ended, so that it holds no CPU and no RAM. Resume starts a QEMU on
// the head disk and loads the state: every process, open file and
// connection in the guest goes on.

// head is a vm's current disk and, if saved, the state to start from.
type head struct {
	Disk   string     `json:"disk"`             // file name in the vm's directory
	Chain  []layerRef `json:"chain"`            // Disk's backing images, nearest first (nook's record, not the qcow2 header's)
	Resume string     `json:"resume,omitempty"` // state file: relative to the directory, or absolute (a snapshot's)
}

func (b *Backend) readHead(id string) head {
	h := head{Disk: "disk.qcow2"}
	if data, err := os.ReadFile(filepath.Join(b.dir(id), "head.json")); err == nil {
		json.Unmarshal(data, &h)
	}
	return h
}

func (b *Backend) writeHead(id string, h head) error {
	return fsutil.WriteJSONAtomic(filepath.Join(b.dir(id), "head.json"), h)
}

func (h head) resumePath(dir string) string {
	if h.Resume == "" || filepath.IsAbs(h.Resume) {
		return h.Resume
	}
	return filepath.Join(dir, h.Resume)
}

// PauseKind implements core.Pauser.
func (b *Backend) PauseKind(id string) string {
	return "saved: memory and devices written to disk and QEMU stopped (no CPU, no RAM)"
}

// PausedInRAM implements core.RAMPauser: a vm's pause saves it to disk
// and ends its QEMU.
func (b *Backend) PausedInRAM(string) bool { return false }

func (b *Backend) runFile(id string) string { return filepath.Join(b.dir(id), "run.json") }

// readRun returns what run.json says, and whether that QEMU is alive.
func (b *Backend) readRun(id string) (state, bool) {
	var st state
	data, err := os.ReadFile(b.runFile(id))
	if err != nil || json.Unmarshal(data, &st) != nil {
		return st, false
	}
	return st, st.PID > 0 && procfs.StartTime(st.PID) == st.StartTime
}

// operate takes the lock that serializes operations on one vm (pause,
// resume, snapshot, rollback, destroy, crash recovery), finishes what a
// crash interrupted, and returns the unlock.
func (b *Backend) operate(id string) func() {
	unlock := b.ops.Lock(id)
	b.recoverLocked(id)
	return unlock
}

// committed reports whether the vm's head names a saved state that exists.
func (b *Backend) committed(id string) bool {
	p := b.readHead(id).resumePath(b.dir(id))
	return p != "" && exists(p)
}

// running returns the sandbox's live QEMU. A QEMU whose saved state the
// head committed only waits to end: it does not count.
func (b *Backend) running(id string) (state, bool) {
	st, live := b.readRun(id)
	if live && st.Saved && b.committed(id) {
		return st, false
	}
	return st, live
}

// recover finishes what a crash interrupted, unless an operation on the
// vm is in progress (its state is then that operation's, not a crash's).
func (b *Backend) recover(id string) {
	if unlock, ok := b.ops.TryLock(id); ok {
		defer unlock()
		b.recoverLocked(id)
	}
}

// recoverLocked, with the vm's lock held: a QEMU whose state was being
// saved (run.json says so) is ended if the head committed that state, and
// continued (its save cancelled) if it did not.
func (b *Backend) recoverLocked(id string) {
	st, live := b.readRun(id)
	if !live || !st.Saved {
		return
	}
	if b.committed(id) {
		syscall.Kill(st.PID, syscall.SIGKILL)
		waitGone(st.PID, 5*time.Second)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mon, err := dialQMP(ctx, filepath.Join(b.dir(id), "qmp.sock"))
	if err != nil {
		return
	}
	defer mon.close()
	// A save the crash cut short may still be writing: cancel it, wait
	// for it to end, then let the guest go on.
	mon.run("migrate_cancel", nil, nil)
	poll.Until(ctx, poll.Options{Min: 5 * time.Millisecond}, func() (bool, error) {
		var q struct {
			Status string `json:"status"`
		}
		err := mon.run("query-migrate", nil, &q)
		return err != nil || (q.Status != "active" && q.Status != "cancelling" && q.Status != "device" && q.Status != "setup"), nil
	})
	if err := mon.run("cont", nil, nil); err == nil {
		st.Saved = false
		b.writeRun(id, st)
	} else {
		b.cfg.Log.Warn("continue a vm whose save was interrupted", "sandbox", id, "err", err)
	}
}

func (b *Backend) writeRun(id string, st state) error {
	return fsutil.WriteJSONAtomic(b.runFile(id), st)
}

// Paused implements core.Pauser.
func (b *Backend) Paused(ctx context.Context, id string) (bool, error) {
	b.recover(id)
	if b.readHead(id).Resume == "" {
		return false, nil
	}
	_, live := b.running(id)
	return !live, nil
}

// saveTo stops a live vm and writes its whole state to path (via a
// temporary file, synced). The vm stays stopped; its QEMU is alive. Its
// run.json says so first, so that after a crash running() continues a
// QEMU whose save no head committed.
func (b *Backend) saveTo(ctx context.Context, id, path string) error {
	st, _ := b.readRun(id)
	st.Saved = true
	if err := b.writeRun(id, st); err != nil {
		return err
	}
	mon, err := dialQMP(ctx, filepath.Join(b.dir(id), "qmp.sock"))
	if err != nil {
		st.Saved = false
		b.writeRun(id, st)
		return err
	}
	defer mon.close()
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	// Always on, so that a start knows what to expect; a sandbox's RAM is
	// private (share=off), so all of it goes into the state either way.
	start := time.Now()
	// Start the disk writing while QEMU still writes the stream, so that
	// the fsync after it has only the tail left to wait for.
	stopFlush := flushBehind(f)
	err = mon.setIgnoreShared()
	if err == nil {
		err = mon.saveState(ctx, f)
	}
	stopFlush()
	migrated := time.Now()
	if err == nil {
		err = f.Sync()
	}
	b.cfg.Log.Debug("vm save", "sandbox", id, "migrate", migrated.Sub(start), "sync", time.Since(migrated))
	f.Close()
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		mon.run("cont", nil, nil) // leave it running, as it was
		st.Saved = false
		b.writeRun(id, st)
		return fmt.Errorf("save the vm: %w", err)
	}
	syncDir(filepath.Dir(path))
	return nil
}

// flushBehind asks the kernel to write f's dirty pages out every few
// milliseconds, until the returned stop is called.
func flushBehind(f *os.File) (stop func()) {
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				unix.SyncFileRange(int(f.Fd()), 0, 0, unix.SYNC_FILE_RANGE_WRITE)
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// stopQEMU ends a QEMU whose state is safe (stop already flushed its disks).
func stopQEMU(ctx context.Context, dir string, pid int) {
	if mon, err := dialQMP(ctx, filepath.Join(dir, "qmp.sock")); err == nil {
		mon.run("quit", nil, nil)
		mon.close()
	}
	if !waitGone(pid, 10*time.Second) {
		syscall.Kill(pid, syscall.SIGKILL)
		waitGone(pid, 5*time.Second)
	}
}

// Pause implements core.Pauser.
func (b *Backend) Pause(ctx context.Context, id string) error {
	defer b.operate(id)()
	st, live := b.running(id)
	h := b.readHead(id)
	if !live {
		if h.Resume != "" {
			return nil // already saved
		}
		return errdefs.Precondition("the vm is not running")
	}
	name := "paused-" + randHex(4) + ".state"
	start := time.Now()
	if err := b.saveTo(ctx, id, filepath.Join(b.dir(id), name)); err != nil {
		return err
	}
	saved := time.Now()
	err := b.commitSaved(ctx, id, st, head{Disk: h.Disk, Chain: h.Chain, Resume: name}, "")
	b.cfg.Log.Debug("vm pause", "sandbox", id, "save", saved.Sub(start), "commit and quit", time.Since(saved))
	return err
}

// commitSaved ends a vm whose state was just saved, once head h (naming
// that state) is committed: run.json says saved first, so that a crash
// before the head commit continues the QEMU and one after ends it. A
// disk file the vm no longer uses (oldDisk) is removed last.
func (b *Backend) commitSaved(ctx context.Context, id string, st state, h head, oldDisk string) error {
	st.Saved = true
	if err := b.writeRun(id, st); err != nil {
		return err
	}
	if err := b.writeHead(id, h); err != nil {
		return err
	}
	stopQEMU(ctx, b.dir(id), st.PID)
	if oldDisk != "" && oldDisk != h.Disk {
		os.Remove(filepath.Join(b.dir(id), oldDisk))
	}
	return nil
}

// Resume implements core.Pauser: it starts the vm from the state its head names.
func (b *Backend) Resume(ctx context.Context, id string) error {
	defer b.operate(id)()
	if _, live := b.running(id); live {
		return nil
	}
	st, _ := b.readRun(id)
	if st.KernelHash == "" {
		return fmt.Errorf("the vm's record (run.json) is missing")
	}
	return b.startSaved(ctx, id, st)
}

// startSaved starts QEMU on the head disk, loads the head's state, and
// records the new QEMU; a state file of the vm's own is then deleted.
func (b *Backend) startSaved(ctx context.Context, id string, st state) error {
	dir := b.dir(id)
	h := b.readHead(id)
	statePath := h.resumePath(dir)
	if adopted, err := b.adoptOrphan(ctx, id, st, h); adopted || err != nil {
		return err
	}
	if statePath == "" {
		return errdefs.Precondition("the vm has no saved state to start from")
	}
	fi, err := os.Stat(statePath)
	if err != nil {
		return fmt.Errorf("the vm's saved state: %w", err)
	}
	if avail := memAvailable(); avail > 0 && avail < fi.Size()+(256<<20) {
		return errdefs.Exhausted("not enough free memory to start the vm: it needs about %s, the host has %s available",
			core.FormatBytes(fi.Size()+(256<<20)), core.FormatBytes(avail))
	}
	k, err := b.stateKernel(ctx, st)
	if err != nil {
		return err
	}
	if k.Hash != st.KernelHash {
		return errdefs.Precondition("the vm was saved with another guest kernel or agent (%s), which this nook no longer has", st.KernelHash)
	}
	m := machine{Accel: st.Accel, CPUs: st.CPUs, MemoryMiB: st.MemoryMiB, Kernel: k, TSCKHz: st.TSCKHz, Init: st.Init}
	begin := time.Now()
	proc, _, err := b.relaunch(ctx, id, st, h, m, true)
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
	started := time.Now()
	f, err := os.Open(statePath)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	if err := mon.setIgnoreShared(); err != nil {
		return fail(err)
	}
	if err := mon.loadState(ctx, f); err != nil {
		return fail(fmt.Errorf("start the saved vm: %w%s", err, b.consoleTail(dir)))
	}
	b.cfg.Log.Debug("vm start from a saved state", "sandbox", id, "qemu up", started.Sub(begin), "load", time.Since(started))
	st.PID, st.StartTime, st.Saved = proc.pid, procfs.StartTime(proc.pid), false
	if err := b.writeRun(id, st); err != nil {
		return fail(err)
	}
	h.Resume = ""
	if err := b.writeHead(id, h); err != nil {
		return fail(err)
	}
	// Running again: a state file of its own is history (a snapshot's stays).
	if strings.HasPrefix(statePath, dir+string(filepath.Separator)) {
		if err := os.Remove(statePath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// relaunch starts a new QEMU for an existing vm, on its head disk, as the
// machine m (incoming: it waits for a saved state to load), with its
// network and its QEMU user.
func (b *Backend) relaunch(ctx context.Context, id string, st state, h head, m machine, incoming bool) (*qemuProc, launch, error) {
	dir := b.dir(id)
	l := launch{machine: m, Disk: filepath.Join(dir, h.Disk), Chain: h.Chain, AgentSock: filepath.Join(dir, "agent.sock"),
		QMPSock: filepath.Join(dir, "qmp.sock"), ConsoleLog: filepath.Join(dir, "console.log"), Incoming: incoming}
	var err error
	if b.cfg.Net != nil {
		if l.Tap, err = b.cfg.Net.AttachTap(ctx, id); err != nil {
			return nil, l, fmt.Errorf("network: %w", err)
		}
	}
	os.Remove(l.AgentSock)
	os.Remove(l.QMPSock)
	uid, err := b.vmUID(id)
	if err != nil {
		return nil, l, err
	}
	proc, err := b.start(ctx, &core.Sandbox{ID: id, CPUs: st.CPULimit, MemoryBytes: st.MemoryMiB << 20}, l, uid)
	return proc, l, err
}

// adoptOrphan deals with a QEMU an interrupted start left using the vm's
// disk (the daemon died between starting it and recording it). If its
// guest runs, the start had loaded the saved state and continued: it is
// adopted and the start committed. Otherwise it never ran guest code
// (disks stay inactive until then), so it is ended and the start can
// begin again from the same state.
func (b *Backend) adoptOrphan(ctx context.Context, id string, st state, h head) (bool, error) {
	dir := b.dir(id)
	pid := qemuPID(dir)
	if pid == 0 {
		return false, nil
	}
	qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	status := ""
	if mon, err := dialQMP(qctx, filepath.Join(dir, "qmp.sock")); err == nil {
		status, _ = mon.status()
		mon.close()
	}
	if status == "running" {
		st.PID, st.StartTime, st.Saved = pid, procfs.StartTime(pid), false
		if err := b.writeRun(id, st); err != nil {
			return false, err
		}
		statePath := h.resumePath(dir)
		h.Resume = ""
		if err := b.writeHead(id, h); err != nil {
			return false, err
		}
		if strings.HasPrefix(statePath, dir+string(filepath.Separator)) {
			os.Remove(statePath)
		}
		b.cfg.Log.Info("adopted a vm an interrupted start had left running", "sandbox", id, "pid", pid)
		return true, nil
	}
	syscall.Kill(pid, syscall.SIGKILL)
	waitGone(pid, 5*time.Second)
	return false, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func waitGone(pid int, timeout time.Duration) bool {
	return poll.Until(context.Background(), poll.Options{Timeout: timeout, Max: 5 * time.Millisecond}, func() (bool, error) {
		return procfs.StartTime(pid) == 0, nil
	}) == nil
}

func syncDir(dir string) { fsutil.SyncDir(dir) }

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

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
