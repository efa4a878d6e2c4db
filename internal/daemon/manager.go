// Package daemon is the nook daemon's core: the Manager owns the sandbox
// lifecycle (create, exec, TTL, destroy), keeps the database and the host
// in agreement (reconcile on start, a reaper for expired and dead
// sandboxes), and dispatches to the isolation backends. It refuses at
// start an agent binary no sandbox could boot (agentbin.go).
package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/backend/container"
	"github.com/nookhq/nook/internal/backend/vm"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/diskimg"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/events"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/identity"
	"github.com/nookhq/nook/internal/image"
	"github.com/nookhq/nook/internal/keylock"
	"github.com/nookhq/nook/internal/network"
	"github.com/nookhq/nook/internal/runcbin"
	"github.com/nookhq/nook/internal/secrets"
	"github.com/nookhq/nook/internal/store"
	"github.com/nookhq/nook/internal/template"
	"github.com/nookhq/nook/internal/volume"
)

// Version is nook's version, set at build time.
var Version = "dev"

// Config configures a Manager. Zero fields take the defaults in one place: withDefaults.
type Config struct {
	DataDir      string        // database, sandboxes; default /var/lib/nook
	RunDir       string        // sockets and runtime state (tmpfs); default /run/nook
	TemplatesDir string        // default DataDir/templates
	AgentBinary  string        // default: nook-agent beside the running executable
	CgroupParent string        // default "nook"
	ReapInterval time.Duration // how often expired and dead sandboxes are looked for; default 5s
	WarmPool     int           // started sandboxes kept ready per template (and vm shape) in use; default 2, negative: none
	WarmPoolMax  int           // how far a template's container pool grows after bursts of creates; default 16, never below WarmPool
	Accel        string        // vm accelerator: kvm or tcg; default: detected
	// ContainerPause is what a container's pause does: "checkpoint" (to
	// disk with CRIU >= 4, which must be there), "freeze" (the cgroup
	// freezer), or "" (checkpoint where CRIU >= 4 is found, else freeze).
	ContainerPause string
	CRIU           string        // the CRIU binary; default: DefaultCRIU, else criu in PATH
	Runc           string        // the runc binary; default: runcbin.Find (scripts/runc.sh's build, else runc in PATH)
	VMCacheDir     string        // guest kernels, vm template images and snapshots; default DataDir/vm
	VolumesDir     string        // volumes (internal/volume); default DataDir/volumes
	KernelRoot     string        // an unpacked Debian linux-image package for vm guests; default: fetched with apt
	VMColdBoot     bool          // boot vm sandboxes instead of restoring their template's snapshot (benchmarks)
	Net            NetConfig     // sandbox networking (network.go); zero: off, loopback only
	IdlePause      time.Duration // idle pause of sandboxes created without one; default 0: never
	MinIdlePause   time.Duration // the shortest idle pause accepted; default core.MinIdlePause (tests lower it)
	// AgentTimeout bounds how long a sandbox's agent may take to answer a
	// request (or, while a stream is open, a ping) before the call fails
	// as unavailable; default agent.DefaultAnswerTimeout (30s).
	AgentTimeout time.Duration
	// MaxSandboxes is how many sandboxes may exist (any state); more
	// creates and forks are refused (errdefs.ErrLimit). 0: no limit.
	MaxSandboxes int
	// MaxMemory is the most memory the sandboxes that hold RAM (running,
	// or paused in RAM) may commit between them; what would go over it is
	// refused (errdefs.ErrLimit). 0: no limit.
	MaxMemory int64
	// AllowHostMounts are the directories of the host under which a
	// create may mount a directory (--mount); none: no host mounts.
	AllowHostMounts []string
	// Identity configures sandboxes' identity tokens (identity.go).
	Identity IdentityConfig
	// Observer, if set, is told of operations' latencies and errors and
	// of refused connections and DNS queries (stats.go; the metrics).
	Observer Observer
	Log      *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.DataDir == "" {
		c.DataDir = "/var/lib/nook"
	}
	if c.RunDir == "" {
		c.RunDir = "/run/nook"
	}
	if c.TemplatesDir == "" {
		c.TemplatesDir = filepath.Join(c.DataDir, "templates")
	}
	if c.AgentBinary == "" {
		c.AgentBinary = DefaultAgentBinary()
	}
	// runc resolves bind-mount sources from the bundle directory: keep every path absolute.
	for _, p := range []*string{&c.DataDir, &c.RunDir, &c.TemplatesDir, &c.AgentBinary} {
		if abs, err := filepath.Abs(*p); err == nil {
			*p = abs
		}
	}
	if c.CgroupParent == "" {
		c.CgroupParent = "nook"
	}
	if c.Runc == "" {
		c.Runc = runcbin.Find()
	}
	if c.VMCacheDir == "" {
		c.VMCacheDir = filepath.Join(c.DataDir, "vm")
	}
	if c.VolumesDir == "" {
		c.VolumesDir = filepath.Join(c.DataDir, "volumes")
	}
	if c.WarmPool == 0 {
		c.WarmPool = 2
	}
	if c.WarmPoolMax == 0 {
		c.WarmPoolMax = 16
	}
	if c.ReapInterval == 0 {
		c.ReapInterval = 5 * time.Second
	}
	if c.MinIdlePause == 0 {
		c.MinIdlePause = core.MinIdlePause
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	return c
}

// DefaultAgentBinary is nook-agent beside the running nook binary, else /usr/local/lib/nook/nook-agent.
func DefaultAgentBinary() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "nook-agent")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "/usr/local/lib/nook/nook-agent"
}

// Manager runs sandboxes.
type Manager struct {
	cfg       Config
	log       *slog.Logger
	store     *store.Store
	templates *template.Store
	backends  map[string]core.Backend

	// tplMu is held for reading by creates while they pick a template
	// build, and for writing while builds nothing records are removed.
	tplMu sync.RWMutex
	// volumes keeps the volumes; volMu is held (read) by a create from
	// choosing its volumes until its record names them, and (write) by a
	// volume's removal, which counts the records.
	volumes *volume.Store
	volMu   sync.RWMutex

	mu      sync.Mutex
	locks   keylock.Map // serializes lifecycle operations per sandbox name
	atRest  atRest      // sandboxes the reaper need not look at (reap.go)
	reboots reboots     // guests' recent reboots (stop.go)
	// hostRestarted: the host restarted since the daemon last ran (set
	// during reconcile only): what ran then was stopped by it.
	hostRestarted bool
	agents        map[string]*agent.Client // by sandbox ID
	volServes     map[string]*volServe     // by sandbox ID: vms' volume streams (vmvolumes.go)
	volRestored   map[string]bool          // by sandbox ID: vms rolled back or forked, until their volume stream opens

	net *sandboxNets // sandbox networks (network.go); nil when networking is off

	idle *idleTracker // when each sandbox was last used (idle.go)

	pauseMode string // what a container's pause does, for Info

	limits *ledger // the host limits and their use (limits.go)

	quotas *quotaLedger // tokens' quotas: reservations under way (quotas.go)
	idem   *idempotency // idempotency keys' requests under way (idempotency.go)

	issuer  *identity.Issuer // sandboxes' identity tokens (identity.go)
	secrets *secretStore     // secrets and sandboxes' bindings (secrets.go)
	idlog   *identityLog

	events events.Bus // lifecycle events (events.go)
}

// DefaultCRIU is where scripts/criu.sh installs the CRIU nook builds.
const DefaultCRIU = container.DefaultCRIU

// containerPause decides what a container's pause does (Config.ContainerPause)
// and returns the CRIU binary to checkpoint with ("" to freeze).
func (m *Manager) containerPause(ctx context.Context) (string, error) {
	mode := m.cfg.ContainerPause
	if mode != "" && mode != "checkpoint" && mode != "freeze" {
		return "", errdefs.Invalid("container pause %q is not valid: use checkpoint, freeze (or leave it out to checkpoint where CRIU >= 4 is installed)", mode)
	}
	if mode == "freeze" {
		m.pauseMode = "freeze (cgroup freezer, memory kept in RAM): chosen by --container-pause"
		return "", nil
	}
	path := m.cfg.CRIU
	if path == "" {
		path = DefaultCRIU
		if _, err := os.Stat(path); err != nil {
			path, _ = exec.LookPath("criu")
		}
	}
	why := "CRIU is not installed (scripts/criu.sh builds it)"
	if path != "" {
		version, ok, notOK, err := container.CRIUVersion(ctx, path)
		switch {
		case err != nil:
			why = err.Error()
		case !ok:
			why = notOK
		default:
			m.pauseMode = fmt.Sprintf("checkpoint (to disk, with CRIU %s at %s)", version, path)
			return path, nil
		}
	}
	if mode == "checkpoint" {
		return "", errdefs.Precondition("--container-pause checkpoint: %s", why)
	}
	m.pauseMode = "freeze (cgroup freezer, memory kept in RAM): " + why
	return "", nil
}

