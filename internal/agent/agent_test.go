package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"

	"github.com/nookhq/nook/internal/poll"
)

// startAgent serves the agent in-process on a unix socket (without
// reaping every child, since the test binary is not PID 1).
func startAgent(t *testing.T) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := NewServer(slog.New(slog.DiscardHandler), false, false)
	go srv.Serve(ctx, ln)
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(func() { c.Close(); cancel() })
	return c
}

type result struct {
	stdout, stderr bytes.Buffer
	exit           api.ExitStatus
}

func run(t *testing.T, c *Client, req *ExecRequest) (*result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := c.Exec(ctx, req)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	var r result
	for {
		kind, b, err := p.Next()
		if err != nil {
			t.Fatalf("stream ended without exit: %v", err)
		}
		switch kind {
		case api.FrameStdout:
			r.stdout.Write(b)
		case api.FrameStderr:
			r.stderr.Write(b)
		case api.FrameExit:
			if err := json.Unmarshal(b, &r.exit); err != nil {
				t.Fatal(err)
			}
			return &r, nil
		}
	}
}

func TestExec(t *testing.T) {
	c := startAgent(t)
	if _, err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	r, err := run(t, c, &ExecRequest{Argv: []string{"sh", "-c", `echo out; echo err >&2; printf '\377\000\303'; echo "$FOO $(pwd)"; exit 7`}, Env: map[string]string{"FOO": "bar"}, Cwd: dir})
	if err != nil {
		t.Fatal(err)
	}
	want := "out\n\xff\x00\xc3bar " + dir + "\n"
	if r.stdout.String() != want || r.stderr.String() != "err\n" || r.exit.ExitCode != 7 {
		t.Fatalf("stdout %q stderr %q exit %+v", r.stdout.String(), r.stderr.String(), r.exit)
	}
}

func TestConfigureSetsBaseEnv(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	if err := c.Configure(ctx, &ConfigureRequest{Hostname: "box-1", Env: map[string]string{"TOKENLESS": "yes"}}); err != nil {
		t.Fatal(err)
	}
	r, err := run(t, c, &ExecRequest{Argv: []string{"sh", "-c", "echo $TOKENLESS"}})
	if err != nil || r.stdout.String() != "yes\n" {
		t.Fatalf("%v %q", err, r.stdout.String())
	}
	err = c.Configure(ctx, &ConfigureRequest{Hostname: "Not A Name"})
	var ae *AgentError
	if !errors.As(err, &ae) || !strings.Contains(ae.Message, "DNS label") {
		t.Fatalf("bad hostname: %v", err)
	}
	// A wake (a vm resumed from a pause) sets only the clock and the seed:
	// no hostname needed, and the environment stays.
	if err := c.Configure(ctx, &ConfigureRequest{WakeOnly: true, Seed: []byte("fresh")}); err != nil {
		t.Fatal(err)
	}
	if r, err := run(t, c, &ExecRequest{Argv: []string{"sh", "-c", "echo $TOKENLESS"}}); err != nil || r.stdout.String() != "yes\n" {
		t.Fatalf("after a wake: %v %q", err, r.stdout.String())
	}
	err = c.Configure(ctx, &ConfigureRequest{WakeOnly: true, Hostname: "box-2"})
	if !errors.As(err, &ae) || !strings.Contains(ae.Message, "only the time and the seed") {
		t.Fatalf("a wake that sets a hostname: %v", err)
	}
}

