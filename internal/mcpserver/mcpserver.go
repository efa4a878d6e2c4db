// Package mcpserver exposes nook to agents as MCP tools, built with the
// official MCP Go SDK. Every tool goes through the nook Go SDK, so `nook mcp`
// (stdio) and the daemon's /mcp endpoint (streamable HTTP) behave the same.
package mcpserver

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// OutputLimit is how much of stdout and of stderr a tool returns; the
// middle of longer output is cut out, with a note saying so.
const OutputLimit = 64 << 10

// New returns an MCP server whose tools drive nook through c.
func New(c *sdk.Client, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "nook", Title: "nook sandboxes", Version: version}, &mcp.ServerOptions{
		Instructions: "nook gives you Linux sandboxes (Debian 12, root, apt-get, python3, git, curl). " +
			"Create one with sandbox_create, run commands with exec, keep long-running servers with process_start, " +
			"and move files with read_file, write_file, list_files and search_files. " +
			"In a sandbox created with isolation \"vm\", sandbox_snapshot saves everything (files and running processes): " +
			"try an approach, sandbox_rollback to undo it, or sandbox_fork to try several at once. Destroy a sandbox when done.",
	})
	t := &tools{c: c}
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_create", Description: "Create a new, isolated Linux sandbox (Debian 12 with root, apt-get, python3, git, curl) and return it. " +
		"Use this before running anything. It starts in well under a second. Returns the sandbox's name, which every other tool takes. " +
		"A host full to its operator's limits refuses it with a message saying which (\"host limit reached: ...\"): destroy, stop or pause sandboxes you no longer need, then try again."}, t.create)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_list", Description: "List all sandboxes with their state, size and expiry. Use it to find a sandbox you created earlier."}, t.list)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_inspect", Description: "Show one sandbox: its state (running, paused, stopped or failed, with the reason), CPU and memory limits, environment and when it expires."}, t.inspect)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_pause", Description: "Pause a sandbox you will come back to: its processes stop where they are (servers, shells, builds) and it uses no CPU. " +
		"Nothing is lost. Any later exec or file call on it resumes it automatically; sandbox_resume does so explicitly."}, t.pause)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_resume", Description: "Resume a paused sandbox: its processes continue exactly where they stopped. Returns the sandbox."}, t.resume)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_stop", Description: "Stop a sandbox like powering off a machine: its processes end and its memory is freed; its files are kept. " +
		"Calls on it fail until sandbox_start. Use sandbox_pause instead to keep its processes."}, t.stop)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_start", Description: "Start a stopped sandbox again, afresh on its files (a vm boots), with its name, address and network policy. Returns the sandbox."}, t.startSandbox)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_destroy", Description: "Destroy a sandbox and everything in it (processes and files). Irreversible. Use it when the work is finished."}, t.destroy)
	mcp.AddTool(s, &mcp.Tool{Name: "exec", Description: "Run a shell command in a sandbox and wait for it (default timeout 120s). " +
		"The command runs with /bin/sh -c, as root unless user is set. Returns exit_code, stdout and stderr; output over 64 KiB per stream " +
		"is cut in the middle with a note. For servers or anything that runs longer, use process_start instead."}, t.exec)
	mcp.AddTool(s, &mcp.Tool{Name: "process_start", Description: "Start a long-running command (a server, a build, a test run) in the background of a sandbox and return its pid at once. " +
		"It keeps running after this call. Read its output with process_output; stop it with process_kill."}, t.start)
	mcp.AddTool(s, &mcp.Tool{Name: "process_output", Description: "Read the output a background process produced since a byte offset (0 for all; pass next_offset from the previous call to get only new output). " +
		"Waits up to wait_seconds (default 2) for more output if there is none yet. Returns the output, next_offset, and whether it is still running (with its exit code once it has exited)."}, t.output)
	mcp.AddTool(s, &mcp.Tool{Name: "process_list", Description: "List the processes started with process_start (and exec) in a sandbox, running or recently finished, with their pids and exit codes."}, t.processes)
	mcp.AddTool(s, &mcp.Tool{Name: "process_kill", Description: "Send a signal (default TERM; KILL to force) to a background process and everything it started."}, t.kill)
	mcp.AddTool(s, &mcp.Tool{Name: "template_list", Description: "List the templates sandboxes can start from (name, source image and digest, size) and the ones nook can build (base, dev).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, t.templates)
	mcp.AddTool(s, &mcp.Tool{Name: "template_build", Description: "Build a template that sandbox_create can start from: from an image (from: a registry reference such as python:3.12-slim or ghcr.io/org/img@sha256:...), " +
		"from a Dockerfile's text (dockerfile), or, with neither, one of nook's own (base, dev). The image's ENV, WORKDIR and USER become the defaults of every command in its sandboxes. Returns the template; takes as long as the image takes to pull."}, t.buildTemplate)
	mcp.AddTool(s, &mcp.Tool{Name: "network_log", Description: "Show what a sandbox was denied on the network: blocked connections and refused DNS lookups, newest last, each with the destination and why " +
		"(policy: not in the allowlist; not-allowed: a name the policy does not allow; tunnel: a lookup shaped like data smuggling). " +
		"Use it when a download, git clone or API call fails inside a sandbox, to see which domain the task needs allowed."}, t.netLog)
	mcp.AddTool(s, &mcp.Tool{Name: "volume_create", Description: "Create a volume: a directory of a fixed size (default 10G) whose files outlive every sandbox, for data to keep " +
		"or share (a package cache, a dataset, results). Mount it with sandbox_create's volumes (NAME:/path, or NAME:/path:ro). Returns the volume."}, t.createVolume)
	mcp.AddTool(s, &mcp.Tool{Name: "volume_list", Description: "List the volumes with their size, what they use and the sandboxes that mount them.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, t.volumes)
	mcp.AddTool(s, &mcp.Tool{Name: "volume_destroy", Description: "Destroy a volume and every file in it. Irreversible. Refused while a sandbox mounts it: destroy those sandboxes first."}, t.destroyVolume)
	addFileTools(s, t)
	addSnapshotTools(s, t)
	return s
}

// VolumeInput is volume_create's input.
type VolumeInput struct {
	Name string `json:"name" jsonschema:"the volume's name: lowercase letters, digits and '-'"`
	Size string `json:"size,omitempty" jsonschema:"its size, such as 1G or 500M; default 10G"`
}

func (t *tools) createVolume(ctx context.Context, _ *mcp.CallToolRequest, in VolumeInput) (*mcp.CallToolResult, any, error) {
	v, err := t.c.CreateVolume(ctx, in.Name, in.Size)
	if err != nil {
		return fail(err)
	}
	return nil, v, nil
}

func (t *tools) volumes(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
	vols, err := t.c.ListVolumes(ctx)
	if err != nil {
		return fail(err)
	}
	return nil, api.VolumeList{Volumes: vols}, nil
}

// VolumeNameInput names a volume.
type VolumeNameInput struct {
	Name string `json:"name" jsonschema:"the volume's name"`
}

func (t *tools) destroyVolume(ctx context.Context, _ *mcp.CallToolRequest, in VolumeNameInput) (*mcp.CallToolResult, any, error) {
	if err := t.c.DeleteVolume(ctx, in.Name, false); err != nil {
		return fail(err)
	}
	return nil, map[string]any{"destroyed": in.Name}, nil
}

type tools struct{ c *sdk.Client }

// fail returns a tool error: the model sees the message and can correct itself.
func fail(err error) (*mcp.CallToolResult, any, error) {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: err.Error()}}}, nil, nil
}

