package daemon

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/testutil"
)

// TestEscapeDynamicAgent: a dynamically linked nook-agent (built without
// CGO_ENABLED=0) makes every vm's kernel panic at boot; the daemon
// refuses it at start, with a message that says how to build a good one,
// and creates nothing.
func TestEscapeDynamicAgent(t *testing.T) {
	dyn, err := os.ReadFile("/bin/true") // a dynamically linked executable on every Debian host
	if err != nil {
		t.Skipf("no /bin/true to stand for a dynamic agent: %v", err)
	}
	dir := t.TempDir()
	agentPath := filepath.Join(dir, "nook-agent")
	if err := os.WriteFile(agentPath, dyn, 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	m, err := New(context.Background(), Config{
		DataDir: data, RunDir: filepath.Join(dir, "run"), AgentBinary: agentPath, WarmPool: -1,
		CgroupParent: testutil.RandomName("nook-agentbin-"), Log: slog.New(slog.DiscardHandler),
	})
	if err == nil {
		m.Close()
	}
	want := agentPath + " is dynamically linked (it needs /lib64/ld-linux-x86-64.so.2); build it with CGO_ENABLED=0 (make build does)"
	if err == nil || err.Error() != want {
		t.Fatalf("error %v,\nwant %s", err, want)
	}
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("error %v is not a failed precondition", err)
	}
	if _, err := os.Stat(data); err == nil {
		t.Error("the daemon created its data directory before refusing the agent")
	}
	// Not an executable at all.
	os.WriteFile(agentPath, []byte("#!/bin/sh\n"), 0o755)
	if err := checkAgentBinary(agentPath); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a shell script as the agent: %v", err)
	}
	// A missing binary is the backends' to report.
	if err := checkAgentBinary(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("a missing agent: %v", err)
	}
}

// The static agent make build writes is accepted.
func TestStaticAgentAccepted(t *testing.T) {
	if err := checkAgentBinary(testutil.AgentBinary(t)); err != nil {
		t.Fatal(err)
	}
}

// FuzzAgentELF: whatever the file holds, the check answers without
// panicking the daemon.
func FuzzAgentELF(f *testing.F) {
	if b, err := os.ReadFile("/bin/true"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("\x7fELF\x02\x01\x01\x00"))
	f.Add([]byte("#!/bin/sh\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkAgentELF("nook-agent", bytes.NewReader(data))
	})
}