func TestExecStdinAndSignal(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	p, err := c.Exec(ctx, &ExecRequest{Argv: []string{"cat"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	p.Write([]byte("hello"))
	p.CloseStdin()
	var out bytes.Buffer
	for {
		k, b, err := p.Next()
		if err != nil {
			t.Fatal(err)
		}
		if k == api.FrameStdout {
			out.Write(b)
		}
		if k == api.FrameExit {
			break
		}
	}
	p.Close()
	if out.String() != "hello" {
		t.Fatalf("cat echoed %q", out.String())
	}

	p, err = c.Exec(ctx, &ExecRequest{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Signal("TERM")
	for {
		k, b, err := p.Next()
		if err != nil {
			t.Fatal(err)
		}
		if k == api.FrameExit {
			var st api.ExitStatus
			json.Unmarshal(b, &st)
			if st.Signal != "TERM" || st.ExitCode != -1 {
				t.Fatalf("exit %+v", st)
			}
			return
		}
	}
}

func TestExecTimeout(t *testing.T) {
	c := startAgent(t)
	start := time.Now()
	r, err := run(t, c, &ExecRequest{Argv: []string{"sleep", "60"}, TimeoutMS: 200})
	if err != nil {
		t.Fatal(err)
	}
	if !r.exit.TimedOut || r.exit.Signal != "KILL" || time.Since(start) > 10*time.Second {
		t.Fatalf("exit %+v after %v", r.exit, time.Since(start))
	}
}

func TestExecRefusals(t *testing.T) {
	c := startAgent(t)
	cases := []struct {
		req  ExecRequest
		code string
		msg  string
	}{
		{ExecRequest{Argv: []string{"no-such-command-xyz"}}, CodeCommandNotFound, "not found"},
		{ExecRequest{Argv: []string{"/no/such/binary"}}, CodeCommandNotFound, "no such file"},
		{ExecRequest{Argv: []string{"true"}, Cwd: "/no/such/dir"}, CodeInvalidArgument, "does not exist"},
		{ExecRequest{Argv: []string{"true"}, User: "no-such-user-xyz"}, CodeInvalidArgument, "does not exist"},
		{ExecRequest{Argv: []string{}}, CodeInvalidArgument, "no command"},
		{ExecRequest{Argv: []string{"a\x00b"}}, CodeInvalidArgument, "NUL"},
	}
	for _, tc := range cases {
		_, err := run(t, c, &tc.req)
		var ae *AgentError
		if !errors.As(err, &ae) || ae.Code != tc.code || !strings.Contains(ae.Message, tc.msg) {
			t.Errorf("%v: got %v", tc.req.Argv, err)
		}
	}
}

// A client that disconnects mid-stream kills its foreground process, and the agent keeps serving.
func TestDisconnectKillsForegroundProcess(t *testing.T) {
	c := startAgent(t)
	marker := filepath.Join(t.TempDir(), "pid")
	p, err := c.Exec(context.Background(), &ExecRequest{Argv: []string{"sh", "-c", "echo $$ > " + marker + "; exec sleep 60"}})
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(marker); err == nil && len(b) > 1 {
			pid = p.PID
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.Close()
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if syscall.Kill(pid, 0) == nil {
		t.Fatalf("process %d survived its client", pid)
	}
	if _, err := c.Ping(context.Background()); err != nil {
		t.Fatalf("agent unhealthy after disconnect: %v", err)
	}
}

// A flood of output is carried with bounded buffers: the agent writes only
// as fast as the reader consumes.
func TestLargeOutput(t *testing.T) {
	c := startAgent(t)
	r, err := run(t, c, &ExecRequest{Argv: []string{"head", "-c", "50000000", "/dev/zero"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.stdout.Len() != 50000000 || r.exit.ExitCode != 0 {
		t.Fatalf("got %d bytes, exit %+v", r.stdout.Len(), r.exit)
	}
}

// The agent binary must never import the daemon's packages. A package of
// nook's own outside internal/agent may be shared only when it is a leaf
// that imports no other package of nook's (as internal/quickack and
// internal/poll).
func TestAgentDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "github.com/nookhq/nook/cmd/nook-agent").Output()
	if err != nil {
		t.Skipf("go list unavailable: %v", err)
	}
	const mod = "github.com/nookhq/nook/"
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		dep, imports := f[0], f[1:]
		if strings.Contains(dep, "sqlite") || strings.Contains(dep, "net/http") {
			t.Errorf("nook-agent imports %s", dep)
		}
		if !strings.HasPrefix(dep, mod) || strings.HasPrefix(dep, mod+"internal/agent") ||
			dep == mod+"api" || dep == mod+"cmd/nook-agent" {
			continue
		}
		for _, imp := range imports {
			if strings.HasPrefix(imp, mod) {
				t.Errorf("nook-agent imports %s, which is not a leaf (it imports %s)", dep, imp)
			}
		}
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(`{"op":"exec","exec":{"argv":["sh","-c","x"],"env":{"A":"b"},"timeout_ms":5}}`))
	f.Add([]byte(`{"op":"ping"}`))
	f.Add([]byte(`{"op":"exec"}`))
	f.Add([]byte(`{"op":"configure","configure":{"hostname":"a","env":{"K":"v"}}}`))
	f.Add([]byte(`{"op":"stat","files":{"path":"/etc/../etc/passwd"}}`))
	f.Add([]byte(`{"op":"read","files":{"path":"/root/f","offset":10,"length":5}}`))
	f.Add([]byte(`{"op":"write","files":{"path":"/root/f","mode":493,"parents":true}}`))
	f.Add([]byte(`{"op":"move","files":{"path":"/a","dest":"b"}}`))
	f.Add([]byte(`{"op":"chmod","files":{"path":"/a","mode":4095}}`))
	f.Add([]byte(`{"op":"watch","files":{"path":"/tmp","recursive":true}}`))
	f.Add([]byte(`{"op":"attach","attach":{"pid":12,"offset":4,"input":true}}`))
	f.Add([]byte(`{"op":"signal","signal":{"pid":12,"signal":"TERM"}}`))
	f.Add([]byte(`{"op":"exec","exec":{"argv":["sh"],"tty":true,"rows":24,"cols":80,"background":true}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRequest(data)
		if err != nil {
			return
		}
		if r.Op == OpExec && (r.Exec == nil || len(r.Exec.Argv) == 0 || r.Exec.Argv[0] == "") {
			t.Fatalf("accepted an exec with no command: %s", data)
		}
		if r.Op == OpAttach && (r.Attach == nil || r.Attach.PID <= 0 || r.Attach.Offset < 0) {
			t.Fatalf("accepted a bad attach: %s", data)
		}
		if r.Op == OpSignal && (r.Signal == nil || r.Signal.PID <= 0) {
			t.Fatalf("accepted a bad signal: %s", data)
		}
		if r.Op == OpConfigure && (r.Configure == nil || !hostnameRE.MatchString(r.Configure.Hostname)) {
			t.Fatalf("accepted a configure with a bad hostname: %s", data)
		}
		if r.Files != nil && (r.Op == OpStat || r.Op == OpMove || r.Op == OpWrite) && CheckPath(r.Files.Path) != nil {
			t.Fatalf("accepted a file op with a bad path: %s", data)
		}
	})
}

func TestBackgroundSessionOutliveClientAndReattach(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	pid, err := c.Start(ctx, &ExecRequest{Argv: []string{"sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.1; done; echo err >&2; exit 4"}})
	if err != nil {
		t.Fatal(err)
	}
	// Re-attach from offset 6 (after "line1\n") and follow to the exit.
	p, err := c.Attach(ctx, &AttachRequest{PID: pid, Offset: 6})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var st api.ExitStatus
	for {
		k, b, err := p.Next()
		if err != nil {
			t.Fatalf("attach stream: %v", err)
		}
		if k == api.FrameStdout || k == api.FrameStderr {
			out.Write(b)
		}
		if k == api.FrameExit {
			json.Unmarshal(b, &st)
			break
		}
	}
	p.Close()
	if out.String() != "line2\nline3\nerr\n" || st.ExitCode != 4 {
		t.Fatalf("attach from offset 6: %q %+v", out.String(), st)
	}
	procs, err := c.Processes(ctx)
	if err != nil || len(procs) != 1 || procs[0].Running || procs[0].Exit.ExitCode != 4 || procs[0].OutputTo != 22 {
		t.Fatalf("processes: %+v %v", procs, err)
	}
	// A finished process can still be read from the start, and cannot be signalled.
	p, err = c.Attach(ctx, &AttachRequest{PID: pid})
	if err != nil {
		t.Fatal(err)
	}
	k, b, _ := p.Next()
	if k != api.FrameStdout || !strings.HasPrefix(string(b), "line1") {
		t.Fatalf("replay: %d %q", k, b)
	}
	p.Close()
	var ae *AgentError
	if err := c.SignalProcess(ctx, pid, "TERM"); !errors.As(err, &ae) || !strings.Contains(ae.Message, "already exited") {
		t.Fatalf("signal a finished process: %v", err)
	}
	if _, err := c.Attach(ctx, &AttachRequest{PID: 999999}); !errors.As(err, &ae) || ae.Code != CodeNotFound {
		t.Fatalf("attach to an unknown pid: %v", err)
	}
	if _, err := c.Attach(ctx, &AttachRequest{PID: pid, Offset: 1 << 40}); !errors.As(err, &ae) || ae.Code != CodeInvalidArgument {
		t.Fatalf("attach past the end: %v", err)
	}
}

func TestBackgroundSignalAndDetach(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	pid, err := c.Start(ctx, &ExecRequest{Argv: []string{"sleep", "60"}})
	if err != nil {
		t.Fatal(err)
	}
	// Attaching and detaching leaves it running.
	p, err := c.Attach(ctx, &AttachRequest{PID: pid})
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	time.Sleep(100 * time.Millisecond)
	if syscall.Kill(pid, 0) != nil {
		t.Fatal("detaching killed a background process")
	}
	if err := c.SignalProcess(ctx, pid, "KILL"); err != nil {
		t.Fatal(err)
	}
	p, _ = c.Attach(ctx, &AttachRequest{PID: pid})
	defer p.Close()
	for {
		k, b, err := p.Next()
		if err != nil {
			t.Fatal(err)
		}
		if k == api.FrameExit {
			var st api.ExitStatus
			json.Unmarshal(b, &st)
			if st.Signal != "KILL" {
				t.Fatalf("exit %+v", st)
			}
			return
		}
	}
}

func TestTerminalSession(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	p, err := c.Exec(ctx, &ExecRequest{Argv: []string{"sh", "-c", `stty size; read line; echo "got:$line"; tty >/dev/null && echo is-a-tty`}, TTY: true, Rows: 30, Cols: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Write([]byte("hello\n"))
	var out bytes.Buffer
	for {
		k, b, err := p.Next()
		if err != nil {
			t.Fatalf("terminal stream: %v (output %q)", err, out.String())
		}
		if k == api.FrameStdout {
			out.Write(b)
		}
		if k == api.FrameExit {
			break
		}
	}
	for _, want := range []string{"30 100", "got:hello", "is-a-tty"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("terminal output %q lacks %q", out.String(), want)
		}
	}
}

func TestRingBounded(t *testing.T) {
	r := newRing()
	chunk := bytes.Repeat([]byte("x"), 1000)
	for i := 0; i < 3000; i++ {
		r.write(api.FrameStdout, chunk)
	}
	from, to := r.bounds()
	if to != 3000000 || to-from > ringSize+1000 || to-from < ringSize-1000 {
		t.Fatalf("ring keeps [%d, %d)", from, to)
	}
	stop := false
	_, data, next, ok := r.next(0, &stop) // an offset that was dropped starts at the oldest kept
	if !ok || next-int64(len(data)) != from {
		t.Fatalf("read from a dropped offset: next %d len %d from %d", next, len(data), from)
	}
}

// TestQuiesce: Quiesce refuses while a request is open (it is never cut
// off), closes an idle session, and new requests wait for the release.
func TestQuiesce(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	p, err := c.Exec(ctx, &ExecRequest{Argv: []string{"sleep", "30"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Quiesce(); ok {
		t.Fatal("Quiesce accepted a session with an exec in flight")
	}
	if n := c.Streams(); n != 1 {
		t.Fatalf("the exec's stream is gone after a refused Quiesce: %d streams", n)
	}
	p.Signal("KILL")
	for kind, _, err := p.Next(); kind != api.FrameExit; kind, _, err = p.Next() {
		if err != nil {
			t.Fatalf("exec stream: %v", err)
		}
	}
	p.Close()
	// At once: the stream may linger in the session until the agent's
	// close arrives, but the request is over (under load that took long
	// enough for a snapshot to give up on the memory).
	release, ok := c.Quiesce()
	if !ok {
		t.Fatalf("Quiesce refused once the exec was closed (%d streams in the session)", c.Streams())
	}
	c.mu.Lock()
	closed := c.sess == nil
	c.mu.Unlock()
	if !closed {
		t.Fatal("Quiesce left the session open")
	}
	// A request while quiesced waits; one whose context ends says why.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Ping(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ping while quiesced: %v, want a deadline error", err)
	}
	done := make(chan error, 1)
	go func() { _, err := c.Ping(ctx); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("ping went through while quiesced: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	release()
	release() // twice is harmless
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ping still waits after the release")
	}
}

// A background exec with Follow streams the session on the same stream,
// takes input there, and its close detaches: the session runs on and
// keeps its output for an attach.
func TestBackgroundFollow(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	p, err := c.Exec(ctx, &ExecRequest{Argv: []string{"sh", "-c", "read x; echo got $x; read y; echo then $y"}, Background: true, Follow: true, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if p.PID <= 0 {
		t.Fatalf("pid %d", p.PID)
	}
	if _, err := p.Write([]byte("one\n")); err != nil {
		t.Fatal(err)
	}
	k, b, err := p.Next()
	if err != nil || k != api.FrameStdout || string(b) != "got one\n" {
		t.Fatalf("first output: %d %q %v", k, b, err)
	}
	p.Close() // detach: the session waits for its second line
	procs, err := c.Processes(ctx)
	if err != nil || len(procs) != 1 || !procs[0].Running {
		t.Fatalf("after the follower left: %+v %v", procs, err)
	}
	in, err := c.Attach(ctx, &AttachRequest{PID: p.PID, Input: true})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if _, err := in.Write([]byte("two\n")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	for {
		k, b, err := in.Next()
		if err != nil {
			t.Fatalf("attach: %v", err)
		}
		if k == api.FrameStdout {
			out.Write(b)
		}
		if k == api.FrameExit {
			break
		}
	}
	if out.String() != "got one\nthen two\n" {
		t.Fatalf("the session's output: %q", out.String())
	}
}

// Dial carries a TCP connection to a port on the sandbox's loopback both
// ways, half-closes included; a port nobody listens on is not found.
func TestDial(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		b, _ := io.ReadAll(conn) // to the client's half-close
		conn.Write(append([]byte("echo: "), b...))
	}()
	port := l.Addr().(*net.TCPAddr).Port
	conn, err := c.Dial(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("hello"))
	conn.Close() // a yamux close is a half-close: the answer still comes
	got, err := io.ReadAll(conn)
	if err != nil || string(got) != "echo: hello" {
		t.Fatalf("through the dial: %q %v", got, err)
	}
	l2, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := l2.Addr().(*net.TCPAddr).Port
	l2.Close()
	var ae *AgentError
	if _, err := c.Dial(ctx, closed); !errors.As(err, &ae) || ae.Code != CodeNotFound {
		t.Fatalf("dial of a closed port: %v", err)
	}
}

// A client retired while its dial is under way drops the connection the
// dial made: left open, it would hold a vm's agent port (one connection
// at a time) from the client that replaced it (a guest reboot's start
// then never reached the new agent).
func TestCloseDuringDial(t *testing.T) {
	release := make(chan struct{})
	dialed := make(chan net.Conn, 1)
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
		<-release
		a, b := net.Pipe()
		dialed <- b
		return a, nil
	})
	errc := make(chan error, 1)
	go func() {
		_, err := c.Ping(context.Background())
		errc <- err
	}()
	// The dial is under way once the client has asked for it.
	if err := poll.Until(context.Background(), poll.Options{Timeout: 10 * time.Second}, func() (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.dialing != nil, nil
	}); err != nil {
		t.Fatalf("the dial did not start: %v", err)
	}
	c.Retire()
	close(release)
	if err := <-errc; !errors.Is(err, errClientClosed) {
		t.Fatalf("a request on a client closed during its dial: %v", err)
	}
	peer := <-dialed
	peer.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 64)
	for {
		if _, err := peer.Read(buf); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatal("the connection dialed for a closed client stays open")
			}
			break
		}
	}
	if _, err := c.Ping(context.Background()); !errors.Is(err, errClientClosed) {
		t.Fatalf("a retired client dialed again: %v", err)
	}
}