// CreateInput is sandbox_create's input.
type CreateInput struct {
	Name     string            `json:"name,omitempty" jsonschema:"a name for the sandbox (lowercase letters, digits, '-'); generated if omitted"`
	Template string            `json:"template,omitempty" jsonschema:"template to start from (template_list shows them, template_build makes one from an image); default base"`
	CPUs     float64           `json:"cpus,omitempty" jsonschema:"CPU limit in cores; default 2"`
	Memory   string            `json:"memory,omitempty" jsonschema:"memory limit such as 1G or 512M; default 2G"`
	TTL      string            `json:"ttl,omitempty" jsonschema:"how long it lives before it is destroyed, e.g. 90m, 2h, 3d; default 1h"`
	Env      map[string]string `json:"env,omitempty" jsonschema:"environment variables for every command"`
	// Optional: the isolation (vm is what snapshots, rollback and fork need).
	Isolation string `json:"isolation,omitempty" jsonschema:"container (default: the lightest and fastest) or vm (a microVM of its own: stronger isolation, Docker inside, and the only kind that can take snapshots, roll back and fork)"`
	// Optional: idle pause and what the TTL does.
	IdlePause string `json:"idle_pause,omitempty" jsonschema:"pause the sandbox after this long without use, e.g. 10m, or off; the next call wakes it with everything intact. A running command keeps it awake. Default: the daemon's setting"`
	OnExpire  string `json:"on_expire,omitempty" jsonschema:"what happens when the ttl runs out: destroy (default), pause or stop (kept until a new ttl is set)"`
	Init      string `json:"init,omitempty" jsonschema:"PID 1: systemd (vm sandboxes whose template has it, e.g. dev: services run) or agent (fastest start); default: systemd where the template has it"`
	// Optional: the network policy.
	Net   string   `json:"net,omitempty" jsonschema:"network mode: allowlist (default: the sandbox reaches only what allow names) or none (no network at all)"`
	Allow []string `json:"allow,omitempty" jsonschema:"what the sandbox may reach on the network; by default nothing. Each entry is a domain (github.com), a wildcard (*.pythonhosted.org), an IPv4 CIDR, or a preset (@registries: GitHub, Debian, PyPI, npm, the Go proxy, crates.io; @internet: everything public), optionally with ports (example.com:443). TCP to a domain must be TLS or HTTP naming it unless the rule ends in /tcp (github.com:22/tcp). Ask for only what the task needs"`
	Deny  []string `json:"deny,omitempty" jsonschema:"domains, wildcards or CIDRs the sandbox may never reach, even if allow names them"`
	// Optional: volumes.
	Volumes []string `json:"volumes,omitempty" jsonschema:"volumes to mount, each NAME:/path or NAME:/path:ro; volume_create makes one. Their files outlive the sandbox and are shared with every sandbox that mounts them"`
}

