package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/e2b/envdpb/process"
	"github.com/nookhq/nook/internal/e2b/envdpb/process/processconnect"
	"github.com/nookhq/nook/internal/errdefs"
)

// processService is envd's Process service over the Manager: every
// process is a nook background process (its output kept by the agent,
// running on when a stream ends), followed by an attach.
type processService struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}

// procTable keeps what envd knows of a process and nook does not: its
// tag, its config as asked, and an input handle (an attach with input)
// shared by the calls that write to it.
type procTable struct {
	mu    sync.Mutex
	procs map[string]map[int]*procEntry // by sandbox ID, then PID
}

type procEntry struct {
	tag string
	cfg *process.ProcessConfig
	in  *agent.Process // nil until an input call needs one
}

func newProcTable() *procTable { return &procTable{procs: map[string]map[int]*procEntry{}} }

func (t *procTable) put(sandboxID string, pid int, e *procEntry) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[sandboxID] == nil {
		t.procs[sandboxID] = map[int]*procEntry{}
	}
	t.procs[sandboxID][pid] = e
}

func (t *procTable) get(sandboxID string, pid int) *procEntry {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.procs[sandboxID][pid]
}

// room makes sure the table can keep another process of t's sandbox:
// past maxSandboxes, sandboxes that are gone are dropped; past maxProcs,
// the sandbox's processes that ended are; still past it, the start is
// refused.
func (t *procTable) room(ctx context.Context, s *Server, tg target) error {
	t.mu.Lock()
	many, full := len(t.procs) >= maxSandboxes, len(t.procs[tg.sb.ID]) >= maxProcs
	t.mu.Unlock()
	if many {
		if all, err := s.m.List(ctx); err == nil {
			live := map[string]bool{}
			for _, sb := range all {
				live[sb.ID] = true
			}
			t.mu.Lock()
			for id := range t.procs {
				if !live[id] {
					delete(t.procs, id)
				}
			}
			t.mu.Unlock()
		}
	}
	if !full {
		return nil
	}
	ps, err := s.m.Processes(ctx, tg.sb.Name)
	if err != nil {
		return err
	}
	running := map[int]bool{}
	for _, p := range ps {
		running[p.PID] = p.Running
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for pid := range t.procs[tg.sb.ID] {
		if !running[pid] {
			delete(t.procs[tg.sb.ID], pid)
		}
	}
	if len(t.procs[tg.sb.ID]) >= maxProcs {
		return errdefs.Exhausted("sandbox %s runs %d processes started through E2B's API: end some first", tg.sb.Name, maxProcs)
	}
	return nil
}

// byTag is the PID of the process with tag, or 0.
func (t *procTable) byTag(sandboxID, tag string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	for pid, e := range t.procs[sandboxID] {
		if e.tag == tag {
			return pid
		}
	}
	return 0
}

// forget drops a sandbox's processes (it was killed). An input handle
// is its owner's to close (a start's stream, or input's reader, which
// ends with the process): never closed here, where another stream may
// still be reading it.
func (t *procTable) forget(sandbox string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.procs, sandbox)
}

// drop forgets one process (it exited).
func (t *procTable) drop(sandboxID string, pid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.procs[sandboxID], pid)
}

// homeOf is a user's home directory as E2B's templates lay them out.
func homeOf(user string) string {
	if user == "" || user == "root" {
		return "/root"
	}
	return "/home/" + user
}

// keepaliveEvery is how often a stream with nothing to say sends a
// keepalive: Keepalive-Ping-Interval seconds (the SDKs ask for 50),
// else 90, within [1 s, 5 min].
func keepaliveEvery(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval"))
	if err != nil || n <= 0 {
		n = 90
	}
	return time.Duration(min(max(n, 1), 300)) * time.Second
}

// Bounds on what the edge keeps of a process.
const (
	maxTag        = 256     // bytes of a process's tag
	maxKeptConfig = 4 << 10 // bytes of its config kept for List (larger: nook's argv alone)
	maxProcs      = 4096    // processes kept per sandbox
	maxSandboxes  = 1024    // sandboxes with processes kept, before those gone are dropped
)