// New opens the data directory, reconciles the database with the host and returns a Manager.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	cfg = cfg.withDefaults()
	if cfg.Accel != "" && cfg.Accel != "kvm" && cfg.Accel != "tcg" {
		return nil, errdefs.Invalid("accelerator %q is not valid: use kvm or tcg (or leave it out to detect)", cfg.Accel)
	}
	if cfg.MaxSandboxes < 0 || cfg.MaxMemory < 0 {
		return nil, errdefs.Invalid("--max-sandboxes and --max-memory cannot be negative (0: no limit)")
	}
	if err := checkAgentBinary(cfg.AgentBinary); err != nil {
		return nil, err
	}
	// Nobody else on the host may walk into sandboxes' files (a setuid
	// binary a sandbox made would be a way to its uids, or, in a vm's or
	// an older container's files, to root). The data directory and the
	// containers' are searchable, not listable: a container's root, an
	// unprivileged uid of its own on the host, passes them on the way to
	// its rootfs, and each sandbox's directory lets in only that uid's
	// group (container.Backend); everything else in them is root's alone.
	// The database first: it was readable by anyone who could reach it.
	for _, p := range []string{"nook.db", "nook.db-wal", "nook.db-shm"} {
		if err := os.Chmod(filepath.Join(cfg.DataDir, p), 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	// The templates are root's alone (their rootfs have setuid-root
	// files), wherever they are.
	if err := os.MkdirAll(cfg.TemplatesDir, 0o700); err != nil {
		return nil, fmt.Errorf("create %s: %w", cfg.TemplatesDir, err)
	}
	if err := os.Chmod(cfg.TemplatesDir, 0o700); err != nil {
		return nil, err
	}
	// (The data directory first: parents MkdirAll makes get its mode.)
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{{cfg.DataDir, 0o711}, {filepath.Join(cfg.DataDir, "sandboxes"), 0o711}, {cfg.RunDir, 0o700}} {
		if err := os.MkdirAll(d.path, d.mode); err != nil {
			return nil, fmt.Errorf("create %s: %w", d.path, err)
		}
		if err := os.Chmod(d.path, d.mode); err != nil {
			return nil, err
		}
	}
	st, err := store.Open(ctx, filepath.Join(cfg.DataDir, "nook.db"))
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg: cfg, log: cfg.Log, store: st,
		templates:   template.NewStore(cfg.TemplatesDir, cfg.Log),
		agents:      map[string]*agent.Client{},
		volServes:   map[string]*volServe{},
		volRestored: map[string]bool{},
		idle:        newIdleTracker(),
		limits:      newLedger(cfg.MaxSandboxes, cfg.MaxMemory),
		quotas:      newQuotaLedger(),
		idem:        newIdempotency(),
	}
	if m.volumes, err = volume.Open(cfg.VolumesDir, cfg.Log); err != nil {
		st.Close()
		return nil, err
	}
	for _, dir := range cfg.AllowHostMounts {
		// A container's root is root in a host directory it mounts: a
		// setuid file it leaves there is one the host's users can run.
		var sfs unix.Statfs_t
		if unix.Statfs(dir, &sfs) == nil && sfs.Flags&unix.ST_NOSUID == 0 {
			cfg.Log.Warn("a directory allowed for host mounts is on a file system mounted without nosuid: a sandbox's root can leave setuid files there that the host's users can run; allow only directories on a nosuid mount, or that no other user of the host can reach", "dir", dir)
		}
	}
	if m.issuer, err = openIssuer(cfg); err != nil {
		st.Close()
		return nil, err
	}
	if m.secrets, err = openSecrets(cfg, st); err != nil {
		st.Close()
		return nil, err
	}
	m.idlog = newIdentityLog(st, cfg.Log)
	var hooks core.NetHooks // stays a nil interface when networking is off
	if cfg.Net.Enabled {
		if m.net, err = newSandboxNets(ctx, cfg, st, m.metadataHandler); err != nil {
			m.idlog.close()
			st.Close()
			return nil, err
		}
		m.net.intercept = m.secrets.interceptor
		m.net.closeIntercept = m.secrets.closeIdle
		m.secrets.refused = m.net.secretRefused
		hooks = m.net
	}
	criu, err := m.containerPause(ctx)
	if err != nil {
		if m.net != nil {
			m.net.close()
		}
		m.idlog.close()
		st.Close()
		return nil, err
	}
	m.warnRunc(ctx)
	ctr := container.New(container.Config{
		Runc: cfg.Runc, RuncRoot: filepath.Join(cfg.RunDir, "runc"), StateDir: filepath.Join(cfg.DataDir, "sandboxes"),
		AgentBinary: cfg.AgentBinary, CgroupParent: cfg.CgroupParent, TemplateRootfs: m.templates.Rootfs, TemplateLayers: m.templates.Layers, VolumePath: m.volumes.Path, HostMountPath: m.HostMountAllowed, VolumesDir: cfg.VolumesDir, Log: cfg.Log,
		WarmPool: max(cfg.WarmPool, 0), WarmPoolMax: cfg.WarmPoolMax, Net: hooks, CRIU: criu,
	})
	vmb := vm.New(vm.Config{
		StateDir: filepath.Join(cfg.DataDir, "vms"), CacheDir: cfg.VMCacheDir, KernelRoot: cfg.KernelRoot,
		AgentBinary: cfg.AgentBinary, CgroupParent: cfg.CgroupParent, Accel: cfg.Accel,
		TemplateRootfs: m.templates.Rootfs, TemplateStore: cfg.TemplatesDir, PrepareTemplate: m.prepareTemplate, Log: cfg.Log, WarmPool: max(cfg.WarmPool, 0), ColdBoot: cfg.VMColdBoot,
		Net: hooks,
	})
	m.backends = map[string]core.Backend{ctr.Isolation(): ctr, vmb.Isolation(): vmb}
	m.templates.OnRemove(m.forgetTemplate)
	bootFile := filepath.Join(cfg.DataDir, "host-boot-id")
	bootID, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if was, err := os.ReadFile(bootFile); err == nil && len(bootID) > 0 && !bytes.Equal(was, bootID) {
		m.hostRestarted = true
		m.log.Info("the host restarted since the daemon last ran: sandboxes that ran are stopped, for `nook start`")
	}
	err = m.reconcile(ctx)
	m.hostRestarted = false
	if err == nil {
		err = m.rebuildLedger(ctx)
	}
	if err == nil && len(bootID) > 0 {
		// Recorded once reconciled: a crash before leaves the next start
		// to find the host restarted still.
		err = fsutil.WriteFileAtomic(bootFile, bootID)
	}
	if err != nil {
		if m.net != nil {
			m.net.close()
		}
		m.idlog.close()
		st.Close()
		return nil, fmt.Errorf("reconcile: %w", err)
	}
	// Keep the default template warm from the start.
	if t, err := m.templates.Get("base"); err == nil {
		if ok, _, _ := ctr.Available(ctx); ok {
			ctr.Prewarm(&core.Sandbox{TemplateID: t.ID})
		}
	}
	return m, nil
}

// Close releases the Manager. Sandboxes keep running; a new Manager re-adopts them.
func (m *Manager) Close() error {
	for _, b := range m.backends {
		if wp, ok := b.(core.WarmPool); ok {
			if err := wp.Shutdown(context.Background()); err != nil {
				m.log.Error("destroy warm pool", "err", err)
			}
		}
	}
	m.mu.Lock()
	for id, c := range m.agents {
		c.Retire()
		delete(m.agents, id)
	}
	m.mu.Unlock()
	if m.net != nil {
		m.net.close()
	}
	m.idlog.close()
	if !diskimg.Settle(5 * time.Second) {
		m.log.Warn("loop devices are still being removed as the daemon stops")
	}
	return m.store.Close()
}

// lockSandbox checks a sandbox name, takes its lifecycle lock and reads
// its record; on an error nothing is held.
func (m *Manager) lockSandbox(ctx context.Context, name string) (*core.Sandbox, func(), error) {
	if err := core.ValidateName(name); err != nil {
		return nil, nil, err
	}
	unlock := m.lockName(name)
	sb, err := m.store.GetSandbox(ctx, name)
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return sb, unlock, nil
}

// lockName serializes lifecycle operations on one sandbox name. Whatever
// the holder does, the reaper looks at the sandbox again at its next tick.
func (m *Manager) lockName(name string) func() {
	unlock := m.locks.Lock(name)
	m.atRest.forget(name)
	return unlock
}

func (m *Manager) backend(isolation string) (core.Backend, error) {
	b, ok := m.backends[isolation]
	if !ok {
		return nil, errdefs.Invalid("isolation %q is not valid: use container or vm", isolation)
	}
	return b, nil
}

func (m *Manager) agentFor(sb *core.Sandbox) (*agent.Client, error) {
	b, err := m.backend(sb.Isolation)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.agents[sb.ID]
	if c == nil {
		sbCopy := *sb
		c = agent.NewClient(func(ctx context.Context) (net.Conn, error) { return b.DialAgent(ctx, &sbCopy) }).SetAnswerTimeout(m.cfg.AgentTimeout)
		m.agents[sb.ID] = c
	}
	m.serveVolumesLocked(sb, c)
	return c, nil
}

func (m *Manager) dropAgent(id string) {
	m.mu.Lock()
	vs := m.stopVolumesLocked(id)
	if c := m.agents[id]; c != nil {
		c.Retire()
		delete(m.agents, id)
	}
	m.mu.Unlock()
	vs.wait() // a vm's volumes are closed when its client goes (a destroy leaves nothing open)
}

