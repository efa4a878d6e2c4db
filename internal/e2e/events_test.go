package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// bgNook is a CLI command running in the background (nook events, nook
// logs -f): its output is collected a line at a time.
type bgNook struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func (d *daemon) background(t *testing.T, args ...string) *bgNook {
	t.Helper()
	b := &bgNook{cmd: exec.Command(d.bin, args...), done: make(chan struct{})}
	b.cmd.Env = append(b.cmd.Environ(), "NOOK_HOST=unix://"+d.socket())
	out, err := b.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := b.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(b.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			b.mu.Lock()
			b.lines = append(b.lines, sc.Text())
			b.mu.Unlock()
		}
		io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() { b.stop() })
	return b
}

// stop ends the command (by its PID) and waits for it.
func (b *bgNook) stop() {
	if b.cmd.Process == nil || b.cmd.ProcessState != nil {
		return
	}
	b.cmd.Process.Kill()
	<-b.done
	b.cmd.Wait()
}

func (b *bgNook) output() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.lines...)
}

// events are the background `nook events --json`'s events so far.
func (b *bgNook) events(t *testing.T) []api.Event {
	t.Helper()
	var out []api.Event
	for _, l := range b.output() {
		var e api.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("nook events --json printed %q: %v", l, err)
		}
		out = append(out, e)
	}
	return out
}

// TestEventsAndLogs: `nook events --json` sees a container sandbox's
// lifecycle, in order, with who did what (the host, or nook itself for an
// idle pause); --since replays it and the filters filter; `nook logs`
// shows what the sandbox wrote to its agent log, and -f what it writes
// later; a log the backend does not have is said so.
func TestEventsAndLogs(t *testing.T) {
	d := newDaemon(t, "--min-idle-pause", "1s")
	// --since: whatever the stream's subscription raced with is replayed
	// (the daemon is new: nothing older is there).
	ev := d.background(t, "events", "--json", "--since", "1h")
	d.must("create", "--name", "ev-a")
	waitWithin(t, "the created event", 30*time.Second, func() bool { return len(ev.events(t)) > 0 })
	d.must("pause", "ev-a")
	d.must("resume", "ev-a")
	d.must("fork", "ev-a", "--name", "ev-fork")
	d.must("rm", "ev-fork")
	d.must("create", "--name", "ev-idle", "--idle-pause", "2s")

	// Logs, meanwhile: what the sandbox writes to its agent's log.
	d.must("exec", "ev-a", "--", "sh", "-c", "echo first-line-from-the-sandbox >>/.nook/agent.log")
	if out := d.must("logs", "ev-a"); !strings.Contains(out, "first-line-from-the-sandbox\n") {
		t.Fatalf("nook logs ev-a:\n%s", out)
	}
	// (The agent may log a line of its own at any time: only counted.)
	if out := d.must("logs", "--tail", "1", "ev-a"); strings.Count(out, "\n") != 1 {
		t.Fatalf("nook logs --tail 1 ev-a: %q", out)
	}
	follow := d.background(t, "logs", "-f", "--tail", "0", "ev-a")
	// The follow reads the log first at some moment after its command
	// starts: a line written before then is old to it (--tail 0). A line
	// is written every half second until one written after it shows.
	var wrote time.Time
	waitWithin(t, "nook logs -f to print a later line", 15*time.Second, func() bool {
		if time.Since(wrote) > 500*time.Millisecond {
			d.must("exec", "ev-a", "--", "sh", "-c", "echo later-line >>/.nook/agent.log")
			wrote = time.Now()
		}
		return slices.Contains(follow.output(), "later-line")
	})
	follow.stop()
	if out := strings.Join(follow.output(), "\n"); strings.Contains(out, "first-line-from-the-sandbox") {
		t.Fatalf("nook logs -f --tail 0 printed an old line:\n%s", out)
	}
	d.expectCLI(t, []cliCase{
		{[]string{"logs", "--log", "console", "ev-a"}, 1, "a container has no console"},
		{[]string{"events", "--type", "exploded"}, 1, `event type "exploded" is not known`},
		{[]string{"events", "--since", "yesterday"}, 1, "neither a duration"},
	})

	waitWithin(t, "the idle pause's event", 30*time.Second, func() bool {
		for _, e := range ev.events(t) {
			if e.Type == api.EventPausedByIdle {
				return true
			}
		}
		return false
	})
	// A sandbox's token sees its own sandbox's events only.
	token := strings.TrimSpace(d.must("token", "create", "--name", "box", "--scope", "sandbox:ev-a"))
	mine := 0
	for _, e := range ev.events(t) {
		if e.Sandbox == "ev-a" {
			mine++
		}
	}
	// (Through the SDK: the CLI sends no token on the unix socket.)
	cl, err := sdk.New("unix://"+d.socket(), token)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	stream, err := cl.Events(ctx, sdk.EventsOptions{Since: "1h"})
	if err != nil {
		t.Fatal(err)
	}
	for range mine {
		e, err := stream.Next()
		if err != nil {
			t.Fatalf("the sandbox token's stream: %v", err)
		}
		if e.Sandbox != "ev-a" {
			t.Errorf("a token for ev-a sees another sandbox's event: %+v", e)
		}
	}
	stream.Close()
	d.must("rm", "ev-idle")
	d.must("rm", "ev-a")
	waitWithin(t, "ev-a's destroyed event", 30*time.Second, func() bool {
		es := ev.events(t)
		return len(es) > 0 && es[len(es)-1].Type == api.EventDestroyed && es[len(es)-1].Sandbox == "ev-a"
	})

	type step struct{ typ, sandbox, actor, reason string }
	want := []step{
		{api.EventCreated, "ev-a", "host", ""},
		{api.EventPaused, "ev-a", "host", ""},
		{api.EventResumed, "ev-a", "host", ""},
		{api.EventSnapshotTaken, "ev-a", "host", ""},
		{api.EventForked, "ev-fork", "host", ""},
		{api.EventDestroyed, "ev-fork", "host", ""},
		{api.EventCreated, "ev-idle", "host", ""},
		{api.EventPausedByIdle, "ev-idle", "nook", "idle for 2s"},
		{api.EventDestroyed, "ev-idle", "host", ""},
		{api.EventDestroyed, "ev-a", "host", ""},
	}
	all := ev.events(t)
	var got []step
	var seq int64
	for _, e := range all {
		if e.Seq <= seq || e.Time.IsZero() || e.SandboxID == "" || e.Isolation != api.IsolationContainer || e.Template != "base" {
			t.Errorf("event %+v: out of order, or without its time, ID, isolation or template", e)
		}
		seq = e.Seq
		s := step{e.Type, e.Sandbox, e.Actor, ""}
		if e.Type == api.EventPausedByIdle {
			s.reason = e.Reason
		}
		got = append(got, s)
	}
	if len(got) != len(want) {
		t.Fatalf("events:\n%+v\nwant:\n%+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("event %d is %+v, want %+v; all:\n%+v", i, got[i], want[i], got)
		}
	}

	// --since replays them; --sandbox and --type filter (the replay ends
	// where the stream would wait: the CLI is stopped once it printed them).
	replay := d.background(t, "events", "--since", "10m", "--sandbox", "ev-a", "--type", "paused", "--type", "destroyed")
	waitWithin(t, "the replay", 15*time.Second, func() bool { return len(replay.output()) >= 2 })
	replay.stop()
	lines := replay.output()
	if len(lines) != 2 || !strings.HasSuffix(lines[0], " paused ev-a (container, base) by host") || !strings.HasSuffix(lines[1], " destroyed ev-a (container, base) by host") {
		t.Fatalf("nook events --since 10m --sandbox ev-a --type paused --type destroyed:\n%s", strings.Join(lines, "\n"))
	}
	if _, err := time.Parse(time.RFC3339, strings.Fields(lines[0])[0]); err != nil {
		t.Fatalf("event line %q does not start with its time: %v", lines[0], err)
	}
}

