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
	"github.com/nookhq/nook/internal/poll"
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

// logSink counts what a follow writes, and whether a line with mark
// came (a follow writes whole lines).
type logSink struct {
	mu   sync.Mutex
	n    int
	mark string
	saw  bool
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n += len(p)
	s.saw = s.saw || strings.Contains(string(p), s.mark)
	return len(p), nil
}

func (s *logSink) state() (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, s.saw
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
	sink := logSink{mark: "written-after-the-gib"}
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- l.Copy(fctx, &sink, 0, true, func() {}) }()
	defer func() { cancel(); <-done }()

	run := func(cmd ...string) {
		t.Helper()
		p, err := m.Exec(ctx, "logs", api.ExecRequest{Cmd: cmd})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		for {
			kind, _, err := p.Next()
			if err != nil || kind == api.FrameExit {
				return
			}
		}
	}
	run("truncate", "-s", "1G", "/.nook/agent.log")
	if err := poll.Until(ctx, poll.Options{Timeout: 10 * time.Second}, func() (bool, error) {
		n, _ := sink.state()
		return n > 0, nil
	}); err != nil {
		t.Fatalf("the follow wrote nothing of the grown log: %v", err)
	}
	// A line after the GiB: a follow that read the whole GiB would have
	// written it all before this line.
	run("sh", "-c", "echo written-after-the-gib >>/.nook/agent.log")
	if err := poll.Until(ctx, poll.Options{Timeout: 10 * time.Second}, func() (bool, error) {
		_, saw := sink.state()
		return saw, nil
	}); err != nil {
		t.Fatalf("the follow did not write the line after the GiB: %v", err)
	}
	if n, _ := sink.state(); n > 2*maxLogRead {
		t.Fatalf("the follow read %d bytes of a sparse GiB, want at most %d", n, 2*maxLogRead)
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if target, _ := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); strings.HasSuffix(target, "/.nook/agent.log") {
			t.Fatalf("the follow holds the log open between reads: fd %s -> %s", fd.Name(), target)
		}
	}
}
