// Package agent implements both ends of the protocol between the nook
// daemon and nook-agent, the process that runs as PID 1 inside every
// sandbox. The transport is any byte stream (a unix socket for
// containers, a virtio-serial port for vms) carrying a yamux session;
// every request is one yamux stream of api frames. The first frame of a
// stream is a FrameJSON Request; the agent answers with a FrameJSON Reply
// or a FrameError, and an exec then streams FrameStdout/FrameStderr to the
// daemon (and takes FrameStdin/FrameEOF/FrameSignal from it) until a final
// FrameExit.
//
// The daemon's side (Client) treats the agent as hostile, since whoever
// controls the sandbox controls it (hostile.go): what it decodes is
// bounded, listings stop at their cap, a stream or ping the agent opens
// ends the session, and every wait has a deadline: a request's first
// answer within the answer timeout (30 s by default; 20 times that for a
// remove or a move), and while streams are open the agent must answer
// pings within it, so a quiet command runs on but a stopped or traced
// agent fails calls with a NoAnswerError.
//
// This package must never import the daemon: the agent binary is built
// from it alone (a test enforces it).
package agent

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nookhq/nook/api"
)

// Ops a Request can name.
const (
	OpPing      = "ping"
	OpExec      = "exec"
	OpConfigure = "configure"
	OpAttach    = "attach"
	OpProcesses = "processes"
	OpSignal    = "signal"
	// OpDial connects to a TCP port on the sandbox's loopback; after the
	// reply the stream carries the connection's bytes both ways.
	OpDial = "dial"
)

// Request is the first frame of every stream.
type Request struct {
	Op        string            `json:"op"`
	Exec      *ExecRequest      `json:"exec,omitempty"`
	Configure *ConfigureRequest `json:"configure,omitempty"`
	Attach    *AttachRequest    `json:"attach,omitempty"`
	Signal    *SignalRequest    `json:"signal,omitempty"`
	Files     *FileRequest      `json:"files,omitempty"` // the file ops (files.go)
	Volumes   *VolumesRequest   `json:"volumes,omitempty"`
	Dial      *DialRequest      `json:"dial,omitempty"`
}

// DialRequest names the port of an OpDial.
type DialRequest struct {
	Port int `json:"port"`
}

// AttachRequest streams a session's output from a byte offset (of its
// combined stdout and stderr), following it until the process exits.
// With Input, frames from the client go to its stdin or terminal.
type AttachRequest struct {
	PID    int   `json:"pid"`
	Offset int64 `json:"offset,omitempty"`
	Input  bool  `json:"input,omitempty"`
}

// SignalRequest sends a signal to a session's process group.
type SignalRequest struct {
	PID    int    `json:"pid"`
	Signal string `json:"signal"`
}

// ProcessInfo describes a session in the agent's process table.
type ProcessInfo struct {
	PID        int             `json:"pid"`
	Argv       []string        `json:"argv"`
	TTY        bool            `json:"tty,omitempty"`
	Running    bool            `json:"running"`
	StartedAt  time.Time       `json:"started_at"`
	Exit       *api.ExitStatus `json:"exit,omitempty"`
	OutputFrom int64           `json:"output_from"` // oldest offset still in the ring
	OutputTo   int64           `json:"output_to"`   // bytes of output so far
	// Passive: its running is no use of the sandbox (ExecRequest.Passive).
	Passive bool `json:"passive,omitempty"`
}

