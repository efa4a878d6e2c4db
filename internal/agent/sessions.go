package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	"github.com/nookhq/nook/api"
)

// Bounds of the session table.
const (
	ringSize      = 1 << 20 // output kept per session
	keepFinished  = 64      // finished sessions kept for their output and exit status
	maxChunkBytes = 32 << 10
)

// outputRing keeps the last ringSize bytes of a session's combined output
// as (kind, bytes) chunks with absolute offsets, and wakes readers that
// follow it. Writers never block: a reader that falls behind the ring
// skips what was dropped.
type outputRing struct {
	mu     sync.Mutex
	cond   *sync.Cond
	chunks []chunk
	start  int64 // offset of the oldest byte kept
	end    int64 // offset after the newest byte
	closed bool  // no more output will come
}

type chunk struct {
	kind byte
	off  int64
	data []byte
}

func newRing() *outputRing {
	r := &outputRing{}
	r.cond = sync.NewCond(&r.mu)
	return r
}

func (r *outputRing) write(kind byte, p []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.chunks = append(r.chunks, chunk{kind: kind, off: r.end, data: append([]byte(nil), p...)})
	r.end += int64(len(p))
	for len(r.chunks) > 0 && r.end-r.chunks[0].off > ringSize && len(r.chunks) > 1 {
		r.chunks = r.chunks[1:]
	}
	if len(r.chunks) > 0 {
		r.start = r.chunks[0].off
	}
	r.cond.Broadcast()
}

func (r *outputRing) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cond.Broadcast()
}

// next returns the output from offset off: the chunk holding it (trimmed
// to start at off, or at the ring's start if off was dropped). It waits
// for output while the ring is open; ok is false once everything was read
// and the ring is closed, or when stop is set.
func (r *outputRing) next(off int64, stop *bool) (kind byte, data []byte, next int64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for off >= r.end && !r.closed && !*stop {
		r.cond.Wait()
	}
	if *stop || off >= r.end {
		return 0, nil, off, false
	}
	if off < r.start {
		off = r.start
	}
	i := sort.Search(len(r.chunks), func(i int) bool { return r.chunks[i].off+int64(len(r.chunks[i].data)) > off })
	c := r.chunks[i]
	return c.kind, c.data[off-c.off:], c.off + int64(len(c.data)), true
}

func (r *outputRing) bounds() (int64, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.start, r.end
}

// session is a process in the table: a background process or a terminal.
type session struct {
	pid     int
	argv    []string
	tty     *os.File // the terminal's master side, for TTY sessions
	stdin   *os.File // write side of stdin, for non-TTY sessions with stdin
	inMu    sync.Mutex
	ring    *outputRing
	started time.Time
	passive bool // ExecRequest.Passive

	done   chan struct{}
	status api.ExitStatus
}

func (ss *session) info() ProcessInfo {
	from, to := ss.ring.bounds()
	pi := ProcessInfo{PID: ss.pid, Argv: ss.argv, TTY: ss.tty != nil, StartedAt: ss.started, OutputFrom: from, OutputTo: to, Running: true, Passive: ss.passive}
	select {
	case <-ss.done:
		st := ss.status
		pi.Running, pi.Exit = false, &st
	default:
	}
	return pi
}

func (ss *session) input(p []byte) {
	ss.inMu.Lock()
	defer ss.inMu.Unlock()
	w := ss.stdin
	if ss.tty != nil {
		w = ss.tty
	}
	if w != nil {
		w.Write(p)
	}
}

func (ss *session) closeInput() {
	ss.inMu.Lock()
	defer ss.inMu.Unlock()
	if ss.tty != nil {
		ss.tty.Write([]byte{4}) // ^D: end of input on a terminal
		return
	}
	if ss.stdin != nil {
		ss.stdin.Close()
		ss.stdin = nil
	}
}

func (ss *session) resize(p []byte) {
	var ws api.WindowSize
	if ss.tty == nil || json.Unmarshal(p, &ws) != nil || ws.Rows == 0 || ws.Cols == 0 {
		return
	}
	pty.Setsize(ss.tty, &pty.Winsize{Rows: ws.Rows, Cols: ws.Cols})
}

type sessionTable struct {
	mu       sync.Mutex
	sessions map[int]*session
	finished []int // oldest first
}