func (t *tools) create(ctx context.Context, _ *mcp.CallToolRequest, in CreateInput) (*mcp.CallToolResult, any, error) {
	sb, err := t.c.CreateSandbox(ctx, api.CreateSandboxRequest{Name: in.Name, Template: in.Template, Isolation: in.Isolation, CPUs: in.CPUs, Memory: in.Memory, TTL: in.TTL, Env: in.Env,
		IdlePause: in.IdlePause, OnExpire: in.OnExpire, Init: in.Init, Net: in.Net, Allow: in.Allow, Deny: in.Deny, Volumes: in.Volumes})
	if err != nil {
		return fail(err)
	}
	return nil, sb, nil
}

// TemplateBuildInput is template_build's input.
type TemplateBuildInput struct {
	Name  string `json:"name" jsonschema:"the template's name: lowercase letters, digits and '-'"`
	From  string `json:"from,omitempty" jsonschema:"the image to build it from: a registry reference (python:3.12-slim, ghcr.io/org/img:tag, ...@sha256:...); omit to build nook's own base or dev"`
	Pull  bool   `json:"pull,omitempty" jsonschema:"resolve the image's tag again instead of the digest a previous build of this template recorded"`
	Start string `json:"start,omitempty" jsonschema:"a shell command every sandbox of the template starts in the background when it comes up (default: the image's ENTRYPOINT and CMD; none: nothing)"`
	Ready string `json:"ready,omitempty" jsonschema:"what sandbox_create waits for once the service started: port:N, file:PATH or cmd:COMMAND"`
	// Dockerfile builds from a Dockerfile's text instead (no build context).
	Dockerfile string            `json:"dockerfile,omitempty" jsonschema:"build from this Dockerfile text instead of from: FROM an image, a nook template (base, dev) or a stage; RUN steps run in nook sandboxes (network: @registries); there is no build context, so COPY works only --from a stage or an image"`
	BuildArgs  map[string]string `json:"build_args,omitempty" jsonschema:"values of the Dockerfile's ARGs"`
}

