package sshd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"

	"golang.org/x/crypto/ssh"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
)

// Channel requests of a session (RFC 4254 section 6), as they arrive.

type ptyRequest struct {
	Term          string
	Cols, Rows    uint32
	Width, Height uint32
	Modes         string
}

type windowChange struct {
	Cols, Rows    uint32
	Width, Height uint32
}

type envRequest struct {
	Name, Value string
}

type stringRequest struct {
	Value string
}

// Bounds on what a client may pass: env requests (count, name, all
// names and values together) and a terminal type.
const (
	maxEnvVars  = 64
	maxEnvName  = 256
	maxEnvBytes = 64 << 10
	maxTerm     = 256
)

// decodeRequest decodes a session request's payload into the struct of
// its kind; unknown kinds decode to nil. The payload is the client's:
// malformed ones are errors, never panics.
func decodeRequest(kind string, payload []byte) (any, error) {
	var v any
	switch kind {
	case "pty-req":
		v = &ptyRequest{}
	case "window-change":
		v = &windowChange{}
	case "env":
		v = &envRequest{}
	case "exec", "subsystem", "signal":
		v = &stringRequest{}
	default:
		return nil, nil
	}
	if err := ssh.Unmarshal(payload, v); err != nil {
		return nil, fmt.Errorf("malformed %s request: %w", kind, err)
	}
	return v, nil
}

// termSize clamps a client's terminal size to what a terminal holds.
func termSize(cols, rows uint32) (uint16, uint16) {
	clamp := func(v uint32) uint16 {
		if v == 0 {
			return 0
		}
		return uint16(min(v, 4096))
	}
	return clamp(cols), clamp(rows)
}

// session is one session channel: a shell, a command or SFTP.
type session struct {
	c   *conn
	ch  ssh.Channel
	pty *ptyRequest // guarded by mu once the session runs (window-change)
	env map[string]string
	// envBytes is what env holds, names and values.
	envBytes int
	// started: the shell, command or subsystem runs; later ones are refused.
	started bool
	mu      sync.Mutex
	proc    *agent.Process // set once the process runs
}

func (c *conn) session(ctx context.Context, nch ssh.NewChannel) {
	ch, reqs, err := nch.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s := &session{c: c, ch: ch, env: map[string]string{}}
	done := make(chan struct{})
	for {
		select {
		case req, ok := <-reqs:
			if !ok {
				// The client closed the channel: end what runs.
				cancel()
				s.closeProc()
				if s.started {
					<-done
				}
				return
			}
			s.handle(ctx, req, done)
		case <-done:
			// The process ended and its exit was sent; the channel closes.
			go ssh.DiscardRequests(reqs)
			return
		}
	}
}

func (s *session) closeProc() {
	s.mu.Lock()
	p := s.proc
	s.mu.Unlock()
	if p != nil {
		p.Close()
	}
}

// handle answers one request; shell, exec and subsystem start the
// session's work, which closes done when it ends.
func (s *session) handle(ctx context.Context, req *ssh.Request, done chan struct{}) {
	v, err := decodeRequest(req.Type, req.Payload)
	if err != nil {
		req.Reply(false, nil)
		return
	}
	switch req.Type {
	case "pty-req":
		if s.started {
			req.Reply(false, nil)
			return
		}
		pty := v.(*ptyRequest)
		if len(pty.Term) > maxTerm {
			req.Reply(false, nil)
			return
		}
		pty.Modes = "" // nook's terminals keep their defaults
		s.mu.Lock()
		s.pty = pty
		s.mu.Unlock()
		req.Reply(true, nil)
	case "window-change":
		w := v.(*windowChange)
		cols, rows := termSize(w.Cols, w.Rows)
		s.mu.Lock()
		p := s.proc
		if p == nil && s.pty != nil {
			s.pty.Cols, s.pty.Rows = w.Cols, w.Rows
		}
		s.mu.Unlock()
		if p != nil && cols > 0 && rows > 0 {
			p.Resize(rows, cols)
		}
		req.Reply(true, nil) // window-change wants no reply; Reply ignores that
	case "env":
		e := v.(*envRequest)
		ok := !s.started && len(s.env) < maxEnvVars && len(e.Name) <= maxEnvName && s.envBytes+len(e.Name)+len(e.Value) <= maxEnvBytes && s.c.s.envAccepted(e.Name)
		if ok {
			s.env[e.Name] = e.Value
			s.envBytes += len(e.Name) + len(e.Value)
		}
		req.Reply(ok, nil)
	case "signal":
		name := strings.TrimPrefix(v.(*stringRequest).Value, "SIG")
		s.mu.Lock()
		p := s.proc
		s.mu.Unlock()
		if p != nil && validSignal(name) {
			p.Signal(name)
		}
		req.Reply(true, nil)
	case "shell", "exec", "subsystem":
		if s.started {
			req.Reply(false, nil)
			return
		}
		if req.Type == "subsystem" && v.(*stringRequest).Value != "sftp" {
			req.Reply(false, nil)
			return
		}
		s.started = true
		req.Reply(true, nil)
		go func() {
			defer close(done)
			cmd := ""
			if req.Type == "exec" {
				cmd = v.(*stringRequest).Value
			}
			code := s.run(ctx, req.Type, cmd)
			if code != noExitStatus {
				s.ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{code}))
			}
			s.ch.CloseWrite()
			s.ch.Close()
		}()
	default:
		// Agent forwarding (auth-agent-req@openssh.com), X11, break and
		// anything else: refused.
		req.Reply(false, nil)
	}
}