func newID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

var (
	adjectives = []string{"brave", "calm", "clever", "eager", "fancy", "gentle", "happy", "jolly", "keen", "lucky", "merry", "nimble", "proud", "quick", "quiet", "sharp", "steady", "swift", "tidy", "witty"}
	nouns      = []string{"otter", "falcon", "badger", "heron", "lynx", "marten", "newt", "owl", "panda", "quail", "raven", "seal", "tapir", "viper", "walrus", "yak", "zebra", "bison", "crane", "dingo"}
)

func generateName() string {
	b := make([]byte, 4)
	rand.Read(b)
	return fmt.Sprintf("%s-%s-%s", adjectives[int(b[0])%len(adjectives)], nouns[int(b[1])%len(nouns)], hex.EncodeToString(b[2:]))
}

// Create validates a request, makes the sandbox and returns it running.
// progress receives template build output when the template must be built first.
func (m *Manager) Create(ctx context.Context, req api.CreateSandboxRequest, progress io.Writer) (_ *core.Sandbox, err error) {
	defer m.observe(opCreate, time.Now(), &err)
	return m.create(ctx, req, progress, "")
}

// create is Create; with build set, the sandbox starts from that build of
// req.Template (a template build's step, "name/step-..."), not from its
// current one.
func (m *Manager) create(ctx context.Context, req api.CreateSandboxRequest, progress io.Writer, build string) (*core.Sandbox, error) {
	began := time.Now()
	if req.Isolation == "" {
		req.Isolation = api.IsolationContainer
	}
	b, err := m.backend(req.Isolation)
	if err != nil {
		return nil, err
	}
	if ok, why, _ := b.Available(ctx); !ok {
		return nil, errdefs.Unavailable("the %s backend is not available on this host: %s", req.Isolation, why)
	}
	caps := b.Capabilities()
	if req.Name != "" {
		if err := core.ValidateName(req.Name); err != nil {
			return nil, err
		}
	}
	ttl, err := core.ValidateTTL(req.TTL)
	if err != nil {
		return nil, err
	}
	if ttl, err = m.capTTL(ctx, ttl, req.TTL != "", ""); err != nil {
		return nil, err
	}
	idlePause, onExpire, err := m.idleSettings(req, b)
	if err != nil {
		return nil, err
	}
	hostCPUs, hostMem := core.HostSize()
	cpus := req.CPUs
	switch {
	case cpus == 0:
		cpus = float64(min(2, hostCPUs))
	case cpus < 0.01:
		return nil, errdefs.Invalid("cpus %g is not valid: ask for at least 0.01", cpus)
	case cpus > float64(hostCPUs):
		return nil, errdefs.Invalid("cpus %g is more than this host has (%d)", cpus, hostCPUs)
	}
	mem := int64(2 << 30)
	if req.Memory != "" {
		if mem, err = core.ParseSize(req.Memory); err != nil {
			return nil, fmt.Errorf("memory: %w", err)
		}
		if mem < core.MinMemory {
			return nil, errdefs.Invalid("memory %s is too small: ask for at least 64M", req.Memory)
		}
	}
	if req.Isolation == api.IsolationVM && mem < vm.MinMemory {
		return nil, errdefs.Invalid("memory %s is too small for a vm sandbox: its kernel and agent need at least %s", core.FormatBytes(mem), core.FormatBytes(vm.MinMemory))
	}
	if hostMem > 0 && mem > hostMem {
		if req.Memory != "" {
			return nil, errdefs.Invalid("memory %s is more than this host has (%s)", req.Memory, core.FormatBytes(hostMem))
		}
		mem = hostMem / 2
	}
	disk := caps.DefaultDiskBytes
	if req.Disk != "" {
		if disk, err = core.ParseSize(req.Disk); err != nil {
			return nil, fmt.Errorf("disk: %w", err)
		}
		if !caps.DiskLimit {
			return nil, errdefs.Invalid("the %s backend cannot limit disk size: omit --disk (the sandbox shares the host's disk)", req.Isolation)
		}
		if disk < caps.MinDiskBytes {
			return nil, errdefs.Invalid("disk %s is too small for a %s sandbox: ask for at least %s", req.Disk, req.Isolation, core.FormatBytes(caps.MinDiskBytes))
		}
		if req.Isolation == api.IsolationVM && disk < vm.MinDisk {
			return nil, errdefs.Invalid("disk %s is too small for a vm sandbox: ask for at least %s (beside the template's files)", req.Disk, core.FormatBytes(vm.MinDisk))
		}
		var fs syscall.Statfs_t
		if syscall.Statfs(m.cfg.DataDir, &fs) == nil && disk > int64(fs.Bavail)*fs.Bsize {
			return nil, errdefs.Invalid("disk %s is more than %s has free (%s)", req.Disk, m.cfg.DataDir, core.FormatBytes(int64(fs.Bavail)*fs.Bsize))
		}
	}
	if req.IdentityAudience != "" {
		if m.net == nil {
			return nil, errdefs.Invalid("an identity token file needs sandbox networking (its agent fetches the token from the sandbox's metadata endpoint): nook serve --network")
		}
		if err := identity.CheckAudience(req.IdentityAudience); err != nil {
			return nil, fmt.Errorf("identity audience: %w", err)
		}
	}
	if err := core.ValidateLabels(req.Labels); err != nil {
		return nil, err
	}
	if err := core.ValidateEnv(req.Env); err != nil {
		return nil, err
	}
	env := maps.Clone(req.Env)
	if env == nil {
		env = map[string]string{}
	}
	var bound []secrets.Bound
	if len(req.Secrets) > 0 {
		if m.net == nil {
			return nil, errdefs.Invalid("secrets need sandbox networking (nook terminates TLS to their hosts on the sandbox's path out): nook serve --network")
		}
		if bound, err = m.secrets.bind(ctx, req.Secrets, env); err != nil {
			return nil, err
		}
	}
	repo, err := checkRepo(req)
	if err != nil {
		return nil, err
	}
	if err := checkSSHKeys(req.SSHKeys); err != nil {
		return nil, err
	}
	vols, err := m.parseVolumes(req.Volumes, req.Mounts, req.Isolation)
	if err != nil {
		return nil, err
	}
	pol, err := m.createPolicy(req)
	if err != nil {
		return nil, err
	}
	// Room on the host (--max-sandboxes, --max-memory), taken before
	// anything else is done (a template build too): parallel creates never
	// go over together. The record takes it over; a failure gives it back.
	room, err := m.limits.reserve(1, mem, "creating")
	if err != nil {
		return nil, err
	}
	defer room.release()
	// And in the quotas of the caller's token (quotas.go), the same way.
	share, err := m.reserveQuota(ctx, tokenIDFrom(ctx), store.Usage{Sandboxes: 1, CPUs: cpus, MemoryBytes: mem, DiskBytes: disk}, "creating this sandbox")
	if err != nil {
		return nil, err
	}
	defer share.release()
	tplName := req.Template
	if tplName == "" {
		tplName = "base"
	}
	// From choosing the template build until the sandbox's record names it,
	// no rebuild or removal may delete that build (they count records).
	// The build (minutes, if it is missing) happens outside the lock, so
	// that no create waits for another template's build.
	if build == "" {
		before, _ := m.templates.Get(tplName)
		if t, err := m.templates.EnsureBuilt(ctx, tplName, progress); err != nil {
			return nil, err
		} else if before.ID != "" && t.ID != before.ID {
			m.afterBuild(ctx, tplName, t) // rebuilt from a newer recipe
		}
	}
	m.tplMu.RLock()
	tplLocked := true
	defer func() {
		if tplLocked {
			m.tplMu.RUnlock()
		}
	}()
	// From here until its record names them, none of its volumes may be
	// removed (a removal counts the records).
	volLocked := false
	if len(vols) > 0 {
		m.volMu.RLock()
		volLocked = true
		defer func() {
			if volLocked {
				m.volMu.RUnlock()
			}
		}()
		if err := m.volumesExist(vols); err != nil {
			return nil, err
		}
	}
	tpl := api.Template{Name: tplName, ID: build}
	if build == "" {
		if tpl, err = m.templates.Get(tplName); err != nil { // the current build, which GC keeps while the lock is held
			return nil, err
		}
	}

	now := time.Now()
	sb := &core.Sandbox{
		ID: newID(), Name: req.Name, Template: tpl.Name, TemplateID: tpl.ID, Isolation: req.Isolation,
		State: core.StateCreating, CPUs: cpus, MemoryBytes: mem, DiskBytes: disk, PidsLimit: 4096,
		Env: env, CreatedAt: now, ExpiresAt: now.Add(ttl), IdlePause: idlePause, OnExpire: onExpire,
		Volumes: vols, Labels: req.Labels, Creator: creatorFrom(ctx), IdentityAudience: req.IdentityAudience,
	}
	if sb.Init, err = chooseInit(b, sb, req.Init); err != nil {
		return nil, err
	}
	// Insert first, as creating: a daemon killed from here on finds the
	// record on restart and removes whatever was half made.
	// Take the name first, then (if the backend keeps any) a warm sandbox,
	// then record the sandbox as creating: a daemon killed from here on finds
	// the record on restart and removes whatever was half made.
	var unlock func()
	for attempt := 0; ; attempt++ {
		if req.Name == "" {
			sb.Name = generateName()
		}
		unlock = m.lockName(sb.Name)
		_, err := m.store.GetSandbox(ctx, sb.Name)
		if errors.Is(err, errdefs.ErrNotFound) {
			break
		}
		unlock()
		if err != nil {
			return nil, err
		}
		if req.Name != "" || attempt > 5 {
			return nil, store.ErrNameTaken(sb.Name)
		}
	}
	defer unlock()
	warm := false
	// A build step's is no build to keep warm; a warm sandbox has no volumes.
	if wp, ok := b.(core.WarmPool); ok && build == "" && len(vols) == 0 {
		if id, ok := wp.TakeWarm(sb); ok {
			sb.ID, warm = id, true
		}
	}
	inserting := time.Now()
	if err := m.linkIdempotent(ctx, idemSandbox, sb.ID); err != nil {
		if derr := b.Destroy(context.WithoutCancel(ctx), sb.ID); derr != nil {
			m.log.Error("release sandbox resources after failed insert", "sandbox", sb.ID, "err", derr)
		}
		return nil, err
	}
	if err := m.insertSandbox(ctx, sb, room); err != nil {
		if derr := b.Destroy(context.WithoutCancel(ctx), sb.ID); derr != nil {
			m.log.Error("release sandbox resources after failed insert", "sandbox", sb.ID, "err", derr)
		}
		return nil, err
	}
	if err := m.recordOwner(context.WithoutCancel(ctx), share, sb.ID); err != nil {
		m.abandonCreate(context.WithoutCancel(ctx), b, sb)
		return nil, fmt.Errorf("create sandbox %s: record its token: %w", sb.Name, err)
	}
	m.tplMu.RUnlock()
	tplLocked = false
	if volLocked {
		m.volMu.RUnlock()
		volLocked = false
	}
	// Finish even if the client goes away: a create is never left half done.
	cctx := context.WithoutCancel(ctx)
	if len(bound) > 0 {
		// Its CA and bindings, before its network asks for them.
		var ca *secrets.CA
		if ca, err = secrets.NewCA(sb.Name, hostsOf(bound)); err == nil {
			err = m.secrets.record(cctx, sb.ID, bound, ca)
		}
		if err != nil {
			m.abandonCreate(cctx, b, sb)
			return nil, fmt.Errorf("create sandbox %s: its secrets: %w", sb.Name, err)
		}
	}
	if len(req.SSHKeys) > 0 {
		// Recorded with the creating row: an abandoned create's go with it.
		if err := m.recordSSHKeys(cctx, sb, req.SSHKeys); err != nil {
			m.abandonCreate(cctx, b, sb)
			return nil, fmt.Errorf("create sandbox %s: its SSH keys: %w", sb.Name, err)
		}
	}
	start := time.Now()
	err = b.Create(cctx, sb)
	backendDone := time.Now()
	if err == nil && m.net != nil {
		err = m.net.setup(cctx, sb, pol)
	}
	netDone := time.Now()
	if err == nil {
		err = m.waitAgent(cctx, sb)
	}
	if err == nil && repo != nil {
		// Before the template's service starts: nothing of the sandbox's
		// own runs yet beside the clone.
		err = m.cloneRepo(cctx, sb, *repo, progress)
	}
	if err == nil {
		err = m.startService(cctx, sb)
	}
	agentDone := time.Now()
	if err == nil {
		sb.State = core.StateRunning
		err = m.updateSandbox(cctx, sb)
	}
	if err != nil {
		m.abandonCreate(cctx, b, sb)
		return nil, fmt.Errorf("create sandbox %s: %w", sb.Name, err)
	}
	m.idle.touch(sb.ID)
	m.log.Info("sandbox created", "sandbox", sb.Name, "id", sb.ID, "template", sb.TemplateID, "duration", time.Since(start),
		"prepare", inserting.Sub(began), "insert", start.Sub(inserting), "backend", backendDone.Sub(start), "network", netDone.Sub(backendDone), "agent", agentDone.Sub(netDone), "record", time.Since(agentDone), "warm", warm)
	m.emit(ctx, api.EventCreated, sb, "")
	return sb, nil
}

