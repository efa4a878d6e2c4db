package container

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/poll"
	"github.com/nookhq/nook/internal/procfs"
)

// With CRIU configured, a paused container is checkpointed to disk and
// ended, so that it holds no RAM; resume restores it with every process,
// open file and TCP connection. The sandbox's directory then holds:
//
//	checkpoint/      CRIU's images of the paused container (committed)
//	checkpoint.tmp/  a checkpoint being written
//	restoring        a restore under way
//	criu/            CRIU's logs
//
// A checkpoint freezes the container, dumps it with --leave-running (so it
// stays frozen and whole until the images are safe), renames the images
// into place, and only then ends the container. A restore writes
// `restoring` first and removes the images once the container runs. A
// crash at any point leaves a state settleCheckpoint completes (Status
// calls it): images and a live container mean a checkpoint whose
// container was not ended yet (it is ended), or, with `restoring`, a
// restore that finished (the images go).

// DefaultCRIU is where scripts/criu.sh installs the CRIU nook builds.
const DefaultCRIU = "/usr/local/lib/nook/criu/sbin/criu"

// CRIUVersion returns the version of the CRIU binary at path, and whether
// it can checkpoint nook's containers: CRIU 4 or later (Debian bookworm's
// 3.17 fails on kernels from 6.13 on), built with scripts/criu.sh's patch
// that restores a container into the user namespace it names (without
// it, no user-namespaced sandbox can be restored). why says what is
// missing when !ok.
func CRIUVersion(ctx context.Context, path string) (version string, ok bool, why string, err error) {
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", false, "", fmt.Errorf("%s --version: %w", path, err)
	}
	m := regexp.MustCompile(`Version: (\d+)\.(\d+)(\.\d+)?`).FindStringSubmatch(string(out))
	if m == nil {
		return "", false, "", fmt.Errorf("%s --version printed no version: %q", path, out)
	}
	major, _ := strconv.Atoi(m[1])
	version = strings.TrimPrefix(m[0], "Version: ")
	if major < 4 {
		return version, false, fmt.Sprintf("%s is CRIU %s, and checkpoints need CRIU >= 4 (scripts/criu.sh builds it)", path, version), nil
	}
	if patch, err := os.ReadFile(path + ".patch"); err != nil || len(bytes.TrimSpace(patch)) == 0 {
		return version, false, fmt.Sprintf("%s is CRIU %s without nook's patch for user namespaces (%s.patch is missing; scripts/criu.sh builds it)", path, version, path), nil
	}
	return version, true, "", nil
}

func (b *Backend) checkpointDir(id string) string { return filepath.Join(b.dir(id), "checkpoint") }

// checkpointed reports whether sandbox id is paused to disk.
func (b *Backend) checkpointed(id string) bool {
	_, err := os.Stat(filepath.Join(b.checkpointDir(id), "inventory.img"))
	return err == nil
}

