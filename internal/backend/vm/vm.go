// Package vm is the vm isolation backend: each sandbox is a QEMU microvm
// with its own kernel (Debian's linux-image-amd64, booted through PVH),
// nook-agent as the guest's PID 1 talking to the daemon over
// virtio-serial, and a qcow2 copy-on-write root disk over the template's
// read-only ext4 image. A sandbox starts by restoring a memory snapshot
// taken once per template (guest RAM mapped copy-on-write from a file),
// not by booting; a cold boot is the fallback. Each QEMU runs as a user
// of its own, in an empty network namespace, chrooted into a directory
// with only its binary, libraries and firmware, and is given every file
// it uses as an open descriptor (uid.go, chroot.go, qemu.go).
package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/agent/guestinit"
	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/keylock"
	"github.com/nookhq/nook/internal/procfs"
	"github.com/nookhq/nook/internal/warmpool"
)

// MinMemory is the least guest RAM a vm sandbox may have.
const MinMemory = 256 << 20

// Config configures the backend.
type Config struct {
	QEMU         string // qemu-system-x86_64; default: found in PATH
	QEMUImg      string // qemu-img; default: found in PATH
	StateDir     string // per-sandbox directories
	CacheDir     string // kernels, template disk images and snapshots
	LayersDir    string // sandbox snapshots; default: "vm-snapshots" beside StateDir (the same filesystem: a paused vm's snapshot hard-links its files)
	KernelRoot   string // an unpacked Debian linux-image package (or /); default: fetched with apt into CacheDir
	AgentBinary  string // the static nook-agent that becomes the guest's init
	CgroupParent string
	// Accel forces an accelerator (kvm or tcg); empty: detected.
	Accel string
	// ColdBoot boots every sandbox instead of restoring a template snapshot.
	ColdBoot bool
	// TemplateRootfs returns the read-only root filesystem of a template build.
	TemplateRootfs func(templateID string) (string, error)
	// TemplateStore names the template store the builds come from (its
	// directory): what the cache makes of a build is marked with it, and
	// CachedTemplates lists only what this store's builds made, so that a
	// daemon of another store sharing the cache never removes it.
	TemplateStore string
	// PrepareTemplate, if set, runs in a template's boot, through its
	// agent, before the template's snapshot is saved (after systemd has
	// started, in a systemd guest): what it starts runs in every vm
	// restored from the snapshot. The daemon starts the template's
	// service there. Its error fails the snapshot (the create boots the
	// vm instead, and says why) once: the build's next snapshot is saved
	// without it.
	PrepareTemplate func(ctx context.Context, templateID string, c *agent.Client) error
	// WarmPool is how many restored vms to keep ready per template build
	// and machine shape in use (0: none).
	WarmPool int
	// UIDBase is the first of the user and group IDs QEMU runs as: each
	// vm's QEMU gets one of its own, UIDBase+slot (slots up to uidSlots),
	// which must be used by nothing else on the host (no /etc/passwd entry
	// is needed). Default DefaultUIDBase. QEMU never runs as root.
	UIDBase uint32
	// UIDClaimDir holds the host-wide claims on QEMU users (uid.go); every
	// daemon on a host shares it. Default DefaultUIDClaimDir.
	UIDClaimDir string
	// Net gives sandboxes their network (a tap device per vm); nil: none.
	Net core.NetHooks
	// BootTimeout bounds a cold boot until the agent answers.
	BootTimeout time.Duration
	Log         *slog.Logger
}

// Backend runs vm sandboxes.
type Backend struct {
	cfg   Config
	accel string
	why   string // why this accelerator

	kmu      sync.Mutex
	kernel   *Kernel
	tkernels map[string]*Kernel // templates' own kernels by template build; nil: it has none (tplkernel.go)
	// tkernelErr: why a template build's own kernel cannot boot, once seen.
	tkernelErr map[string]error

	smu   sync.Mutex
	slock map[string]*sync.Mutex // per template snapshot, in this process (flock across processes)

	uidMu sync.Mutex // a vm's user: recorded and claimed at once (uid.go)

	rootMu sync.Mutex
	root   string // the directory QEMU is chrooted into (chroot.go)

	ramMu sync.Mutex
	rams  map[string]*sealedRAM // template snapshots' RAM, by file path (templateRAM)

	pool *warmpool.Pool[state]
	ops  keylock.Map  // per sandbox ID, see operate
	gcMu sync.RWMutex // GC (write) against snapshot, rollback and fork (read)
	// ready holds, by sandbox ID, an agent connection a warm vm's warm-up
	// left open (handshake done) for the first DialAgent.
	ready sync.Map
	// unprepared holds the template builds whose PrepareTemplate failed
	// once: their snapshots are saved without it.
	unprepared sync.Map
}

