package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
)

func TestLastLines(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"a\nb\nc\n", -1, "a\nb\nc\n"},
		{"a\nb\nc\n", 0, ""},
		{"a\nb\nc\n", 1, "c\n"},
		{"a\nb\nc\n", 2, "b\nc\n"},
		{"a\nb\nc\n", 3, "a\nb\nc\n"},
		{"a\nb\nc\n", 9, "a\nb\nc\n"},
		{"a\nb\nc", 1, "c"},
		{"a\nb\nc", 2, "b\nc"},
		{"", 2, ""},
		{"\n\n", 1, "\n"},
	} {
		if got := string(lastLines([]byte(tc.in), tc.n)); got != tc.want {
			t.Errorf("lastLines(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// logSink counts what a follow writes.
type logSink struct {
	mu sync.Mutex
	n  int
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n += len(p)
	return len(p), nil
}

func (s *logSink) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// A follow of a container's agent log holds nothing of its root open
// between reads (a stop could not unmount its disk), and a log the
// sandbox makes huge (a sparse GiB) is read from its last MiB, not whole.
func TestLogFollowBounded(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: "logs"}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Destroy(ctx, "logs") })
	l, err := m.OpenLog(ctx, "logs", core.LogAgent)
	if err != nil {
		t.Fatal(err)
	}
	var sink logSink
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Copy(fctx, &sink, 0, true, func() {}) }()
	defer func() { cancel(); <-done }()

	p, err := m.Exec(ctx, "logs", api.ExecRequest{Cmd: []string{"truncate", "-s", "1G", "/.nook/agent.log"}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		kind, _, err := p.Next()
		if err != nil || kind == api.FrameExit {
			break
		}
	}
	p.Close()
	deadline := time.Now().Add(10 * time.Second)
	for sink.total() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if sink.total() == 0 {
		t.Fatal("the follow wrote nothing of the grown log")
	}
	// Four more looks at a log that does not grow: nothing more.
	time.Sleep(4 * logPoll)
	if n := sink.total(); n > 2*maxLogRead {
		t.Fatalf("the follow read %d bytes of a sparse GiB, want at most %d", n, 2*maxLogRead)
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if target, _ := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); strings.HasSuffix(target, "/.nook/agent.log") {
			t.Fatalf("the follow holds the log open between reads: fd %s -> %s", fd.Name(), target)
		}
	}
}