// abandonCreate releases what a failed create made. If the backend cannot
// release everything, the record stays as destroying so that the reaper
// retries; it is deleted only once nothing is left on the host.
func (m *Manager) abandonCreate(ctx context.Context, b core.Backend, sb *core.Sandbox) {
	m.dropAgent(sb.ID)
	if err := b.Destroy(ctx, sb.ID); err != nil {
		m.log.Error("clean up failed create; the reaper will retry", "sandbox", sb.ID, "err", err)
		sb.State, sb.Reason = core.StateDestroying, "create failed"
		if err := m.updateSandbox(ctx, sb); err != nil {
			m.log.Error("mark failed create for cleanup", "sandbox", sb.ID, "err", err)
		}
		return
	}
	if err := m.deleteSandbox(ctx, sb.ID); err != nil {
		m.log.Error("delete record of failed sandbox", "sandbox", sb.ID, "err", err)
	}
}

// waitAgent waits until the sandbox's agent answers, and gives the sandbox its identity.
func (m *Manager) waitAgent(ctx context.Context, sb *core.Sandbox) error {
	return m.configureAgent(ctx, sb, false)
}

// configureAgent waits for the sandbox's agent and configures it: all of
// it, or (wake) only what a vm woken from a pause needs, the time and
// fresh entropy.
func (m *Manager) configureAgent(ctx context.Context, sb *core.Sandbox, wake bool) error {
	return m.configureAgentUnset(ctx, sb, wake, nil)
}

// configureAgentUnset is configureAgent; unset are variables its
// processes' environment loses (a fork's parent had them).
func (m *Manager) configureAgentUnset(ctx context.Context, sb *core.Sandbox, wake bool, unset []string) error {
	c, err := m.agentFor(sb)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	env := map[string]string{}
	if cfg := m.imageConfig(sb); cfg != nil {
		for _, kv := range cfg.Env {
			if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
				env[k] = v
			}
		}
	}
	env["NOOK_SANDBOX"] = sb.Name
	var ident *agent.IdentityConfig
	if sb.IdentityAudience != "" && m.net != nil {
		env["NOOK_IDENTITY_TOKEN_FILE"] = api.IdentityTokenFile
		ident = &agent.IdentityConfig{Sandbox: sb.ID, Audience: sb.IdentityAudience, File: api.IdentityTokenFile,
			URL: "http://" + network.MetadataAddr.String() + "/v1/token?audience=" + url.QueryEscape(sb.IdentityAudience)}
	}
	for k, v := range sb.Env {
		env[k] = v
	}
	req := &agent.ConfigureRequest{Hostname: sb.Name, Env: env, Identity: ident, Unset: unset}
	if ss := m.secrets.sandbox(sb.ID); ss != nil {
		req.TrustCA = string(ss.CA.CertPEM)
	}
	if wake {
		req = &agent.ConfigureRequest{WakeOnly: true}
	}
	if m.net != nil && !wake {
		if addr, gw, ok := m.net.agentNet(sb); ok {
			// A vm's eth0 only the guest can configure; a container's the host did.
			req.Net = &agent.NetConfig{Address: addr, Gateway: gw, SetLink: sb.Isolation == api.IsolationVM}
		}
	}
	if sb.Isolation == api.IsolationVM {
		// A vm restored from a snapshot wakes at the snapshot's time and
		// with the snapshot's random pool: give it the time and fresh entropy.
		req.Seed = make([]byte, 64)
		rand.Read(req.Seed)
		req.TimeUnixNano = time.Now().UnixNano()
	}
	err = c.Configure(ctx, req)
	// The clock it sets is as old as the request was slow to arrive (a
	// guest just woken under load took seconds): a slow one is followed by
	// clock-only ones until one arrives at once.
	for tries := 0; err == nil && req.TimeUnixNano != 0 && tries < 3 && time.Since(time.Unix(0, req.TimeUnixNano)) > clockSlack; tries++ {
		req = &agent.ConfigureRequest{WakeOnly: true, TimeUnixNano: time.Now().UnixNano()}
		err = c.Configure(ctx, req)
	}
	if err != nil {
		msg := ""
		if cl, ok := m.backends[sb.Isolation].(core.ConsoleLogger); ok {
			msg = cl.ConsoleTail(sb.ID)
		}
		return fmt.Errorf("the sandbox's agent did not answer: %w%s", err, msg)
	}
	return m.volumesMounted(ctx, sb)
}

// clockSlack is how late a vm's clock may be set by a configure that
// was slow to arrive.
const clockSlack = 250 * time.Millisecond

// Get returns a sandbox by name.
func (m *Manager) Get(ctx context.Context, name string) (*core.Sandbox, error) {
	if err := core.ValidateName(name); err != nil {
		return nil, err
	}
	return m.store.GetSandbox(ctx, name)
}

// List returns every sandbox.
func (m *Manager) List(ctx context.Context) ([]*core.Sandbox, error) {
	return m.store.ListSandboxes(ctx)
}