var (
	_ core.Backend       = (*Backend)(nil)
	_ core.Describer     = (*Backend)(nil)
	_ core.ConsoleLogger = (*Backend)(nil)
)

// New returns a vm backend.
func New(cfg Config) *Backend {
	if cfg.QEMU == "" {
		cfg.QEMU = "qemu-system-x86_64"
	}
	if cfg.QEMUImg == "" {
		cfg.QEMUImg = "qemu-img"
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "nook"
	}
	if cfg.LayersDir == "" {
		cfg.LayersDir = filepath.Join(filepath.Dir(cfg.StateDir), "vm-snapshots")
	}
	if cfg.UIDBase == 0 {
		cfg.UIDBase = DefaultUIDBase
	}
	if cfg.UIDClaimDir == "" {
		cfg.UIDClaimDir = DefaultUIDClaimDir
	}
	if cfg.BootTimeout == 0 {
		cfg.BootTimeout = 60 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	b := &Backend{cfg: cfg, slock: map[string]*sync.Mutex{}, rams: map[string]*sealedRAM{}, tkernels: map[string]*Kernel{}, tkernelErr: map[string]error{}}
	b.accel, b.why = DetectAccel(cfg.Accel)
	b.pool = newPool(b, cfg.WarmPool)
	return b
}

// DetectAccel picks the accelerator: forced if given, else KVM only where
// a stock guest kernel runs under it (hardware VMX/SVM, not PVM), else TCG.
func DetectAccel(forced string) (accel, why string) {
	if forced != "" {
		return forced, "forced by --accel"
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return "tcg", "no /dev/kvm"
	}
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return "tcg", "/dev/kvm is PVM, which cannot run a stock guest kernel"
	}
	cpuinfo, _ := os.ReadFile("/proc/cpuinfo")
	for _, l := range strings.Split(string(cpuinfo), "\n") {
		if strings.HasPrefix(l, "flags") {
			f := " " + l + " "
			if strings.Contains(f, " vmx ") || strings.Contains(f, " svm ") {
				return "kvm", "hardware virtualization (vmx/svm)"
			}
			break
		}
	}
	return "tcg", "the CPU has no vmx/svm"
}

// Accelerator reports the accelerator in use and why.
func (b *Backend) Accelerator() (string, string) { return b.accel, b.why }

// Isolation implements core.Backend.
func (b *Backend) Isolation() string { return api.IsolationVM }

// Capabilities implements core.Backend.
func (b *Backend) Capabilities() api.Capabilities {
	// A vm that asks for no disk gets its template's image: its files and
	// defaultImageSize free (growDisk leaves it as it is).
	return api.Capabilities{CPULimit: true, MemoryLimit: true, DiskLimit: true, Pause: true, Snapshot: true, OwnKernel: true, Stop: true, SystemdInit: true,
		DefaultDiskBytes: defaultImageSize}
}