func (p *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	t := targetOf(ctx)
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return errdefs.Invalid("process.cmd is empty")
	}
	if len(req.Msg.GetTag()) > maxTag {
		return errdefs.Invalid("a tag is at most %d bytes", maxTag)
	}
	if err := p.s.procs.room(ctx, p.s, t); err != nil {
		return err
	}
	er := api.ExecRequest{Cmd: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Env: cfg.GetEnvs(), Cwd: cfg.GetCwd(), User: t.user,
		Background: true, Stdin: req.Msg.GetStdin()}
	if er.Cwd == "" {
		er.Cwd = homeOf(t.user)
	}
	if pty := req.Msg.GetPty(); pty != nil {
		er.TTY, er.Rows, er.Cols = true, uint16(min(pty.GetSize().GetRows(), 1000)), uint16(min(pty.GetSize().GetCols(), 1000))
	}
	// envd ends a process when its start call's deadline
	// (Connect-Timeout-Ms, 60 s by default in the SDKs) passes.
	if dl, ok := ctx.Deadline(); ok {
		er.Timeout = strconv.FormatInt(max(time.Until(dl).Milliseconds(), 1), 10) + "ms"
	}
	out, err := p.s.m.ExecFollow(ctx, t.sb.Name, er)
	if err != nil {
		return err
	}
	pid := out.PID
	e := &procEntry{tag: req.Msg.GetTag()}
	if proto.Size(cfg) <= maxKeptConfig {
		e.cfg = cfg
	}
	p.s.procs.put(t.sb.ID, pid, e)
	p.s.procs.mu.Lock()
	if e.in == nil {
		e.in = out
	}
	p.s.procs.mu.Unlock()
	defer func() {
		p.s.procs.mu.Lock()
		if e.in == out {
			e.in = nil
		}
		p.s.procs.mu.Unlock()
		out.Close()
	}()
	st := &startStream{p: out, reattach: func() (*agent.Process, error) {
		// An agent older than Follow ends the stream after its reply:
		// follow the process with an attach, and let the input calls
		// make their own.
		p.s.procs.mu.Lock()
		if e.in == out {
			e.in = nil
		}
		p.s.procs.mu.Unlock()
		return p.s.m.Attach(ctx, t.sb.Name, pid, 0, false)
	}}
	defer st.Close()
	return p.s.follow(ctx, t, pid, er.TTY, st, req.Header(), func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	})
}

// startStream is a started process's stream, which falls back to an
// attach if it ends before its first frame.
type startStream struct {
	mu       sync.Mutex
	p        *agent.Process
	closed   bool
	reattach func() (*agent.Process, error)
	begun    bool // a frame came (or the fallback was taken)
}

func (s *startStream) Next() (byte, []byte, error) {
	s.mu.Lock()
	p := s.p
	s.mu.Unlock()
	kind, data, err := p.Next()
	if s.begun || !errors.Is(err, io.EOF) {
		s.begun = true
		return kind, data, err
	}
	s.begun = true
	p.Close()
	np, aerr := s.reattach()
	if aerr != nil {
		return 0, nil, aerr
	}
	s.mu.Lock()
	s.p = np
	closed := s.closed
	s.mu.Unlock()
	if closed { // its caller is gone already
		np.Close()
	}
	return np.Next()
}

// Close closes the stream it reads now (the first one is its caller's).
func (s *startStream) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.p.Close()
}

// frames is what follow reads: a process stream.
type frames interface {
	Next() (byte, []byte, error)
}

func (p *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	t := targetOf(ctx)
	pid, err := p.s.pidOf(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	info, err := p.s.procInfo(ctx, t, pid)
	if err != nil {
		return err
	}
	if !info.Running {
		return errdefs.NotFound("process %d has exited", pid)
	}
	out, err := p.s.m.Attach(ctx, t.sb.Name, pid, info.OutputTo, false)
	if err != nil {
		return err
	}
	defer out.Close()
	return p.s.follow(ctx, t, pid, info.TTY, out, req.Header(), func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	})
}