func (t *sessionTable) add(ss *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sessions == nil {
		t.sessions = map[int]*session{}
	}
	t.sessions[ss.pid] = ss
}

func (t *sessionTable) finish(pid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.finished = append(t.finished, pid)
	for len(t.finished) > keepFinished {
		delete(t.sessions, t.finished[0])
		t.finished = t.finished[1:]
	}
}

func (t *sessionTable) get(pid int) (*session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ss, ok := t.sessions[pid]
	if !ok {
		return nil, &AgentError{Code: CodeNotFound, Message: fmt.Sprintf("no process %d started through nook in this sandbox (see nook ps)", pid)}
	}
	return ss, nil
}

func (t *sessionTable) list() []ProcessInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]ProcessInfo, 0, len(t.sessions))
	for _, ss := range t.sessions {
		out = append(out, ss.info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].StartedAt.Before(out[j].StartedAt) })
	return out
}

// startSession starts a background process or a terminal session. A
// background session answers with its PID and ends the stream; a
// terminal session started in the foreground is attached to this stream
// and killed when it ends.
func (s *Server) startSession(fr *api.FrameReader, fw *frameWriter, req *ExecRequest) {
	l, aerr := s.prepare(req)
	if aerr != nil {
		fw.failWith(aerr.(*AgentError))
		return
	}
	ss := &session{argv: req.Argv, ring: newRing(), started: time.Now(), done: make(chan struct{}), passive: req.Passive}
	var outputs []*os.File
	var childFiles []*os.File
	if req.TTY {
		master, slave, err := pty.Open()
		if err != nil {
			fw.fail(CodeInternal, "open a terminal: %v", err)
			return
		}
		rows, cols := req.Rows, req.Cols
		if rows == 0 || cols == 0 {
			rows, cols = 24, 80
		}
		pty.Setsize(master, &pty.Winsize{Rows: rows, Cols: cols})
		ss.tty = master
		outputs = []*os.File{master}
		childFiles = []*os.File{slave, slave, slave}
		l.attr.Sys.Setpgid = false
		l.attr.Sys.Setsid, l.attr.Sys.Setctty, l.attr.Sys.Ctty = true, true, 0
		if !hasEnv(l.attr.Env, "TERM") {
			l.attr.Env = append(l.attr.Env, "TERM=xterm-256color")
		}
	} else {
		var stdinR *os.File
		var err error
		if req.Stdin {
			if stdinR, ss.stdin, err = os.Pipe(); err != nil {
				fw.fail(CodeInternal, "pipe: %v", err)
				return
			}
		} else if stdinR, err = os.Open(os.DevNull); err != nil {
			fw.fail(CodeInternal, "open %s: %v", os.DevNull, err)
			return
		}
		outR, outW, err1 := os.Pipe()
		errR, errW, err2 := os.Pipe()
		if err1 != nil || err2 != nil {
			fw.fail(CodeInternal, "pipe: %v", errors.Join(err1, err2))
			return
		}
		outputs = []*os.File{outR, errR}
		childFiles = []*os.File{stdinR, outW, errW}
	}
	l.attr.Files = childFiles
	pid, done, err := s.procs.start(l.path, l.argv, l.attr)
	closeAll(childFiles)
	if err != nil {
		closeAll(outputs)
		if ss.stdin != nil {
			ss.stdin.Close()
		}
		fw.failWith(startError(req.Argv[0], err))
		return
	}
	ss.pid = pid
	s.sessions.add(ss)

	var pumps sync.WaitGroup
	for i, f := range outputs {
		kind := api.FrameStdout
		if i == 1 {
			kind = api.FrameStderr
		}
		pumps.Add(1)
		go func(f *os.File, kind byte) {
			defer pumps.Done()
			buf := make([]byte, maxChunkBytes)
			for {
				n, err := f.Read(buf)
				if n > 0 {
					ss.ring.write(kind, buf[:n])
				}
				if err != nil { // EOF, or EIO once a terminal's last writer is gone
					return
				}
			}
		}(f, kind)
	}
	deadline := killAfter(req.TimeoutMS, pid)
	go func() {
		ws := <-done
		deadline.stop()
		drain(&pumps, outputs...)
		ss.inMu.Lock()
		if ss.stdin != nil {
			ss.stdin.Close()
			ss.stdin = nil
		}
		ss.inMu.Unlock()
		ss.status = exitStatus(ws)
		ss.status.TimedOut = deadline.fired.Load()
		close(ss.done)
		ss.ring.close()
		s.sessions.finish(pid)
	}()

	if err := fw.json(api.FrameJSON, Reply{PID: pid}); err != nil {
		return
	}
	if req.Background {
		if req.Follow {
			s.follow(fr, fw, ss, 0, true, nil)
		}
		return
	}
	// A foreground terminal: this stream is its client.
	s.follow(fr, fw, ss, 0, true, func() { syscall.Kill(-pid, syscall.SIGKILL) })
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if len(kv) > len(key) && kv[:len(key)+1] == key+"=" {
			return true
		}
	}
	return false
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