// Available implements core.Backend.
func (b *Backend) Available(ctx context.Context) (bool, string, map[string]string) {
	path, err := exec.LookPath(b.cfg.QEMU)
	if err != nil {
		return false, "QEMU is not installed (apt-get install qemu-system-x86 qemu-utils)", nil
	}
	versions := map[string]string{}
	if out, err := exec.CommandContext(ctx, path, "--version").Output(); err == nil {
		versions["qemu"] = strings.TrimPrefix(strings.SplitN(string(out), "\n", 2)[0], "QEMU emulator version ")
	}
	versions["accel"] = b.accel
	if _, err := exec.LookPath(b.cfg.QEMUImg); err != nil {
		return false, "qemu-img is not installed (apt-get install qemu-utils)", versions
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		return false, "mkfs.ext4 is not installed (apt-get install e2fsprogs)", versions
	}
	if os.Geteuid() != 0 {
		return false, "the vm backend needs root", versions
	}
	if err := b.checkUIDRange(); err != nil {
		return false, err.Error(), versions
	}
	if b.accel == "kvm" {
		if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
			return false, fmt.Sprintf("accelerator kvm: %v", err), versions
		} else {
			f.Close()
		}
	}
	if _, err := os.Stat(b.cfg.AgentBinary); err != nil {
		return false, fmt.Sprintf("nook-agent binary not found at %s (build it with make build)", b.cfg.AgentBinary), versions
	}
	b.kmu.Lock()
	if b.kernel != nil {
		versions["kernel"] = b.kernel.Release
	}
	b.kmu.Unlock()
	return true, "", versions
}

func (b *Backend) dir(id string) string { return filepath.Join(b.cfg.StateDir, id) }

// state is what the backend persists about a sandbox.
type state struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
	Accel     string `json:"accel"`
	Boot      string `json:"boot"` // snapshot or cold
	Kernel    string `json:"kernel"`
	// The machine, as a resume from disk must start it again.
	KernelHash string  `json:"kernel_hash"`
	CPUs       int     `json:"cpus"`
	CPULimit   float64 `json:"cpu_limit"`
	MemoryMiB  int64   `json:"memory_mib"`
	TSCKHz     int64   `json:"tsc_khz"`
	// Init is the guest's PID 1: api.InitSystemd, or the agent ("" in
	// records older than systemd support).
	Init string `json:"init,omitempty"`
	// KernelTemplate is the template build whose own kernel the vm boots
	// ("": the daemon's).
	KernelTemplate string `json:"kernel_template,omitempty"`
	// Saved: this QEMU's state was written to disk; it only waits to end.
	Saved bool `json:"saved,omitempty"`
}

// ensureKernel prepares the guest kernel once per process.
func (b *Backend) ensureKernel(ctx context.Context) (*Kernel, error) {
	b.kmu.Lock()
	defer b.kmu.Unlock()
	if b.kernel != nil {
		return b.kernel, nil
	}
	k, err := prepareKernel(ctx, filepath.Join(b.cfg.CacheDir, "kernel"), b.cfg.KernelRoot, b.cfg.AgentBinary)
	if err == nil {
		err = publicKernel(k)
	}
	if err != nil {
		return nil, errdefs.Unavailable("vm guest kernel: %v", err)
	}
	b.kernel = k
	return k, nil
}

// machineFor is the VM shape of a sandbox.
func (b *Backend) machineFor(sb *core.Sandbox, k *Kernel) machine {
	cpus := int(sb.CPUs + 0.999)
	if cpus < 1 {
		cpus = 1
	}
	return machine{Accel: b.accel, CPUs: cpus, MemoryMiB: max(sb.MemoryBytes>>20, 128), Kernel: k, TSCKHz: tscKHz(), Init: sb.Init}
}

// Create implements core.Backend: it claims the warm vm TakeWarm reserved
// under sb.ID if there is one, and restores (or boots) a new one otherwise.
func (b *Backend) Create(ctx context.Context, sb *core.Sandbox) error {
	if w, ok := b.pool.Claimed(sb.ID); ok {
		err := b.claim(w, sb)
		if err == nil {
			return b.growDisk(ctx, sb)
		}
		b.cfg.Log.Warn("warm vm unusable; starting a new one", "sandbox", sb.ID, "err", err)
		if err := b.Destroy(ctx, sb.ID); err != nil {
			return err
		}
	}
	if err := b.createNew(ctx, sb); err != nil {
		return err
	}
	b.Prewarm(sb)
	return b.growDisk(ctx, sb)
}

// MinDisk is the smallest disk a vm may ask for: a vm's disk holds its
// template's files and the disk it asks for (by default MinDisk) beside
// them.
const MinDisk = defaultImageSize

