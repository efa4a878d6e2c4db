// Package core holds what every part of the nook daemon agrees on: the
// sandbox model and its lifecycle state machine, the Backend interface that
// isolation backends (container, vm) implement, and the validation of
// user input (names, sizes, durations).
package core

import (
	"context"
	"net"
	"os"

	"github.com/nookhq/nook/api"
)

// Backend runs sandboxes of one isolation kind. The daemon's manager owns
// the lifecycle and the database; a backend owns only host resources
// (processes, mounts, cgroups, files under its sandbox directory) and must
// be able to find them again from the sandbox ID alone, because the daemon
// may be killed at any moment and restarted.
//
// Lifecycle, as the manager drives it:
//
//	Create  -> resources allocated and the sandbox started, its agent listening.
//	           On error the backend has already released what it allocated.
//	Status  -> what is really there: running, stopped (resources remain) or absent.
//	DialAgent -> a byte stream to the sandbox's nook-agent; the manager runs
//	           the agent protocol over it. Called again after any failure.
//	Destroy -> every process, mount, cgroup and file of the sandbox is gone.
//	           Keyed by ID alone, so orphans the database lost can be removed.
//	           Idempotent: destroying an absent or half-created sandbox succeeds.
//	List    -> the IDs of every sandbox the backend has resources for, so that
//	           the manager can reap orphans the database does not know.
//
// Optional features (pause, snapshots) are separate small interfaces found
// by type assertion, and are reported in Capabilities.
type Backend interface {
	// Isolation names the kind of sandbox this backend runs: "container" or "vm".
	Isolation() string
	// Available reports whether the backend can run on this host, and if not why,
	// with versions of the tools it uses.
	Available(ctx context.Context) (ok bool, reason string, versions map[string]string)
	// Capabilities says what the backend can do.
	Capabilities() api.Capabilities
	Create(ctx context.Context, sb *Sandbox) error
	Status(ctx context.Context, sb *Sandbox) (RuntimeStatus, error)
	DialAgent(ctx context.Context, sb *Sandbox) (net.Conn, error)
	Destroy(ctx context.Context, id string) error
	List(ctx context.Context) ([]string, error)
}

// RuntimeStatus is what a backend finds on the host for one sandbox.
type RuntimeStatus struct {
	State  RuntimeState
	Detail string // e.g. why it stopped
	// Restarted: the backend started the sandbox's processes afresh while
	// looking (it finished a rollback a crash interrupted); its agent
	// needs its configuration again.
	Restarted bool
	// Halt, for a stopped sandbox, is what its guest asked for, as far as
	// the backend can tell: HaltPoweroff, HaltReboot, HaltStopped (a
	// Stop), or "" (it crashed, or nothing tells).
	Halt string
}

// What stopped a sandbox (RuntimeStatus.Halt).
const (
	HaltStopped  = "stopped"
	HaltPoweroff = "poweroff"
	HaltReboot   = "reboot"
)

// RuntimeState is the host-side state of a sandbox.
type RuntimeState int

// Host-side states.
const (
	RuntimeAbsent  RuntimeState = iota // nothing of the sandbox is on the host
	RuntimeStopped                     // resources remain, but nothing runs
	RuntimeRunning                     // its processes run
	RuntimeSaved                       // paused to disk: nothing runs, everything is kept to resume
)

func (s RuntimeState) String() string {
	switch s {
	case RuntimeRunning:
		return "running"
	case RuntimeStopped:
		return "stopped"
	case RuntimeSaved:
		return "saved"
	default:
		return "absent"
	}
}

// Pauser is an optional Backend feature: stopping a sandbox's processes
// without losing them, and continuing them. Both are idempotent (pausing a
// paused sandbox succeeds), so the manager can bring the host in line with
// the database after a crash. Paused reports the host's view.
type Pauser interface {
	// Pause may end the sandbox's processes (a pause to disk): the caller
	// closes its connections to the agent first.
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	Paused(ctx context.Context, id string) (bool, error)
	// PauseKind says what the pause of paused sandbox id keeps and where,
	// for users, e.g. "frozen: processes stopped, memory kept in RAM".
	PauseKind(id string) string
}

