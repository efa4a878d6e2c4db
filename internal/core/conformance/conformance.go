// Package conformance is the test suite every core.Backend must pass.
// A backend's own tests call Run with a Harness; the suite drives the
// backend and the agent inside its sandboxes exactly as the daemon does.
package conformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
)

// Harness is what a backend's test gives the suite.
type Harness struct {
	Backend    core.Backend
	TemplateID string
	// Leaks lists anything of sandbox id still on the host (processes,
	// mounts, cgroups, files, runtime state); empty after a destroy.
	Leaks func(id string) []string
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	t.Run("CreateExecDestroy", func(t *testing.T) { testCreateExecDestroy(t, h) })
	t.Run("ExecSemantics", func(t *testing.T) { testExecSemantics(t, h) })
	t.Run("ReapsZombies", func(t *testing.T) { testReapsZombies(t, h) })
	t.Run("NoHostNetwork", func(t *testing.T) { testNoHostNetwork(t, h) })
	t.Run("DestroyIsIdempotent", func(t *testing.T) { testDestroyIdempotent(t, h) })
	t.Run("ParallelCreate", func(t *testing.T) { testParallel(t, h) })
	t.Run("Processes", func(t *testing.T) { testProcesses(t, h) })
	t.Run("Pause", func(t *testing.T) { testPause(t, h) })
	t.Run("StopStart", func(t *testing.T) { testStopStart(t, h) })
	t.Run("Files", func(t *testing.T) { testFiles(t, h) })
}

// NewSandbox returns a sandbox record with small, valid defaults. If the
// backend keeps warm sandboxes, Create claims one when one is ready.
func NewSandbox(name, templateID string) *core.Sandbox {
	b := make([]byte, 8)
	rand.Read(b)
	return &core.Sandbox{
		ID: hex.EncodeToString(b), Name: name, Template: "base", TemplateID: templateID, Isolation: "test",
		State: core.StateCreating, CPUs: 1, MemoryBytes: 512 << 20, PidsLimit: 512,
		Env: map[string]string{"SANDBOX_ENV": "from-create"}, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour),
	}
}

// Sandbox is a created sandbox with an agent client, destroyed at test end.
type Sandbox struct {
	*core.Sandbox
	Agent *agent.Client
	h     Harness
}

// Create creates a sandbox and registers its destruction (and a leak check) with t.
func Create(t *testing.T, h Harness, name string) *Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sb := NewSandbox(name, h.TemplateID)
	if wp, ok := h.Backend.(core.WarmPool); ok {
		if id, ok := wp.TakeWarm(sb); ok {
			sb.ID = id
		}
	}
	if err := h.Backend.Create(ctx, sb); err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	s := Adopt(t, h, sb)
	// As the daemon does: the agent gives the sandbox its identity.
	if err := s.Agent.Configure(ctx, &agent.ConfigureRequest{Hostname: sb.Name, Env: sb.Env}); err != nil {
		t.Fatalf("agent of %s does not answer: %v", name, err)
	}
	return s
}

// Adopt wraps a sandbox the backend created with an agent client, and
// registers its destruction (and a leak check) with t.
func Adopt(t *testing.T, h Harness, sb *core.Sandbox) *Sandbox {
	s := &Sandbox{Sandbox: sb, h: h}
	s.Agent = agent.NewClient(func(ctx context.Context) (net.Conn, error) { return h.Backend.DialAgent(ctx, sb) })
	t.Cleanup(func() { s.Destroy(t) })
	return s
}

// Destroy destroys the sandbox and checks that nothing is left.
func (s *Sandbox) Destroy(t *testing.T) {
	t.Helper()
	s.Agent.Close()
	if err := s.h.Backend.Destroy(context.Background(), s.ID); err != nil {
		t.Errorf("destroy %s: %v", s.Name, err)
	}
	st, err := s.h.Backend.Status(context.Background(), s.Sandbox)
	if err != nil || st.State != core.RuntimeAbsent {
		t.Errorf("after destroy, status %v %v", st.State, err)
	}
	if s.h.Leaks != nil {
		if leaks := s.h.Leaks(s.ID); len(leaks) > 0 {
			t.Errorf("destroy of %s left behind:\n  %s", s.Name, strings.Join(leaks, "\n  "))
		}
	}
}

// Result is a finished exec.
type Result struct {
	Stdout, Stderr string
	Exit           api.ExitStatus
}

// Exec runs a command to completion.
func (s *Sandbox) Exec(t *testing.T, req *agent.ExecRequest) (*Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	p, err := s.Agent.Exec(ctx, req)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	var out, errb bytes.Buffer
	for {
		kind, b, err := p.Next()
		if err != nil {
			return nil, fmt.Errorf("exec stream: %w", err)
		}
		switch kind {
		case api.FrameStdout:
			out.Write(b)
		case api.FrameStderr:
			errb.Write(b)
		case api.FrameExit:
			r := &Result{Stdout: out.String(), Stderr: errb.String()}
			return r, json.Unmarshal(b, &r.Exit)
		}
	}
}

// Sh runs a shell command and fails the test unless it exits 0.
func (s *Sandbox) Sh(t *testing.T, script string) string {
	t.Helper()
	r, err := s.Exec(t, &agent.ExecRequest{Argv: []string{"sh", "-c", script}})
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	if r.Exit.ExitCode != 0 {
		t.Fatalf("%s: exit %+v, stderr %q", script, r.Exit, r.Stderr)
	}
	return r.Stdout
}