// growDisk gives a sandbox that asked for more than the template image's
// free space its disk (the template's files and what it asked for): QEMU
// grows the block device (the guest sees the new capacity at once) and
// the guest grows its root filesystem online.
func (b *Backend) growDisk(ctx context.Context, sb *core.Sandbox) error {
	if sb.DiskBytes <= defaultImageSize {
		return nil
	}
	st, err := os.Stat(filepath.Join(b.templateDir(sb.TemplateID), "rootfs.ext4"))
	if err != nil {
		return fmt.Errorf("the template's root image: %w", err)
	}
	// An image made before images held their files beside the free space
	// is defaultImageSize in all.
	files := max(st.Size()-defaultImageSize, 0)
	size := (files + sb.DiskBytes) &^ (1<<20 - 1)
	if size <= st.Size() {
		return nil
	}
	mon, err := dialQMP(ctx, filepath.Join(b.dir(sb.ID), "qmp.sock"))
	if err != nil {
		return err
	}
	defer mon.close()
	if err := mon.run("block_resize", map[string]any{"node-name": "root", "size": size}, nil); err != nil {
		return fmt.Errorf("grow the disk to %s: %w", core.FormatBytes(size), err)
	}
	if err := b.guestRun(ctx, sb.ID, "resize2fs \"$(findfs LABEL="+guestinit.RootLabel+")\" >/dev/null 2>&1 || { sleep 0.2; resize2fs \"$(findfs LABEL="+guestinit.RootLabel+")\"; }"); err != nil {
		return fmt.Errorf("grow the root filesystem: %w", err)
	}
	return nil
}

