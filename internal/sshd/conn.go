package sshd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
)

// maxChannels caps a connection's open channels (sessions and forwards).
const maxChannels = 64

// conn is one logged-in SSH connection: to one sandbox, as one user.
type conn struct {
	s         *Server
	sc        *ssh.ServerConn
	name      string // the sandbox's
	sandboxID string
	user      string // "" the sandbox's default user
	// lastUse is when the connection last told the daemon it was used
	// (unix nanoseconds): traffic restarts the idle clock at most once a
	// second.
	lastUse atomic.Int64
	// login is the user's passwd entry, read once it read well
	// (loginMu; loaded).
	loginMu sync.Mutex
	loaded  bool
	login   passwdEntry
}

// serveConn serves one connection: the handshake (handshakeDone once it
// ended, logged in or not), then its channels.
func (s *Server) serveConn(ctx context.Context, nc net.Conn, cfg *ssh.ServerConfig, handshakeDone func()) {
	nc.SetDeadline(time.Now().Add(handshakeTimeout))
	sc, chans, reqs, err := ssh.NewServerConn(nc, cfg)
	handshakeDone()
	if err != nil {
		return // a scanner, a wrong key: nothing to log for each
	}
	nc.SetDeadline(time.Time{})
	defer sc.Close()
	name, _, _ := strings.Cut(sc.User(), "+")
	c := &conn{s: s, sc: sc, name: name, sandboxID: sc.Permissions.Extensions[extSandboxID], user: sc.Permissions.Extensions[extUser]}
	if !s.perSandbox.acquire(c.sandboxID) {
		s.log.Warn("ssh login refused: too many connections to the sandbox", "sandbox", name, "max", maxConnsPerSandbox)
		return
	}
	defer s.perSandbox.release(c.sandboxID)
	s.log.Info("ssh login", "sandbox", name, "user", c.user, "remote", nc.RemoteAddr().String())
	c.used()
	// Global requests (keepalives, remote forwards): refused, which
	// OpenSSH's keepalive takes as an answer.
	go ssh.DiscardRequests(reqs)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var open atomic.Int32
	var wg sync.WaitGroup
	defer wg.Wait()
	for nch := range chans {
		if open.Load() >= maxChannels {
			nch.Reject(ssh.ResourceShortage, fmt.Sprintf("at most %d channels per connection", maxChannels))
			continue
		}
		// Each channel is a new use of the login: the sandbox must still
		// be the one it logged in to, and what admitted it still admit it.
		if err := c.stillAllowed(ctx); err != nil {
			nch.Reject(ssh.Prohibited, "this login no longer admits you to sandbox "+name)
			sc.Close()
			continue
		}
		var handle func(context.Context, ssh.NewChannel)
		switch nch.ChannelType() {
		case "session":
			handle = c.session
		case "direct-tcpip":
			handle = c.forward
		default:
			nch.Reject(ssh.UnknownChannelType, "nook serves sessions and local port forwarding (-L) only")
			continue
		}
		open.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer open.Add(-1)
			handle(ctx, nch)
		}()
	}
	cancel() // the connection is gone: end what it started
}

// stillAllowed checks the login again (Server.allowed).
func (c *conn) stillAllowed(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	sb, err := c.s.m.Get(ctx, c.name)
	if err != nil {
		return err
	}
	return c.s.allowed(ctx, sb, c.sc.Permissions)
}

// used restarts the sandbox's idle clock, at most once a second.
func (c *conn) used() {
	now := time.Now().UnixNano()
	if last := c.lastUse.Load(); now-last < int64(time.Second) || !c.lastUse.CompareAndSwap(last, now) {
		return
	}
	c.s.m.Used(c.sandboxID)
}

// passive is the context of a call whose agent stream stays open for the
// session: open streams are no use of the sandbox, traffic is (used).
func passive(ctx context.Context) context.Context { return daemon.Passive(ctx) }

// passwdEntry is what a login needs of a user's /etc/passwd line.
type passwdEntry struct {
	name, home, shell string
}

// maxPasswd bounds the /etc/passwd a login reads.
const maxPasswd = 4 << 20