// TestVMLogs: `nook logs` shows a vm's serial console, where its guest
// writes, -f sees a later line, and its agent's own log is said to be
// there.
func TestVMLogs(t *testing.T) {
	requireVM(t)
	d := newDaemon(t)
	// The shape the other vm tests use, so the template snapshot is shared.
	d.must("create", "--isolation", "vm", "--name", "vmlog", "--cpus", "1", "--memory", "512M")
	follow := d.background(t, "logs", "-f", "--tail", "0", "vmlog")
	// As in TestEventsAndLogs: written until a line written after the
	// follow's first read shows.
	var wrote time.Time
	waitWithin(t, "nook logs -f to print the console line", 30*time.Second, func() bool {
		if time.Since(wrote) > time.Second {
			d.must("exec", "vmlog", "--", "sh", "-c", "echo written-to-the-console >/dev/console")
			wrote = time.Now()
		}
		return strings.Contains(strings.Join(follow.output(), "\n"), "written-to-the-console")
	})
	follow.stop()
	if out := d.must("logs", "vmlog"); !strings.Contains(out, "written-to-the-console") {
		t.Fatalf("nook logs vmlog:\n%s", out)
	}
	d.expectCLI(t, []cliCase{{[]string{"logs", "--log", "agent", "vmlog"}, 1, "a vm's agent has no log of its own"}})
	// A vm's stats: QEMU's CPU and memory (its cgroup), its disk's top
	// layer on the host.
	var st []api.SandboxStats
	if err := json.Unmarshal([]byte(d.must("stats", "vmlog", "--no-stream", "--json")), &st); err != nil || len(st) != 1 {
		t.Fatalf("nook stats vmlog: %v %+v", err, st)
	}
	if s := st[0]; s.Isolation != "vm" || s.CPUSeconds <= 0 || s.MemoryBytes <= 0 || s.MemoryLimitBytes <= 0 || s.DiskBytes <= 0 {
		t.Errorf("a vm's stats: %+v", s)
	}
	d.must("rm", "vmlog")
}
