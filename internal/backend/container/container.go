// Package container is the container isolation backend: Linux namespaces,
// a user namespace of its own per sandbox (its root is an unprivileged
// uid on the host: userns.go), cgroups and seccomp through an OCI runtime
// (runc, driven through its CLI; the one runcbin.Find picks, CRIU
// reaching it through PATH: see runcenv.go), with the root filesystem an
// overlay over a read-only template, idmapped, whose writable layer lives
// on the sandbox's own loop-mounted ext4 image, so that its size (--disk)
// and inodes are limited (disk.go).
package container

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/diskimg"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/keylock"
	"github.com/nookhq/nook/internal/mntns"
	"github.com/nookhq/nook/internal/poll"
	"github.com/nookhq/nook/internal/procfs"
	"github.com/nookhq/nook/internal/runcbin"
	"github.com/nookhq/nook/internal/warmpool"
)

// Config configures the backend.
type Config struct {
	Runc         string // runc binary; default: runcbin.Find (scripts/runc.sh's build, else runc in PATH)
	RuncRoot     string // runc's state directory (tmpfs, e.g. /run/nook/runc)
	StateDir     string // per-sandbox directories (e.g. /var/lib/nook/sandboxes)
	SnapshotDir  string // snapshot layers (e.g. /var/lib/nook/container-snapshots); default: beside StateDir
	AgentBinary  string // the host's static nook-agent, bind-mounted into every sandbox
	CgroupParent string // sandboxes' cgroups go under /<CgroupParent>/<id> in every hierarchy
	// TemplateRootfs returns the read-only root filesystem of a template build.
	TemplateRootfs func(templateID string) (string, error)
	// TemplateLayers, if set, returns the layer directories (topmost
	// first) of a template build made of layers rather than one rootfs
	// (a Dockerfile build's step), or nil for one that is a rootfs.
	TemplateLayers func(templateID string) ([]string, error)
	// VolumePath returns the host directory of volume name's files
	// (mounted): what a sandbox that mounts it sees at its target.
	VolumePath func(name string) (string, error)
	// HostMountPath returns a recorded host mount's directory if the
	// daemon still allows it.
	HostMountPath func(dir string) (string, error)
	// VolumesDir is where the volumes are mounted on the host: runc's
	// mount namespace is made without those mounts (it needs none, and
	// a copy would keep a removed volume's image attached).
	VolumesDir string
	// WarmPool is how many started containers to keep ready per template
	// build in use (0: none; every create starts a container).
	WarmPool int
	// WarmPoolMax is how many a template build's pool may grow to after
	// bursts of creates (see internal/warmpool); below WarmPool (0):
	// WarmPool, no growth.
	WarmPoolMax int
	// Net gives every container, warm ones included, its network: the
	// backend attaches the network namespace runc made for it once its
	// init runs, and detaches it on Destroy. nil: loopback only.
	Net core.NetHooks
	// CRIU is a CRIU >= 4 binary: a pause then checkpoints the container
	// to disk (see checkpoint.go). Empty: pauses freeze it in RAM.
	CRIU string
	// IDClaimDir holds the host-wide claims of the uid ranges of
	// user-namespaced sandboxes (userns.go); every daemon on a host must
	// share it. Default: /var/lib/nook/userns.
	IDClaimDir string
	Log        *slog.Logger
}

// DefaultIDClaimDir is where the uid ranges of sandboxes are claimed.
const DefaultIDClaimDir = "/var/lib/nook/userns"

// Backend runs container sandboxes.
type Backend struct {
	cfg  Config
	pool *warmpool.Pool[state]
	// versionMu guards the runc version Available read last, and the
	// binary it read it from (path, size, mtime).
	versionMu           sync.Mutex
	versionKey, version string
	// gcMu: snapshots, rollbacks and forks (readers) against the removal
	// of layers nothing uses (the writer).
	gcMu sync.RWMutex
	// rollbacks: a rollback against Status finishing an interrupted one.
	rollbacks keylock.Map
	// legacyOnce: the sandboxes made before user namespaces are marked
	// once, before any is started (markLegacy).
	legacyOnce sync.Once
	legacyErr  error
	// base is the mount namespace runc run and restore start from
	// (mountBase); baseFailed: it could not be made, do not try again.
	baseMu     sync.Mutex
	base       *mntns.Base
	baseFailed bool
}