// loginEntry reads the login user's passwd entry from the sandbox, once
// per connection (its shell and home; sh and / for a user it does not
// list, or a sandbox without /etc/passwd). An error is not kept: the
// next session reads again.
func (c *conn) loginEntry(ctx context.Context) (passwdEntry, error) {
	c.loginMu.Lock()
	defer c.loginMu.Unlock()
	if c.loaded {
		return c.login, nil
	}
	user := c.user
	if user == "" {
		sb, err := c.s.m.Get(ctx, c.name)
		if err != nil {
			return passwdEntry{}, err
		}
		user = c.s.m.DefaultUser(sb)
	}
	if user == "" {
		user = "root"
	}
	user, _, _ = strings.Cut(user, ":") // USER:GROUP
	entry := passwdEntry{name: user, home: "/", shell: "/bin/sh"}
	_, rc, err := c.s.m.ReadFile(passive(ctx), c.name, "/etc/passwd", 0, maxPasswd)
	switch {
	case errors.Is(err, errdefs.ErrNotFound):
	case err != nil:
		return passwdEntry{}, err
	default:
		e, ok := findPasswd(io.LimitReader(rc, maxPasswd), user)
		rc.Close()
		if ok {
			entry = e
		}
	}
	c.login, c.loaded = entry, true
	return entry, nil
}

// findPasswd finds user (a name or a uid) in a passwd file.
func findPasswd(r io.Reader, user string) (passwdEntry, bool) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 64<<10)
	_, numeric := strconv.Atoi(user)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 7 {
			continue
		}
		if f[0] == user || (numeric == nil && f[2] == user) {
			e := passwdEntry{name: f[0], home: f[5], shell: f[6]}
			if e.home == "" {
				e.home = "/"
			}
			if e.shell == "" || !strings.HasPrefix(e.shell, "/") {
				e.shell = "/bin/sh"
			}
			return e, true
		}
	}
	return passwdEntry{}, false
}

// forward serves a direct-tcpip channel (ssh -L): a TCP connection to a
// port of the sandbox itself. It never dials from the host: the sandbox's
// agent connects to its own loopback, so a forward reaches nothing the
// sandbox could not.
func (c *conn) forward(ctx context.Context, nch ssh.NewChannel) {
	var req struct {
		Host       string
		Port       uint32
		OriginHost string
		OriginPort uint32
	}
	if err := ssh.Unmarshal(nch.ExtraData(), &req); err != nil {
		nch.Reject(ssh.ConnectionFailed, "malformed direct-tcpip request")
		return
	}
	if err := forwardTarget(req.Host, req.Port); err != nil {
		nch.Reject(ssh.Prohibited, err.Error())
		return
	}
	dctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	tc, err := c.s.m.DialPort(passive(dctx), c.name, int(req.Port))
	cancel()
	if err != nil {
		nch.Reject(ssh.ConnectionFailed, fmt.Sprintf("connect to port %d in sandbox %s: %v", req.Port, c.name, err))
		return
	}
	defer tc.Close()
	ch, reqs, err := nch.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	go ssh.DiscardRequests(reqs)
	c.used()
	stop := context.AfterFunc(ctx, func() { ch.Close(); tc.Close() })
	defer stop()
	done := make(chan struct{})
	go func() {
		io.Copy(tc, usedReader{ch, c})
		// The client's EOF on to the sandbox's server. The agent's stream
		// is a yamux stream, whose Close is a half-close: reads go on
		// until the sandbox's side ends.
		tc.Close()
		close(done)
	}()
	if _, err := io.Copy(ch, usedReader{tc, c}); err != nil {
		ch.Close() // the sandbox's side broke: the client's copy ends too
	} else {
		ch.CloseWrite()
	}
	<-done
}

// forwardTarget checks a local forward's destination: the sandbox's own
// loopback, by any of its names.
func forwardTarget(host string, port uint32) error {
	if port < 1 || port > 65535 {
		return fmt.Errorf("port %d is not a TCP port", port)
	}
	switch strings.ToLower(host) {
	case "localhost", "127.0.0.1", "::1", "ip6-localhost", "0.0.0.0", "":
		return nil
	}
	return fmt.Errorf("nook forwards only to the sandbox's own ports (localhost:PORT), not to %q", host)
}

// usedReader reports traffic to the idle clock.
type usedReader struct {
	r io.Reader
	c *conn
}

func (u usedReader) Read(p []byte) (int, error) {
	n, err := u.r.Read(p)
	if n > 0 {
		u.c.used()
	}
	return n, err
}