func (t *tools) buildTemplate(ctx context.Context, _ *mcp.CallToolRequest, in TemplateBuildInput) (*mcp.CallToolResult, any, error) {
	if in.Dockerfile != "" {
		if in.From != "" || in.Pull {
			return fail(errors.New("give either from (an image) or dockerfile, not both"))
		}
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		tw.WriteHeader(&tar.Header{Name: "Dockerfile", Mode: 0o644, Size: int64(len(in.Dockerfile)), Typeflag: tar.TypeReg})
		tw.Write([]byte(in.Dockerfile))
		tw.Close()
		tpl, err := t.c.BuildTemplateDockerfile(ctx, in.Name, api.DockerfileBuild{BuildArgs: in.BuildArgs, Start: in.Start, Ready: in.Ready}, &b, nil)
		if err != nil {
			return fail(err)
		}
		return nil, tpl, nil
	}
	tpl, err := t.c.BuildTemplateFrom(ctx, api.BuildTemplateRequest{Name: in.Name, From: in.From, Pull: in.Pull, Start: in.Start, Ready: in.Ready}, nil)
	if err != nil {
		return fail(err)
	}
	return nil, tpl, nil
}

func (t *tools) templates(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
	tl, err := t.c.ListTemplates(ctx)
	if err != nil {
		return fail(err)
	}
	return nil, tl, nil
}

// NetLogInput is network_log's input.
type NetLogInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name"`
	Limit   int    `json:"limit,omitempty" jsonschema:"at most this many of the newest entries; default 50"`
}

func (t *tools) netLog(ctx context.Context, _ *mcp.CallToolRequest, in NetLogInput) (*mcp.CallToolResult, any, error) {
	l, err := t.c.NetLog(ctx, in.Sandbox)
	if err != nil {
		return fail(err)
	}
	limit := in.Limit
	if limit <= 0 {
		limit = 50
	}
	if len(l.Entries) > limit {
		l.Entries = l.Entries[len(l.Entries)-limit:]
	}
	return nil, l, nil
}

// ListOutput is sandbox_list's output.
type ListOutput struct {
	Sandboxes []api.Sandbox `json:"sandboxes"`
}

func (t *tools) list(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
	sbs, err := t.c.ListSandboxes(ctx)
	if err != nil {
		return fail(err)
	}
	if sbs == nil {
		sbs = []api.Sandbox{}
	}
	return nil, ListOutput{Sandboxes: sbs}, nil
}

// NameInput names a sandbox.
type NameInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name"`
}

func (t *tools) inspect(ctx context.Context, _ *mcp.CallToolRequest, in NameInput) (*mcp.CallToolResult, any, error) {
	sb, err := t.c.GetSandbox(ctx, in.Sandbox)
	if err != nil {
		return fail(err)
	}
	return nil, sb, nil
}

func (t *tools) pause(ctx context.Context, _ *mcp.CallToolRequest, in NameInput) (*mcp.CallToolResult, any, error) {
	sb, err := t.c.PauseSandbox(ctx, in.Sandbox)
	if err != nil {
		return fail(err)
	}
	return nil, sb, nil
}

func (t *tools) resume(ctx context.Context, _ *mcp.CallToolRequest, in NameInput) (*mcp.CallToolResult, any, error) {
	sb, err := t.c.ResumeSandbox(ctx, in.Sandbox)
	if err != nil {
		return fail(err)
	}
	return nil, sb, nil
}