// Destroy removes a sandbox and everything it had on the host.
func (m *Manager) Destroy(ctx context.Context, name string) error {
	sb, unlock, err := m.lockSandbox(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	return m.destroyLocked(context.WithoutCancel(ctx), sb)
}

func (m *Manager) destroyLocked(ctx context.Context, sb *core.Sandbox) error {
	start := time.Now()
	// A destroy tried before may have removed what says so already.
	gc := sb.State == core.StateDestroying || m.refersToSnapshots(ctx, sb)
	if err := m.beginDestroy(ctx, sb); err != nil {
		return err
	}
	m.dropAgent(sb.ID)
	backendStart := time.Now()
	if b, ok := m.backends[sb.Isolation]; ok {
		if err := b.Destroy(ctx, sb.ID); err != nil {
			return fmt.Errorf("destroy sandbox %s: %w (it stays in state destroying and is retried)", sb.Name, err)
		}
	}
	backendDone := time.Now()
	m.reboots.forget(sb.ID)
	if err := m.deleteSandbox(ctx, sb.ID); err != nil {
		return err
	}
	// Its snapshots' records went with it; their files go unless forks use them.
	if gc {
		m.gcSnapshots(ctx)
	}
	m.log.Info("sandbox destroyed", "sandbox", sb.Name, "id", sb.ID, "duration", time.Since(start),
		"backend", backendDone.Sub(backendStart), "records", backendStart.Sub(start)+time.Since(backendDone))
	m.emit(ctx, api.EventDestroyed, sb, "")
	return nil
}

// beginDestroy records sb destroying, unless it is already; the caller
// holds its name's lock.
func (m *Manager) beginDestroy(ctx context.Context, sb *core.Sandbox) error {
	if sb.State == core.StateDestroying {
		return nil
	}
	if err := core.CheckTransition(sb.State, core.StateDestroying); err != nil {
		return err
	}
	old := sb.State
	sb.State = core.StateDestroying
	if err := m.updateSandbox(ctx, sb); err != nil {
		sb.State = old
		return err
	}
	return nil
}

// chooseInit resolves a create's init with its backend: systemd only
// where the backend can boot it (and its template has it).
func chooseInit(b core.Backend, sb *core.Sandbox, requested string) (string, error) {
	switch requested {
	case "", api.InitAgent, api.InitSystemd:
	default:
		return "", errdefs.Invalid("init %q is not valid: use systemd or agent", requested)
	}
	if c, ok := b.(core.InitChooser); ok && b.Capabilities().SystemdInit {
		return c.ChooseInit(sb, requested)
	}
	if requested == api.InitSystemd {
		return "", errdefs.Invalid("%s sandboxes run nook-agent as their init, not systemd (it would need the host's cgroups delegated to a user namespace): use --isolation vm with a template that has systemd, such as dev", sb.Isolation)
	}
	return api.InitAgent, nil
}

// View is a sandbox as the API shows it, with what the backend says of its pause.
func (m *Manager) View(sb *core.Sandbox) api.Sandbox {
	v := sb.API()
	if m.net != nil {
		v.Network = m.net.view(sb.ID)
	}
	v.Secrets = m.secretBindings(sb.ID)
	if d, ok := m.backends[sb.Isolation].(core.Describer); ok {
		d.Describe(sb, &v)
	}
	v.SnapshotsBytes = m.SnapshotsUsage(context.Background(), sb.ID)
	if t := m.reboots.last(sb.ID); !t.IsZero() {
		t = t.UTC()
		v.RebootedAt = &t
	}
	if sb.State == core.StatePaused {
		if p, ok := m.backends[sb.Isolation].(core.Pauser); ok {
			v.PauseKind = p.PauseKind(sb.ID)
		}
	}
	return v
}

// Pause stops a running sandbox's processes, keeping them (how depends on
// the backend: Capabilities.Pause, and PauseKind in the sandbox).
func (m *Manager) Pause(ctx context.Context, name string) (_ *core.Sandbox, err error) {
	defer m.observe(opPause, time.Now(), &err)
	return m.setPaused(ctx, name, true, "", api.EventPaused)
}

// pauseFor pauses a sandbox on nook's own initiative, recording why in the
// same update that records the pause, so no reader sees one without the
// other, and publishing event (paused-by-idle, or the TTL's expired).
func (m *Manager) pauseFor(ctx context.Context, name, reason, event string) (*core.Sandbox, error) {
	return m.setPaused(ctx, name, true, reason, event)
}

// Resume continues a paused sandbox.
func (m *Manager) Resume(ctx context.Context, name string) (_ *core.Sandbox, err error) {
	defer m.observe(opResume, time.Now(), &err)
	sb, err := m.setPaused(ctx, name, false, "", api.EventResumed)
	if err == nil {
		m.resumed(sb)
	}
	return sb, err
}

// wake resumes a sandbox if it is (still) paused. Unlike Resume, finding
// it running is no error: concurrent calls that all found it paused all
// get the running sandbox.
func (m *Manager) wake(ctx context.Context, name string) (*core.Sandbox, error) {
	sb, err := m.setPaused(ctx, name, false, "", api.EventResumed)
	if errors.Is(err, errNotPaused) {
		return m.Get(ctx, name)
	}
	if err == nil {
		m.resumed(sb)
	}
	return sb, err
}

var errNotPaused = errors.New("not paused")

// notPaused is the failed-precondition error of resuming a running sandbox.
type notPaused struct{ error }

func (e notPaused) Unwrap() error        { return e.error }
func (e notPaused) Is(target error) bool { return target == errNotPaused }

// setPaused pauses or resumes a sandbox, publishing event under its lock
// once done.
func (m *Manager) setPaused(ctx context.Context, name string, pause bool, reason, event string) (*core.Sandbox, error) {
	sb, unlock, err := m.lockSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	b, err := m.backend(sb.Isolation)
	if err != nil {
		return nil, err
	}
	p, ok := b.(core.Pauser)
	if !ok || !b.Capabilities().Pause {
		return nil, errdefs.Precondition("the %s backend cannot pause sandboxes", sb.Isolation)
	}
	switch {
	case pause && sb.State == core.StatePaused:
		return nil, errdefs.Precondition("sandbox %s is already paused: resume it with `nook resume %s`", name, name)
	case !pause && sb.State == core.StateRunning:
		return nil, notPaused{errdefs.Precondition("sandbox %s is not paused", name)}
	case !pause && sb.State != core.StatePaused:
		return nil, errdefs.Precondition("sandbox %s is %s, not paused", name, sb.State)
	}
	to := core.StateRunning
	if pause {
		to = core.StatePaused
	}
	if err := core.CheckTransition(sb.State, to); err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	// Pause: record first, then freeze; resume: thaw first, then record.
	// A crash in between leaves the two apart, and reconcile aligns the
	// host with the record (neither step was acknowledged).
	cctx := context.WithoutCancel(ctx)
	if pause {
		oldReason := sb.Reason
		sb.State, sb.Reason = core.StatePaused, reason
		if err := m.updateSandbox(cctx, sb); err != nil {
			return nil, err
		}
		// A pause to disk ends the sandbox's processes (a vm's QEMU), and a
		// container's checkpoint must find no connection from the host.
		m.dropAgent(sb.ID)
		if err := p.Pause(cctx, sb.ID); err != nil {
			// A freeze that failed half-way must not leave it frozen.
			if rerr := p.Resume(cctx, sb.ID); rerr != nil {
				m.log.Error("thaw after a failed pause", "sandbox", name, "err", rerr)
			}
			sb.State, sb.Reason = core.StateRunning, oldReason
			if uerr := m.updateSandbox(cctx, sb); uerr != nil {
				m.log.Error("undo pause record", "sandbox", name, "err", uerr)
			}
			return nil, fmt.Errorf("pause sandbox %s: %w", name, err)
		}
		// Frozen in RAM, it still holds its memory; saved to disk, it
		// holds none from now on.
		m.limits.commit(nil, sb.ID, m.holds(sb))
		m.emitTransition(ctx, event, sb)
		return sb, nil
	}
	// A sandbox paused to disk takes its memory again: room first.
	room, err := m.reserveRAM(sb, "resuming")
	if err != nil {
		return nil, err
	}
	defer room.release()
	if err := p.Resume(cctx, sb.ID); err != nil {
		return nil, fmt.Errorf("resume sandbox %s: %w", name, err)
	}
	if lv, ok := b.(core.Liveness); ok {
		lv.Refresh(sb) // a resume from disk started new processes: recorded below
	}
	if sb.Isolation == api.IsolationVM {
		// A vm restored from disk wakes at the time it was paused, on a new
		// agent connection: give it the time (and fresh entropy) again.
		m.dropAgent(sb.ID)
		if err := m.configureAgent(cctx, sb, true); err != nil {
			return nil, fmt.Errorf("resume sandbox %s: %w", name, err)
		}
	}
	// The reason nook paused it for goes with the pause.
	sb.State, sb.Reason = core.StateRunning, ""
	if err := m.commitSandbox(cctx, sb, room); err != nil {
		return sb, err
	}
	m.emitTransition(ctx, event, sb)
	return sb, nil
}

// alignPause makes the host's pause state match the record after a restart.
func (m *Manager) alignPause(ctx context.Context, sb *core.Sandbox) {
	p, ok := m.backends[sb.Isolation].(core.Pauser)
	if !ok {
		return
	}
	paused, err := p.Paused(ctx, sb.ID)
	if err != nil {
		m.log.Warn("read pause state", "sandbox", sb.Name, "err", err)
		return
	}
	switch {
	case sb.State == core.StatePaused && !paused:
		err = p.Pause(ctx, sb.ID)
	case sb.State == core.StateRunning && paused:
		err = p.Resume(ctx, sb.ID)
		if err == nil && sb.Isolation == api.IsolationVM {
			// Woken at the time it was paused: give it the time again.
			m.dropAgent(sb.ID)
			err = m.configureAgent(ctx, sb, true)
		}
	}
	if err != nil {
		m.log.Error("align pause state", "sandbox", sb.Name, "err", err)
	}
}

// SetTTL sets a sandbox's remaining lifetime.
func (m *Manager) SetTTL(ctx context.Context, name, ttl string) (*core.Sandbox, error) {
	if ttl == "" {
		return nil, errdefs.Invalid("ttl is empty: give the new remaining time, e.g. 2h")
	}
	d, err := core.ValidateTTL(ttl)
	if err != nil {
		return nil, err
	}
	sb, unlock, err := m.lockSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb.State == core.StateDestroying {
		return nil, errdefs.Precondition("sandbox %s is being destroyed", name)
	}
	// The cap of the token the sandbox counts against holds too, whoever
	// asks (quotas.go).
	owner, err := m.store.SandboxOwner(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	if d, err = m.capTTL(ctx, d, true, owner); err != nil {
		return nil, err
	}
	sb.ExpiresAt, sb.Expired = time.Now().Add(d), false
	return sb, m.updateSandbox(ctx, sb)
}

// Exec starts a command in a sandbox. The caller reads the Process to its
// FrameExit and closes it; closing early kills the command. A background
// command returns a Process with only its PID set.
func (m *Manager) Exec(ctx context.Context, name string, req api.ExecRequest) (_ *agent.Process, err error) {
	defer m.observe(opExec, time.Now(), &err)
	sb, c, areq, err := m.execRequest(ctx, name, req)
	if err != nil {
		return nil, err
	}
	if req.Background {
		pid, err := c.Start(ctx, areq)
		if err != nil {
			return nil, m.agentError(ctx, sb, err)
		}
		return &agent.Process{PID: pid}, nil
	}
	p, err := c.Exec(ctx, areq)
	if err != nil {
		return nil, m.agentError(ctx, sb, err)
	}
	return p, nil
}

// ExecFollow starts a command in the background and follows it on the
// returned Process, as an attach with input from its first byte would:
// read it to its FrameExit; closing it detaches, and the command runs
// on (Processes, Attach and Signal reach it by its PID).
func (m *Manager) ExecFollow(ctx context.Context, name string, req api.ExecRequest) (_ *agent.Process, err error) {
	defer m.observe(opExec, time.Now(), &err)
	req.Background = true
	sb, c, areq, err := m.execRequest(ctx, name, req)
	if err != nil {
		return nil, err
	}
	areq.Follow = true
	p, err := c.Exec(ctx, areq)
	if err != nil {
		return nil, m.agentError(ctx, sb, err)
	}
	return p, nil
}

// execRequest checks an exec and makes the agent's request of it, with
// the image's USER and WORKDIR unless the call names its own.
func (m *Manager) execRequest(ctx context.Context, name string, req api.ExecRequest) (*core.Sandbox, *agent.Client, *agent.ExecRequest, error) {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return nil, nil, nil, errdefs.Invalid("no command given: pass the command after --, e.g. nook exec NAME -- echo hi")
	}
	if err := core.ValidateEnv(req.Env); err != nil {
		return nil, nil, nil, err
	}
	var timeout time.Duration
	if req.Timeout != "" {
		var err error
		if timeout, err = core.ParseDuration(req.Timeout); err != nil {
			return nil, nil, nil, fmt.Errorf("timeout: %w", err)
		}
	}
	sb, c, err := m.runningAgent(ctx, name)
	if err != nil {
		return nil, nil, nil, err
	}
	areq := &agent.ExecRequest{Argv: req.Cmd, Env: req.Env, Cwd: req.Cwd, User: req.User, TimeoutMS: timeout.Milliseconds(),
		Background: req.Background, Stdin: req.Stdin, TTY: req.TTY, Rows: req.Rows, Cols: req.Cols}
	if cfg := m.imageConfig(sb); cfg != nil {
		if areq.User == "" {
			areq.User = cfg.User
		}
		if areq.Cwd == "" {
			areq.Cwd = cfg.WorkingDir
		}
	}
	// A Passive call's process is no use of the sandbox (idle.go).
	areq.Passive = agent.IsQuiet(ctx)
	return sb, c, areq, nil
}

// runningAgent returns a running sandbox and the client of its agent, or
// an error that says why the sandbox cannot serve requests.
func (m *Manager) runningAgent(ctx context.Context, name string) (*core.Sandbox, *agent.Client, error) {
	sb, err := m.Get(ctx, name)
	if err != nil {
		return nil, nil, err
	}
	// A paused sandbox wakes up for any call that needs it: the caller
	// sees only the latency.
	if sb.State == core.StatePaused {
		if lookOnly(ctx) {
			return nil, nil, errdefs.Precondition("sandbox %s is paused, and a read-only token cannot wake it: resume it with an admin token (`nook resume %s`)", name, name)
		}
		if sb, err = m.wake(ctx, name); err != nil {
			return nil, nil, err
		}
	}
	if sb.State != core.StateRunning {
		msg := fmt.Sprintf("sandbox %s is %s", name, sb.State)
		if sb.Reason != "" {
			msg += " (" + sb.Reason + ")"
		}
		if sb.State == core.StateStopped {
			return nil, nil, errdefs.Precondition("%s: start it with `nook start %s`", msg, name)
		}
		return nil, nil, errdefs.Precondition("%s; remove it with `nook rm %s`", msg, name)
	}
	// A guest reboot's start is under way: its agent is neither up nor
	// configured yet. Wait for the start, then look again.
	if wait := m.reboots.pending(sb.ID); wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		return m.runningAgent(ctx, name)
	}
	c, err := m.agentFor(sb)
	if err != nil {
		return nil, nil, err
	}
	// The call restarts the idle clock; if the reaper is pausing the
	// sandbox for idleness right now, wait for that, then wake it.
	if pausing := m.idle.use(sb.ID); pausing != nil {
		select {
		case <-pausing:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
		return m.runningAgent(ctx, name)
	}
	return sb, c, nil
}

// agentError turns an error from a sandbox's agent into an error category:
// what the agent refused keeps its meaning; an agent that cannot be reached
// makes the manager check whether the sandbox died.
func (m *Manager) agentError(ctx context.Context, sb *core.Sandbox, err error) error {
	var ae *agent.AgentError
	var na *agent.NoAnswerError
	switch {
	case ctx.Err() == nil && errors.As(err, &na):
		// The session stays (a request the agent left unanswered) or is
		// already closed (no answer to pings): nothing to drop.
		if !m.checkHealth(byNook(context.WithoutCancel(ctx)), sb) {
			return m.stoppedError(sb)
		}
		return errdefs.Unavailable("the agent of sandbox %s did not answer within %s: is the sandbox's PID 1 stopped or traced (e.g. by a debugger in the sandbox)? Try again once it runs, or remove the sandbox with `nook rm %s`", sb.Name, na.After, sb.Name)
	case errors.As(err, &ae):
		switch ae.Code {
		case agent.CodeNotFound:
			return errdefs.NotFound("sandbox %s: %s", sb.Name, ae.Message)
		case agent.CodePermissionDenied:
			return errdefs.Denied("sandbox %s: %s", sb.Name, ae.Message)
		case agent.CodeAlreadyExists:
			return errdefs.Exists("sandbox %s: %s", sb.Name, ae.Message)
		case agent.CodeResourceExhausted:
			return errdefs.Exhausted("sandbox %s: %s", sb.Name, ae.Message)
		case agent.CodeInternal:
			return fmt.Errorf("sandbox %s: %s", sb.Name, ae.Message)
		default: // invalid_argument, command_not_found
			return errdefs.Invalid("sandbox %s: %s", sb.Name, ae.Message)
		}
	case ctx.Err() != nil:
		return ctx.Err()
	default:
		m.dropAgent(sb.ID)
		if m.checkHealth(byNook(context.WithoutCancel(ctx)), sb) {
			return errdefs.Unavailable("sandbox %s did not answer: %v; try again", sb.Name, err)
		}
		return m.stoppedError(sb)
	}
}

func (m *Manager) stoppedError(sb *core.Sandbox) error {
	reason := sb.Reason
	if reason == "" {
		reason = "it is no longer running"
	}
	if sb.State == core.StateStopped {
		return errdefs.Precondition("sandbox %s has stopped (%s): start it with `nook start %s`", sb.Name, reason, sb.Name)
	}
	return errdefs.Precondition("sandbox %s has stopped (%s): remove it with `nook rm %s`", sb.Name, reason, sb.Name)
}

// checkHealth compares a running sandbox with the host and marks it failed
// if it is no longer running. It reports whether it is still running.
func (m *Manager) checkHealth(ctx context.Context, sb *core.Sandbox) bool {
	b, ok := m.backends[sb.Isolation]
	if !ok {
		return false
	}
	rs, err := b.Status(ctx, sb)
	if err == nil && sb.State == core.StateStopped {
		return false // recorded stopped: whatever is there, nothing should run
	}
	if err == nil && rs.State == core.RuntimeSaved && sb.State == core.StateRunning {
		// Saved to disk but recorded running: a snapshot or rollback that
		// could not start it again. Recorded paused, the next call wakes it.
		unlock := m.lockName(sb.Name)
		defer unlock()
		if cur, err := m.store.GetSandbox(ctx, sb.Name); err == nil && cur.ID == sb.ID && cur.State == core.StateRunning {
			if rs2, err := b.Status(ctx, cur); err == nil && rs2.State == core.RuntimeSaved {
				cur.State = core.StatePaused
				if err := m.updateSandbox(ctx, cur); err == nil {
					*sb = *cur
					m.dropAgent(sb.ID)
					m.log.Warn("sandbox was saved to disk but recorded running: recorded paused", "sandbox", sb.Name)
					m.emit(ctx, api.EventPaused, cur, "saved to disk by a snapshot or rollback that could not start it again")
				}
			}
		}
		return true
	}
	if err == nil && rs.Restarted {
		m.restarted(ctx, sb)
	}
	if err == nil && rs.State == core.RuntimeSaved && sb.State == core.StatePaused {
		m.restSaved(ctx, b, sb)
		return true
	}
	if err != nil || rs.State == core.RuntimeRunning || rs.State == core.RuntimeSaved {
		return true
	}
	unlock := m.lockName(sb.Name)
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, sb.Name)
	if err != nil || cur.ID != sb.ID || (cur.State != core.StateRunning && cur.State != core.StatePaused) {
		return false
	}
	// Looked at again under the lock: a start (after a guest reboot) may
	// have held it meanwhile, and what was seen before is stale.
	if rs, err = b.Status(ctx, cur); err != nil || rs.State == core.RuntimeRunning || rs.State == core.RuntimeSaved {
		*sb = *cur
		return true
	}
	if rs.State == core.RuntimeStopped && rs.Halt != "" {
		running := m.halted(ctx, cur)
		*sb = *cur
		return running
	}
	if _, err := m.stopper(cur); err == nil && m.hostRestarted && rs.State == core.RuntimeStopped {
		// Its disk is there: it waits for a start, as after a power cut.
		cur.State, cur.Reason = core.StateStopped, "the host restarted"
		m.recordStopped(ctx, cur)
		*sb = *cur
		return false
	}
	cur.State, cur.Reason = core.StateFailed, rs.Detail
	err = m.updateSandbox(ctx, cur)
	*sb = *cur
	m.dropAgent(sb.ID)
	if err != nil {
		// Not recorded: the next health check tries again, and publishes.
		m.log.Error("mark sandbox failed", "sandbox", sb.Name, "err", err)
		return false
	}
	m.log.Warn("sandbox stopped unexpectedly", "sandbox", sb.Name, "reason", rs.Detail)
	m.emit(ctx, api.EventFailed, cur, rs.Detail)
	return false
}