// ConfigureRequest gives a sandbox its identity: the daemon sends it once
// after the sandbox starts (and again after a restore or fork). The agent
// takes the environment as every process's base, writes /etc/hostname and
// /etc/hosts, and sets the hostname where it is allowed to (in a vm; a
// container's hostname is set by the backend).
type ConfigureRequest struct {
	Hostname string            `json:"hostname"`
	Env      map[string]string `json:"env,omitempty"`
	// TimeUnixNano sets the clock (a vm restored from a snapshot wakes up
	// at the snapshot's time). Zero leaves it alone; containers share the host's.
	TimeUnixNano int64 `json:"time_unix_nano,omitempty"`
	// Seed is mixed into the kernel's random pool, which is then reseeded:
	// every vm restored from one snapshot starts with the same pool.
	Seed []byte `json:"seed,omitempty"`
	// Net is the sandbox's network. The agent writes /etc/resolv.conf, and
	// in a vm (whose interface only the guest can configure) sets eth0's
	// address and default route; a container's are set from the host.
	Net *NetConfig `json:"net,omitempty"`
	// WakeOnly: the sandbox woke from a pause with everything else as it
	// was: set the clock and reseed, and change nothing else (not the
	// files of its identity, which its user may have edited since).
	WakeOnly bool `json:"wake_only,omitempty"`
	// Identity: keep an identity token fresh in a file (identity.go).
	Identity *IdentityConfig `json:"identity,omitempty"`
	// Unset are variables to drop from every process's environment (a
	// fork's secret bindings it did not inherit).
	Unset []string `json:"unset,omitempty"`
	// TrustCA is a CA certificate (PEM) the sandbox trusts: the CA nook
	// terminates TLS to the hosts of its secrets with (trust.go).
	TrustCA string `json:"trust_ca,omitempty"`
}

// NetConfig is a sandbox's IPv4 network.
type NetConfig struct {
	Address string `json:"address"` // CIDR, e.g. 10.89.0.2/30
	Gateway string `json:"gateway"` // and the DNS resolver nook runs for the sandbox
	// SetLink: configure eth0 from inside (vms).
	SetLink bool `json:"set_link,omitempty"`
}