// follow sends a process's start event, its output and its end (or a
// keepalive whenever nothing else was sent for a while). A stream that
// ends because the sandbox went away (killed, paused) is aborted, not
// ended: the SDKs tell the two apart.
func (s *Server) follow(ctx context.Context, t target, pid int, tty bool, out frames, h http.Header, send func(*process.ProcessEvent) error) error {
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: uint32(pid)}}}); err != nil {
		return err
	}
	type frame struct {
		kind byte
		data []byte
		err  error
	}
	ch := make(chan frame, 16)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			kind, data, err := out.Next()
			data = bytes.Clone(data) // Next's buffer is its own
			select {
			case ch <- frame{kind, data, err}:
			case <-stop:
				return
			}
			if err != nil || kind == api.FrameExit || kind == api.FrameError {
				return
			}
		}
	}()
	every := keepaliveEvery(h)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case f := <-ch:
			if f.err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				s.abortIfGone(t)
				return errdefs.Unavailable("process %d: its output ended: %v", pid, f.err)
			}
			tick.Reset(every)
			var ev *process.ProcessEvent
			switch f.kind {
			case api.FrameStdout:
				data := &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: f.data}}
				if tty {
					data.Output = &process.ProcessEvent_DataEvent_Pty{Pty: f.data}
				}
				ev = &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: data}}
			case api.FrameStderr:
				ev = &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: f.data}}}}
			case api.FrameExit:
				var st api.ExitStatus
				if err := json.Unmarshal(f.data, &st); err != nil {
					return fmt.Errorf("process %d: its exit status: %w", pid, err)
				}
				s.procs.drop(t.sb.ID, pid)
				return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: endEvent(st)}})
			case api.FrameError:
				var ae agent.Error
				json.Unmarshal(f.data, &ae)
				return fmt.Errorf("process %d: %s", pid, ae.Message)
			default:
				continue
			}
			if err := send(ev); err != nil {
				return err
			}
		}
	}
}

// abortIfGone aborts the response when the sandbox is no longer running.
func (s *Server) abortIfGone(t target) {
	sb, err := s.m.Get(context.Background(), t.sb.Name)
	if err != nil || sb.ID != t.sb.ID || sb.State != core.StateRunning {
		panic(http.ErrAbortHandler)
	}
}

// signalStatus is how Go's os.ProcessState (which envd reports) names a
// death by signal.
var signalStatus = map[string]string{"KILL": "killed", "TERM": "terminated", "INT": "interrupt", "HUP": "hangup", "QUIT": "quit",
	"ABRT": "aborted", "SEGV": "segmentation fault", "PIPE": "broken pipe", "ALRM": "alarm clock", "USR1": "user defined signal 1", "USR2": "user defined signal 2"}

// endEvent is envd's end event for an exit status: exited and its code,
// or killed by a signal (exit code -1), with os.ProcessState's words.
func endEvent(st api.ExitStatus) *process.ProcessEvent_EndEvent {
	if st.Signal != "" {
		name, ok := signalStatus[st.Signal]
		if !ok {
			name = "SIG" + st.Signal
		}
		msg := "signal: " + name
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: msg, Error: &msg}
	}
	status := "exit status " + strconv.Itoa(st.ExitCode)
	end := &process.ProcessEvent_EndEvent{ExitCode: int32(st.ExitCode), Exited: true, Status: status}
	if st.ExitCode != 0 {
		end.Error = &status
	}
	return end
}

// pidOf resolves a process selector.
func (s *Server) pidOf(ctx context.Context, t target, sel *process.ProcessSelector) (int, error) {
	switch v := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if v.Pid == 0 {
			return 0, errdefs.Invalid("process pid 0")
		}
		return int(v.Pid), nil
	case *process.ProcessSelector_Tag:
		if pid := s.procs.byTag(t.sb.ID, v.Tag); pid != 0 {
			return pid, nil
		}
		return 0, errdefs.NotFound("no process has tag %q", v.Tag)
	}
	return 0, errdefs.Invalid("no process selected: give its pid or tag")
}

// procInfo is nook's view of one process.
func (s *Server) procInfo(ctx context.Context, t target, pid int) (api.Process, error) {
	ps, err := s.m.Processes(ctx, t.sb.Name)
	if err != nil {
		return api.Process{}, err
	}
	for _, p := range ps {
		if p.PID == pid {
			return p, nil
		}
	}
	return api.Process{}, errdefs.NotFound("process %d not found", pid)
}