// refreshLiveness records the processes a sandbox Status found running
// runs now, if its record names others (a resume from disk replaced
// them), so that the reaper's next Alive holds.
func (m *Manager) refreshLiveness(ctx context.Context, lv core.Liveness, sb *core.Sandbox) {
	if sb.State != core.StateRunning && sb.State != core.StatePaused {
		return
	}
	if probe := *sb; !lv.Refresh(&probe) {
		return // nothing newer runs (paused to disk), or the record is current
	}
	unlock := m.lockName(sb.Name)
	defer unlock()
	cur, err := m.store.GetSandbox(ctx, sb.Name)
	if err != nil || cur.ID != sb.ID || (cur.State != core.StateRunning && cur.State != core.StatePaused) || lv.Alive(cur) || !lv.Refresh(cur) {
		return
	}
	if err := m.updateSandbox(ctx, cur); err != nil {
		m.log.Warn("record a sandbox's current processes", "sandbox", sb.Name, "err", err)
	}
}

// reconcile makes the database and the host agree after a start: sandboxes
// half created are removed, interrupted destroys finished, running ones
// re-adopted or marked failed, and host resources no record owns removed.
func (m *Manager) reconcile(ctx context.Context) error {
	ctx = byNook(ctx)
	start := time.Now()
	sbs, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, sb := range sbs {
		known[sb.ID] = true
		switch sb.State {
		case core.StateCreating:
			m.log.Info("removing sandbox whose create was interrupted", "sandbox", sb.Name)
			if b, ok := m.backends[sb.Isolation]; ok {
				if err := b.Destroy(ctx, sb.ID); err != nil {
					m.log.Error("remove half-created sandbox", "sandbox", sb.Name, "err", err)
					continue
				}
			}
			if err := m.deleteSandbox(ctx, sb.ID); err != nil {
				return err
			}
		case core.StateDestroying:
			if err := m.destroyLocked(ctx, sb); err != nil {
				m.log.Error("finish interrupted destroy", "sandbox", sb.Name, "err", err)
			}
		case core.StateRunning, core.StatePaused:
			if m.checkHealth(ctx, sb) {
				m.log.Info("re-adopted sandbox", "sandbox", sb.Name, "state", sb.State)
				m.alignPause(ctx, sb)
				if sb.State == core.StateRunning && sb.Isolation == api.IsolationVM && len(sb.Volumes) > 0 {
					m.agentFor(sb) // its guest's volume calls wait for the daemon to serve them again
				}
			}
		case core.StateStopped:
			m.alignStopped(ctx, sb)
		}
	}
	adopted := time.Now()
	for iso, b := range m.backends {
		ids, err := b.List(ctx)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if !known[id] {
				m.log.Info("removing orphaned sandbox resources", "isolation", iso, "id", id)
				if err := b.Destroy(ctx, id); err != nil {
					m.log.Error("remove orphan", "id", id, "err", err)
				}
			}
		}
	}
	// Snapshot files a crash left unrecorded (or half written), and those
	// of snapshots whose records are gone, unless a sandbox uses them.
	orphans := time.Now()
	m.gcSnapshots(ctx)
	m.gcTemplateCaches(ctx, sbs)
	gc := time.Now()
	if m.net != nil {
		// Policies, resolvers and exposed ports come back; networks no
		// record owns go.
		left, err := m.store.ListSandboxes(ctx)
		if err != nil {
			return err
		}
		if err := m.net.reconcile(ctx, left); err != nil {
			m.log.Error("reconcile sandbox networks", "err", err)
		}
	}
	m.log.Info("reconciled the sandboxes with the host", "sandboxes", len(sbs), "duration", time.Since(start),
		"sandboxes_checked", adopted.Sub(start), "orphans_removed", orphans.Sub(adopted), "snapshots_gc", gc.Sub(orphans), "networks", time.Since(gc))
	return nil
}