// ExecRequest starts a process in the sandbox.
type ExecRequest struct {
	Argv      []string          `json:"argv"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	User      string            `json:"user,omitempty"`
	Stdin     bool              `json:"stdin,omitempty"`      // keep stdin open for FrameStdin; otherwise /dev/null
	TimeoutMS int64             `json:"timeout_ms,omitempty"` // kill the process group after this long
	// Background starts a session that outlives the stream: the reply
	// carries its PID and the stream ends; attach to read its output.
	Background bool `json:"background,omitempty"`
	// Follow, with Background, keeps the stream after the reply: it
	// follows the session as an attach with input from its first byte
	// would, and its end detaches (the session goes on).
	Follow bool `json:"follow,omitempty"`
	// TTY runs the process on a terminal of Rows x Cols. A TTY session
	// is attached by this stream; with Background it survives the
	// stream, otherwise it is killed when the stream ends.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// Passive marks a process whose running alone is no use of the
	// sandbox (an SSH session's shell: its traffic is): the daemon's idle
	// check leaves it out.
	Passive bool `json:"passive,omitempty"`
}

// Reply answers a Request.
type Reply struct {
	// Ping
	Hostname string `json:"hostname,omitempty"`
	Kernel   string `json:"kernel,omitempty"`
	Version  string `json:"version,omitempty"`
	// Exec, attach
	PID        int   `json:"pid,omitempty"`
	OutputFrom int64 `json:"output_from,omitempty"` // attach: the oldest offset still kept
}

// Error codes the agent sends in a FrameError.
const (
	CodeCommandNotFound  = "command_not_found"
	CodeNotFound         = api.CodeNotFound
	CodeAlreadyExists    = api.CodeAlreadyExists
	CodeInvalidArgument  = api.CodeInvalidArgument
	CodePermissionDenied = api.CodePermissionDenied
	CodeInternal         = api.CodeInternal
)

// Limits on a request, so a confused or hostile peer cannot make the agent allocate without bound.
const (
	maxArgs     = 4096
	maxEnv      = 4096
	maxArgBytes = 256 << 10
)

// DecodeRequest parses and validates the first frame of a stream.
func DecodeRequest(payload []byte) (*Request, error) {
	var r Request
	if err := json.Unmarshal(payload, &r); err != nil {
		return nil, fmt.Errorf("malformed request: %w", err)
	}
	switch r.Op {
	case OpPing:
		return &r, nil
	case OpProcesses:
		return &r, nil
	case OpAttach:
		if r.Attach == nil || r.Attach.PID <= 0 || r.Attach.Offset < 0 {
			return nil, fmt.Errorf("attach needs a process id and an offset >= 0")
		}
		return &r, nil
	case OpSignal:
		if r.Signal == nil || r.Signal.PID <= 0 {
			return nil, fmt.Errorf("signal needs a process id")
		}
		if _, ok := signalByName(r.Signal.Signal); !ok {
			return nil, fmt.Errorf("signal %q is not valid: use a name like TERM or KILL, or a number", r.Signal.Signal)
		}
		return &r, nil
	case OpConfigure:
		if r.Configure == nil {
			return nil, fmt.Errorf("configure request without configure body")
		}
		return &r, r.Configure.validate()
	case OpExec:
		if r.Exec == nil {
			return nil, fmt.Errorf("exec request without exec body")
		}
		return &r, r.Exec.validate()
	case OpDial:
		if r.Dial == nil || r.Dial.Port < 1 || r.Dial.Port > 65535 {
			return nil, fmt.Errorf("dial needs a port from 1 to 65535")
		}
		return &r, nil
	case OpVolumes:
		if r.Volumes == nil {
			return nil, fmt.Errorf("volumes request without volumes body")
		}
		return &r, r.Volumes.validate()
	case OpStat, OpList, OpRead, OpWrite, OpMkdir, OpRemove, OpMove, OpChmod, OpTarGet, OpTarPut, OpWatch:
		if r.Files == nil {
			return nil, fmt.Errorf("%s request without files body", r.Op)
		}
		return &r, r.Files.validate(r.Op)
	default:
		return nil, fmt.Errorf("unknown op %q", r.Op)
	}
}

var hostnameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func (c *ConfigureRequest) validate() error {
	if c.WakeOnly && (c.Hostname != "" || len(c.Env) > 0 || c.Net != nil) {
		return fmt.Errorf("a wake-only configure sets only the time and the seed")
	}
	if !c.WakeOnly && !hostnameRE.MatchString(c.Hostname) {
		return fmt.Errorf("hostname %q is not a DNS label", c.Hostname)
	}
	if len(c.Env) > maxEnv || len(c.Unset) > maxEnv {
		return fmt.Errorf("too many environment variables")
	}
	if len(c.TrustCA) > 16<<10 || c.TrustCA != "" && !strings.HasPrefix(c.TrustCA, "-----BEGIN CERTIFICATE-----") {
		return fmt.Errorf("trust_ca is not a PEM certificate")
	}
	if len(c.Seed) > 512 {
		return fmt.Errorf("seed is longer than 512 bytes")
	}
	if c.Net != nil {
		if p, err := netip.ParsePrefix(c.Net.Address); err != nil || !p.Addr().Is4() {
			return fmt.Errorf("network address %q is not an IPv4 CIDR", c.Net.Address)
		}
		if a, err := netip.ParseAddr(c.Net.Gateway); err != nil || !a.Is4() {
			return fmt.Errorf("gateway %q is not an IPv4 address", c.Net.Gateway)
		}
	}
	for k, v := range c.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("environment variable %q is not valid", k)
		}
	}
	return nil
}

func (e *ExecRequest) validate() error {
	if len(e.Argv) == 0 || e.Argv[0] == "" {
		return fmt.Errorf("no command given")
	}
	if len(e.Argv) > maxArgs || len(e.Env) > maxEnv {
		return fmt.Errorf("too many arguments or environment variables")
	}
	size := 0
	for _, a := range e.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return fmt.Errorf("an argument contains a NUL byte")
		}
		size += len(a)
	}
	for k, v := range e.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return fmt.Errorf("environment variable %q is not valid", k)
		}
		size += len(k) + len(v)
	}
	if size > maxArgBytes {
		return fmt.Errorf("arguments and environment exceed %d bytes", maxArgBytes)
	}
	if strings.IndexByte(e.Cwd, 0) >= 0 || strings.IndexByte(e.User, 0) >= 0 || !utf8.ValidString(e.User) {
		return fmt.Errorf("cwd or user is not valid")
	}
	if e.TimeoutMS < 0 {
		return fmt.Errorf("negative timeout")
	}
	return nil
}

// Error is the payload of a FrameError from the agent.
type Error = api.Error