func (b *Backend) createNew(ctx context.Context, sb *core.Sandbox) (err error) {
	k, ownKernel, err := b.kernelFor(ctx, sb.TemplateID)
	if err != nil {
		return err
	}
	m := b.machineFor(sb, k)
	var snap *snapshot
	if !b.cfg.ColdBoot {
		snap, err = b.ensureSnapshot(ctx, sb.TemplateID, m)
		if err != nil {
			b.cfg.Log.Warn("no template snapshot; booting instead", "template", sb.TemplateID, "err", err)
		}
	}
	defer func() {
		if err != nil {
			if derr := b.Destroy(context.WithoutCancel(ctx), sb.ID); derr != nil {
				b.cfg.Log.Error("clean up after failed create", "sandbox", sb.ID, "err", derr)
			}
		}
	}()
	if err := os.MkdirAll(b.cfg.StateDir, 0o700); err != nil {
		return err
	}
	dir := b.dir(sb.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	l := launch{
		machine: m, Disk: filepath.Join(dir, "disk.qcow2"), AgentSock: filepath.Join(dir, "agent.sock"),
		QMPSock: filepath.Join(dir, "qmp.sock"), ConsoleLog: filepath.Join(dir, "console.log"),
	}
	st := state{Accel: m.Accel, Kernel: k.Release, KernelHash: k.Hash, CPUs: m.CPUs, CPULimit: sb.CPUs, MemoryMiB: m.MemoryMiB, TSCKHz: m.TSCKHz, Init: m.Init}
	if ownKernel {
		st.KernelTemplate = sb.TemplateID
	}
	if b.cfg.Net != nil {
		if l.Tap, err = b.cfg.Net.AttachTap(ctx, sb.ID); err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}
	if snap != nil {
		if err := copyFile(snap.child, l.Disk); err != nil {
			return err
		}
		if l.MemFile, err = b.templateRAM(snap); err != nil {
			return err
		}
		defer l.MemFile.Close()
		l.Incoming, st.Boot = true, "snapshot"
		l.Chain = snap.chain
	} else {
		base, err := b.ensureImage(ctx, sb.TemplateID)
		if err != nil {
			return err
		}
		if err := b.qemuImgCreate(ctx, base, "raw", l.Disk); err != nil {
			return err
		}
		st.Boot = "cold"
		l.Chain = []layerRef{{Path: base, Format: "raw"}}
	}
	if err := b.writeHead(sb.ID, head{Disk: "disk.qcow2", Chain: l.Chain}); err != nil {
		return err
	}
	uid, err := b.vmUID(sb.ID)
	if err != nil {
		return err
	}
	t0 := time.Now()
	proc, err := b.start(ctx, sb, l, uid)
	if err != nil {
		return err
	}
	t1 := time.Now()
	st.PID, st.StartTime = proc.pid, procfs.StartTime(proc.pid)
	sb.BackendState, _ = json.Marshal(st)
	if err := b.writeRun(sb.ID, st); err != nil {
		return err
	}
	if snap != nil {
		mon, err := proc.monitor(ctx)
		if err != nil {
			return err
		}
		defer mon.close()
		sf, err := os.Open(snap.state)
		if err != nil {
			return err
		}
		defer sf.Close()
		if err := mon.setIgnoreShared(); err != nil {
			return err
		}
		t2 := time.Now()
		if err := mon.loadState(ctx, sf); err != nil {
			return fmt.Errorf("restore template snapshot: %w%s", err, b.consoleTail(dir))
		}
		b.cfg.Log.Debug("vm restored", "sandbox", sb.ID, "start", t1.Sub(t0), "qmp", t2.Sub(t1), "restore", time.Since(t2))
		return nil
	}
	if err := b.waitBoot(ctx, proc, l.AgentSock, dir); err != nil {
		return err
	}
	b.servicesUp(ctx, sb.ID, l.AgentSock, m)
	return nil
}

// qemuProc is a started QEMU.
type qemuProc struct {
	pid    int
	qmp    string
	exited chan struct{}
	status string // how it exited, once exited is closed
	log    string
}

func (p *qemuProc) monitor(ctx context.Context) (*monitor, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	go func() {
		select {
		case <-p.exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	mon, err := dialQMP(ctx, p.qmp)
	if err != nil {
		select {
		case <-p.exited:
			return nil, fmt.Errorf("%w: %s", errQEMUExited, lastLines(readTail(p.log), 5))
		default:
		}
	}
	return mon, err
}

// start launches QEMU for a sandbox in its cgroup, as user and group
// uid (never root), chrooted into qemuRoot, in a network namespace of
// its own with nothing but a loopback that is down: it reaches the
// guest's network only through the tap descriptor it inherits, and no
// host address or service. Its sockets are unix sockets the daemon
// listens on and hands it.
func (b *Backend) start(ctx context.Context, sb *core.Sandbox, l launch, uid uint32) (*qemuProc, error) {
	if uid == 0 {
		return nil, errdefs.Invalid("refusing to run QEMU as root: a guest that escapes into its QEMU would own the host (UIDBase %d)", b.cfg.UIDBase)
	}
	dir := filepath.Dir(l.Disk)
	logPath := filepath.Join(dir, "qemu.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	var fds fdTable
	defer fds.close()
	args, err := l.args(&fds)
	if err != nil {
		return nil, fmt.Errorf("start QEMU: %w", err)
	}
	root, err := b.qemuRoot(ctx)
	if err != nil {
		return nil, err
	}
	// Until this QEMU is in its cgroups, a destroy must look for it among
	// the host's processes (placedFile).
	placed := ""
	if dir == b.dir(sb.ID) { // not a template's snapshot being made
		placed = placedFile(dir)
		if err := os.Remove(placed); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	// What an earlier QEMU of this vm left charged to its memory cgroup
	// (shared memory it faulted in outlives it: pages of a template's RAM
	// copy made before sealedCopy allocated it whole) must not count
	// against this one's limit: it gets cgroups of its own.
	cgroups.Renew(b.cfg.CgroupParent, sb.ID)
	cmd := exec.Command(b.cfg.QEMU, args...)
	cmd.ExtraFiles = fds.files
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Dir = "/" // it opens nothing by name
	cmd.SysProcAttr = b.qemuAttr(uid, root)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start QEMU: %w", err)
	}
	p := &qemuProc{pid: cmd.Process.Pid, qmp: l.QMPSock, exited: make(chan struct{}), log: logPath}
	go func() {
		cmd.Wait()
		p.status = cmd.ProcessState.String()
		close(p.exited)
	}()
	// The guest's RAM plus QEMU's own (code cache, devices, the kernel image it keeps).
	lim := cgroups.Limits{CPUs: max(sb.CPUs, 0.01), MemoryBytes: l.MemoryMiB<<20 + 384<<20, Pids: 512}
	if err := cgroups.Create(b.cfg.CgroupParent, sb.ID, lim, p.pid); err != nil {
		syscall.Kill(p.pid, syscall.SIGKILL)
		return nil, err
	}
	if placed != "" {
		if err := os.WriteFile(placed, nil, 0o600); err != nil {
			b.cfg.Log.Warn("record that the vm's QEMU is in its cgroups; a destroy will look for it among all processes", "sandbox", sb.ID, "err", err)
		}
	}
	return p, nil
}

// placedFile, in a vm's directory, says that every QEMU started on its
// disk since was in the vm's cgroups before it ran: removing the cgroups
// kills them all, and a destroy needs no search of the host's processes
// for one (qemuPID reads every process's owner: with 1,000 containers
// alive that made a vm's rm 1.5x slower). A start removes it before it
// starts QEMU and writes it once QEMU is in its cgroups, so a daemon
// that died between the two leaves none.
func placedFile(dir string) string { return filepath.Join(dir, "qemu.placed") }

// qemuAttr is how a QEMU process starts: its own process group (signals
// aimed at the daemon's terminal must not reach sandboxes), its own
// empty network namespace, chrooted into root (none: "", under KVM),
// and its own user and group with no supplementary groups (but
// /dev/kvm's, under KVM).
func (b *Backend) qemuAttr(uid uint32, root string) *syscall.SysProcAttr {
	groups := []uint32{}
	if b.accel == "kvm" {
		if fi, err := os.Stat("/dev/kvm"); err == nil {
			groups = append(groups, fi.Sys().(*syscall.Stat_t).Gid)
		}
	}
	return &syscall.SysProcAttr{
		Setpgid: true,
		// An empty network namespace, and an IPC one of its own (no SysV
		// segment or queue outlives it for the next vm given its uid).
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC,
		Chroot:     root,
		Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: groups},
	}
}

// Status implements core.Backend.
func (b *Backend) Status(ctx context.Context, sb *core.Sandbox) (core.RuntimeStatus, error) {
	b.recover(sb.ID)
	console := filepath.Join(b.dir(sb.ID), "console.log")
	capConsole(console)
	if st, live := b.running(sb.ID); live {
		if guestHalt(readTail(console)) != core.HaltPoweroff {
			return core.RuntimeStatus{State: core.RuntimeRunning}, nil
		}
		// Halted (not powered off): QEMU runs on with nothing to run. It
		// is ended unless an operation on the vm is under way (it runs
		// until the next look).
		unlock, ok := b.ops.TryLock(sb.ID)
		if !ok {
			return core.RuntimeStatus{State: core.RuntimeRunning}, nil
		}
		b.quit(ctx, sb.ID, st.PID)
		unlock()
	}
	if b.readHead(sb.ID).Resume != "" { // not running, saved: paused (recovered above)
		return core.RuntimeStatus{State: core.RuntimeSaved, Detail: "paused to disk"}, nil
	}
	if _, err := os.Stat(b.dir(sb.ID)); err == nil {
		if _, err := os.Stat(b.stoppedFile(sb.ID)); err == nil {
			return core.RuntimeStatus{State: core.RuntimeStopped, Halt: core.HaltStopped, Detail: "stopped"}, nil
		}
		switch guestHalt(readTail(console)) {
		case core.HaltPoweroff:
			return core.RuntimeStatus{State: core.RuntimeStopped, Halt: core.HaltPoweroff, Detail: "powered off by its guest"}, nil
		case core.HaltReboot:
			return core.RuntimeStatus{State: core.RuntimeStopped, Halt: core.HaltReboot, Detail: "rebooted by its guest"}, nil
		}
		detail := "the sandbox's QEMU process is not running"
		if l := lastLines(readTail(filepath.Join(b.dir(sb.ID), "qemu.log")), 1); l != "" {
			detail += ": " + l
		}
		if l := lastLines(readTail(filepath.Join(b.dir(sb.ID), "console.log")), 3); l != "" {
			detail += "; guest console: " + l
		}
		return core.RuntimeStatus{State: core.RuntimeStopped, Detail: detail}, nil
	}
	return core.RuntimeStatus{State: core.RuntimeAbsent, Detail: "the sandbox's files are gone"}, nil
}

func decodeState(sb *core.Sandbox) (state, error) {
	var st state
	if len(sb.BackendState) > 0 {
		if err := json.Unmarshal(sb.BackendState, &st); err != nil {
			return st, fmt.Errorf("sandbox %s: backend state: %w", sb.ID, err)
		}
	}
	return st, nil
}

// Describe implements core.Describer.
func (b *Backend) Describe(sb *core.Sandbox, v *api.Sandbox) {
	if st, err := decodeState(sb); err == nil {
		v.Accelerator, v.Boot, v.GuestKernel = st.Accel, st.Boot, st.Kernel
		if st.Init == api.InitSystemd {
			v.Init = api.InitSystemd
		}
		if st.Kernel != "" {
			v.GuestKernelFrom = "nook"
			if st.KernelTemplate != "" {
				v.GuestKernelFrom = "template"
			}
		}
	}
}

// DialAgent implements core.Backend: the agent's virtio-serial port, through QEMU's socket.
func (b *Backend) DialAgent(ctx context.Context, sb *core.Sandbox) (net.Conn, error) {
	if c, ok := b.ready.LoadAndDelete(sb.ID); ok {
		return c.(net.Conn), nil
	}
	sock := filepath.Join(b.dir(sb.ID), "agent.sock")
	hctx, cancel := context.WithTimeout(ctx, agentAnswer)
	conn, err := dialAgent(hctx, sock)
	cancel()
	if err == nil || ctx.Err() != nil {
		return conn, err
	}
	// No answer for that long: a guest left stopped (no operation on the
	// vm, yet QEMU not running it) is continued, and asked once more.
	// A guest QEMU runs is only slow: it gets the rest of ctx.
	status, changed := b.unstick(sb.ID)
	if !changed && status != "running" {
		if status != "" {
			err = fmt.Errorf("%w (QEMU's run state: %s)", err, status)
		}
		return nil, err
	}
	// Greeted on a new connection every agentAnswer: a guest whose answer
	// went to a connection that was closing (or that missed the port's
	// changes while stopped) answers the next connection's nonce
	// (guestinit's handshake).
	for {
		hctx, cancel := context.WithTimeout(ctx, agentAnswer)
		conn, err = dialAgent(hctx, sock)
		unanswered := hctx.Err() != nil
		cancel()
		if err == nil || ctx.Err() != nil || !unanswered {
			return conn, err
		}
	}
}

// agentAnswer bounds how long a guest may take to answer a connection
// before the vm is looked at (a restore under TCG answers in under a
// second); shorter than the daemon's wait for a restarted sandbox's agent.
var agentAnswer = 8 * time.Second

// unstick continues a vm that QEMU holds stopped while no operation on it
// is under way and nothing is being saved, and says what state it found.
func (b *Backend) unstick(id string) (status string, changed bool) {
	unlock, ok := b.ops.TryLock(id)
	if !ok {
		return "", false
	}
	defer unlock()
	if st, live := b.readRun(id); !live || st.Saved {
		b.recoverLocked(id)
		return "", false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mon, err := dialQMP(ctx, filepath.Join(b.dir(id), "qmp.sock"))
	if err != nil {
		return "", false
	}
	defer mon.close()
	status, err = mon.status()
	if err != nil {
		return "", false
	}
	switch status {
	case "paused", "postmigrate", "finish-migrate":
		b.cfg.Log.Warn("continuing a vm that was left stopped", "sandbox", id, "state", status)
		if err := mon.run("cont", nil, nil); err != nil {
			b.cfg.Log.Error("continue a vm left stopped", "sandbox", id, "err", err)
			return status, false
		}
		return status, true
	}
	return status, false
}

// dialAgent connects to a guest agent and opens the stream with the handshake.
func dialAgent(ctx context.Context, sock string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return nil, err
	}
	if err := guestinit.DialHandshake(ctx, conn); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// ConsoleTail returns the end of a sandbox's guest console log, for errors.
func (b *Backend) ConsoleTail(id string) string { return b.consoleTail(b.dir(id)) }

func (b *Backend) consoleTail(dir string) string {
	if l := lastLines(readTail(filepath.Join(dir, "console.log")), 8); l != "" {
		return "\nguest console:\n" + l
	}
	return ""
}

// Destroy implements core.Backend.
func (b *Backend) Destroy(ctx context.Context, id string) error {
	if id == "" || strings.ContainsAny(id, "/.") {
		return errdefs.Invalid("bad sandbox id %q", id)
	}
	defer b.ops.Lock(id)()
	if c, ok := b.ready.LoadAndDelete(id); ok {
		c.(net.Conn).Close()
	}
	var errs []error
	// QEMU is in the sandbox's cgroups: removing them kills it.
	cgErr := cgroups.Remove(b.cfg.CgroupParent, id, nil)
	if cgErr != nil {
		errs = append(errs, cgErr)
	}
	// A QEMU that never made it into its cgroup, or that outlived them.
	qemuAlive := false
	if _, err := os.Stat(placedFile(b.dir(id))); err == nil && cgErr == nil {
		// None: every QEMU of the vm was in them.
	} else if pid := qemuPID(b.dir(id)); pid > 0 {
		syscall.Kill(pid, syscall.SIGKILL)
		if !waitGone(pid, time.Second) {
			qemuAlive = true
			errs = append(errs, fmt.Errorf("the vm's QEMU (pid %d) did not die", pid))
		}
	}
	if b.cfg.Net != nil {
		if err := b.cfg.Net.Detach(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("network: %w", err))
		}
	}
	uid, hasUID := b.recordedUID(id)
	if err := os.RemoveAll(b.dir(id)); err != nil {
		errs = append(errs, err)
	} else if hasUID && !qemuAlive && len(cgroups.Threads(b.cfg.CgroupParent, id)) == 0 {
		// Only now, its QEMU surely dead (none left in its cgroups, nor
		// outside), may another QEMU run as its user; one that may still
		// run keeps it.
		if err := b.releaseUID(id, uid); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// qemuPID finds a QEMU still running on a sandbox directory's disk (its
// command line names the top disk it was given). Where the directory
// records the vm's QEMU user (always before its QEMU starts), only that
// user's processes are read: a stat of /proc/PID each, not a read of
// every process's command line, which with 1,000 containers alive made
// an rm of a vm 2.4x slower.
func qemuPID(dir string) int {
	target := dir + string(filepath.Separator) + "disk"
	uid, hasUID := recordedUser(dir)
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if hasUID && (unix.Stat("/proc/"+p.Name(), &st) != nil || st.Uid != uid) {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && (bytes.Contains(cmdline, []byte("opaque="+target)) ||
			bytes.Contains(cmdline, []byte("file.filename="+target))) { // or one an older nook started
			return pid
		}
	}
	return 0
}

// List implements core.Backend.
func (b *Backend) List(ctx context.Context) ([]string, error) {
	entries, err := os.ReadDir(b.cfg.StateDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

func (b *Backend) qemuImgCreate(ctx context.Context, backing, backingFmt, dst string) error {
	out, err := exec.CommandContext(ctx, b.cfg.QEMUImg, "create", "-q", "-f", "qcow2", "-b", backing, "-F", backingFmt, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// pingAgent waits until the guest's agent answers over its socket.
func pingAgent(ctx context.Context, sock string) error {
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return dialAgent(ctx, sock) })
	defer c.Close()
	_, err := c.Ping(ctx)
	return err
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// maxConsole bounds a vm's console log: the guest writes it (a root guest
// can flood its serial port), so it is emptied when it grows past this;
// the reaper checks it on every tick.
const maxConsole = 8 << 20

func capConsole(path string) {
	if fi, err := os.Stat(path); err == nil && fi.Size() > maxConsole {
		os.Truncate(path, 0) // QEMU appends (O_APPEND): it goes on at the start
	}
}

// readTail returns the last 4 KiB of a file a guest can write (its
// console), safe to show.
func readTail(path string) string { return fsutil.Tail(path, 4096) }

var tscOnce = sync.OnceValue(func() int64 {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return v
		}
	}
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return int64(mhz * 1000)
			}
		}
	}
	return 0
})

func tscKHz() int64 { return tscOnce() }

func hashStrings(parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(h[:])[:16]
}