var _ core.Backend = (*Backend)(nil)

// New returns a container backend.
func New(cfg Config) *Backend {
	if cfg.Runc == "" {
		cfg.Runc = runcbin.Find()
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "nook"
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.IDClaimDir == "" {
		cfg.IDClaimDir = DefaultIDClaimDir
	}
	if cfg.SnapshotDir == "" {
		cfg.SnapshotDir = filepath.Join(filepath.Dir(cfg.StateDir), "container-snapshots")
	}
	b := &Backend{cfg: cfg}
	b.pool = newPool(b, cfg)
	return b
}

// Isolation implements core.Backend.
func (b *Backend) Isolation() string { return api.IsolationContainer }

// Capabilities implements core.Backend. The disk is the sandbox's own
// ext4 image (disk.go). Snapshots have the memory too where CRIU is
// configured (see memory.go).
func (b *Backend) Capabilities() api.Capabilities {
	return api.Capabilities{CPULimit: true, MemoryLimit: true, DiskLimit: true, PidsLimit: true, Pause: true, Snapshot: true, Stop: true,
		DefaultDiskBytes: DefaultDisk, MinDiskBytes: MinDisk}
}

// runcVersion is what `runc --version` says first, asked again only when
// the binary changed (every create asks whether the backend is available).
func (b *Backend) runcVersion(ctx context.Context, path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	key := fmt.Sprintf("%s\x00%d\x00%d", path, fi.Size(), fi.ModTime().UnixNano())
	b.versionMu.Lock()
	defer b.versionMu.Unlock()
	if b.versionKey == key {
		return b.version, nil
	}
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", err
	}
	b.versionKey, b.version = key, strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "runc version ")
	return b.version, nil
}

// Available implements core.Backend.
func (b *Backend) Available(ctx context.Context) (bool, string, map[string]string) {
	path, err := exec.LookPath(b.cfg.Runc)
	if err != nil {
		return false, "runc is not installed (apt-get install runc)", nil
	}
	v, err := b.runcVersion(ctx, path)
	if err != nil {
		return false, fmt.Sprintf("%s --version failed: %v", path, err), nil
	}
	versions := map[string]string{"runc": v}
	if os.Geteuid() != 0 {
		return false, "the container backend needs root", versions
	}
	if ok, release := kernelAtLeast(5, 19); !ok {
		return false, fmt.Sprintf("Linux %s is too old: container sandboxes run in user namespaces over idmapped layers, which overlayfs takes from Linux 5.19 on", release), versions
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		return false, "unshare is not installed (apt-get install util-linux): it makes each container's user and network namespaces", versions
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return false, "mkfs.ext4 is not installed (apt-get install e2fsprogs): every container's disk is an ext4 image", versions
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return false, "no /dev/loop-control (modprobe loop): every container's disk is a loop-mounted image", versions
	}
	if _, err := os.Stat(b.cfg.AgentBinary); err != nil {
		return false, fmt.Sprintf("nook-agent binary not found at %s (build it with make build)", b.cfg.AgentBinary), versions
	}
	return true, "", versions
}

func (b *Backend) dir(id string) string    { return filepath.Join(b.cfg.StateDir, id) }
func (b *Backend) rootfs(id string) string { return filepath.Join(b.dir(id), "rootfs") }
func (b *Backend) socket(id string) string { return filepath.Join(b.dir(id), "agent.sock") }

// state is what the backend persists about a running sandbox.
type state struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"` // /proc/PID/stat field 22, to tell a reused PID apart
}

