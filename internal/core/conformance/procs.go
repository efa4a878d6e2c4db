package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
)

// drain reads a process stream to its exit frame.
func drain(t *testing.T, p *agent.Process) (string, api.ExitStatus) {
	t.Helper()
	var out bytes.Buffer
	for {
		kind, b, err := p.Next()
		if err != nil {
			t.Fatalf("stream ended without exit (output %q): %v", out.String(), err)
		}
		switch kind {
		case api.FrameStdout, api.FrameStderr:
			out.Write(b)
		case api.FrameExit:
			var st api.ExitStatus
			json.Unmarshal(b, &st)
			return out.String(), st
		}
	}
}

func testProcesses(t *testing.T, h Harness) {
	s := Create(t, h, "conf-procs")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Background: survives its stream, lists, re-attaches from an offset.
	pid, err := s.Agent.Start(ctx, &agent.ExecRequest{Argv: []string{"sh", "-c", "echo one; sleep 0.2; echo two; sleep 0.2; exit 9"}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Agent.Attach(ctx, &agent.AttachRequest{PID: pid, Offset: 4})
	if err != nil {
		t.Fatal(err)
	}
	out, st := drain(t, p)
	p.Close()
	if out != "two\n" || st.ExitCode != 9 {
		t.Fatalf("attach from offset 4: %q %+v", out, st)
	}
	ps, err := s.Agent.Processes(ctx)
	if err != nil || len(ps) != 1 || ps[0].PID != pid || ps[0].Running {
		t.Fatalf("processes: %+v %v", ps, err)
	}

	// A terminal inside the sandbox, resized while it runs.
	p, err = s.Agent.Exec(ctx, &agent.ExecRequest{Argv: []string{"sh", "-c", "stty size; read x; stty size; tty"}, TTY: true, Rows: 10, Cols: 40})
	if err != nil {
		t.Fatal(err)
	}
	// Resize only once the first stty has reported the initial size (the
	// shell may take any time to get there under TCG); resize and input
	// are applied in order.
	var first bytes.Buffer
	for !strings.Contains(first.String(), "10 40") {
		kind, b, err := p.Next()
		if err != nil || kind == api.FrameExit {
			t.Fatalf("terminal ended before its first stty size (output %q): %v", first.String(), err)
		}
		first.Write(b)
	}
	p.Resize(50, 132)
	p.Write([]byte("go\n"))
	out, st = drain(t, p)
	out = first.String() + out
	p.Close()
	if !strings.Contains(out, "10 40") || !strings.Contains(out, "50 132") || !strings.Contains(out, "/dev/pts/") || st.ExitCode != 0 {
		t.Fatalf("terminal: %q %+v", out, st)
	}

	// A signal reaches the whole process group.
	pid, err = s.Agent.Start(ctx, &agent.ExecRequest{Argv: []string{"sh", "-c", "sleep 300 & wait"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Agent.SignalProcess(ctx, pid, "KILL"); err != nil {
		t.Fatal(err)
	}
	p, _ = s.Agent.Attach(ctx, &agent.AttachRequest{PID: pid})
	_, st = drain(t, p)
	p.Close()
	if st.Signal != "KILL" {
		t.Fatalf("after KILL: %+v", st)
	}
	deadline := time.Now().Add(10 * time.Second)
	for strings.Contains(s.Sh(t, "ps -eo comm"), "sleep") {
		if time.Now().After(deadline) {
			t.Fatal("the signal did not reach the process group")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