// forgetTemplate has the backends remove what they made from a build
// the template store removed (no sandbox uses it).
func (m *Manager) forgetTemplate(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, b := range m.backends {
		if tc, ok := b.(core.TemplateCache); ok {
			if err := tc.ForgetTemplate(ctx, id); err != nil {
				m.log.Warn("remove what a backend made of a removed template build", "template", id, "err", err)
			}
		}
	}
}

// gcTemplateCaches removes, at start, what backends keep of template
// builds the store no longer has and no sandbox uses (a build removed
// while the daemon was down, or before the backend was told).
func (m *Manager) gcTemplateCaches(ctx context.Context, sbs []*core.Sandbox) {
	used := map[string]bool{}
	for _, sb := range sbs {
		used[sb.TemplateID] = true
	}
	for _, b := range m.backends {
		tc, ok := b.(core.TemplateCache)
		if !ok {
			continue
		}
		for _, id := range tc.CachedTemplates() {
			if used[id] || m.templates.Exists(id) {
				continue
			}
			if err := tc.ForgetTemplate(ctx, id); err != nil {
				m.log.Warn("remove what a backend made of a removed template build", "template", id, "err", err)
			}
		}
	}
}

// Run reaps expired sandboxes, finishes stuck destroys and notices dead
// sandboxes until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.cfg.ReapInterval)
	defer t.Stop()
	for {
		m.reapOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Manager) reapOnce(ctx context.Context) {
	ctx = byNook(ctx)
	expired, err := m.store.Expired(ctx, time.Now())
	if err != nil {
		m.log.Error("list expired sandboxes", "err", err)
	}
	for _, sb := range expired {
		m.log.Info("sandbox expired", "sandbox", sb.Name, "expired_at", sb.ExpiresAt)
		unlock := m.lockName(sb.Name)
		cur, err := m.store.GetSandbox(ctx, sb.Name)
		if err == nil && cur.ID == sb.ID && !cur.ExpiresAt.After(time.Now()) && !cur.Expired {
			if cur.OnExpire == core.OnExpirePause {
				unlock() // it takes the lock itself
				m.expirePause(ctx, cur)
				continue
			}
			if cur.OnExpire == core.OnExpireStop {
				unlock() // it takes the lock itself
				m.expireStop(ctx, cur)
				continue
			}
			// Published once the destroy is recorded (it is retried as
			// destroying from there), not on each tick a write fails.
			if err := m.beginDestroy(ctx, cur); err != nil {
				m.log.Error("destroy expired sandbox", "sandbox", sb.Name, "err", err)
			} else {
				m.emit(ctx, api.EventExpired, cur, "destroyed")
				if err := m.destroyLocked(ctx, cur); err != nil {
					m.log.Error("destroy expired sandbox", "sandbox", sb.Name, "err", err)
				}
			}
		}
		unlock()
	}
	all, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return
	}
	for _, sb := range all {
		switch sb.State {
		case core.StateStopped:
			if !m.atRest.is(sb) {
				m.alignStopped(ctx, sb)
			}
		case core.StateRunning, core.StatePaused:
			// The fast path: the process the record names runs (a look at
			// /proc), so nothing changed; or the sandbox was found paused to
			// disk and nothing took its lock since. Otherwise the full look
			// (Status), which also brings a record naming a replaced process
			// up to date.
			lv, ok := m.backends[sb.Isolation].(core.Liveness)
			if ok && lv.Alive(sb) || m.atRest.is(sb) {
				continue
			}
			if m.checkHealth(ctx, sb) && ok {
				m.refreshLiveness(ctx, lv, sb)
			}
		case core.StateDestroying:
			unlock := m.lockName(sb.Name)
			if cur, err := m.store.GetSandbox(ctx, sb.Name); err == nil && cur.State == core.StateDestroying {
				if err := m.destroyLocked(ctx, cur); err != nil {
					m.log.Error("retry destroy", "sandbox", sb.Name, "err", err)
				}
			}
			unlock()
		}
	}
	m.pauseIdle(ctx, all)
}