// Liveness is an optional Backend feature: a cheap look, for the reaper's
// every tick, at whether a running (or frozen) sandbox's processes still
// run as its record says, without the locks, files and crash recovery of
// Status. Alive takes no lock and reads no file but /proc: true means the
// process sb.BackendState records (not a later one: a rollback or a
// resume from disk replaces it) runs now; false means only "look closer"
// (Status), never "dead". The daemon's start (reconcile) always uses Status.
type Liveness interface {
	Alive(sb *Sandbox) bool
	// Refresh brings sb.BackendState up to what runs now, after Status
	// found the sandbox running while Alive said false (a resume from
	// disk started new processes the record does not name), and reports
	// whether it changed: the caller records it, so that the next Alive
	// holds again. The caller holds the sandbox's lifecycle lock.
	Refresh(sb *Sandbox) bool
}

// RAMPauser is an optional Pauser feature: whether paused sandbox id
// still holds its memory in the host's RAM (frozen by the cgroup freezer)
// or not (saved to disk). The daemon counts the memory of a paused
// sandbox against `nook serve --max-memory` unless its backend says it is
// not in RAM. It is a cheap look (a stat, no lock).
type RAMPauser interface {
	PausedInRAM(id string) bool
}

// Stopper is an optional Backend feature: a sandbox powered off (its
// processes ended, its memory freed, its disk kept) and on again (started
// afresh on its disk: a vm boots from it), like a machine.
type Stopper interface {
	// Stop ends a running or paused sandbox (a pause's saved memory is
	// dropped). The caller closes its connections to the agent first.
	Stop(ctx context.Context, id string) error
	// Start starts a stopped sandbox again; its agent then needs its
	// configuration.
	Start(ctx context.Context, sb *Sandbox) error
}

// TemplateCache is a backend that keeps what it made from template
// builds (a vm's root image and template snapshots).
type TemplateCache interface {
	// CachedTemplates lists the builds it keeps something of.
	CachedTemplates() []string
	// ForgetTemplate removes what it made from a build no sandbox uses
	// any more (the template store removed it), warm sandboxes included.
	ForgetTemplate(ctx context.Context, templateID string) error
}

// WarmPool is an optional Backend feature: sandboxes started ahead of
// demand, so that a create only has to claim one and give it its identity
// (limits, hostname; the manager then configures it through its agent).
// Warm sandboxes have no database record: after a crash they are orphans,
// and the manager's reconcile removes them.
type WarmPool interface {
	// TakeWarm reserves a warm sandbox for sb (its template build and,
	// where the backend needs it, its shape) and returns its ID; the
	// manager records the sandbox under that ID and calls Create, which
	// claims it. ok is false when none is ready.
	TakeWarm(sb *Sandbox) (id string, ok bool)
	// Prewarm asks for warm sandboxes like sb, in the background.
	Prewarm(sb *Sandbox)
	// Drain destroys the warm sandboxes of every build of a template.
	Drain(ctx context.Context, template string) error
	// Shutdown stops refilling and destroys every warm sandbox.
	Shutdown(ctx context.Context) error
	// WarmPools reports what each key's pool holds and wants.
	WarmPools() []api.WarmPool
}

// Describer is an optional Backend feature: details of how a sandbox runs
// (e.g. a vm's accelerator and guest kernel) added to what the API shows.
type Describer interface {
	Describe(sb *Sandbox, v *api.Sandbox)
}

// InitChooser is an optional Backend feature of backends that can boot
// systemd (Capabilities.SystemdInit): it resolves a create's init
// (api.InitSystemd, api.InitAgent or "") for the sandbox's template, or
// fails with an ErrInvalidArgument saying why the template cannot.
type InitChooser interface {
	ChooseInit(sb *Sandbox, requested string) (string, error)
}

// ChangesExporter is an optional Backend feature of backends whose
// sandboxes keep their changes over their template as a layer (a
// container's overlay upper directory): a template build runs a step in
// a sandbox and keeps what it changed as the next layer. ExportChanges
// ends the sandbox's processes and copies its changes to dst (which must
// not exist) in overlay's format (whiteouts as 0:0 character devices,
// opaque directories marked), owners 0-based; the caller destroys the
// sandbox after.
type ChangesExporter interface {
	ExportChanges(ctx context.Context, id, dst string) error
}