func (t *tools) stop(ctx context.Context, _ *mcp.CallToolRequest, in NameInput) (*mcp.CallToolResult, any, error) {
	sb, err := t.c.StopSandbox(ctx, in.Sandbox)
	if err != nil {
		return fail(err)
	}
	return nil, sb, nil
}

func (t *tools) startSandbox(ctx context.Context, _ *mcp.CallToolRequest, in NameInput) (*mcp.CallToolResult, any, error) {
	sb, err := t.c.StartSandbox(ctx, in.Sandbox)
	if err != nil {
		return fail(err)
	}
	return nil, sb, nil
}

func (t *tools) destroy(ctx context.Context, _ *mcp.CallToolRequest, in NameInput) (*mcp.CallToolResult, any, error) {
	if err := t.c.DeleteSandbox(ctx, in.Sandbox); err != nil {
		return fail(err)
	}
	return nil, DoneOutput{Done: fmt.Sprintf("sandbox %s destroyed", in.Sandbox)}, nil
}

// DoneOutput reports what a tool did.
type DoneOutput struct {
	Done string `json:"done"`
}

// ExecInput is exec's input.
type ExecInput struct {
	Sandbox string            `json:"sandbox" jsonschema:"the sandbox's name"`
	Command string            `json:"command" jsonschema:"shell command, run with /bin/sh -c"`
	Cwd     string            `json:"cwd,omitempty" jsonschema:"working directory; default the user's home"`
	User    string            `json:"user,omitempty" jsonschema:"user to run as; default root"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	Timeout string            `json:"timeout,omitempty" jsonschema:"kill the command after this long, e.g. 30s or 10m; default 120s"`
}

// ExecOutput is exec's output.
type ExecOutput struct {
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
}

func (t *tools) exec(ctx context.Context, _ *mcp.CallToolRequest, in ExecInput) (*mcp.CallToolResult, any, error) {
	if in.Command == "" {
		return fail(errors.New("command is empty: give a shell command such as `ls -la`"))
	}
	if in.Timeout == "" {
		in.Timeout = "120s"
	}
	var out, errb limitedBuffer
	st, err := t.c.Exec(ctx, in.Sandbox, api.ExecRequest{Cmd: []string{"/bin/sh", "-c", in.Command}, Cwd: in.Cwd, User: in.User, Env: in.Env, Timeout: in.Timeout}, &out, &errb)
	if err != nil {
		return fail(err)
	}
	return nil, ExecOutput{ExitCode: st.ExitCode, Signal: st.Signal, TimedOut: st.TimedOut, Stdout: out.String(), Stderr: errb.String()}, nil
}

// limitedBuffer keeps the first and last OutputLimit/2 bytes of what is
// written to it, so that memory stays bounded whatever a command prints.
type limitedBuffer struct {
	head, tail []byte
	total      int64
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	b.total += int64(n)
	half := OutputLimit / 2
	if room := half - len(b.head); room > 0 {
		n := min(room, len(p))
		b.head = append(b.head, p[:n]...)
		p = p[n:]
	}
	if len(p) > 0 {
		b.tail = append(b.tail, p...)
		if len(b.tail) > half {
			b.tail = append(b.tail[:0], b.tail[len(b.tail)-half:]...)
		}
	}
	return n, nil
}

func (b *limitedBuffer) String() string {
	kept := int64(len(b.head) + len(b.tail))
	if kept == b.total {
		return string(b.head) + string(b.tail)
	}
	return fmt.Sprintf("%s\n[... %d bytes omitted: redirect the output to a file and read the part you need ...]\n%s", b.head, b.total-kept, b.tail)
}

// StartInput is process_start's input.
type StartInput struct {
	Sandbox string            `json:"sandbox" jsonschema:"the sandbox's name"`
	Command string            `json:"command" jsonschema:"shell command, run with /bin/sh -c"`
	Cwd     string            `json:"cwd,omitempty" jsonschema:"working directory; default the user's home"`
	User    string            `json:"user,omitempty" jsonschema:"user to run as; default root"`
	Env     map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
}

// StartOutput is process_start's output.
type StartOutput struct {
	PID int `json:"pid"`
}

func (t *tools) start(ctx context.Context, _ *mcp.CallToolRequest, in StartInput) (*mcp.CallToolResult, any, error) {
	if in.Command == "" {
		return fail(errors.New("command is empty: give a shell command such as `python3 -m http.server 8000`"))
	}
	pid, err := t.c.Start(ctx, in.Sandbox, api.ExecRequest{Cmd: []string{"/bin/sh", "-c", in.Command}, Cwd: in.Cwd, User: in.User, Env: in.Env})
	if err != nil {
		return fail(err)
	}
	return nil, StartOutput{PID: pid}, nil
}

// OutputInput is process_output's input.
type OutputInput struct {
	Sandbox     string  `json:"sandbox" jsonschema:"the sandbox's name"`
	PID         int     `json:"pid" jsonschema:"the process id process_start returned"`
	Offset      int64   `json:"offset,omitempty" jsonschema:"byte offset to read from; 0 for everything kept (the last 1 MiB)"`
	WaitSeconds float64 `json:"wait_seconds,omitempty" jsonschema:"how long to wait for output if there is none yet; default 2, at most 60"`
}

// OutputOutput is process_output's output.
type OutputOutput struct {
	Output     string `json:"output"`
	NextOffset int64  `json:"next_offset"`
	Running    bool   `json:"running"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	Signal     string `json:"signal,omitempty"`
}