// Create implements core.Backend: it claims the warm container TakeWarm
// reserved under sb.ID if there is one, and starts a new container otherwise.
func (b *Backend) Create(ctx context.Context, sb *core.Sandbox) error {
	if w, ok := b.pool.Claimed(sb.ID); ok {
		err := b.claim(w, sb)
		if err == nil {
			return nil
		}
		b.cfg.Log.Warn("warm container unusable; starting a new one", "sandbox", sb.ID, "err", err)
		if err := b.Destroy(ctx, sb.ID); err != nil {
			return err
		}
	}
	if err := b.createCold(ctx, sb); err != nil {
		return err
	}
	b.Prewarm(sb)
	return nil
}

func (b *Backend) createCold(ctx context.Context, sb *core.Sandbox) error {
	return b.start(ctx, sb, chain{Template: sb.TemplateID}, true, nil)
}

// memoryImages is a snapshot's memory for start: CRIU's images, and the
// sandbox's CRIU lock (nil: start takes it). tcpClose: TCP connections
// come back closed (a fork: another address, and another sandbox's
// peers); otherwise as they were (a rollback, like a resume).
type memoryImages struct {
	dir      string
	lock     *os.File
	tcpClose bool
}

// start mounts a sandbox's root filesystem, its upper directory over the
// chain c, and runs its container: afresh, or (mem) restored from a
// snapshot's memory. A restore CRIU cannot do (a CRIU or kernel that
// changed since, a process it cannot bring back) starts the processes
// afresh on the snapshot's files instead, and logs why. fresh: a failure
// removes everything (a create, a fork); otherwise (a rollback) the
// sandbox's files stay.
func (b *Backend) start(ctx context.Context, sb *core.Sandbox, c chain, fresh bool, mem *memoryImages) error {
	if mem == nil {
		return b.startOnce(ctx, sb, c, fresh, nil)
	}
	err := b.startOnce(ctx, sb, c, false, mem)
	var re restoreError
	if errors.As(err, &re) {
		b.cfg.Log.Warn("the snapshot's processes could not be restored: starting them afresh on its files", "sandbox", sb.ID, "err", err)
		// What the restore left in the (new) upper directory goes.
		base := b.upperBase(sb.ID)
		if err = errors.Join(os.RemoveAll(filepath.Join(base, "upper")), os.RemoveAll(filepath.Join(base, "work"))); err == nil {
			return b.startOnce(ctx, sb, c, fresh, nil)
		}
	}
	if err != nil && fresh {
		if derr := b.Destroy(context.WithoutCancel(ctx), sb.ID); derr != nil {
			b.cfg.Log.Error("clean up after failed create", "sandbox", sb.ID, "err", derr)
		}
	}
	return err
}