// noExitStatus: the exit was sent as exit-signal, or there is none.
const noExitStatus = ^uint32(0)

// validSignal admits the signal names RFC 4254 lists (and USR1/2).
func validSignal(name string) bool {
	switch name {
	case "ABRT", "ALRM", "FPE", "HUP", "ILL", "INT", "KILL", "PIPE", "QUIT", "SEGV", "TERM", "USR1", "USR2":
		return true
	}
	return false
}

// envAccepted says whether a client may set the variable name (AcceptEnv).
func (s *Server) envAccepted(name string) bool {
	if name == "" || strings.ContainsAny(name, "=\x00") {
		return false
	}
	for _, pat := range s.acceptEnv {
		if prefix, ok := strings.CutSuffix(pat, "*"); ok {
			if strings.HasPrefix(name, prefix) {
				return true
			}
		} else if name == pat {
			return true
		}
	}
	return false
}

// fail tells the client why its session ends, on stderr, and gives the
// exit status OpenSSH gives a session it could not start.
func (s *session) fail(format string, args ...any) uint32 {
	fmt.Fprintf(s.ch.Stderr(), "nook: "+format+"\r\n", args...)
	return 255
}

// run runs what a session asked for in the sandbox, as the login user,
// and pumps the channel to and from it: kind "shell" (the user's login
// shell), "exec" (cmd by that shell) or "subsystem" (SFTP: the agent's
// binary as an SFTP server, agent.SFTPServerMain, never on a terminal).
func (s *session) run(ctx context.Context, kind, cmd string) uint32 {
	c := s.c
	login, err := c.loginEntry(ctx)
	if err != nil {
		return s.fail("%v", err)
	}
	var argv []string
	switch kind {
	case "shell":
		argv = []string{login.shell, "-l"}
	case "exec":
		argv = []string{login.shell, "-c", cmd}
	default:
		argv = []string{agent.SFTPServerPath, agent.SFTPServerArg}
	}
	env := map[string]string{"SHELL": login.shell}
	for k, v := range s.env {
		env[k] = v
	}
	if ra, ok := c.sc.RemoteAddr().(*net.TCPAddr); ok {
		if la, ok := c.sc.LocalAddr().(*net.TCPAddr); ok {
			env["SSH_CLIENT"] = fmt.Sprintf("%s %d %d", ra.IP, ra.Port, la.Port)
			env["SSH_CONNECTION"] = fmt.Sprintf("%s %d %s %d", ra.IP, ra.Port, la.IP, la.Port)
		}
	}
	// The agent starts it in the user's home (/ when that is missing).
	req := api.ExecRequest{Cmd: argv, Env: env, User: c.user, Stdin: true}
	s.mu.Lock()
	pty := s.pty
	if pty != nil && kind != "subsystem" {
		req.TTY = true
		req.Cols, req.Rows = termSize(pty.Cols, pty.Rows)
		if pty.Term != "" {
			env["TERM"] = pty.Term
		}
	}
	s.mu.Unlock()
	// A shell or SFTP session sitting open is no use of the sandbox, its
	// traffic is (used); a command is use while it runs, as nook exec's.
	ectx := ctx
	if kind != "exec" {
		ectx = passive(ctx)
	}
	p, err := c.s.m.Exec(ectx, c.name, req)
	if err != nil {
		return s.fail("%v", err)
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	defer p.Close()
	// The channel may have closed before s.proc was set: the session's
	// end still ends the process.
	stop := context.AfterFunc(ctx, func() { p.Close() })
	defer stop()
	c.used()
	// Input: the channel to the process's stdin, EOF closing it.
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := s.ch.Read(buf)
			if n > 0 {
				c.used()
				if _, werr := p.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				if err == io.EOF {
					p.CloseStdin()
				}
				return
			}
		}
	}()
	stderr := s.ch.Stderr()
	for {
		kind, b, err := p.Next()
		if err != nil {
			if ctx.Err() != nil {
				return noExitStatus
			}
			return s.fail("the connection to sandbox %s ended (%v): is it paused or stopped? `nook ls`", c.name, err)
		}
		c.used()
		switch kind {
		case api.FrameStdout:
			if _, err := s.ch.Write(b); err != nil {
				return noExitStatus
			}
		case api.FrameStderr:
			if _, err := stderr.Write(b); err != nil {
				return noExitStatus
			}
		case api.FrameExit:
			var st api.ExitStatus
			if err := json.Unmarshal(b, &st); err != nil {
				return s.fail("the sandbox's agent sent a bad exit status")
			}
			if st.Signal != "" {
				s.ch.SendRequest("exit-signal", false, ssh.Marshal(struct {
					Signal     string
					CoreDumped bool
					Message    string
					Lang       string
				}{st.Signal, false, "", ""}))
				return noExitStatus
			}
			return uint32(st.ExitCode)
		}
	}
}