// input is the process's input handle: the one a stream holds, else an
// attach made for it, kept until the process ends.
func (s *Server) input(ctx context.Context, t target, pid int) (*agent.Process, error) {
	s.procs.mu.Lock()
	e := s.procs.procs[t.sb.ID][pid]
	if e != nil && e.in != nil {
		in := e.in
		s.procs.mu.Unlock()
		return in, nil
	}
	s.procs.mu.Unlock()
	info, err := s.procInfo(ctx, t, pid)
	if err != nil {
		return nil, err
	}
	if !info.Running {
		return nil, errdefs.NotFound("process %d has exited", pid)
	}
	in, err := s.m.Attach(context.WithoutCancel(ctx), t.sb.Name, pid, info.OutputTo, true)
	if err != nil {
		return nil, err
	}
	s.procs.mu.Lock()
	if s.procs.procs[t.sb.ID] == nil {
		s.procs.procs[t.sb.ID] = map[int]*procEntry{}
	}
	if e = s.procs.procs[t.sb.ID][pid]; e == nil {
		e = &procEntry{}
		s.procs.procs[t.sb.ID][pid] = e
	}
	if cur := e.in; cur != nil { // another call made one meanwhile
		s.procs.mu.Unlock()
		in.Close()
		return cur, nil
	}
	e.in = in
	s.procs.mu.Unlock()
	// Its output is not wanted: read it away until the process ends.
	go func() {
		for {
			if _, _, err := in.Next(); err != nil {
				break
			}
		}
		s.procs.mu.Lock()
		if e.in == in {
			e.in = nil
		}
		s.procs.mu.Unlock()
		in.Close()
	}()
	return in, nil
}

// withInput runs op on the process's input handle; if that handle went
// away meanwhile (the start stream that held it ended), once more on a
// new one.
func (s *Server) withInput(ctx context.Context, t target, pid int, op func(*agent.Process) error) error {
	var err error
	for range 2 {
		var in *agent.Process
		if in, err = s.input(ctx, t, pid); err != nil {
			return err
		}
		if err = op(in); err == nil {
			return nil
		}
		s.procs.mu.Lock()
		if e := s.procs.procs[t.sb.ID][pid]; e != nil && e.in == in {
			e.in = nil // broken: the next call makes another
		}
		s.procs.mu.Unlock()
	}
	return errdefs.Unavailable("process %d: its input: %v", pid, err)
}

func (p *processService) List(ctx context.Context, req *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	t := targetOf(ctx)
	ps, err := p.s.m.Processes(ctx, t.sb.Name)
	if err != nil {
		return nil, err
	}
	out := &process.ListResponse{}
	for _, pr := range ps {
		if !pr.Running || len(pr.Cmd) == 0 {
			continue
		}
		info := &process.ProcessInfo{Pid: uint32(pr.PID), Config: &process.ProcessConfig{Cmd: pr.Cmd[0], Args: pr.Cmd[1:]}}
		if e := p.s.procs.get(t.sb.ID, pr.PID); e != nil {
			if e.cfg != nil {
				info.Config = e.cfg
			}
			if e.tag != "" {
				tag := e.tag
				info.Tag = &tag
			}
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

func (p *processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	t := targetOf(ctx)
	pid, err := p.s.pidOf(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var data []byte
	switch v := req.Msg.GetInput().GetInput().(type) {
	case *process.ProcessInput_Stdin:
		data = v.Stdin
	case *process.ProcessInput_Pty:
		data = v.Pty
	}
	if err := p.s.withInput(ctx, t, pid, func(in *agent.Process) error { _, err := in.Write(data); return err }); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func (p *processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	t := targetOf(ctx)
	pid, err := p.s.pidOf(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.s.withInput(ctx, t, pid, func(in *agent.Process) error { return in.CloseStdin() }); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}

func (p *processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	t := targetOf(ctx)
	pid, err := p.s.pidOf(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		rows, cols := uint16(min(size.GetRows(), 1000)), uint16(min(size.GetCols(), 1000))
		if err := p.s.withInput(ctx, t, pid, func(in *agent.Process) error { return in.Resize(rows, cols) }); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

func (p *processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	t := targetOf(ctx)
	pid, err := p.s.pidOf(ctx, t, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	sig := "KILL"
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGTERM:
		sig = "TERM"
	case process.Signal_SIGNAL_SIGKILL:
	default:
		return nil, errdefs.Invalid("signal %v: envd sends SIGTERM or SIGKILL", req.Msg.GetSignal())
	}
	if err := p.s.m.Signal(ctx, t.sb.Name, pid, sig); err != nil {
		// A process that exited is not there to signal (the SDK's kill
		// answers false).
		if errors.Is(err, errdefs.ErrInvalidArgument) {
			return nil, errdefs.NotFound("process %d: %v", pid, err)
		}
		return nil, err
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}
