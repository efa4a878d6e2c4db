package core

import (
	"fmt"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
)

// State is a sandbox's lifecycle state as the database records it.
type State string

// The states. A sandbox is inserted as creating before any host resource
// exists, so that a daemon killed mid-create finds and removes the
// half-created sandbox on restart; it is marked destroying before its
// resources are released, so that a destroy interrupted by a crash is
// finished on restart.
const (
	StateCreating   State = api.StateCreating
	StateRunning    State = api.StateRunning
	StateDestroying State = api.StateDestroying
	StateFailed     State = api.StateFailed
	StatePaused     State = api.StatePaused
	// StateStopped: powered off (by `nook stop` or the guest), its
	// processes ended and memory freed, its disk kept for a start.
	StateStopped State = api.StateStopped
)

// transitions lists the legal state changes. Later states (paused,
// snapshotting...) are added here and nowhere else.
var transitions = map[State][]State{
	StateCreating:   {StateRunning, StateDestroying, StateFailed},
	StateRunning:    {StateDestroying, StateFailed, StatePaused, StateStopped},
	StatePaused:     {StateRunning, StateDestroying, StateFailed, StateStopped},
	StateStopped:    {StateRunning, StateDestroying, StateFailed},
	StateFailed:     {StateDestroying},
	StateDestroying: {},
}

// CheckTransition returns an ErrFailedPrecondition if a sandbox may not go from one state to another.
func CheckTransition(from, to State) error {
	for _, s := range transitions[from] {
		if s == to {
			return nil
		}
	}
	return errdefs.Precondition("a sandbox that is %s cannot become %s", from, to)
}

// Sandbox is the daemon's record of a sandbox.
type Sandbox struct {
	ID          string
	Name        string
	Template    string // template name
	TemplateID  string // the template build it was created from
	Isolation   string
	State       State
	Reason      string
	CPUs        float64
	MemoryBytes int64
	DiskBytes   int64
	PidsLimit   int64
	Env         map[string]string
	CreatedAt   time.Time
	ExpiresAt   time.Time
	// IdlePause is how long the sandbox may be idle before the daemon
	// pauses it; 0: never.
	IdlePause time.Duration
	// OnExpire is what happens when ExpiresAt passes: OnExpireDestroy,
	// OnExpirePause or OnExpireStop. Expired records that a pause-on-expire sandbox's TTL
	// ran out and it was paused; it no longer expires until a new TTL is set.
	OnExpire string
	Expired  bool
	// Init is what create asked to run as PID 1 (api.InitSystemd,
	// api.InitAgent, or "" for the backend's choice); the backend records
	// what runs (Describe). Not persisted by the daemon.
	Init string
	// BackendState is opaque to everything but the backend that wrote it
	// (e.g. the container's init PID); it is persisted with the sandbox.
	BackendState []byte
	// Volumes are the volumes it mounts, fixed at create (a fork mounts
	// the same).
	Volumes []VolumeMount
	// Labels are the caller's key=value pairs, fixed at create (a fork
	// has its parent's); E2B's metadata.
	Labels map[string]string
	// Creator is the name of the token that created it ("" over the
	// daemon's Unix socket); ParentID the sandbox it was forked from and
	// LineageID the first sandbox of its line of forks ("": its own ID).
	// Its identity tokens carry them.
	Creator, ParentID, LineageID string
	// IdentityAudience: its agent keeps a token for this audience in
	// api.IdentityTokenFile ("": none); a fork has its parent's.
	IdentityAudience string
	// Repo is the repository cloned into it at create (zero: none); a
	// fork has its parent's.
	Repo Repo
}

// Repo is a repository cloned into a sandbox at create, and the commit
// it checked out.
type Repo struct {
	URL    string `json:"url"`
	Branch string `json:"branch,omitempty"`
	Path   string `json:"path"`
	Commit string `json:"commit,omitempty"`
}

// VolumeMount is a volume a sandbox mounts (Name's files), or a
// directory of the host (HostPath, resolved), at Target, read-only or not.
type VolumeMount struct {
	Name     string `json:"name,omitempty"`
	HostPath string `json:"host_path,omitempty"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// API returns the sandbox as the API reports it.
func (sb *Sandbox) API() api.Sandbox {
	v := api.Sandbox{
		ID: sb.ID, Name: sb.Name, Template: sb.Template, Isolation: sb.Isolation,
		State: string(sb.State), Reason: sb.Reason, CPUs: sb.CPUs,
		MemoryBytes: sb.MemoryBytes, DiskBytes: sb.DiskBytes, PidsLimit: sb.PidsLimit,
		Env: sb.Env, CreatedAt: sb.CreatedAt.UTC(), ExpiresAt: sb.ExpiresAt.UTC(),
		OnExpire: sb.OnExpire, Expired: sb.Expired, Init: api.InitAgent, Labels: sb.Labels, IdentityAudience: sb.IdentityAudience,
	}
	if v.OnExpire == "" {
		v.OnExpire = OnExpireDestroy
	}
	if sb.Repo != (Repo{}) {
		v.Repo = &api.Repo{URL: sb.Repo.URL, Branch: sb.Repo.Branch, Path: sb.Repo.Path, Commit: sb.Repo.Commit}
	}
	if sb.IdlePause > 0 {
		v.IdlePause = FormatDuration(sb.IdlePause)
	}
	for _, vm := range sb.Volumes {
		v.Volumes = append(v.Volumes, api.VolumeMount{Name: vm.Name, HostPath: vm.HostPath, Path: vm.Target, ReadOnly: vm.ReadOnly})
	}
	return v
}

func (sb *Sandbox) String() string { return fmt.Sprintf("%s (%s)", sb.Name, sb.ID) }

// Snapshot is the daemon's record of a snapshot of a sandbox.
type Snapshot struct {
	ID        string
	SandboxID string
	Sandbox   string // its sandbox's name, filled in for views
	Name      string // unique within its sandbox
	Parent    string // the snapshot its sandbox descended from when this one was taken
	CreatedAt time.Time
	SizeBytes int64 // the disk its own layers and memory take
	Memory    bool  // it holds the sandbox's memory, not only its disk
}

// API returns the snapshot as the API reports it.
func (s *Snapshot) API() api.Snapshot {
	return api.Snapshot{ID: s.ID, Name: s.Name, Sandbox: s.Sandbox, Parent: s.Parent, CreatedAt: s.CreatedAt.UTC(), SizeBytes: s.SizeBytes, Memory: s.Memory}
}