// startOnce is start without the fallback.
func (b *Backend) startOnce(ctx context.Context, sb *core.Sandbox, c chain, fresh bool, mem *memoryImages) (err error) {
	lowers, tplLowers, err := b.lowerDirsN(c)
	if err != nil {
		return err
	}
	defer func() {
		switch {
		case err == nil:
		case fresh:
			if derr := b.Destroy(context.WithoutCancel(ctx), sb.ID); derr != nil {
				b.cfg.Log.Error("clean up after failed create", "sandbox", sb.ID, "err", derr)
			}
		default:
			if serr := b.stop(context.WithoutCancel(ctx), sb.ID); serr != nil {
				b.cfg.Log.Error("stop after failed start", "sandbox", sb.ID, "err", serr)
			}
		}
	}()
	dir := b.dir(sb.ID)
	if err := b.markLegacy(); err != nil {
		return err
	}
	// Only root on the host may list the sandboxes; a sandbox's own root
	// (an unprivileged uid on the host) may pass on the way to its rootfs.
	if err := os.MkdirAll(b.cfg.StateDir, 0o711); err != nil {
		return err
	}
	err = os.Mkdir(dir, 0o700)
	if err != nil && !os.IsExist(err) {
		return err
	}
	var m idmap
	if err == nil { // a new sandbox: its own uid range and disk
		if m, err = b.newIDMap(sb.ID); err != nil {
			return err
		}
		diskStart := time.Now()
		if err := b.makeDisk(ctx, sb.ID, diskSize(sb)); err != nil {
			return err
		}
		b.cfg.Log.Debug("disk image", "sandbox", sb.ID, "size", diskSize(sb), "duration", time.Since(diskStart))
	} else if m, err = b.ownIDMap(sb.ID); err != nil {
		return err
	}
	if m.enabled() {
		if err := errors.Join(searchable(b.cfg.StateDir), reachable(b.cfg.StateDir), sandboxDirMode(dir, m)); err != nil {
			return err
		}
	}
	if _, err := os.Stat(b.diskImage(sb.ID)); err == nil {
		if err := b.mountDisk(sb.ID); err != nil {
			return err
		}
	}
	base := b.upperBase(sb.ID)
	upper, work, rootfs := filepath.Join(base, "upper"), filepath.Join(base, "work"), b.rootfs(sb.ID)
	for _, d := range []string{work, rootfs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	switch err := os.Mkdir(upper, 0o755); {
	case err == nil && m.enabled():
		// The merged root is the upper's: the sandbox's root owns it.
		if err := os.Chown(upper, int(m.Base), int(m.Base)); err != nil {
			return err
		}
	case err != nil && !os.IsExist(err):
		return err
	}
	if err := fsutil.WriteJSONAtomic(filepath.Join(dir, "chain.json"), c); err != nil {
		return err
	}
	if err := fsutil.WriteJSONAtomic(b.volumesFile(sb.ID), sb.Volumes); err != nil {
		return err
	}
	// The network namespace first (the agent starts with its interface
	// up), with the user namespace it belongs to.
	netns, userns := b.netnsFile(sb.ID), b.usernsFile(sb.ID)
	if _, err := b.ensureNamespaces(sb.ID, m); err != nil {
		return err
	}
	if err := b.mountRoot(sb.ID, lowers, m); err != nil {
		return err
	}
	// Files the template marked with capabilities the sandbox lacks
	// would not run (fcaps.go).
	var capped []string
	for _, l := range lowers[len(lowers)-tplLowers:] {
		files, err := templateCapFiles(l)
		if err != nil {
			return err
		}
		capped = append(capped, files...)
	}
	if err := dropFileCaps(rootfs, capped); err != nil {
		return err
	}
	if b.cfg.Net != nil {
		netStart := time.Now()
		if err := b.cfg.Net.AttachNetns(ctx, sb.ID, netns); err != nil {
			return fmt.Errorf("network: %w", err)
		}
		b.cfg.Log.Debug("network attach", "sandbox", sb.ID, "duration", time.Since(netStart))
	}
	spec, err := generateSpec(sb, b.cfg.AgentBinary, b.cfg.CgroupParent, netns, userns, m)
	if err != nil {
		return err
	}
	spec.Mounts = append(spec.Mounts, b.volumeMounts(sb.ID, sb.Volumes)...)
	// CRIU's own settings for this container's checkpoints and restores.
	if err := b.writeCRIUConf(sb.ID, false); err != nil {
		return err
	}
	spec.Annotations = map[string]string{"org.criu.config": filepath.Join(dir, "criu.conf")}
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), specJSON, 0o600); err != nil {
		return err
	}
	// The agent listens in the sandbox's root (the daemon dials it through
	// the overlay, see inroot.go) and has no stdio of the host's: both are
	// what lets CRIU checkpoint the container.
	// A container started by an earlier nook listened on a host socket:
	// this one does not, and dialAgent must not find the old one.
	if err := os.Remove(b.socket(sb.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	pidFile := filepath.Join(dir, "init.pid")
	if mem != nil {
		return b.restoreSnapshot(ctx, sb, mem)
	}
	runStart := time.Now()
	if err := b.runcSetup(ctx, sb.ID, nil, "run", "--detach", "--pid-file", pidFile, "--bundle", dir, sb.ID); err != nil {
		return err
	}
	b.cfg.Log.Debug("runc run", "sandbox", sb.ID, "duration", time.Since(runStart))
	sb.BackendState, err = b.recordInit(sb.ID)
	return err
}

// recordInit reads the PID runc wrote to init.pid (a run or a restore)
// and records that init, with its start time, in init.json. It is kept
// beside the sandbox's files as well as in its record: a rollback or a
// restore starts a new init, and a crash before the daemon records it
// must not make the sandbox look dead.
func (b *Backend) recordInit(id string) ([]byte, error) {
	dir := b.dir(id)
	pidBytes, err := os.ReadFile(filepath.Join(dir, "init.pid"))
	if err != nil {
		return nil, fmt.Errorf("read container pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(pidBytes)))
	if err != nil {
		return nil, fmt.Errorf("container pid %q: %w", pidBytes, err)
	}
	st, err := json.Marshal(state{PID: pid, StartTime: procfs.StartTime(pid)})
	if err != nil {
		return nil, err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, "init.json"), st); err != nil {
		return nil, err
	}
	return st, nil
}

// runc runs a runc command on sandbox id with no stdio of the daemon's
// (a started container inherits it), its errors logged to the sandbox's
// runc.log and returned with that log's end.
func (b *Backend) runc(ctx context.Context, id string, args ...string) error {
	return b.runcFiles(ctx, id, nil, args...)
}

// runcFiles is runc with files the runc process inherits (fd 3 on).
func (b *Backend) runcFiles(ctx context.Context, id string, files []*os.File, args ...string) error {
	return b.runcCmd(ctx, id, files, false, args...)
}

// runcSetup is runcFiles for the commands that set a container's root up
// (run, restore): runc runs in a mount namespace of its own that has the
// host's base mounts and this sandbox's root and namespace files, not the
// mounts of every other sandbox (internal/mntns), so that what it costs
// does not grow with the number of sandboxes.
func (b *Backend) runcSetup(ctx context.Context, id string, files []*os.File, args ...string) error {
	return b.runcCmd(ctx, id, files, true, args...)
}

func (b *Backend) runcCmd(ctx context.Context, id string, files []*os.File, setup bool, args ...string) error {
	log := filepath.Join(b.dir(id), "runc.log")
	full := append([]string{"--root", b.cfg.RuncRoot, "--log", log, "--log-format", "text"}, args...)
	cmd := exec.CommandContext(ctx, b.cfg.Runc, full...)
	cmd.Env = b.runcEnv() // CRIU's directory first in PATH
	cmd.ExtraFiles = files
	// Its own process group: a Ctrl-C aimed at the daemon's terminal must not reach sandboxes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var err error
	if base := b.mountBase(setup); base != nil {
		if err = base.Start(cmd, b.setupBinds(id)...); err == nil {
			err = cmd.Wait()
		}
	} else {
		err = cmd.Run()
	}
	if err != nil {
		return fmt.Errorf("runc %s: %w: %s", args[0], err, runcError(tail(log)))
	}
	return nil
}

// mountBase is the base namespace runc's setup commands start from, made
// on first use; nil (runc runs in the daemon's namespace) when setup is
// false or the base cannot be made (a kernel without open_tree, before
// 5.2: logged once).
func (b *Backend) mountBase(setup bool) *mntns.Base {
	if !setup {
		return nil
	}
	b.baseMu.Lock()
	defer b.baseMu.Unlock()
	if b.base == nil && !b.baseFailed {
		hide := []string{b.cfg.StateDir}
		if b.cfg.VolumesDir != "" {
			hide = append(hide, b.cfg.VolumesDir)
		}
		base, err := mntns.New(hide...)
		if err != nil {
			b.baseFailed = true
			b.cfg.Log.Warn("runc runs in the daemon's mount namespace: a create costs more with every sandbox", "err", err)
			return nil
		}
		b.base = base
	}
	return b.base
}

// setupBinds are the paths of sandbox id that runc's setup needs from the
// daemon's namespace: its root and the files that hold its namespaces.
func (b *Backend) setupBinds(id string) []string {
	binds := []string{b.rootfs(id)}
	for _, p := range []string{b.netnsFile(id), b.usernsFile(id)} {
		if _, err := os.Stat(p); err == nil {
			binds = append(binds, p)
		}
	}
	return append(binds, b.mountedVolumes(id)...)
}

// runcError is the message of runc's last error line in a text log
// (level=error msg="..."), or the line itself.
func runcError(log string) string {
	line := lastLine(log)
	if i := strings.Index(line, "msg="); i >= 0 {
		if m, err := strconv.Unquote(line[i+4:]); err == nil {
			return m
		}
		return line[i+4:]
	}
	return line
}

// tail returns the end of a log file, for error messages. A sandbox can
// write to its log, so only its end is ever read, and it is shown without
// terminal escapes.
func tail(path string) string { return strings.TrimSpace(fsutil.Tail(path, 2000)) }

// agentLog is the end of the agent's log in the sandbox's root, or of the
// log a container started by an earlier nook has beside its files.
func (b *Backend) agentLog(id string) string {
	if l := tailInRoot(b.rootfs(id), agentLogInSandbox); l != "" {
		return l
	}
	return tail(filepath.Join(b.dir(id), "agent.log"))
}

// Status implements core.Backend: the container runs while its init
// process (the agent) does.
func (b *Backend) Status(ctx context.Context, sb *core.Sandbox) (core.RuntimeStatus, error) {
	// A rollback in progress replaces the init: wait for it.
	unlock := b.rollbacks.Lock(sb.ID)
	defer unlock()
	// And the runc of a checkpoint or restore a dead daemon left running:
	// what it does decides what a crash left (checkpoint.go).
	lock, release, err := b.waitCRIU(ctx, sb.ID)
	if err != nil {
		return core.RuntimeStatus{}, err
	}
	defer release()
	return b.statusLocked(ctx, sb, lock)
}

// statusLocked is Status. With the sandbox's CRIU lock (and its
// rollbacks lock) held, it also finishes what a crash interrupted.
func (b *Backend) statusLocked(ctx context.Context, sb *core.Sandbox, lock *os.File) (core.RuntimeStatus, error) {
	finish := lock != nil
	var st state
	if len(sb.BackendState) > 0 {
		if err := json.Unmarshal(sb.BackendState, &st); err != nil {
			return core.RuntimeStatus{}, fmt.Errorf("sandbox %s: backend state: %w", sb.ID, err)
		}
	}
	// The init a rollback started, which the record may not have yet.
	var latest state
	if fsutil.ReadJSON(filepath.Join(b.dir(sb.ID), "init.json"), &latest) == nil && latest.PID > 0 {
		st = latest
	}
	running := st.PID > 0 && st.StartTime != 0 && procfs.StartTime(st.PID) == st.StartTime
	if finish {
		redone, err := b.finishRollback(ctx, sb, running, lock)
		if err != nil {
			b.cfg.Log.Error("finish an interrupted rollback", "sandbox", sb.ID, "err", err)
		}
		if redone && err == nil {
			rs, err := b.statusLocked(ctx, sb, nil)
			rs.Restarted = true
			return rs, err
		}
	}
	if finish {
		if err := b.settleCheckpoint(ctx, sb.ID); err != nil {
			b.cfg.Log.Error("finish an interrupted pause or resume", "sandbox", sb.ID, "err", err)
		}
		if fsutil.ReadJSON(filepath.Join(b.dir(sb.ID), "init.json"), &latest) == nil && latest.PID > 0 {
			running = procfs.StartTime(latest.PID) == latest.StartTime
		}
	}
	if running {
		return core.RuntimeStatus{State: core.RuntimeRunning}, nil
	}
	if b.checkpointed(sb.ID) {
		return core.RuntimeStatus{State: core.RuntimeSaved, Detail: "paused to disk (a CRIU checkpoint)"}, nil
	}
	if _, err := os.Stat(b.stoppedFile(sb.ID)); err == nil {
		return core.RuntimeStatus{State: core.RuntimeStopped, Halt: core.HaltStopped, Detail: "stopped"}, nil
	}
	if _, err := os.Stat(b.dir(sb.ID)); err == nil {
		detail := "the sandbox's init process (nook-agent) is not running"
		if l := b.agentLog(sb.ID); l != "" {
			detail += ": " + lastLine(l)
		}
		return core.RuntimeStatus{State: core.RuntimeStopped, Detail: detail}, nil
	}
	return core.RuntimeStatus{State: core.RuntimeAbsent, Detail: "the sandbox's files are gone"}, nil
}

// Alive implements core.Liveness: the init sb's record names (not
// init.json's, which a rollback or a restore may have replaced) runs, as
// /proc says; no lock is taken and no other file read. A frozen init
// runs; a checkpointed, stopped, replaced or dead one does not.
func (b *Backend) Alive(sb *core.Sandbox) bool {
	var st state
	if len(sb.BackendState) == 0 || json.Unmarshal(sb.BackendState, &st) != nil || st.PID <= 0 || st.StartTime == 0 {
		return false
	}
	return procfs.StartTime(st.PID) == st.StartTime
}

// Refresh implements core.Liveness: the record takes the init init.json
// names if that one runs (a resume from disk started it).
func (b *Backend) Refresh(sb *core.Sandbox) bool {
	var latest state
	if fsutil.ReadJSON(filepath.Join(b.dir(sb.ID), "init.json"), &latest) != nil || latest.PID <= 0 ||
		latest.StartTime == 0 || procfs.StartTime(latest.PID) != latest.StartTime {
		return false
	}
	data, err := json.Marshal(latest)
	if err != nil || bytes.Equal(data, sb.BackendState) {
		return false
	}
	sb.BackendState = data
	return true
}

func lastLine(s string) string {
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// DialAgent implements core.Backend.
func (b *Backend) DialAgent(ctx context.Context, sb *core.Sandbox) (net.Conn, error) {
	return b.dialAgent(ctx, sb.ID, func() bool {
		rs, err := b.statusLocked(ctx, sb, nil)
		return err == nil && rs.State == core.RuntimeRunning
	})
}

// Destroy implements core.Backend. Each step tolerates what an earlier,
// interrupted create or destroy left behind.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	release, err := b.exclusive(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	var errs []error
	start := time.Now()
	if err := b.stop(ctx, id); err != nil {
		errs = append(errs, err)
	}
	stopped := time.Now()
	// The container's namespace is gone with its processes; the rest of
	// its network (rules, resolver, exposed ports) goes now.
	if b.cfg.Net != nil {
		if err := b.cfg.Net.Detach(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("network: %w", err))
		}
	}
	detached := time.Now()
	defer func() {
		b.cfg.Log.Debug("container destroyed", "sandbox", id, "stop", stopped.Sub(start),
			"network", detached.Sub(stopped), "disk_and_files", time.Since(detached))
	}()
	if err := removeNetns(b.netnsFile(id)); err != nil {
		errs = append(errs, err)
	}
	if err := removeNetns(b.usernsFile(id)); err != nil {
		errs = append(errs, err)
	}
	m, merr := b.readIDMap(id)
	// The disk's unmount detaches its loop device (autoclear). Its files
	// are not walked while it might still be mounted.
	if err := b.unmountDisk(id); err != nil {
		return errors.Join(append(errs, fmt.Errorf("the sandbox's disk: %w", err))...)
	}
	if err := b.unmountVolumes(id); err != nil {
		return errors.Join(append(errs, err)...)
	}
	if err := removeSandboxDir(b.dir(id)); err != nil {
		errs = append(errs, err)
	} else if len(cgroups.Threads(b.cfg.CgroupParent, id)) == 0 {
		// Only once its processes (none left in its cgroups, or the
		// cgroups gone) and files are gone: none may keep the range's uids.
		// A sandbox whose create a crash cut short between the claim and
		// its record has no record to say which.
		if merr == nil && m.enabled() {
			err = b.releaseIDMap(id, m)
		} else {
			err = b.claims().ReleaseAll(b.dir(id))
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// exclusive waits until nothing else works on sandbox id: no rollback
// (nor Status finishing an interrupted one), no runc of a checkpoint or
// restore (an earlier daemon's included). release lets go.
func (b *Backend) exclusive(ctx context.Context, id string) (release func(), err error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	unlock := b.rollbacks.Lock(id)
	_, releaseCRIU, err := b.waitCRIU(ctx, id)
	if err != nil {
		unlock()
		return nil, err
	}
	return func() { releaseCRIU(); unlock() }, nil
}

// stop ends a sandbox's container: its processes, cgroups and runc state,
// and unmounts its root filesystem. Its files and network stay.
func (b *Backend) stop(ctx context.Context, id string) error {
	var errs []error
	// Killed through the cgroup, a frozen container's processes where
	// they stand and only then thawed so that they can die: none may run
	// on past a checkpoint of them (runc's kill would thaw them first).
	// And waited for: runc's own kill looks again only after 100 ms.
	// (The init is looked up first: once killed, it no longer passes for
	// the container's, and runc delete would be left to wait for it.)
	init, ierr := b.lookupInit(id)
	cgroups.Kill(b.cfg.CgroupParent, id)
	if frozen, err := b.frozen(id); err == nil && frozen {
		b.thaw(id)
	}
	// runc delete --force kills every process of the container, waits for
	// them and removes its cgroups and state; while the killed init is
	// still there (a zombie not yet reaped) it sleeps 100 ms before it
	// looks again. runc takes a dead or zombie init for a stopped
	// container, which a plain delete removes at once: that is tried
	// first.
	del := func(flags ...string) ([]byte, error) {
		args := append(append([]string{"--root", b.cfg.RuncRoot, "delete"}, flags...), id)
		return exec.CommandContext(ctx, b.cfg.Runc, args...).CombinedOutput()
	}
	out, err := []byte(nil), errors.New("no init")
	if ierr == nil && waitDead(init) {
		out, err = del()
	}
	if err != nil { // not stopped (a process outlived the kill), or no init known
		out, err = del("--force")
	}
	if err != nil && !bytes.Contains(out, []byte("does not exist")) && !bytes.Contains(out, []byte("not exist")) {
		errs = append(errs, fmt.Errorf("runc delete: %v: %s", err, bytes.TrimSpace(out)))
	}
	// A create interrupted between cgroup creation and runc's state leaves
	// cgroups runc no longer knows about.
	if err := b.removeCgroups(id); err != nil {
		errs = append(errs, err)
	}
	if err := unmount(b.rootfs(id)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// waitDead waits (up to a second) for a killed init to be dead: gone, or
// a zombie, which runc takes for stopped. It reports whether it is.
func waitDead(init state) bool {
	return poll.Until(context.Background(), poll.Options{Timeout: time.Second, Max: 5 * time.Millisecond}, func() (bool, error) {
		return procfs.StartTime(init.PID) != init.StartTime, nil // 0 for a zombie
	}) == nil
}

func validID(id string) error {
	if id == "" || strings.ContainsAny(id, "/.") {
		return errdefs.Invalid("bad sandbox id %q", id)
	}
	return nil
}

func (b *Backend) removeCgroups(id string) error {
	return cgroups.Remove(b.cfg.CgroupParent, id, func() { b.thaw(id) })
}

func unmount(target string) error { return diskimg.Unmount(target) }

// List implements core.Backend: every sandbox with a directory or runc state.
func (b *Backend) List(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	for _, d := range []string{b.cfg.StateDir, b.cfg.RuncRoot} {
		entries, err := os.ReadDir(d)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		for _, e := range entries {
			if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
				seen[e.Name()] = true
			}
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	return ids, nil
}
