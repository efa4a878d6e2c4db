// Package api holds nook's REST API: the wire types shared by the daemon
// and the Go SDK, the exec stream framing, and the OpenAPI 3 spec
// (openapi.yaml) that documents both. It has no dependencies beyond the
// standard library so that SDK users pull in nothing of the server.
package api

import (
	_ "embed"
	"time"
)

// OpenAPISpec is the checked-in OpenAPI 3 description of this API, served at /v1/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPISpec []byte

// Isolation kinds.
const (
	IsolationContainer = "container"
	IsolationVM        = "vm"
)

// Sandbox states.
const (
	StateCreating   = "creating"
	StateRunning    = "running"
	StateDestroying = "destroying"
	StateFailed     = "failed"
	StatePaused     = "paused"
	StateStopped    = "stopped"
)

// Sandbox is a sandbox as the API reports it.
type Sandbox struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Template  string `json:"template"`
	Isolation string `json:"isolation"`
	State     string `json:"state"`
	Reason    string `json:"reason,omitempty"`     // why a sandbox is failed
	PauseKind string `json:"pause_kind,omitempty"` // how a paused sandbox is paused, e.g. "frozen"
	// RebootedAt is when its guest last rebooted (and the daemon started
	// it again), as far as this daemon has seen; absent otherwise.
	RebootedAt *time.Time `json:"rebooted_at,omitempty"`
	// vm sandboxes: the accelerator (kvm or tcg), how the sandbox started
	// (snapshot: restored from its template's snapshot; cold: booted) and
	// the guest kernel's release.
	Accelerator string `json:"accelerator,omitempty"`
	Boot        string `json:"boot,omitempty"`
	GuestKernel string `json:"guest_kernel,omitempty"`
	// GuestKernelFrom says whose kernel it is: "nook" (the daemon's) or
	// "template" (the template's own).
	GuestKernelFrom string `json:"guest_kernel_from,omitempty"`
	// Init is what runs as the sandbox's PID 1: "systemd" or "agent".
	Init string `json:"init,omitempty"`
	// SnapshotsBytes is the disk the sandbox's snapshots really use (their
	// own layers and memory, not what they share).
	SnapshotsBytes int64             `json:"snapshots_bytes,omitempty"`
	CPUs           float64           `json:"cpus"`
	MemoryBytes    int64             `json:"memory_bytes"`
	DiskBytes      int64             `json:"disk_bytes,omitempty"` // 0: not limited
	PidsLimit      int64             `json:"pids_limit"`
	Env            map[string]string `json:"env,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	// IdentityAudience is the audience of the token its agent keeps in
	// IdentityTokenFile; absent: none.
	IdentityAudience string    `json:"identity_audience,omitempty"`
	CreatedAt        time.Time `json:"created_at"`
	ExpiresAt        time.Time `json:"expires_at"`
	// IdlePause is how long the sandbox may be idle before it pauses
	// itself (e.g. "10m"); absent: never.
	IdlePause string `json:"idle_pause,omitempty"`
	// OnExpire is what the TTL does when it runs out: destroy or pause.
	OnExpire string `json:"on_expire"`
	// Expired: the TTL of an on_expire=pause sandbox ran out and it was
	// paused; it does not expire again until a new TTL is set.
	Expired bool `json:"expired,omitempty"`
	// Network is the sandbox's network and egress policy; absent when the
	// daemon runs without networking (loopback only).
	Network *Network `json:"network,omitempty"`
	// Volumes are the volumes it mounts.
	Volumes []VolumeMount `json:"volumes,omitempty"`
	// Secrets are its secret bindings (never a value: the placeholder
	// its environment variable of the secret's name holds).
	Secrets []SecretBinding `json:"secrets,omitempty"`
	// Repo is the repository cloned into it at create.
	Repo *Repo `json:"repo,omitempty"`
}

// SecretBinding is a secret bound to a sandbox: Binding is the
// NAME@HOST[,HOST...][:option...] it was bound with.
type SecretBinding struct {
	Secret      string `json:"secret"`
	Binding     string `json:"binding"`
	Placeholder string `json:"placeholder"`
}

// Repo is a repository cloned into a sandbox at create.
type Repo struct {
	URL    string `json:"url"`
	Branch string `json:"branch,omitempty"`
	Path   string `json:"path"`
	Commit string `json:"commit,omitempty"`
}

// Secret is a secret as the API shows it: never its value.
type Secret struct {
	Name      string    `json:"name"`
	Owner     string    `json:"owner"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SecretList is the answer of GET /v1/secrets.