func testCreateExecDestroy(t *testing.T, h Harness) {
	s := Create(t, h, "conf-basic")
	ping, err := s.Agent.Ping(context.Background())
	if err != nil || ping.Hostname != "conf-basic" {
		t.Fatalf("ping: %+v %v", ping, err)
	}
	if got := s.Sh(t, "echo hi"); got != "hi\n" {
		t.Fatalf("echo hi printed %q", got)
	}
	if got := strings.TrimSpace(s.Sh(t, "hostname")); got != "conf-basic" {
		t.Fatalf("hostname %q", got)
	}
	if got := s.Sh(t, "grep -c conf-basic /etc/hosts"); strings.TrimSpace(got) != "1" {
		t.Fatalf("/etc/hosts lacks the name: %q", got)
	}
	// The root filesystem is writable, and a write stays in this sandbox.
	s.Sh(t, "echo data > /root/f && cat /root/f && apt-get --version >/dev/null")
	if ps := s.Sh(t, "cat /proc/1/cmdline | tr '\\0' ' '"); !strings.Contains(ps, "nook-agent") {
		t.Fatalf("PID 1 is %q, not nook-agent", ps)
	}
}

func testExecSemantics(t *testing.T, h Harness) {
	s := Create(t, h, "conf-exec")
	r, err := s.Exec(t, &agent.ExecRequest{
		Argv: []string{"sh", "-c", `echo "$SANDBOX_ENV $EXEC_ENV $(pwd) $(id -u)"; echo oops >&2; exit 3`},
		Env:  map[string]string{"EXEC_ENV": "from-exec"}, Cwd: "/tmp", User: "nobody",
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Stdout != "from-create from-exec /tmp 65534\n" || r.Stderr != "oops\n" || r.Exit.ExitCode != 3 {
		t.Fatalf("got %+v", r)
	}
	_, err = s.Exec(t, &agent.ExecRequest{Argv: []string{"definitely-not-a-command"}})
	var ae *agent.AgentError
	if !errors.As(err, &ae) || ae.Code != agent.CodeCommandNotFound {
		t.Fatalf("missing command: %v", err)
	}
	// Binary output passes unchanged.
	r, err = s.Exec(t, &agent.ExecRequest{Argv: []string{"printf", `\377\000\303\n`}})
	if err != nil || r.Stdout != "\xff\x00\xc3\n" {
		t.Fatalf("binary output %q %v", r.Stdout, err)
	}
	// A timeout kills the process.
	r, err = s.Exec(t, &agent.ExecRequest{Argv: []string{"sleep", "30"}, TimeoutMS: 300})
	if err != nil || !r.Exit.TimedOut {
		t.Fatalf("timeout: %+v %v", r, err)
	}
}

func testReapsZombies(t *testing.T, h Harness) {
	s := Create(t, h, "conf-zombies")
	// Each shell exits at once, orphaning its background sleeper to PID 1.
	for i := 0; i < 20; i++ {
		s.Sh(t, "sleep 0.05 >/dev/null 2>&1 &")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		z := strings.TrimSpace(s.Sh(t, "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l"))
		if z == "0" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s zombies not reaped by PID 1", z)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func testNoHostNetwork(t *testing.T, h Harness) {
	s := Create(t, h, "conf-net")
	// A backend without network hooks gives loopback only: no other
	// interface has an address (a vm has an unconnected NIC, so that its
	// snapshots fit any network it may get later).
	if addrs := strings.TrimSpace(s.Sh(t, "ip -o -4 addr show | grep -v ' lo ' || true")); addrs != "" {
		t.Fatalf("sandbox has addresses beyond loopback: %s", addrs)
	}
	if addrs := strings.TrimSpace(s.Sh(t, "ip -o -6 addr show | grep -v ' lo ' || true")); addrs != "" {
		t.Fatalf("sandbox has IPv6 addresses beyond loopback: %s", addrs)
	}
	// Nothing of the host is routable.
	r, err := s.Exec(t, &agent.ExecRequest{Argv: []string{"sh", "-c", "cat /proc/net/route | wc -l"}})
	if err != nil || strings.TrimSpace(r.Stdout) != "1" {
		t.Fatalf("routes: %q %v", r.Stdout, err)
	}
}

func testDestroyIdempotent(t *testing.T, h Harness) {
	s := Create(t, h, "conf-destroy")
	s.Destroy(t)
	if err := h.Backend.Destroy(context.Background(), s.ID); err != nil {
		t.Fatalf("second destroy: %v", err)
	}
	if err := h.Backend.Destroy(context.Background(), "0000000000000000"); err != nil {
		t.Fatalf("destroy of an unknown id: %v", err)
	}
}

func testParallel(t *testing.T, h Harness) {
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			t.Run(fmt.Sprintf("sb%d", i), func(t *testing.T) {
				s := Create(t, h, fmt.Sprintf("conf-par-%d", i))
				if got := s.Sh(t, "hostname"); got != fmt.Sprintf("conf-par-%d\n", i) {
					t.Errorf("hostname %q", got)
				}
			})
		}(i)
	}
	wg.Wait()
}