func (t *tools) output(ctx context.Context, _ *mcp.CallToolRequest, in OutputInput) (*mcp.CallToolResult, any, error) {
	wait := 2 * time.Second
	if in.WaitSeconds > 0 {
		wait = time.Duration(min(in.WaitSeconds, 60) * float64(time.Second))
	}
	// Output older than the kept 1 MiB is gone: reading starts at the oldest kept byte.
	from := in.Offset
	if ps, err := t.c.Processes(ctx, in.Sandbox); err == nil {
		for _, p := range ps {
			if p.PID == in.PID && p.OutputFrom > from {
				from = p.OutputFrom
			}
		}
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var buf limitedBuffer
	st, err := t.c.Output(rctx, in.Sandbox, in.PID, from, &buf, &buf)
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fail(err)
	}
	out := OutputOutput{Output: buf.String(), NextOffset: from + buf.total, Running: st == nil}
	if st != nil {
		code := st.ExitCode
		out.ExitCode, out.Signal = &code, st.Signal
	}
	return nil, out, nil
}

// ProcessesOutput is process_list's output.
type ProcessesOutput struct {
	Processes []api.Process `json:"processes"`
}

func (t *tools) processes(ctx context.Context, _ *mcp.CallToolRequest, in NameInput) (*mcp.CallToolResult, any, error) {
	ps, err := t.c.Processes(ctx, in.Sandbox)
	if err != nil {
		return fail(err)
	}
	if ps == nil {
		ps = []api.Process{}
	}
	return nil, ProcessesOutput{Processes: ps}, nil
}

// KillInput is process_kill's input.
type KillInput struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's name"`
	PID     int    `json:"pid" jsonschema:"the process id"`
	Signal  string `json:"signal,omitempty" jsonschema:"TERM (default), KILL, INT, HUP..."`
}

func (t *tools) kill(ctx context.Context, _ *mcp.CallToolRequest, in KillInput) (*mcp.CallToolResult, any, error) {
	if in.Signal == "" {
		in.Signal = "TERM"
	}
	if err := t.c.Signal(ctx, in.Sandbox, in.PID, in.Signal); err != nil {
		return fail(err)
	}
	return nil, DoneOutput{Done: fmt.Sprintf("sent %s to process %d", in.Signal, in.PID)}, nil
}