// ConsoleLogger is an optional Backend feature: the end of a sandbox's
// console output, attached to errors when its agent never answers.
type ConsoleLogger interface {
	ConsoleTail(id string) string
}

// Log names: a sandbox's agent's log, and its console (a vm's serial port).
const (
	LogAgent   = "agent"
	LogConsole = "console"
)

// LogOpener is an optional Backend feature: a sandbox's logs, for `nook
// logs`. MainLog is the log that holds what the sandbox's init and agent
// write; OpenLog opens a log (LogAgent or LogConsole) for reading, or
// says, as an errdefs.ErrNotFound error, why the backend has none. The
// sandbox writes its logs: a reader bounds what it reads and trusts none
// of it.
type LogOpener interface {
	MainLog() string
	OpenLog(id, log string) (*os.File, error)
}

// NetHooks is how a backend gives its sandboxes their network, through
// the daemon's network manager. A backend calls them for every sandbox it
// starts, warm ones included (a warm sandbox's ID becomes the sandbox's),
// and Detach from Destroy; all three are idempotent. A nil NetHooks
// leaves sandboxes with loopback only.
type NetHooks interface {
	// AttachNetns gives a started container, whose network namespace is
	// at netnsPath (e.g. /proc/PID/ns/net), its interface and address.
	AttachNetns(ctx context.Context, id, netnsPath string) error
	// AttachTap makes the tap device a vm's QEMU is given (the backend
	// opens it by name in the daemon's namespace), before QEMU starts.
	AttachTap(ctx context.Context, id string) (tap string, err error)
	// Detach removes every network resource of the sandbox.
	Detach(ctx context.Context, id string) error
}

// Snapshotter is an optional Backend feature: saving a sandbox (its disk,
// and its memory where the backend can) as a snapshot while it goes on,
// going back to a snapshot, and starting new sandboxes from one. Disk
// layers are shared copy-on-write chains. Every step is crash-safe: a
// daemon killed midway leaves the old state or the new one.
type Snapshotter interface {
	// Snapshot saves sandbox sb as snapshot snapID: a running sandbox goes
	// on running, a paused one stays paused.
	Snapshot(ctx context.Context, sb *Sandbox, snapID string, opts SnapshotOptions) (SnapshotInfo, error)
	// Rollback puts sandbox sb back to snapshot snapID, running; it may
	// update sb.BackendState.
	Rollback(ctx context.Context, sb *Sandbox, snapID string) error
	// Fork creates sandbox sb (ID and limits set) from snapshot snapID, running.
	Fork(ctx context.Context, sb *Sandbox, snapID string) error
	// GC removes the files of snapshots not in keep that nothing uses.
	GC(ctx context.Context, keep []string) error
	// SnapshotUsage is the disk a snapshot's own files take.
	SnapshotUsage(snapID string) int64
}

// SnapshotReferrer is a Snapshotter that tells whether a sandbox's own
// files refer to snapshot files (its disk sits on a snapshot's layers,
// or its last snapshot is kept for the next to share), so that the
// destroy of one that does not frees none and needs no GC: a GC reads
// every sandbox's files, which made each rm cost more with every
// sandbox alive. Asked before the sandbox is destroyed; unsure (a file
// it cannot read), it answers true.
type SnapshotReferrer interface {
	RefersToSnapshots(id string) bool
}

// SnapshotOptions is what the caller of Snapshot offers the backend.
type SnapshotOptions struct {
	// Quiesce closes the host's connections to the sandbox's agent and
	// holds new ones until release. A backend whose memory snapshot cannot
	// save a connection from the host (a container's CRIU dump) calls it
	// first; ok false means requests are in flight, and the backend then
	// takes the disk only rather than cut them off. nil: nothing of the
	// host's is connected.
	Quiesce func() (release func(), ok bool)
}

// SnapshotInfo is what a backend says of a snapshot it took.
type SnapshotInfo struct {
	Memory    bool  // the snapshot has the sandbox's memory (its processes go on after a rollback)
	SizeBytes int64 // its own disk use
	// Restarted: the sandbox's processes go on in a new process of the
	// backend (a vm's QEMU started again from the snapshot), so the agent
	// session is new. Otherwise the snapshot only stopped them a moment.
	Restarted bool
}