type SecretList struct {
	Secrets []Secret `json:"secrets"`
}

// SecretCAFile and SecretCABundle are where a sandbox with secrets
// finds its CA, and a bundle of the system's roots and it (the
// variables in SecretCAEnv name the bundle).
const (
	SecretCAFile   = "/etc/nook/secrets-ca.crt"
	SecretCABundle = "/etc/nook/ca-bundle.crt"
)

// SecretCAEnv are the variables set to SecretCABundle in a sandbox with
// secrets, for the tools that read their own.
var SecretCAEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "PIP_CERT", "CURL_CA_BUNDLE"}

// VolumeMount is a volume (Name), or a directory of the host (HostPath,
// --mount), that a sandbox mounts at Path.
type VolumeMount struct {
	Name     string `json:"name,omitempty"`
	HostPath string `json:"host_path,omitempty"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// Volume is a volume: data that outlives sandboxes, mounted by several at once.
type Volume struct {
	Name      string    `json:"name"`
	SizeBytes int64     `json:"size_bytes"`
	UsedBytes int64     `json:"used_bytes"`
	CreatedAt time.Time `json:"created_at"`
	// MountedBy names the sandboxes that mount it.
	MountedBy []string `json:"mounted_by,omitempty"`
}

// CreateVolumeRequest is the body of POST /v1/volumes; Size is a size
// such as "10G" (default 10G, at least 64M).
type CreateVolumeRequest struct {
	Name string `json:"name"`
	Size string `json:"size,omitempty"`
}

// VolumeList is the answer of GET /v1/volumes.
type VolumeList struct {
	Volumes []Volume `json:"volumes"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes. Sizes are strings
// such as "2G" or "512M"; TTL is a duration such as "90m", "2h", "3d" or "2w".
type CreateSandboxRequest struct {
	Name      string            `json:"name,omitempty"`
	Template  string            `json:"template,omitempty"`
	Isolation string            `json:"isolation,omitempty"`
	CPUs      float64           `json:"cpus,omitempty"`
	Memory    string            `json:"memory,omitempty"`
	Disk      string            `json:"disk,omitempty"`
	TTL       string            `json:"ttl,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	// Labels are key=value pairs kept with the sandbox (E2B's metadata):
	// at most 64, keys of at most 128 bytes, values of at most 1024.
	Labels map[string]string `json:"labels,omitempty"`
	// IdentityAudience has the sandbox's agent keep an identity token for
	// this audience fresh in the file IdentityTokenFile (its path is in
	// NOOK_IDENTITY_TOKEN_FILE), for credential providers that read a
	// token file (AWS_WEB_IDENTITY_TOKEN_FILE, GCP's and Azure's
	// workload identity federation). Needs sandbox networking.
	IdentityAudience string `json:"identity_audience,omitempty"`
	// IdlePause pauses the sandbox after this long without activity, e.g.
	// "10m"; "off" (or "0") never; empty: the daemon's default.
	IdlePause string `json:"idle_pause,omitempty"`
	// OnExpire is what the TTL does when it runs out: "destroy" (the
	// default) or "pause".
	OnExpire string `json:"on_expire,omitempty"`
	// Net is the network mode: "allowlist" (the default: only what Allow
	// names) or "none" (nothing leaves the sandbox).
	Net string `json:"net,omitempty"`
	// Allow and Deny are egress rules (see Network); deny wins.
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
	// Init is the sandbox's PID 1: "systemd" (vm sandboxes whose template
	// has systemd: services, timers and journald run as on any server) or
	// "agent" (nook-agent itself: the fastest start). Empty: systemd
	// where the template has it and the backend can run it, else agent.
	Init string `json:"init,omitempty"`
	// Volumes to mount, each "NAME:/path" or "NAME:/path:ro" (container
	// sandboxes).
	Volumes []string `json:"volumes,omitempty"`
	// Mounts are directories of the host to mount, each "/host/dir:/path"
	// or "/host/dir:/path:ro", under a directory the daemon allows
	// (nook serve --allow-host-mounts).
	Mounts []string `json:"mounts,omitempty"`
	// Secrets bind secrets to hosts, each
	// NAME@HOST[,HOST...][:header=H][:format='Bearer {}'][:path=/p][:methods=GET,POST][:query][:body][:inherit]:
	// the sandbox sees a placeholder in the variable NAME, which nook
	// replaces by the value only in requests to those hosts (over TLS,
	// which it terminates with a CA the sandbox trusts).
	Secrets []string `json:"secrets,omitempty"`
	// Repo is a git repository to clone into the sandbox at create (after
	// its network and secrets are in place), Branch its branch (default:
	// the remote's HEAD) and RepoPath where (default /workspace). A
	// secret bound to the repository's host is its credential.
	Repo     string `json:"repo,omitempty"`
	Branch   string `json:"branch,omitempty"`
	RepoPath string `json:"repo_path,omitempty"`
	// SSHKeys are SSH public keys (authorized_keys lines) that may log in
	// to the sandbox through nook's SSH endpoint.
	SSHKeys []string `json:"ssh_keys,omitempty"`
}

// Inits: what runs as a sandbox's PID 1.
const (
	InitAgent   = "agent"
	InitSystemd = "systemd"
)

// SetTTLRequest is the body of PUT /v1/sandboxes/{name}/ttl: the new remaining lifetime.
type SetTTLRequest struct {
	TTL string `json:"ttl"`
}

// ExecRequest is the body of POST /v1/sandboxes/{name}/exec.
type ExecRequest struct {
	Cmd     []string          `json:"cmd"`
	Env     map[string]string `json:"env,omitempty"`
	Cwd     string            `json:"cwd,omitempty"`
	User    string            `json:"user,omitempty"`
	Timeout string            `json:"timeout,omitempty"` // e.g. "30s"; empty: no timeout
	// Background starts the command detached: the answer is its PID, it
	// survives the client, and its output is kept (the last 1 MiB) for
	// GET .../processes/{pid}/output and attach.
	Background bool `json:"background,omitempty"`
	// Stdin keeps the command's stdin open for input frames (WebSocket only).
	Stdin bool `json:"stdin,omitempty"`
	// TTY runs the command on a terminal of Rows x Cols (WebSocket, or with Background).
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
}

// StartedProcess answers an exec with background set.
type StartedProcess struct {
	PID int `json:"pid"`
}

// Process is a command started through nook in a sandbox.
type Process struct {
	PID        int         `json:"pid"`
	Cmd        []string    `json:"cmd"`
	TTY        bool        `json:"tty,omitempty"`
	Running    bool        `json:"running"`
	StartedAt  time.Time   `json:"started_at"`
	Exit       *ExitStatus `json:"exit,omitempty"`
	OutputFrom int64       `json:"output_from"` // oldest output offset still kept
	OutputTo   int64       `json:"output_to"`   // bytes of output so far
}

// SignalRequest is the body of POST /v1/sandboxes/{name}/processes/{pid}/signal.
type SignalRequest struct {
	Signal string `json:"signal"` // e.g. TERM, KILL, INT, or a number
}

// ExitStatus is the payload of the final FrameExit of an exec stream.
type ExitStatus struct {
	ExitCode int    `json:"exit_code"`        // -1 when killed by a signal
	Signal   string `json:"signal,omitempty"` // e.g. "KILL"
	TimedOut bool   `json:"timed_out,omitempty"`
}

// Template is a built root filesystem sandboxes start from.
type Template struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	SizeBytes int64     `json:"size_bytes"`
	Packages  []string  `json:"packages,omitempty"`
	Hooks     []string  `json:"hooks,omitempty"` // a recipe's commands run on the root it made
	InUseBy   int       `json:"in_use_by"`       // sandboxes using it
	// Source is what the build came from: "recipe" (nook's own, built
	// with mmdebstrap), "image" or "dockerfile" (Image is then the
	// Dockerfile's path in its context).
	Source string `json:"source,omitempty"`
	// Image is the image reference it was built from, as given; Digest
	// the manifest digest that reference named at build time, and
	// Canonical the reference a rebuild without pull uses (REPO@DIGEST
	// for a registry image).
	Image     string `json:"image,omitempty"`
	Digest    string `json:"digest,omitempty"`
	Canonical string `json:"canonical,omitempty"`
	Platform  string `json:"platform,omitempty"`
	// Layers are the image's layers, bottom first.
	Layers []TemplateLayer `json:"layers,omitempty"`
	// Config is the image's runtime config: exec defaults for its sandboxes.
	Config *ImageConfig `json:"config,omitempty"`
	// Service is what every sandbox of the template starts once it is up
	// (on create and on start): the image's ENTRYPOINT and CMD, or the
	// build's start command; absent: nothing.
	Service *TemplateService `json:"service,omitempty"`
}

// TemplateService is the service a template's sandboxes start.
type TemplateService struct {
	Cmd []string `json:"cmd"`
	// Ready is what a create waits for once the service started:
	// port:N (something listens on TCP port N in the sandbox),
	// file:PATH (PATH exists) or cmd:CMD (sh -c CMD exits 0); absent: nothing.
	Ready string `json:"ready,omitempty"`
}

// TemplateLayer is one layer of an image template.
type TemplateLayer struct {
	Digest string `json:"digest"`  // of the blob as the image stores it
	DiffID string `json:"diff_id"` // of the uncompressed tar
	Size   int64  `json:"size"`    // of the blob
}

// ImageConfig is what an image says about running it. Env, WorkingDir
// and User are the defaults of every exec in its sandboxes (an exec's
// own env, cwd and user win; a sandbox's --env wins over the image's).
type ImageConfig struct {
	Env          []string          `json:"env,omitempty"`
	WorkingDir   string            `json:"working_dir,omitempty"`
	User         string            `json:"user,omitempty"`
	Entrypoint   []string          `json:"entrypoint,omitempty"`
	Cmd          []string          `json:"cmd,omitempty"`
	ExposedPorts []string          `json:"exposed_ports,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
}

// BuildTemplateRequest is the body of POST /v1/templates. Without From
// it builds one of nook's recipes (base, dev); with it, a template from
// an image.
type BuildTemplateRequest struct {
	Name string `json:"name"`
	// From is an image: a registry reference (python:3.12-slim,
	// ghcr.io/org/img@sha256:...), oci:DIR[:TAG] (an OCI layout) or
	// docker-archive:FILE[:REPO:TAG] (docker save output), read on the
	// daemon's host.
	From string `json:"from,omitempty"`
	// Pull resolves a tag again; without it a rebuild from the same
	// reference uses the digest the template recorded.
	Pull bool `json:"pull,omitempty"`
	// Start is the service every sandbox of the template starts, a shell
	// command (sh -c) run as the image's user in its working directory
	// with its environment; default the image's ENTRYPOINT and CMD;
	// "none": nothing.
	Start string `json:"start,omitempty"`
	// Ready is what a create waits for once the service started (see
	// TemplateService.Ready), at most ReadyTimeout.
	Ready string `json:"ready,omitempty"`
}

// DockerfileBuild is a Dockerfile build of POST
// /v1/templates/{name}/dockerfile, whose body is the build context as a
// tar; these go in its query (build_arg and allow repeated).
type DockerfileBuild struct {
	// Dockerfile is its path in the context (default Dockerfile).
	Dockerfile string `json:"dockerfile,omitempty"`
	// Target is the stage to build (default the last).
	Target string `json:"target,omitempty"`
	// BuildArgs are the build's ARG values.
	BuildArgs map[string]string `json:"build_args,omitempty"`
	// Allow is the network policy of its RUN steps (default @registries).
	Allow []string `json:"allow,omitempty"`
	// Start and Ready: as in BuildTemplateRequest.
	Start string `json:"start,omitempty"`
	Ready string `json:"ready,omitempty"`
}

// SecretsDir is where a Dockerfile build's context tar carries the
// build's secrets, one file per id (RUN --mount=type=secret,id=ID): the
// daemon takes them out of the context before the build reads it, and
// no layer keeps them.
const SecretsDir = ".nook-secrets"

// CreateEvent is one line of the NDJSON stream POST
// /v1/sandboxes?progress=ndjson answers with: progress lines (a template
// built on the way, a repository cloned), then exactly one of Sandbox
// (created) or Error.
type CreateEvent struct {
	Progress string   `json:"progress,omitempty"`
	Sandbox  *Sandbox `json:"sandbox,omitempty"`
	Error    *Error   `json:"error,omitempty"`
}

// BuildEvent is one line of the NDJSON stream POST /v1/templates
// answers with: progress, then exactly one of Template (done) or Error.
type BuildEvent struct {
	// Progress is a line of the build's output.
	Progress string `json:"progress,omitempty"`
	// Layer reports a layer done: its digest, its size, and whether it
	// was already in the layer store (Cached).
	Layer *BuildLayerEvent `json:"layer,omitempty"`
	// Pulling reports a layer being pulled: how many of its bytes have
	// come (about 4 times a second while they come).
	Pulling *BuildPullEvent `json:"pulling,omitempty"`
	// Template is the build, when it succeeded.
	Template *Template `json:"template,omitempty"`
	Error    *Error    `json:"error,omitempty"`
}

// BuildLayerEvent reports one layer of an image build.
type BuildLayerEvent struct {
	Index   int     `json:"index"` // from 0, bottom first
	Count   int     `json:"count"`
	Digest  string  `json:"digest"`
	Size    int64   `json:"size"`
	Cached  bool    `json:"cached"`
	Seconds float64 `json:"seconds"`
}

// BuildPullEvent reports a layer of an image build on its way.
type BuildPullEvent struct {
	Index    int    `json:"index"` // from 0, bottom first
	Count    int    `json:"count"`
	Digest   string `json:"digest"`
	Size     int64  `json:"size"`
	Received int64  `json:"received"` // bytes of it so far
}

// TemplateRecipe is a template nook knows how to build.
type TemplateRecipe struct {
	Name        string `json:"name"`
	Description string `json:"description"`
}

// TemplateList is the body of GET /v1/templates.
type TemplateList struct {
	Templates []Template       `json:"templates"`
	Buildable []TemplateRecipe `json:"buildable"`
}

// Token is an API token. Secret is only ever returned once, by POST /v1/tokens.
type Token struct {
	ID     string `json:"id"`
	Name   string `json:"name,omitempty"`
	Secret string `json:"secret,omitempty"`
	// Scope is what the token may do: "admin" (everything but token
	// management, which is the host's), "read-only" (look, never
	// change) or "sandbox:NAME" (only that sandbox).
	Scope     string    `json:"scope"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is when the token stops working; absent: never.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// Quotas are the token's limits (absent: none); Usage is what counts
	// against them now (token listings only).
	Quotas *TokenQuotas `json:"quotas,omitempty"`
	Usage  *TokenUsage  `json:"usage,omitempty"`
}

// TokenQuotas limit what the sandboxes a token made may hold together (a
// zero or absent field: no limit). A create, fork or snapshot beyond one
// is refused with 429 (limit_reached), saying what is used and allowed.
type TokenQuotas struct {
	MaxSandboxes int     `json:"max_sandboxes,omitempty"`
	MaxCPUs      float64 `json:"max_cpus,omitempty"`
	// MaxMemory and MaxDisk are sizes such as 8G.
	MaxMemory    string `json:"max_memory,omitempty"`
	MaxDisk      string `json:"max_disk,omitempty"`
	MaxSnapshots int    `json:"max_snapshots,omitempty"`
	// MaxTTL (e.g. 2h) caps the TTL of the token's sandboxes, whoever
	// sets it, and of any sandbox the token sets one on: a longer one is
	// refused, and a create or fork without one gets at most this. It caps
	// each TTL (the time left), not the lifetime since creation.
	MaxTTL string `json:"max_ttl,omitempty"`
}

// TokenUsage is what counts against a token's quotas: the sandboxes it
// created or forked that exist (any state), their sizes and snapshots.
type TokenUsage struct {
	Sandboxes   int     `json:"sandboxes"`
	CPUs        float64 `json:"cpus"`
	MemoryBytes int64   `json:"memory_bytes"`
	DiskBytes   int64   `json:"disk_bytes"`
	Snapshots   int     `json:"snapshots"`
}

// IdempotencyKeyHeader names the header that makes a create, fork or
// snapshot idempotent: a retry with the same key (1-255 printable ASCII
// characters, kept 24h per token) and the same body gets the first
// request's answer (IdempotentReplayedHeader: true) instead of a second
// sandbox; the same key with another request is refused (409).
const (
	IdempotencyKeyHeader     = "Idempotency-Key"
	IdempotentReplayedHeader = "Idempotent-Replayed"
)

// CreateTokenRequest is the body of POST /v1/tokens.
type CreateTokenRequest struct {
	Name string `json:"name,omitempty"`
	// Scope: admin (default), read-only or sandbox:NAME.
	Scope string `json:"scope,omitempty"`
	// TTL is how long the token works, e.g. 12h, 30d (default 30d), or
	// "never".
	TTL string `json:"ttl,omitempty"`
	// E2B makes the secret an E2B API key (e2b_ and 64 hex digits), which
	// E2B's SDKs accept unchanged (nook serve --e2b-listen); it works on
	// nook's own API too.
	E2B bool `json:"e2b,omitempty"`
	// Quotas limit the sandboxes the token makes (absent: none).
	Quotas *TokenQuotas `json:"quotas,omitempty"`
}

// Token scopes.
const (
	ScopeAdmin    = "admin"
	ScopeReadOnly = "read-only"
	// ScopeSandboxPrefix starts a one-sandbox scope: "sandbox:NAME".
	ScopeSandboxPrefix = "sandbox:"
)

// Backend describes one isolation backend on this host.
type Backend struct {
	Isolation    string            `json:"isolation"`
	Available    bool              `json:"available"`
	Reason       string            `json:"reason,omitempty"` // why it is not available
	Capabilities Capabilities      `json:"capabilities"`
	Versions     map[string]string `json:"versions,omitempty"`
}

// Capabilities says what a backend can do; a request for something it cannot do is refused.
type Capabilities struct {
	CPULimit    bool `json:"cpu_limit"`
	MemoryLimit bool `json:"memory_limit"`
	DiskLimit   bool `json:"disk_limit"`
	PidsLimit   bool `json:"pids_limit"`
	Pause       bool `json:"pause"`
	Snapshot    bool `json:"snapshot"`
	OwnKernel   bool `json:"own_kernel"`
	// Stop: sandboxes can be stopped (no process, no memory, the disk
	// kept) and started again.
	Stop bool `json:"stop"`
	// SystemdInit: sandboxes can boot systemd as PID 1 (create's init).
	SystemdInit bool `json:"systemd_init"`
	// DefaultDiskBytes is a sandbox's disk when create names none (0:
	// the backend's own default, or not limited); MinDiskBytes the
	// smallest it accepts (0: no minimum of its own).
	DefaultDiskBytes int64 `json:"default_disk_bytes,omitempty"`
	MinDiskBytes     int64 `json:"min_disk_bytes,omitempty"`
}

// Info is the body of GET /v1/info.
type Info struct {
	Version     string `json:"version"`
	Kernel      string `json:"kernel"`
	CPUs        int    `json:"cpus"`
	MemoryBytes int64  `json:"memory_bytes"`
	Accelerator string `json:"accelerator"` // kvm, pvm (not usable with stock kernels) or tcg
	CgroupMode  string `json:"cgroup_mode"` // v1, hybrid or v2
	// ContainerPause is what pausing a container does: checkpoint (to
	// disk, with CRIU) or freeze (in RAM), and why.
	ContainerPause string    `json:"container_pause"`
	DataDir        string    `json:"data_dir"`
	Backends       []Backend `json:"backends"`
	Sandboxes      int       `json:"sandboxes"`
	// MaxSandboxes is how many sandboxes may exist (nook serve
	// --max-sandboxes); 0: no limit.
	MaxSandboxes int `json:"max_sandboxes"`
	// CommittedMemoryBytes is the memory of the sandboxes that hold RAM
	// (running, or paused in RAM), what --max-memory limits.
	CommittedMemoryBytes int64 `json:"committed_memory_bytes"`
	// MaxMemoryBytes is the most memory sandboxes may hold (nook serve
	// --max-memory); 0: no limit.
	MaxMemoryBytes int64 `json:"max_memory_bytes"`
	// SnapshotsBytes is the disk every snapshot really uses.
	SnapshotsBytes int64 `json:"snapshots_bytes"`
	// TLSFingerprint is the TCP listener's certificate's SHA-256
	// fingerprint ("sha256:" and hex), for clients to pin.
	TLSFingerprint string `json:"tls_fingerprint,omitempty"`
	// Runc is the runc the container backend runs, and the known security
	// advisories against it.
	Runc *RuncInfo `json:"runc,omitempty"`
	// WarmPools is what the warm pools hold, per backend and key.
	WarmPools []WarmPool `json:"warm_pools,omitempty"`
	// SSH is the SSH endpoint (nook serve --ssh-listen), if it runs.
	SSH *SSHInfo `json:"ssh,omitempty"`
	// Preview is the preview URL endpoint (--preview-listen), if it runs.
	Preview *PreviewInfo `json:"preview,omitempty"`
}

// WarmPool is what a backend's warm pool holds for one key: a template
// build (for vms, with the machine shape and init). Its target follows
// the creates of the last minute, between the daemon's --warm-pool and
// max; hits and misses count the creates since the daemon started that
// found a warm sandbox, or none.
type WarmPool struct {
	Isolation string `json:"isolation"`
	Key       string `json:"key"`
	Ready     int    `json:"ready"`
	Starting  int    `json:"starting"`
	Stopping  int    `json:"stopping"` // ready ones above a fallen target, being destroyed
	Target    int    `json:"target"`
	Min       int    `json:"min"`
	Max       int    `json:"max"`
	Hits      int64  `json:"hits"`
	Misses    int64  `json:"misses"`
}

// RuncInfo describes a runc binary: what `runc --version` says, and each
// known security advisory with whether this runc has its fix.
type RuncInfo struct {
	Path       string `json:"path"`
	Version    string `json:"version,omitempty"`
	Commit     string `json:"commit,omitempty"`
	Spec       string `json:"spec,omitempty"`
	Libseccomp string `json:"libseccomp,omitempty"`
	// Error says why the version could not be read (then every advisory's
	// status is unknown).
	Error      string         `json:"error,omitempty"`
	Advisories []RuncAdvisory `json:"advisories"`
}

// Statuses of a RuncAdvisory.
const (
	AdvisoryAffected = "affected" // this runc lacks the fix
	AdvisoryFixed    = "fixed"    // its version has the fix, or its distribution's changelog names the CVE
	AdvisoryUnknown  = "unknown"  // its version could not be read
)

// RuncAdvisory is one known security advisory against runc.
type RuncAdvisory struct {
	ID       string   `json:"id"`   // CVE ID
	GHSA     string   `json:"ghsa"` // GitHub advisory ID (github.com/opencontainers/runc/security/advisories/...)
	Severity string   `json:"severity"`
	Summary  string   `json:"summary"`
	FixedIn  []string `json:"fixed_in"` // the first fixed release of each maintained minor line
	Status   string   `json:"status"`   // affected, fixed or unknown
	// Why says how the status was decided (e.g. "Debian's changelog for
	// 1.1.5+ds1-1+deb12u2 names it").
	Why string `json:"why,omitempty"`
}

// Error codes. They are stable: clients may switch on them.
const (
	CodeInvalidArgument    = "invalid_argument"
	CodeNotFound           = "not_found"
	CodeAlreadyExists      = "already_exists"
	CodeFailedPrecondition = "failed_precondition"
	CodeResourceExhausted  = "resource_exhausted"
	CodeLimitReached       = "limit_reached" // 429: a limit of the host's operator (nook serve --max-sandboxes, --max-memory)
	CodeUnavailable        = "unavailable"
	CodeUnauthorized       = "unauthorized"
	CodePermissionDenied   = "permission_denied"
	CodeInternal           = "internal"
)

// Error is the body of every non-2xx response: {"error": {...}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ErrorBody wraps Error as it appears on the wire.
type ErrorBody struct {
	Error Error `json:"error"`
}

// File types in a FileInfo.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other" // fifo, socket or device
)

// FileInfo describes a file in a sandbox. A symlink is described itself
// (with its target), not the file it points to.
type FileInfo struct {
	Path       string    `json:"path"`
	Name       string    `json:"name"`
	Type       string    `json:"type"` // file, dir, symlink or other
	Size       int64     `json:"size"`
	Mode       string    `json:"mode"` // permission bits in octal, e.g. "0644" or "4755"
	ModTime    time.Time `json:"mod_time"`
	UID        int       `json:"uid"`
	GID        int       `json:"gid"`
	LinkTarget string    `json:"link_target,omitempty"`
	// Metadata are a file's or directory's user.* extended attributes,
	// named without "user." (at most 32, values of at most 1 KiB; what
	// does not fit is left out); absent when none. E2B's file metadata.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// FileList is the body of GET /v1/sandboxes/{name}/files/list. Truncated
// says that more entries exist than max_entries allowed.
type FileList struct {
	Path      string     `json:"path"`
	Entries   []FileInfo `json:"entries"`
	Truncated bool       `json:"truncated"`
}

// File event types in a FileEvent. Overflow means events were lost
// because the watcher fell behind.
const (
	FileEventCreate   = "create"
	FileEventWrite    = "write"
	FileEventRemove   = "remove"
	FileEventRename   = "rename"
	FileEventChmod    = "chmod"
	FileEventOverflow = "overflow"
)

// FileEvent is one line of GET /v1/sandboxes/{name}/files/watch (NDJSON).
type FileEvent struct {
	Type string    `json:"type"`
	Path string    `json:"path"`
	Time time.Time `json:"time"`
}

// MkdirRequest is the body of POST /v1/sandboxes/{name}/files/mkdir.
type MkdirRequest struct {
	Path    string `json:"path"`
	Parents bool   `json:"parents,omitempty"` // create missing parents; an existing directory is not an error
	Mode    string `json:"mode,omitempty"`    // octal, default "0755"
}

// MoveRequest is the body of POST /v1/sandboxes/{name}/files/move.
type MoveRequest struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Overwrite bool   `json:"overwrite,omitempty"` // replace an existing file (never a non-empty directory)
}

// ChmodRequest is the body of POST /v1/sandboxes/{name}/files/chmod.
type ChmodRequest struct {
	Path string `json:"path"`
	Mode string `json:"mode"` // octal, e.g. "0755"
}

// SSHKey is an SSH public key registered with nook's SSH endpoint (`nook
// serve --ssh-listen`): a sandbox's, or, without Sandbox, its token's for
// every sandbox that token may run commands in.
type SSHKey struct {
	ID          string    `json:"id"`
	Fingerprint string    `json:"fingerprint"` // SHA256:... as ssh-keygen -l prints it
	PublicKey   string    `json:"public_key"`  // authorized_keys form: TYPE BASE64
	Comment     string    `json:"comment,omitempty"`
	Sandbox     string    `json:"sandbox,omitempty"`
	Owner       string    `json:"owner"` // the ID of the token that added it, or "host"
	CreatedAt   time.Time `json:"created_at"`
}

// AddSSHKeyRequest is the body of POST /v1/ssh-keys and
// POST /v1/sandboxes/{name}/ssh-keys: one authorized_keys line (a
// comment is kept; options are refused).
type AddSSHKeyRequest struct {
	PublicKey string `json:"public_key"`
}

// SSHCertRequest is the body of POST /v1/sandboxes/{name}/ssh-cert: a
// public key to certify for logging in to the sandbox (as User, "" for
// its default user), for TTL (default 10m, at most 24h).
type SSHCertRequest struct {
	PublicKey string `json:"public_key"`
	User      string `json:"user,omitempty"`
	TTL       string `json:"ttl,omitempty"`
}

// SSHCert is a short-lived SSH user certificate signed by nook's SSH CA,
// good for one sandbox (by its ID: not a later one of the same name).
type SSHCert struct {
	Certificate string    `json:"certificate"` // authorized_keys form, for IdentityFile's -cert.pub
	Login       string    `json:"login"`       // the SSH user name: NAME or NAME+USER
	ValidBefore time.Time `json:"valid_before"`
	SSH         SSHInfo   `json:"ssh"`
}

// SSHInfo describes the daemon's SSH endpoint.
type SSHInfo struct {
	Address     string `json:"address"`              // host:port it listens on
	HostKey     string `json:"host_key"`             // authorized_keys form
	Fingerprint string `json:"host_key_fingerprint"` // SHA256:...
	UserCA      string `json:"user_ca"`              // the CA that signs `nook ssh`'s certificates
}

// PreviewInfo describes the daemon's preview URL endpoint.
type PreviewInfo struct {
	// URL is a preview URL with PORT and NAME in place of a port and a
	// sandbox name, e.g. http://PORT-NAME.localhost:8080/.
	URL string `json:"url"`
}

// SandboxStats is one sample of what a sandbox uses (`nook stats`, GET
// /v1/sandboxes/{name}/stats, GET /v1/stats). Counters (CPU seconds,
// network bytes) count from the sandbox's start on this host; CPUPercent
// is the CPU used over the interval before Time, in percent of one CPU
// (200 is two CPUs busy). A sandbox with nothing running (stopped,
// paused to disk) reads zeros for what it does not hold.
type SandboxStats struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	State     string    `json:"state"`
	Isolation string    `json:"isolation"`
	Time      time.Time `json:"time"`

	CPUPercent float64 `json:"cpu_percent"`
	CPUSeconds float64 `json:"cpu_seconds"`
	CPUs       float64 `json:"cpus"` // its CPU limit

	MemoryBytes      int64 `json:"memory_bytes"`
	MemoryLimitBytes int64 `json:"memory_limit_bytes"`
	DiskBytes        int64 `json:"disk_bytes"`                 // its disk's space in use
	DiskLimitBytes   int64 `json:"disk_limit_bytes,omitempty"` // its disk's size; 0: not limited
	NetRxBytes       int64 `json:"net_rx_bytes"`               // received by the sandbox
	NetTxBytes       int64 `json:"net_tx_bytes"`               // sent by the sandbox
	// Pids counts its processes (a container's cgroup tasks); a vm's
	// guest processes are not counted (0).
	Pids int64 `json:"pids"`
}