// Info describes the host and the backends.
func (m *Manager) Info(ctx context.Context) api.Info {
	cpus, mem := core.HostSize()
	var uts syscall.Utsname
	syscall.Uname(&uts)
	info := api.Info{
		Version: Version, Kernel: utsRelease(uts), CPUs: cpus, MemoryBytes: mem,
		Accelerator: m.accelerator(), CgroupMode: detectCgroupMode(), DataDir: m.cfg.DataDir,
		ContainerPause: m.pauseMode,
	}
	for _, iso := range []string{api.IsolationContainer, api.IsolationVM} {
		b, ok := m.backends[iso]
		if !ok {
			info.Backends = append(info.Backends, api.Backend{Isolation: iso, Reason: "not implemented in this version of nook"})
			continue
		}
		avail, why, versions := b.Available(ctx)
		info.Backends = append(info.Backends, api.Backend{Isolation: iso, Available: avail, Reason: why, Capabilities: b.Capabilities(), Versions: versions})
		if wp, ok := b.(core.WarmPool); ok {
			info.WarmPools = append(info.WarmPools, wp.WarmPools()...)
		}
	}
	info.Sandboxes, info.CommittedMemoryBytes = m.limits.use()
	info.MaxSandboxes, info.MaxMemoryBytes = m.limits.maxN, m.limits.maxMem
	info.SnapshotsBytes = m.SnapshotsUsage(ctx, "")
	runc := runcbin.Probe(ctx, m.cfg.Runc)
	info.Runc = &runc
	return info
}

// warnRunc logs the known advisories the runc in use lacks the fixes for.
func (m *Manager) warnRunc(ctx context.Context) {
	info := runcbin.Probe(ctx, m.cfg.Runc)
	if info.Error != "" {
		m.log.Warn("could not tell which runc container sandboxes run (nook info shows it)", "path", info.Path, "err", info.Error)
		return
	}
	if ids := runcbin.Affected(info); len(ids) > 0 {
		m.log.Warn("the runc in use has known security advisories against it; make deps builds a fixed one (scripts/runc.sh), or pass --runc",
			"path", info.Path, "version", info.Version, "advisories", strings.Join(ids, ","))
	}
}

func utsRelease(u syscall.Utsname) string {
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

// accelerator reports the vm backend's accelerator and why it was chosen.
func (m *Manager) accelerator() string {
	if vb, ok := m.backends[api.IsolationVM].(*vm.Backend); ok {
		accel, why := vb.Accelerator()
		return fmt.Sprintf("%s (%s)", accel, why)
	}
	accel, why := vm.DetectAccel(m.cfg.Accel)
	return fmt.Sprintf("%s (%s)", accel, why)
}

func detectCgroupMode() string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "v2"
	}
	if _, err := os.Stat("/sys/fs/cgroup/unified"); err == nil {
		return "hybrid"
	}
	return "v1"
}

// Templates lists built templates and what can be built.
func (m *Manager) Templates(ctx context.Context) (api.TemplateList, error) {
	ts, err := m.templates.List()
	if err != nil {
		return api.TemplateList{}, err
	}
	if ts == nil {
		ts = []api.Template{}
	}
	for i := range ts {
		ts[i].InUseBy, _ = m.store.CountByTemplate(ctx, ts[i].ID)
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return api.TemplateList{Templates: ts, Buildable: template.BuildableList()}, nil
}

// DefaultUser is who a sandbox's commands run as when a call names no
// one: its template's user ("" for root).
func (m *Manager) DefaultUser(sb *core.Sandbox) string {
	if cfg := m.imageConfig(sb); cfg != nil {
		return cfg.User
	}
	return ""
}

// imageConfig is the exec defaults of the template build a sandbox was
// made from (an image's config, or a recipe's), or nil (none, or a build
// that is gone).
func (m *Manager) imageConfig(sb *core.Sandbox) *api.ImageConfig {
	if sb.TemplateID == "" {
		return nil
	}
	t, err := m.templates.ByID(sb.TemplateID)
	if err != nil {
		return nil
	}
	return t.Config
}

// BuildOptions say how a template build reports and whose credentials it uses.
type BuildOptions struct {
	Progress io.Writer                 // the build's output lines
	OnLayer  func(api.BuildLayerEvent) // each image layer done (may be nil)
	OnPull   func(api.BuildPullEvent)  // how far an image layer being pulled is (may be nil)
	// HostCredentials lets the pull use the registry credentials of the
	// daemon's host (root's Docker config and credential helpers): for
	// the host's own callers only, never a remote token's.
	HostCredentials bool
}

// BuildTemplateFrom builds a template from what req names: one of nook's
// recipes, or an image (req.From).
func (m *Manager) BuildTemplateFrom(ctx context.Context, req api.BuildTemplateRequest, opt BuildOptions) (api.Template, error) {
	w, onLayer := opt.Progress, opt.OnLayer
	if req.From == "" {
		if req.Pull || req.Start != "" || req.Ready != "" {
			return api.Template{}, errdefs.Invalid("pull, start and ready are for templates from images: pass from (nook template build NAME --from IMAGE)")
		}
		if err := template.CheckBuildable(req.Name); err != nil {
			return api.Template{}, err
		}
		return m.BuildTemplate(ctx, req.Name, w)
	}
	iopt := template.ImageOptions{Pull: req.Pull, OnLayer: onLayer, OnPull: opt.OnPull, Resolve: image.Options{Remote: !opt.HostCredentials}, Start: req.Start, Ready: req.Ready}
	t, err := m.templates.BuildImage(ctx, req.Name, req.From, iopt, w)
	if err != nil {
		return t, err
	}
	m.afterBuild(ctx, req.Name, t)
	return t, nil
}

// BuildTemplate (re)builds a template, writing progress to w.
func (m *Manager) BuildTemplate(ctx context.Context, name string, w io.Writer) (api.Template, error) {
	t, err := m.templates.Build(ctx, name, w)
	if err != nil {
		return t, err
	}
	m.afterBuild(ctx, name, t)
	return t, nil
}

// afterBuild moves the warm pools to a template's new build t and removes
// the builds nothing uses any more.
func (m *Manager) afterBuild(ctx context.Context, name string, t api.Template) {
	m.tplMu.Lock()
	defer m.tplMu.Unlock()
	// Warm sandboxes of the old build would pin it: start over with the new one.
	m.drainPools(ctx, name)
	for _, b := range m.backends {
		if wp, ok := b.(core.WarmPool); ok {
			wp.Prewarm(&core.Sandbox{TemplateID: t.ID})
		}
	}
	if err := m.templates.GC(ctx, name, m.inUse(ctx)); err != nil {
		m.log.Warn("remove unused template builds", "template", name, "err", err)
	}
}

// RemoveTemplate removes a template nothing uses.
func (m *Manager) RemoveTemplate(ctx context.Context, name string) error {
	m.tplMu.Lock()
	defer m.tplMu.Unlock()
	if t, err := m.templates.Get(name); err == nil {
		if n, err := m.store.CountByTemplate(ctx, t.ID); err == nil && n == 0 {
			m.drainPools(ctx, name)
		}
	}
	return m.templates.Remove(ctx, name, m.inUse(ctx))
}

func (m *Manager) drainPools(ctx context.Context, template string) {
	for _, b := range m.backends {
		if wp, ok := b.(core.WarmPool); ok {
			if err := wp.Drain(ctx, template); err != nil {
				m.log.Warn("drain warm pool", "template", template, "err", err)
			}
		}
	}
}

func (m *Manager) inUse(ctx context.Context) func(string) (int, error) {
	return func(id string) (int, error) { return m.store.CountByTemplate(ctx, id) }
}