// checkpoint pauses sandbox id to disk, or, if CRIU cannot save its
// processes, leaves it frozen in RAM (still paused; the log says why).
// The caller holds the sandbox's CRIU lock (lockCRIU), and settled what
// an earlier one left.
func (b *Backend) checkpoint(ctx context.Context, id string, lock *os.File) error {
	if b.checkpointed(id) {
		return nil
	}
	dir := b.dir(id)
	if _, err := b.lookupInit(id); err != nil {
		return err
	}
	start := time.Now()
	if frozen, err := b.frozen(id); err != nil {
		return err
	} else if !frozen {
		if err := b.freeze(ctx, id, lock); err != nil {
			return err
		}
	}
	frozenAt := time.Now()
	final, tmp := b.checkpointDir(id), b.checkpointDir(id)+".tmp"
	if err := clearDir(tmp); err != nil {
		return err
	}
	if err := b.dump(ctx, id, lock, tmp); err != nil {
		// Still a pause: in RAM, frozen (PauseKind says so).
		os.RemoveAll(tmp)
		b.cfg.Log.Warn("pause to disk failed: the sandbox stays frozen in RAM instead", "sandbox", id, "err", err)
		if frozen, ferr := b.frozen(id); ferr == nil && frozen {
			return nil
		}
		return b.freeze(ctx, id, lock)
	}
	dumped := time.Now()
	if err := syncFiles(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	fsutil.SyncDir(dir)
	committed := time.Now()
	// Committed: from here the sandbox is paused to disk whatever happens.
	if err := b.stop(context.WithoutCancel(ctx), id); err != nil {
		return fmt.Errorf("end the checkpointed container: %w", err)
	}
	b.cfg.Log.Debug("checkpoint", "sandbox", id, "freeze", frozenAt.Sub(start), "dump", dumped.Sub(frozenAt),
		"commit", committed.Sub(dumped), "end", time.Since(committed), "total", time.Since(start))
	return nil
}

// dump saves the processes of frozen sandbox id into the directory
// images with CRIU, and leaves them frozen. The caller holds the CRIU lock.
func (b *Backend) dump(ctx context.Context, id string, lock *os.File, images string) error {
	work := filepath.Join(b.dir(id), "criu")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	if err := b.writeCRIUConf(id, false); err != nil {
		return err
	}
	// --leave-running: the container stays (frozen) until the images are
	// safe. The host's connections to the agent are closed by now; the
	// sandbox's TCP connections are saved with it (--tcp-established), and
	// so are its file locks.
	for attempt := 1; ; attempt++ {
		if err := b.freezeSettled(ctx, id, lock); err != nil {
			return err
		}
		err := b.runcFiles(ctx, id, []*os.File{lock}, "checkpoint", "--image-path", images, "--work-path", work,
			"--leave-running", "--tcp-established", "--file-locks", id)
		if err == nil {
			return nil
		}
		errs := criuErrorLines(filepath.Join(work, "dump.log"))
		why := formatCRIUErrors(errs)
		// A process CRIU could not seize all the same, and the agent may
		// not have closed a connection the host just dropped (its peer is
		// outside, so CRIU cannot save it): let it run a moment, and try again.
		all := strings.Join(errs, "\n")
		if attempt < 3 && (strings.Contains(all, "Unseizable") || strings.Contains(all, "sk-unix")) {
			b.cfg.Log.Info("checkpoint found a process it could not seize or a connection from the host; trying again", "sandbox", id, "attempt", attempt, "err", why)
			if uerr := b.unfreeze(ctx, id); uerr != nil {
				return fmt.Errorf("checkpoint with CRIU: %w%s; and the retry could not thaw the sandbox: %v", err, why, uerr)
			}
			time.Sleep(50 * time.Millisecond)
			if err := clearDir(images); err != nil {
				return err
			}
			continue
		}
		return fmt.Errorf("checkpoint with CRIU: %w%s", err, why)
	}
}

// freezeSettled freezes sandbox id (if it is not frozen) at a moment when
// no process waits in vfork for a child frozen before its exec: CRIU
// cannot seize such a parent and would wait out its whole timeout (3 s)
// before it fails. Caught at one, it thaws the container for a
// millisecond and freezes it again; a wait that lasts (a child blocked
// before its exec) is an error.
func (b *Backend) freezeSettled(ctx context.Context, id string, lock *os.File) error {
	for attempt := 1; ; attempt++ {
		if frozen, err := b.frozen(id); err != nil {
			return err
		} else if !frozen {
			if err := b.freeze(ctx, id, lock); err != nil {
				return err
			}
		}
		tid := b.vforkWaiter(id)
		if tid == 0 {
			return nil
		}
		if attempt == 20 {
			return fmt.Errorf("process %d of the sandbox has waited in vfork for a child that has not reached its exec (CRIU cannot save a process there)", tid)
		}
		b.cfg.Log.Debug("frozen while a process waits in vfork; freezing again", "sandbox", id, "tid", tid)
		if err := b.unfreeze(ctx, id); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
}

// vforkWaiter returns a thread of sandbox id that waits in vfork for its
// child (its kernel wait channel says so), or 0.
func (b *Backend) vforkWaiter(id string) int {
	for _, tid := range cgroups.Threads(b.cfg.CgroupParent, id) {
		w, err := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", tid))
		if err != nil {
			continue
		}
		switch string(w) {
		case "kernel_clone", "_do_fork", "do_fork", "wait_for_vfork_done": // by kernel version
			return tid
		}
	}
	return 0
}

// clearDir empties dir.
func clearDir(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Mkdir(dir, 0o700)
}

// writeCRIUConf writes the CRIU settings runc passes on for sandbox id's
// container (the spec's org.criu.config): give up on a process CRIU
// cannot stop after 3 s, not 10 (dump retries); and for a restore from
// a snapshot (tcpClose), bring TCP connections back closed, since their
// peers have moved on and a fork has another address. Every dump and
// restore writes it first, so what one wrote never applies to the next.
func (b *Backend) writeCRIUConf(id string, tcpClose bool) error {
	conf := "timeout 3\n"
	if tcpClose {
		conf += "tcp-close\n"
	}
	return os.WriteFile(filepath.Join(b.dir(id), "criu.conf"), []byte(conf), 0o600)
}

// lookupInit returns the running init of sandbox id.
func (b *Backend) lookupInit(id string) (state, error) {
	var st state
	if err := fsutil.ReadJSON(filepath.Join(b.dir(id), "init.json"), &st); err != nil || st.PID <= 0 || procfs.StartTime(st.PID) != st.StartTime {
		return state{}, errdefs.Precondition("sandbox %s is not running", id)
	}
	return st, nil
}

// restore resumes a sandbox paused to disk. The caller holds the
// sandbox's CRIU lock, and settled what an earlier one left (so no
// container of it runs).
func (b *Backend) restore(ctx context.Context, id string, lock *os.File) error {
	dir := b.dir(id)
	if err := checkMemory(b.checkpointDir(id), "resuming", 0); err != nil {
		return err
	}
	// What a restore or a checkpoint a crash cut short left: runc's state
	// of a container that is no more, a mount.
	if err := b.stop(ctx, id); err != nil {
		return err
	}
	c, err := b.sandboxChain(id)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	lowers, err := b.lowerDirs(c)
	if err != nil {
		return err
	}
	start := time.Now()
	if _, err := os.Stat(b.diskImage(id)); err == nil {
		if err := b.mountDisk(id); err != nil { // after a reboot
			return err
		}
	}
	m, err := b.ownIDMap(id)
	if err != nil {
		return err
	}
	// After a host reboot the namespaces are gone: new ones (the user
	// namespace with the sandbox's range) get the sandbox's network (same
	// address) before the processes come back.
	made, err := b.ensureNamespaces(id, m)
	if err != nil {
		return err
	}
	if err := b.mountRoot(id, lowers, m); err != nil {
		return err
	}
	fail := func(err error) error {
		// Still paused to disk: the images stay, for another try.
		if serr := b.stop(context.WithoutCancel(ctx), id); serr != nil {
			b.cfg.Log.Error("clean up after a failed restore", "sandbox", id, "err", serr)
		}
		os.Remove(filepath.Join(dir, "restoring"))
		return err
	}
	if made && b.cfg.Net != nil {
		if err := b.cfg.Net.AttachNetns(ctx, id, b.netnsFile(id)); err != nil {
			return fail(fmt.Errorf("network: %w", err))
		}
	}
	if err := fsutil.WriteFileSync(filepath.Join(dir, "restoring"), nil); err != nil {
		return fail(err)
	}
	if err := b.runcRestore(ctx, id, lock, b.checkpointDir(id), false); err != nil {
		return fail(err)
	}
	restored := time.Now()
	if err := b.finishRestore(id); err != nil {
		return err
	}
	b.cfg.Log.Debug("restore", "sandbox", id, "criu", restored.Sub(start), "total", time.Since(start))
	return nil
}

// readableImages lets the processes CRIU restores read their images: in
// a user-namespaced sandbox they open some of them once they are the
// sandbox's uids, through the images directory CRIU opened (so only that
// directory's search bit counts, not those above it). The directories
// above keep everyone else out: a sandbox's directory is its own root's
// and the host's root's (userns.go), the snapshots' directory root's.
func readableImages(dir string) error {
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type().IsRegular() {
			if err := os.Chmod(filepath.Join(dir, e.Name()), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// runcRestore brings sandbox id's processes back from the images in
// images with `runc restore --detach`, TCP connections as they were or
// (tcpClose) closed. The caller holds the CRIU lock, and mounted the
// sandbox's root and made its network namespace.
func (b *Backend) runcRestore(ctx context.Context, id string, lock *os.File, images string, tcpClose bool) error {
	dir := b.dir(id)
	work := filepath.Join(dir, "criu")
	if err := os.MkdirAll(work, 0o700); err != nil {
		return err
	}
	if err := b.writeCRIUConf(id, tcpClose); err != nil {
		return err
	}
	if tcpClose { // the next dump of this container must not close its connections
		defer b.writeCRIUConf(id, false)
	}
	if err := readableImages(images); err != nil {
		return err
	}
	args := []string{"restore", "--detach", "--image-path", images, "--work-path", work,
		"--file-locks", "--pid-file", filepath.Join(dir, "init.pid"), "--bundle", dir}
	if !tcpClose {
		args = append(args, "--tcp-established")
	}
	if err := b.runcSetup(ctx, id, []*os.File{lock}, append(args, id)...); err != nil {
		return fmt.Errorf("restore with CRIU: %w%s", err, formatCRIUErrors(criuErrorLines(filepath.Join(work, "restore.log"))))
	}
	return nil
}

// finishRestore records the restored container's init and drops the images.
func (b *Backend) finishRestore(id string) error {
	if _, err := b.recordInit(id); err != nil {
		return err
	}
	if err := b.dropCheckpoint(id); err != nil {
		return err
	}
	return os.Remove(filepath.Join(b.dir(id), "restoring"))
}

// settleCheckpoint completes what a crash interrupted (see the top of this
// file). The caller holds the CRIU lock, so the runc of a daemon that
// died (still at work, perhaps) is done.
func (b *Backend) settleCheckpoint(ctx context.Context, id string) error {
	dir := b.dir(id)
	marker := filepath.Join(dir, "restoring")
	_, restoring := os.Stat(marker)
	_, err := b.lookupInit(id)
	running := err == nil
	os.RemoveAll(b.checkpointDir(id) + ".tmp")
	os.RemoveAll(b.checkpointDir(id) + ".old")
	if !b.checkpointed(id) {
		// What an earlier nook's removal of the images left (no inventory:
		// not a checkpoint) would block the next one's commit.
		if err := b.dropCheckpoint(id); err != nil {
			return err
		}
		if restoring == nil {
			return os.Remove(marker)
		}
		return nil
	}
	restored := false
	if restoring == nil {
		st, err := b.runcStatus(ctx, id)
		if err != nil {
			// Guessing "not restored" would replay images older than
			// processes that ran: ask again later.
			return err
		}
		// Restored, whatever it did since (its init may even have exited):
		// its processes ran on from the images, which are stale now.
		restored = st != ""
	}
	switch {
	case restored:
		// The restore had finished: init.pid names the restored init.
		b.cfg.Log.Info("finishing an interrupted resume", "sandbox", id)
		return b.finishRestore(id)
	case restoring == nil:
		// The restore failed or never ran: still paused to disk.
		return errors.Join(b.stop(ctx, id), os.Remove(marker))
	case running:
		if frozen, _ := b.frozen(id); frozen {
			// The checkpoint was taken but had not ended the container yet.
			b.cfg.Log.Info("finishing an interrupted pause to disk", "sandbox", id)
			return b.stop(ctx, id)
		}
		// A container that runs on (a rollback that had started it anew)
		// makes the images stale.
		b.cfg.Log.Info("dropping a checkpoint older than the running container", "sandbox", id)
		return b.dropCheckpoint(id)
	}
	return nil
}

// dropCheckpoint removes sandbox id's images, atomically: a crash in the
// middle of the removal must leave neither a partial checkpoint that looks
// whole nor one that blocks the next pause.
func (b *Backend) dropCheckpoint(id string) error {
	final := b.checkpointDir(id)
	old := final + ".old"
	if err := os.RemoveAll(old); err != nil {
		return err
	}
	if err := os.Rename(final, old); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	fsutil.SyncDir(b.dir(id))
	return os.RemoveAll(old)
}

// lockCRIU takes the sandbox's CRIU lock, waiting for it until ctx ends.
// It is passed on to the runc of a checkpoint or a restore, so that it is
// held while that runc runs, even after the daemon that started it died.
func (b *Backend) lockCRIU(ctx context.Context, id string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(b.dir(id), "criu.lock"), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sandbox %s has no files on this host (was it removed?): %w", id, err)
	}
	if err != nil {
		return nil, err
	}
	var lockErr error
	err = poll.Until(ctx, poll.Options{Min: 5 * time.Millisecond, Max: 5 * time.Millisecond}, func() (bool, error) {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil || errors.Is(err, unix.EWOULDBLOCK) || errors.Is(err, unix.EINTR) {
			return err == nil, nil
		}
		lockErr = fmt.Errorf("lock %s: %w", f.Name(), err)
		return false, lockErr
	})
	switch {
	case err == nil:
		return f, nil
	case lockErr != nil:
		f.Close()
		return nil, lockErr
	}
	f.Close()
	return nil, fmt.Errorf("waiting for the CRIU of an earlier checkpoint or restore of sandbox %s to finish: %w", id, err)
}

// waitCRIU waits for the runc of a checkpoint or restore of sandbox id
// that an earlier daemon started (it may run on after that daemon died),
// and keeps others out until release. lock is nil when the sandbox has no
// directory (and so no checkpoint either).
func (b *Backend) waitCRIU(ctx context.Context, id string) (lock *os.File, release func(), err error) {
	lock, err = b.lockCRIU(ctx, id)
	if errors.Is(err, os.ErrNotExist) {
		return nil, func() {}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return lock, func() { lock.Close() }, nil
}

// runcStatus is runc's status of sandbox id's container ("running",
// "paused", "stopped", ...), or "" if runc does not know it.
func (b *Backend) runcStatus(ctx context.Context, id string) (string, error) {
	cmd := exec.CommandContext(ctx, b.cfg.Runc, "--root", b.cfg.RuncRoot, "state", id)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if strings.Contains(stderr.String(), "does not exist") {
			return "", nil
		}
		return "", fmt.Errorf("runc state %s: %w: %s", id, err, strings.TrimSpace(stderr.String()))
	}
	var st struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("runc state %s: %w", id, err)
	}
	return st.Status, nil
}

// syncFiles flushes every file in dir, and dir (cheaper than syncfs of
// a filesystem other sandboxes write to).
func syncFiles(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return err
		}
	}
	fsutil.SyncDir(dir)
	return nil
}

// checkMemory refuses a restore the host has not the memory for: the
// pages of the images in dir, against MemAvailable plus freed (what the
// operation frees first). op names it: "resuming", "rolling back", "forking".
func checkMemory(images, op string, freed int64) error {
	var need int64
	entries, _ := os.ReadDir(images)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "pages-") {
			if fi, err := e.Info(); err == nil {
				need += fi.Size()
			}
		}
	}
	avail, err := memAvailable()
	if err != nil {
		return nil // cannot tell: let CRIU try
	}
	if avail += freed; need > avail {
		return errdefs.Precondition("%s needs %d MiB of memory for the sandbox's processes and the host has %d MiB available: free memory (pause or remove other sandboxes) and try again", op, need>>20, avail>>20)
	}
	return nil
}

// memAvailable is /proc/meminfo's MemAvailable in bytes.
func memAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}

// criuErrorLines is the error lines of CRIU's log (of its last 64 KiB).
func criuErrorLines(log string) []string {
	var errs []string
	for _, l := range strings.Split(fsutil.Tail(log, 64<<10), "\n") {
		if strings.Contains(l, "Error") {
			errs = append(errs, strings.TrimSpace(l))
		}
	}
	return errs
}

// formatCRIUErrors says why CRIU failed: its first errors (the later
// ones are what failed because of them).
func formatCRIUErrors(errs []string) string {
	if len(errs) > 3 {
		errs = errs[:3]
	}
	if len(errs) == 0 {
		return ""
	}
	return " (CRIU: " + strings.Join(errs, "; ") + ")"
}