func exitStatus(ws syscall.WaitStatus) api.ExitStatus {
	st := api.ExitStatus{ExitCode: ws.ExitStatus()}
	if ws.Signaled() {
		st.ExitCode = -1
		st.Signal = signalName(ws.Signal())
	}
	return st
}

// follow streams a session's output from off until it exits, then its
// exit status. With input, frames from the client go to the session.
// onGone runs if the client goes away before the session exits.
func (s *Server) follow(fr *api.FrameReader, fw *frameWriter, ss *session, off int64, input bool, onGone func()) {
	var stop bool
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		for {
			kind, p, err := fr.Next()
			if err != nil {
				ss.ring.mu.Lock()
				stop = true
				ss.ring.mu.Unlock()
				ss.ring.cond.Broadcast()
				return
			}
			if !input {
				continue
			}
			switch kind {
			case api.FrameStdin:
				ss.input(p)
			case api.FrameEOF:
				ss.closeInput()
			case api.FrameResize:
				ss.resize(p)
			case api.FrameSignal:
				if sig, ok := signalByName(string(p)); ok {
					syscall.Kill(-ss.pid, sig)
				}
			}
		}
	}()
	for {
		kind, data, next, ok := ss.ring.next(off, &stop)
		if !ok {
			break
		}
		if err := fw.write(kind, data); err != nil {
			break
		}
		off = next
	}
	select {
	case <-ss.done:
		ss.ring.mu.Lock()
		lost := stop
		ss.ring.mu.Unlock()
		if !lost {
			_ = fw.json(api.FrameExit, ss.status)
		}
	default:
		// The client went away first.
		if onGone != nil {
			onGone()
		}
	}
}

// attach serves OpAttach.
func (s *Server) attach(fr *api.FrameReader, fw *frameWriter, req *AttachRequest) {
	ss, err := s.sessions.get(req.PID)
	if err != nil {
		fw.failWith(err.(*AgentError))
		return
	}
	// An offset the output has not reached yet is waited for while the
	// process runs; past the end of a finished process's output it is an error.
	from, to := ss.ring.bounds()
	select {
	case <-ss.done:
		if req.Offset > to {
			fw.fail(CodeInvalidArgument, "offset %d is past the end of process %d's output (%d bytes; it has exited)", req.Offset, req.PID, to)
			return
		}
	default:
	}
	if err := fw.json(api.FrameJSON, Reply{PID: ss.pid, OutputFrom: from}); err != nil {
		return
	}
	s.follow(fr, fw, ss, req.Offset, req.Input, nil)
}

// signal serves OpSignal.
func (s *Server) signal(fw *frameWriter, req *SignalRequest) {
	ss, err := s.sessions.get(req.PID)
	if err != nil {
		fw.failWith(err.(*AgentError))
		return
	}
	select {
	case <-ss.done:
		fw.fail(CodeInvalidArgument, "process %d has already exited (%s)", req.PID, describeExit(ss.status))
		return
	default:
	}
	sig, _ := signalByName(req.Signal)
	if err := syscall.Kill(-ss.pid, sig); err != nil {
		fw.fail(CodeInternal, "signal %d: %v", req.PID, err)
		return
	}
	_ = fw.json(api.FrameJSON, Reply{PID: ss.pid})
}

func describeExit(st api.ExitStatus) string {
	if st.Signal != "" {
		return "killed by " + st.Signal
	}
	return fmt.Sprintf("exit code %d", st.ExitCode)
}

// processes serves OpProcesses.
func (s *Server) processes(fw *frameWriter) {
	b, _ := json.Marshal(s.sessions.list())
	_ = fw.write(api.FrameJSON, b)
}
