package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/nookhq/nook/api"
)

// A fake agent: a unix socket whose connections serve runs (one
// goroutine per connection), as a hostile agent inside a sandbox would.
type fakeAgent struct {
	t     *testing.T
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newFakeAgent(t *testing.T, serve func(n int, conn net.Conn)) (*fakeAgent, *Client) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeAgent{t: t, ln: ln}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for n := 0; ; n++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, conn)
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				serve(n, conn)
			}()
		}
	}()
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(func() {
		c.Close()
		ln.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f, c
}

// serveStreams runs a yamux server on conn and hands every stream, with
// its decoded request, to handle (in its own goroutine).
func serveStreams(conn net.Conn, handle func(st net.Conn, req *Request)) *yamux.Session {
	cfg := yamuxConfig()
	cfg.AcceptBacklog = 1 << 14 // its own opens (a flood of streams) do not wait for the daemon
	sess, err := yamux.Server(conn, cfg)
	if err != nil {
		conn.Close()
		return nil
	}
	go func() {
		for {
			st, err := sess.AcceptStream()
			if err != nil {
				return
			}
			go func() {
				defer st.Close()
				_, p, err := api.NewFrameReader(st).Next()
				if err != nil {
					return
				}
				var req Request
				if json.Unmarshal(p, &req) != nil {
					return
				}
				handle(st, &req)
			}()
		}
	}()
	return sess
}

// honest answers a ping, and an exec of anything with "ok" and exit 0.
func honest(st net.Conn, req *Request) {
	switch req.Op {
	case OpPing:
		writeJSONFrame(st, Reply{Hostname: "fake"})
	case OpExec:
		writeJSONFrame(st, Reply{PID: 7})
		api.WriteFrame(st, api.FrameStdout, []byte("ok"))
		b, _ := json.Marshal(api.ExitStatus{})
		api.WriteFrame(st, api.FrameExit, b)
	}
}

func writeJSONFrame(w io.Writer, v any) error {
	b, _ := json.Marshal(v)
	return api.WriteFrame(w, api.FrameJSON, b)
}

// heapGrowth runs f while sampling the heap and the goroutines, and
// returns how far each rose above where they were before.
func heapGrowth(f func()) (heap uint64, goroutines int) {
	// The bound is on what the daemon holds, not on the garbage it made
	// on the way: collect as soon as the heap grows by a tenth, so that
	// garbage not yet collected does not count as held (with the default
	// GOGC=100, 1 MiB of input can make 8 MiB of garbage first).
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base, baseG := ms.HeapInuse, runtime.NumGoroutine()
	stop := make(chan struct{})
	done := make(chan struct{})
	peak, peakG := base, baseG
	go func() {
		defer close(done)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			peak, peakG = max(peak, ms.HeapInuse), max(peakG, runtime.NumGoroutine())
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	f()
	close(stop)
	<-done
	return peak - base, peakG - baseG
}

const (
	mib       = 1 << 20
	heapBound = 64 * mib
)

func entry(i int) api.FileInfo {
	return api.FileInfo{Path: "/flood/f", Name: "f", Type: api.FileTypeFile, Mode: "0644", Size: int64(i)}
}

// A listing answered with far more entries than asked for stops at the
// cap: the daemon drops the rest, ends the listing truncated and closes
// the stream, so the agent cannot go on sending.
func TestEscapeAgentFloodListing(t *testing.T) {
	var sent atomic.Int64
	_, c := newFakeAgent(t, func(_ int, conn net.Conn) {
		serveStreams(conn, func(st net.Conn, req *Request) {
			root := api.FileInfo{Path: req.Files.Path, Type: api.FileTypeDir}
			if writeJSONFrame(st, FileReply{File: &root}) != nil {
				return
			}
			batch := make([]api.FileInfo, 1000)
			for i := range batch {
				batch[i] = entry(i)
			}
			b, _ := json.Marshal(FileReply{Entries: batch})
			for sent.Load() < 1<<30 { // up to 1 GiB, if the daemon keeps reading
				if api.WriteFrame(st, api.FrameJSON, b) != nil {
					return
				}
				sent.Add(int64(len(b)))
			}
		})
	})
	for _, tc := range []struct{ ask, want int }{{10, 10}, {2500, 2500}, {0, DefaultListEntries}, {MaxListEntries + 1, MaxListEntries}} {
		sent.Store(0)
		var got int
		var truncated bool
		growth, _ := heapGrowth(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			l, err := c.ListFiles(ctx, &FileRequest{Path: "/flood", MaxEntries: tc.ask})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			for {
				batch, err := l.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("ask %d: %v", tc.ask, err)
				}
				got += len(batch)
				if got > tc.want {
					t.Fatalf("ask %d: the daemon took %d entries", tc.ask, got)
				}
			}
			truncated = l.Truncated
		})
		if got != tc.want || !truncated {
			t.Fatalf("ask %d: %d entries, truncated %v; want %d, truncated", tc.ask, got, truncated, tc.want)
		}
		if growth > heapBound {
			t.Fatalf("ask %d: heap grew %d MiB", tc.ask, growth/mib)
		}
		t.Logf("ask %d: agent sent %d KiB before the daemon closed the stream; heap +%d KiB", tc.ask, sent.Load()>>10, growth>>10)
	}
}

