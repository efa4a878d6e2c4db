package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/errdefs"
)

// A sandbox whose agent (its PID 1) is stopped, as a tracer in the
// sandbox would stop it, fails calls as unavailable within the agent
// timeout instead of hanging them, cuts the exec that was streaming, and
// serves again once the agent runs.
func TestEscapeAgentWedgedContainer(t *testing.T) {
	const timeout = time.Second
	m, res := newManagerWith(t, func(c *Config) { c.AgentTimeout = timeout })
	ctx := context.Background()
	sb, err := m.Create(ctx, api.CreateSandboxRequest{Name: "wedged"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "wedged") })
	b, err := os.ReadFile(filepath.Join(res.StateDir, sb.ID, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}

	p, err := m.Exec(ctx, "wedged", api.ExecRequest{Cmd: []string{"sh", "-c", "echo ready; exec sleep 100"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if kind, out, err := p.Next(); err != nil || kind != api.FrameStdout || string(out) != "ready\n" {
		t.Fatalf("exec: %d %q %v", kind, out, err)
	}

	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); procState(pid) != "T"; {
		if time.Now().After(deadline) {
			t.Fatalf("the agent (pid %d) did not stop: state %q", pid, procState(pid))
		}
		time.Sleep(5 * time.Millisecond)
	}
	bound := 2*timeout + 5*time.Second // a probe interval and a timeout, and slack for a busy machine
	unavailable := func(what string, err error, took time.Duration) {
		t.Helper()
		if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "agent of sandbox wedged did not answer within 1s") || !strings.Contains(err.Error(), "stopped or traced") {
			t.Fatalf("%s with the agent stopped: %v", what, err)
		}
		if took > bound {
			t.Fatalf("%s: the error took %s", what, took)
		}
		t.Logf("%s: unavailable after %s", what, took.Round(time.Millisecond))
	}
	start := time.Now()
	_, err = m.StatFile(ctx, "wedged", "/")
	unavailable("stat", err, time.Since(start))
	start = time.Now()
	_, err = m.Exec(ctx, "wedged", api.ExecRequest{Cmd: []string{"true"}})
	unavailable("exec", err, time.Since(start))
	// The exec that was streaming ends too (its command is quiet, but the
	// agent no longer answers pings).
	start = time.Now()
	_, _, err = p.Next()
	var na *agent.NoAnswerError
	if !errors.As(err, &na) || time.Since(start) > bound {
		t.Fatalf("the streaming exec after %s: %v", time.Since(start), err)
	}

	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := m.StatFile(ctx, "wedged", "/"); err != nil {
		t.Fatalf("stat once the agent runs again: %v", err)
	}
	p2, err := m.Exec(ctx, "wedged", api.ExecRequest{Cmd: []string{"echo", "back"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if kind, out, err := p2.Next(); err != nil || kind != api.FrameStdout || string(out) != "back\n" {
		t.Fatalf("exec once the agent runs again: %d %q %v", kind, out, err)
	}
}

// procState is the state letter of /proc/PID/stat ("" if it is gone).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return ""
	}
	return string(b[i+2])
}