// A batch of more entries than any real agent sends is refused even below the cap.
func TestEscapeAgentFloodListingBatch(t *testing.T) {
	_, c := newFakeAgent(t, func(_ int, conn net.Conn) {
		serveStreams(conn, func(st net.Conn, req *Request) {
			root := api.FileInfo{Path: req.Files.Path, Type: api.FileTypeDir}
			writeJSONFrame(st, FileReply{File: &root})
			// 1 MiB of "{}," is 350,000 entries, each a whole FileInfo once decoded.
			p := []byte(`{"entries":[` + strings.Repeat(`{},`, (api.MaxFramePayload-32)/3) + `{}]}`)
			api.WriteFrame(st, api.FrameJSON, p)
		})
	})
	var err error
	growth, _ := heapGrowth(func() {
		var l *FileListing
		l, err = c.ListFiles(context.Background(), &FileRequest{Path: "/", MaxEntries: MaxListEntries})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		_, err = l.Next()
	})
	if err == nil || !strings.Contains(err.Error(), "a batch of more than") {
		t.Fatalf("oversized batch: %v", err)
	}
	if growth > 16*mib {
		t.Fatalf("one 1 MiB frame grew the heap by %d MiB", growth/mib)
	}
}

// One giant reply: a frame header announcing 4 GiB, a 1 MiB process list
// of empty objects (each a ProcessInfo once decoded), an endless run of
// bytes, a 1 MiB error message. Each fails or is cut, with a bounded heap.
func TestEscapeAgentFloodBigReply(t *testing.T) {
	var mode atomic.Int32
	_, c := newFakeAgent(t, func(_ int, conn net.Conn) {
		serveStreams(conn, func(st net.Conn, req *Request) {
			switch mode.Load() {
			case 0:
				st.Write([]byte{api.FrameJSON, 0xff, 0xff, 0xff, 0xff})
				io.Copy(st, zeros{}) // endless bytes behind it
			case 1:
				api.WriteFrame(st, api.FrameJSON, []byte("["+strings.Repeat(`{},`, (api.MaxFramePayload-8)/3)+"{}]"))
			case 2:
				api.WriteFrame(st, api.FrameJSON, bytes.Repeat([]byte{'['}, api.MaxFramePayload))
				io.Copy(st, zeros{})
			case 3:
				b, _ := json.Marshal(api.Error{Code: "x", Message: strings.Repeat("é", api.MaxFramePayload/2-64)})
				api.WriteFrame(st, api.FrameError, b)
			}
		})
	})
	ctx := context.Background()
	for i, want := range []string{"exceeds 1 MiB", "more than 16384 processes", "bad reply", ""} {
		mode.Store(int32(i))
		var err error
		growth, _ := heapGrowth(func() { _, err = c.Processes(ctx) })
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("case %d: %v", i, err)
		}
		var ae *AgentError
		if i == 3 && (!errors.As(err, &ae) || len(ae.Message) > maxAgentErrorBytes+3 || !strings.HasPrefix(ae.Message, "éé")) {
			t.Fatalf("error message not cut: %d bytes", len(err.Error()))
		}
		if growth > 16*mib {
			t.Fatalf("case %d: heap grew %d MiB", i, growth/mib)
		}
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// 1 GiB of exec output passes through with the heap bounded: each stream
// holds at most its window.
func TestEscapeAgentFloodExecOutput(t *testing.T) {
	const total = 1 << 30
	_, c := newFakeAgent(t, func(_ int, conn net.Conn) {
		serveStreams(conn, func(st net.Conn, req *Request) {
			writeJSONFrame(st, Reply{PID: 1})
			chunk := make([]byte, api.MaxFramePayload)
			for n := 0; n < total; n += len(chunk) {
				if api.WriteFrame(st, api.FrameStdout, chunk) != nil {
					return
				}
			}
			b, _ := json.Marshal(api.ExitStatus{})
			api.WriteFrame(st, api.FrameExit, b)
		})
	})
	var got int
	growth, _ := heapGrowth(func() {
		p, err := c.Exec(context.Background(), &ExecRequest{Argv: []string{"flood"}})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		for {
			kind, b, err := p.Next()
			if err != nil {
				t.Fatal(err)
			}
			if kind == api.FrameExit {
				return
			}
			got += len(b)
		}
	})
	if got != total {
		t.Fatalf("got %d bytes", got)
	}
	if growth > heapBound {
		t.Fatalf("1 GiB of output grew the heap by %d MiB", growth/mib)
	}
	t.Logf("1 GiB relayed; heap +%d KiB", growth>>10)
}

// A watch whose consumer does not read holds at most a window of events:
// the agent's writes wait.
func TestEscapeAgentFloodWatch(t *testing.T) {
	var sent atomic.Int64
	blocked := make(chan struct{})
	_, c := newFakeAgent(t, func(_ int, conn net.Conn) {
		serveStreams(conn, func(st net.Conn, req *Request) {
			root := api.FileInfo{Path: req.Files.Path, Type: api.FileTypeDir}
			writeJSONFrame(st, FileReply{File: &root})
			ev, _ := json.Marshal(api.FileEvent{Type: "write", Path: "/w/" + strings.Repeat("x", 4000)})
			for sent.Load() < 1<<30 {
				// The write waits for the daemon's window; a wait this long
				// means the daemon takes no more.
				st.SetWriteDeadline(time.Now().Add(time.Second))
				if err := api.WriteFrame(st, api.FrameJSON, ev); err != nil {
					if errors.Is(err, yamux.ErrTimeout) {
						close(blocked)
					}
					return
				}
				sent.Add(int64(api.FrameHeaderSize + len(ev)))
			}
		})
	})
	var got int64
	growth, _ := heapGrowth(func() {
		w, err := c.Watch(context.Background(), "/w", true)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		select {
		case <-blocked:
		case <-time.After(time.Minute):
			t.Fatalf("the agent was never held back: it sent %d MiB", sent.Load()/mib)
		}
		for got < sent.Load() {
			ev, err := w.Next()
			if err != nil {
				t.Fatalf("after %d of %d bytes: %v", got, sent.Load(), err)
			}
			b, _ := json.Marshal(ev)
			got += int64(api.FrameHeaderSize + len(b))
		}
	})
	if s := sent.Load(); s > 2*clientWindow {
		t.Fatalf("the agent sent %d KiB to a consumer that did not read", s>>10)
	}
	if growth > heapBound {
		t.Fatalf("heap grew %d MiB", growth/mib)
	}
}

// Streams the agent opens toward the daemon, and pings it sends, end the
// session at once: nothing piles up, and the next call dials again.
func TestEscapeAgentFloodStreams(t *testing.T) {
	for _, flood := range []string{"streams", "pings"} {
		t.Run(flood, func(t *testing.T) {
			opened := make(chan int, 1)
			_, c := newFakeAgent(t, func(n int, conn net.Conn) {
				sess := serveStreams(conn, honest)
				if n > 0 || sess == nil {
					return // later connections behave
				}
				count := 0
				switch flood {
				case "streams":
					payload := make([]byte, 256<<10)
					for ; count < 10000; count++ {
						st, err := sess.OpenStream()
						if err != nil {
							break
						}
						go st.Write(payload)
					}
				case "pings":
					var hdr [yamuxHeaderSize]byte
					hdr[1], hdr[3] = yamuxTypePing, yamuxFlagSYN
					var buf bytes.Buffer
					for i := 0; i < 1000; i++ {
						binary.BigEndian.PutUint32(hdr[8:], uint32(i))
						buf.Write(hdr[:])
					}
					// Raw on the connection: a yamux session only pings once at a time.
					for ; count < 100; count++ {
						if _, err := conn.Write(buf.Bytes()); err != nil {
							break
						}
					}
				}
				opened <- count
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var count int
			growth, goroutines := heapGrowth(func() {
				// The first request is in flight while the agent floods.
				p, err := c.Exec(ctx, &ExecRequest{Argv: []string{"x"}})
				if err == nil {
					p.Close()
				}
				select {
				case count = <-opened:
				case <-time.After(30 * time.Second):
					t.Errorf("the agent's %s flood went on for 30s", flood)
				}
			})
			if t.Failed() || growth > 32*mib || goroutines > 1000 {
				t.Fatalf("after %d %s: heap +%d MiB, %d more goroutines", count, flood, growth/mib, goroutines)
			}
			if flood == "streams" && count >= 10000 {
				t.Fatalf("the agent opened %d streams and the session still stood", count)
			}
			t.Logf("%s: the agent got %d floods out; heap +%d KiB, %d more goroutines at most", flood, count, growth>>10, goroutines)
			if _, err := c.Ping(ctx); err != nil {
				t.Fatalf("the next call: %v", err)
			}
		})
	}
}

// The frame guard passes the frames a real agent sends, whatever the
// read boundaries, and stops at the first SYN.
func TestAgentFrameGuard(t *testing.T) {
	hdr := func(typ byte, flags uint16, id, length uint32) []byte {
		var h [yamuxHeaderSize]byte
		h[1] = typ
		binary.BigEndian.PutUint16(h[2:], flags)
		binary.BigEndian.PutUint32(h[4:], id)
		binary.BigEndian.PutUint32(h[8:], length)
		return h[:]
	}
	var ok bytes.Buffer
	ok.Write(hdr(yamuxTypeWindow, 2, 1, 0)) // ACK
	ok.Write(hdr(yamuxTypeData, 0, 1, 14))
	ok.Write(hdr(yamuxTypePing, 1, 0, 0)) // a payload that looks like a ping SYN
	ok.Write([]byte{1, 2})
	ok.Write(hdr(yamuxTypePing, 2, 0, 9)) // a ping answer
	ok.Write(hdr(yamuxTypeData, 4, 1, 0)) // FIN
	for step := 1; step <= ok.Len(); step++ {
		var g frameGuard
		b := ok.Bytes()
		for i := 0; i < len(b); i += step {
			end := min(i+step, len(b))
			if n, err := g.check(b[i:end]); err != nil || n != end-i {
				t.Fatalf("step %d at %d: %d, %v", step, i, n, err)
			}
		}
	}
	for name, bad := range map[string][]byte{
		"stream": hdr(yamuxTypeWindow, 1, 2, 0),
		"data":   hdr(yamuxTypeData, 1, 2, 5),
		"ping":   hdr(yamuxTypePing, 1, 0, 1),
	} {
		var g frameGuard
		in := append(append([]byte(nil), ok.Bytes()...), bad...)
		n, err := g.check(in)
		if !errors.Is(err, ErrAgentProtocol) || n != ok.Len() {
			t.Fatalf("%s: passed %d of %d, %v", name, n, ok.Len(), err)
		}
		if _, err := g.check([]byte{0}); err == nil {
			t.Fatalf("%s: the guard let bytes through after refusing", name)
		}
	}
}

func FuzzAgentFrameGuard(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0}, uint8(5))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 'a', 'b', 'c', 0, 2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1}, uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, step uint8) {
		// Fed whole or in pieces, the guard refuses the same frame.
		var whole frameGuard
		n, werr := whole.check(data)
		var g frameGuard
		passed := 0
		var err error
		s := int(step%32) + 1
		for i := 0; i < len(data) && err == nil; i += s {
			var k int
			k, err = g.check(data[i:min(i+s, len(data))])
			passed += k
		}
		// A refused header split across pieces had its first bytes passed
		// (yamux never acts on part of a header).
		if (werr == nil) != (err == nil) || passed < n || passed >= n+yamuxHeaderSize || n > len(data) || werr == nil && n != len(data) {
			t.Fatalf("whole: %d %v; in pieces of %d: %d %v", n, werr, s, passed, err)
		}
	})
}

func FuzzAgentReplies(f *testing.F) {
	f.Add([]byte(`{"entries":[{"path":"/a"},{}],"done":false}`))
	f.Add([]byte(`[{"pid":1,"argv":["a"]},{}]`))
	f.Add([]byte(`{"code":"x","message":"m"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if r, err := decodeListBatch(data, 3); err == nil && len(r.Entries.entries) > 3 {
			t.Fatalf("%d entries decoded with a cap of 3", len(r.Entries.entries))
		}
		var l processList
		if json.Unmarshal(data, &l) == nil && len(l) > maxProcessList {
			t.Fatalf("%d processes", len(l))
		}
		var ae *AgentError
		if err := decodeAgentError(data); errors.As(err, &ae) && len(ae.Message) > maxAgentErrorBytes+3 {
			t.Fatalf("message of %d bytes", len(ae.Message))
		}
	})
}

// frozenConn is a fake agent's connection that can be frozen: while it
// is, nothing is read or written, as with a stopped or traced PID 1.
type frozenConn struct {
	net.Conn
	mu     sync.Mutex
	thawed chan struct{} // closed while not frozen
}

func newFrozenConn(c net.Conn) *frozenConn {
	f := &frozenConn{Conn: c, thawed: make(chan struct{})}
	close(f.thawed)
	return f
}

func (f *frozenConn) freeze() {
	f.mu.Lock()
	f.thawed = make(chan struct{})
	f.mu.Unlock()
}

func (f *frozenConn) thaw() {
	f.mu.Lock()
	close(f.thawed)
	f.mu.Unlock()
}

func (f *frozenConn) wait() {
	f.mu.Lock()
	ch := f.thawed
	f.mu.Unlock()
	<-ch
}

func (f *frozenConn) Read(p []byte) (int, error) {
	n, err := f.Conn.Read(p)
	f.wait()
	return n, err
}

func (f *frozenConn) Write(p []byte) (int, error) {
	f.wait()
	return f.Conn.Write(p)
}

const wedgeTimeout = 300 * time.Millisecond

// wantNoAnswer checks that err is the agent's no-answer error and came
// within the bound (one timeout, or for a stream one probe interval and
// a timeout, and slack for a busy machine).
func wantNoAnswer(t *testing.T, what string, err error, took time.Duration) {
	t.Helper()
	var na *NoAnswerError
	if !errors.As(err, &na) || !strings.Contains(err.Error(), "did not answer within 300ms") {
		t.Fatalf("%s: %v", what, err)
	}
	if took > 2*wedgeTimeout+5*time.Second {
		t.Fatalf("%s: the error took %s", what, took)
	}
}

// An agent that takes requests and never answers them fails each call
// after the answer timeout; ctx still ends a call sooner.
func TestEscapeAgentWedgedNoAnswer(t *testing.T) {
	_, c := newFakeAgent(t, func(_ int, conn net.Conn) {
		serveStreams(conn, func(st net.Conn, req *Request) {
			io.Copy(io.Discard, st) // reads everything, answers nothing
		})
	})
	c.SetAnswerTimeout(wedgeTimeout)
	ctx := context.Background()
	calls := map[string]func() error{
		"ping":      func() error { _, err := c.Ping(ctx); return err },
		"exec":      func() error { _, err := c.Exec(ctx, &ExecRequest{Argv: []string{"true"}}); return err },
		"processes": func() error { _, err := c.Processes(ctx); return err },
		"stat":      func() error { _, err := c.Stat(ctx, "/"); return err },
		"list":      func() error { _, err := c.ListFiles(ctx, &FileRequest{Path: "/"}); return err },
		"read":      func() error { _, _, err := c.ReadFile(ctx, "/f", 0, 0); return err },
		"write":     func() error { _, err := c.WriteFile(ctx, &FileRequest{Path: "/f"}, strings.NewReader("x")); return err },
		"watch":     func() error { _, err := c.Watch(ctx, "/", false); return err },
		"configure": func() error { return c.Configure(ctx, &ConfigureRequest{Hostname: "h"}) },
	}
	for what, call := range calls {
		start := time.Now()
		err := call()
		wantNoAnswer(t, what, err, time.Since(start))
		if time.Since(start) < wedgeTimeout {
			t.Fatalf("%s: failed before the timeout: %v", what, err)
		}
	}
	// A remove may take long: it waits 20 timeouts (while the agent
	// answers pings), or until ctx ends.
	cctx, cancel := context.WithTimeout(ctx, 3*wedgeTimeout)
	defer cancel()
	if err := c.Remove(cctx, "/big", true); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("remove: %v", err)
	}
	start := time.Now()
	err := c.Remove(ctx, "/big", true)
	var na *NoAnswerError
	if took := time.Since(start); !errors.As(err, &na) || na.After != patientFactor*wedgeTimeout || took < na.After || took > na.After+5*time.Second {
		t.Fatalf("remove after %s: %v", took, err)
	}
}

// An agent that stops mid-stream (its connection frozen, as with a
// SIGSTOP or a tracer) fails the streams waiting on it and closes the
// session; once it runs again, the next call dials again and works.
func TestEscapeAgentWedgedMidStream(t *testing.T) {
	conns := make(chan *frozenConn, 4)
	_, c := newFakeAgent(t, func(n int, conn net.Conn) {
		fc := newFrozenConn(conn)
		conns <- fc
		serveStreams(fc, func(st net.Conn, req *Request) {
			switch req.Op {
			case OpExec:
				if req.Exec.Argv[0] != "hang" {
					honest(st, req)
					return
				}
				writeJSONFrame(st, Reply{PID: 9})
				api.WriteFrame(st, api.FrameStdout, []byte("started"))
				fc.freeze()
				io.Copy(io.Discard, st)
			case OpRead:
				writeJSONFrame(st, FileReply{File: &api.FileInfo{Path: "/f", Type: api.FileTypeFile}})
				api.WriteFrame(st, api.FrameStdout, []byte("first"))
				fc.freeze()
				io.Copy(io.Discard, st)
			default:
				honest(st, req)
			}
		})
	})
	c.SetAnswerTimeout(wedgeTimeout)
	ctx := context.Background()

	p, err := c.Exec(ctx, &ExecRequest{Argv: []string{"hang"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fc := <-conns
	if kind, b, err := p.Next(); err != nil || kind != api.FrameStdout || string(b) != "started" {
		t.Fatalf("first output: %d %q %v", kind, b, err)
	}
	start := time.Now()
	_, _, err = p.Next()
	wantNoAnswer(t, "exec output", err, time.Since(start))
	// The session is gone: a call now dials again (the frozen agent
	// cannot answer: this connection is new but it is the same fake).
	fc.thaw()
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("ping after the agent runs again: %v", err)
	}

	_, rc, err := c.ReadFile(ctx, "/f", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	fc = <-conns
	buf := make([]byte, 5)
	if _, err := io.ReadFull(rc, buf); err != nil || string(buf) != "first" {
		t.Fatalf("first chunk: %q %v", buf, err)
	}
	start = time.Now()
	_, err = rc.Read(buf)
	wantNoAnswer(t, "download", err, time.Since(start))
	fc.thaw()
}

// A quiet stream is not a wedged agent: a command that prints nothing
// for several answer timeouts runs to its end.
func TestEscapeAgentWedgedQuietExecLives(t *testing.T) {
	c := startAgent(t).SetAnswerTimeout(wedgeTimeout)
	r, err := run(t, c, &ExecRequest{Argv: []string{"sh", "-c", "sleep 1.5; echo done"}})
	if err != nil || r.stdout.String() != "done\n" || r.exit.ExitCode != 0 {
		t.Fatalf("quiet command: %v %q %+v", err, r.stdout.String(), r.exit)
	}
}
