package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/idna"
	"golang.org/x/sys/unix"
)

// Refusal reasons, as the net log shows them.
const (
	ReasonName     = "name"     // the name asked for is not allowed, or did not resolve to the address
	ReasonProtocol = "protocol" // neither TLS nor HTTP, and no rule allows raw TCP there
	ReasonNoName   = "no-name"  // TLS without a server name, HTTP without a Host
	ReasonMismatch = "mismatch" // a later HTTP request on the connection named another host
	ReasonUpstream = "upstream" // the destination did not answer
	peekTimeout    = 10 * time.Second
	maxHello       = 64 << 10 // bytes read to find a ClientHello's server name
)

// Checker decides what a sandbox may reach.
type Checker interface {
	// Name reports whether name may be reached at dst: allowed by the
	// sandbox's policy on dst's port, and resolved through its resolver
	// to dst's address; why says why not.
	Name(name string, dst netip.AddrPort) (ok bool, why string)
	// Raw reports whether dst may be reached with any TCP protocol: an
	// address a rule that allows raw TCP (NAME:PORT/tcp) resolved to.
	Raw(dst netip.AddrPort) bool
}

// Event is a refused connection.
type Event struct {
	Dst    netip.AddrPort
	Name   string // the name the client asked for ("" when none)
	Reason string
	Detail string
}

// Config configures a Proxy.
type Config struct {
	Check Checker
	// OnDenied is told of every refused connection.
	OnDenied func(Event)
	// Dial connects to the destination (default: a TCP dial from the
	// daemon's namespace).
	Dial func(ctx context.Context, dst netip.AddrPort) (net.Conn, error)
	// Target returns where a redirected connection was going (default: its
	// conntrack original destination, SO_ORIGINAL_DST).
	Target func(c net.Conn) (netip.AddrPort, error)
	Log    *slog.Logger
}

// Proxy checks and splices one sandbox's redirected connections.
type Proxy struct {
	cfg Config

	mu     sync.Mutex
	conns  map[net.Conn]*flow
	closed bool
	wg     sync.WaitGroup
}

// flow is what a connection was admitted for, to judge it again when the
// policy changes; up is its upstream connection.
type flow struct {
	name string // "" until admitted; rawName for raw TCP
	dst  netip.AddrPort
	up   net.Conn
}

// rawName marks a flow admitted as raw TCP.
const rawName = "\x00raw"

// New returns a Proxy.
func New(cfg Config) *Proxy {
	if cfg.Dial == nil {
		cfg.Dial = func(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
			return (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, "tcp4", dst.String())
		}
	}
	if cfg.Target == nil {
		cfg.Target = OriginalDst
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.OnDenied == nil {
		cfg.OnDenied = func(Event) {}
	}
	return &Proxy{cfg: cfg, conns: map[net.Conn]*flow{}}
}

// Serve handles the connections ln accepts until it is closed.
func (p *Proxy) Serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		if !p.track(c) {
			c.Close()
			return net.ErrClosed
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			p.handle(c)
		}()
	}
}

// Close closes every connection the proxy holds and waits for them.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c, f := range p.conns {
		c.Close()
		if f.up != nil {
			f.up.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Recheck closes the connections the Checker would no longer admit (the
// policy changed, or a name's resolution expired is not a reason: a
// connection outlives its address's TTL, as without the proxy).
func (p *Proxy) Recheck() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c, f := range p.conns {
		if f.name == "" {
			continue
		}
		ok := false
		if f.name == rawName {
			ok = p.cfg.Check.Raw(f.dst)
		} else {
			ok, _ = p.cfg.Check.Name(f.name, f.dst)
		}
		if !ok {
			reset(c)
			if f.up != nil {
				f.up.Close()
			}
		}
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = &flow{}
	return true
}

// admitted records what c was let through for, and its upstream
// connection; false if the proxy closed meanwhile.
func (p *Proxy) admitted(c net.Conn, name string, dst netip.AddrPort, up net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.conns[c]
	if p.closed || f == nil {
		return false
	}
	f.name, f.dst, f.up = name, dst, up
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

// handle decides on one connection: raw TCP where a rule allows it;
// else TLS whose server name, or HTTP whose every request's Host, is an
// allowed name that resolved to the destination; anything else is reset.
func (p *Proxy) handle(c net.Conn) {
	dst, err := p.cfg.Target(c)
	if err != nil {
		p.cfg.Log.Warn("egress: no original destination", "err", err)
		reset(c)
		return
	}
	if p.cfg.Check.Raw(dst) {
		// Server-first protocols (SMTP, MySQL) send nothing to peek at.
		p.splice(c, nil, rawName, dst)
		return
	}
	c.SetReadDeadline(time.Now().Add(peekTimeout))
	br := bufio.NewReaderSize(c, 4096)
	first, err := br.Peek(1)
	if err != nil {
		reset(c)
		return
	}
	switch {
	case first[0] == 0x16: // a TLS handshake record
		name, hello, err := readHello(br)
		if err != nil || name == "" {
			p.refuse(c, Event{Dst: dst, Reason: ReasonNoName, Detail: "TLS without a server name (SNI)"})
			return
		}
		if ok, why := p.check(name, dst); !ok {
			p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonName, Detail: "TLS server name " + why})
			return
		}
		c.SetReadDeadline(time.Time{})
		buffered, _ := br.Peek(br.Buffered())
		p.splice(c, append(hello, buffered...), name, dst)
	case isTokenByte(first[0]):
		p.proxyHTTP(c, br, dst)
	default:
		p.refuse(c, Event{Dst: dst, Reason: ReasonProtocol, Detail: "neither TLS nor HTTP (allow raw TCP with a rule NAME:PORT/tcp)"})
	}
}

// check normalizes a name the client sent and asks the Checker.
func (p *Proxy) check(name string, dst netip.AddrPort) (bool, string) {
	n, err := NormalizeName(name)
	if err != nil {
		return false, fmt.Sprintf("%q is not a valid name: %v", name, err)
	}
	return p.cfg.Check.Name(n, dst)
}

// NormalizeName is a name as the policy compares it: IDNA's ASCII form,
// lower case, without a trailing dot.
func NormalizeName(name string) (string, error) {
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > 253 {
		return "", errors.New("empty or too long")
	}
	ascii, err := idna.Lookup.ToASCII(name)
	if err != nil {
		return "", err
	}
	return strings.ToLower(ascii), nil
}

// errHello ends the handshake once the ClientHello is read.
var errHello = errors.New("client hello read")

// readHello reads a TLS ClientHello with crypto/tls's own parser and
// returns its server name and the bytes read, to replay upstream.
func readHello(r io.Reader) (string, []byte, error) {
	rec := &recorder{r: io.LimitReader(r, maxHello)}
	var name string
	var seen bool
	srv := tls.Server(rec, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name, seen = h.ServerName, true
		return nil, errHello
	}})
	err := srv.Handshake()
	if !seen {
		if err == nil {
			err = errors.New("no ClientHello")
		}
		return "", nil, err
	}
	return name, rec.buf, nil
}

// recorder is the conn crypto/tls reads the ClientHello from: it keeps
// what was read and writes nothing (the alert the server would send).
type recorder struct {
	r   io.Reader
	buf []byte
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.buf = append(r.buf, p[:n]...)
	return n, err
}
func (r *recorder) Write(p []byte) (int, error)      { return len(p), nil }
func (r *recorder) Close() error                     { return nil }
func (r *recorder) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (r *recorder) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (r *recorder) SetDeadline(time.Time) error      { return nil }
func (r *recorder) SetReadDeadline(time.Time) error  { return nil }
func (r *recorder) SetWriteDeadline(time.Time) error { return nil }

// isTokenByte reports whether b may start an HTTP method.
func isTokenByte(b byte) bool { return b >= 'A' && b <= 'Z' }

// proxyHTTP forwards plain HTTP request by request, each one's Host
// checked: a keep-alive connection cannot switch to another host. An
// upgraded connection (WebSocket) is spliced after its 101.
func (p *Proxy) proxyHTTP(c net.Conn, br *bufio.Reader, dst netip.AddrPort) {
	var up net.Conn
	var host string
	defer func() {
		if up != nil {
			up.Close()
		}
	}()
	respDone := make(chan struct{})
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			if up == nil && !errors.Is(err, io.EOF) {
				p.refuse(c, Event{Dst: dst, Reason: ReasonProtocol, Detail: "not an HTTP request: " + err.Error()})
			}
			if up != nil {
				closeWrite(up)
				up.SetReadDeadline(time.Now().Add(drainTimeout))
				<-respDone
			}
			return
		}
		c.SetReadDeadline(time.Time{})
		h := req.Host
		if hh, _, err := net.SplitHostPort(h); err == nil {
			h = hh
		}
		if h == "" {
			p.refuse(c, Event{Dst: dst, Reason: ReasonNoName, Detail: "HTTP request without a Host"})
			return
		}
		if req.Method == http.MethodConnect {
			p.refuse(c, Event{Dst: dst, Name: h, Reason: ReasonProtocol, Detail: "HTTP CONNECT"})
			return
		}
		if host != "" && !strings.EqualFold(h, host) {
			p.refuse(c, Event{Dst: dst, Name: h, Reason: ReasonMismatch, Detail: fmt.Sprintf("a request for %s on a connection to %s", h, host)})
			return
		}
		if host == "" {
			if ok, why := p.check(h, dst); !ok {
				p.refuse(c, Event{Dst: dst, Name: h, Reason: ReasonName, Detail: "HTTP Host " + why})
				return
			}
			host = h
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			up, err = p.cfg.Dial(ctx, dst)
			cancel()
			if err != nil {
				p.refuse(c, Event{Dst: dst, Name: h, Reason: ReasonUpstream, Detail: err.Error()})
				return
			}
			if n, _ := NormalizeName(h); !p.admitted(c, cmpOr(n, h), dst, up) {
				return
			}
			go func() {
				defer close(respDone)
				io.Copy(c, up)
				closeWrite(c)
			}()
		}
		upgrade := req.Header.Get("Upgrade") != ""
		// The request as the client sent it, framing normalized by Go's
		// parser (a smuggled second request cannot hide in the first).
		if err := req.Write(&protoWriter{w: up, proto: req.Proto}); err != nil {
			return
		}
		if upgrade {
			// A tunnel to the same host from here on.
			io.Copy(up, br)
			closeWrite(up)
			<-respDone
			return
		}
	}
}

// protoWriter puts the client's own protocol version (an HTTP/1.0
// client cannot read a chunked answer) in the request line that
// http.Request.Write writes as HTTP/1.1.
type protoWriter struct {
	w     io.Writer
	proto string
	line  []byte
	done  bool
}

func (p *protoWriter) Write(b []byte) (int, error) {
	if p.done {
		return p.w.Write(b)
	}
	p.line = append(p.line, b...)
	i := bytes.Index(p.line, []byte("\r\n"))
	if i < 0 {
		if len(p.line) > 64<<10 {
			return 0, errors.New("request line too long")
		}
		return len(b), nil
	}
	p.done = true
	first := p.line[:i]
	if p.proto != "HTTP/1.1" && bytes.HasSuffix(first, []byte(" HTTP/1.1")) {
		first = append(first[:len(first)-len("HTTP/1.1")], p.proto...)
	}
	out := append(append(append([]byte(nil), first...), "\r\n"...), p.line[i+2:]...)
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// splice connects the client to dst, sending what was read from it
// already first. Both directions copy socket to socket (splice(2)).
func (p *Proxy) splice(c net.Conn, pending []byte, name string, dst netip.AddrPort) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	up, err := p.cfg.Dial(ctx, dst)
	cancel()
	if err != nil {
		p.refuse(c, Event{Dst: dst, Reason: ReasonUpstream, Detail: err.Error()})
		return
	}
	defer up.Close()
	if n, _ := NormalizeName(name); !p.admitted(c, cmpOr(n, name), dst, up) {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(c, up)
		closeWrite(c)
	}()
	if _, err := up.Write(pending); err == nil {
		io.Copy(up, c)
	}
	closeWrite(up)
	// The client is done sending: the answer has this long to end.
	up.SetReadDeadline(time.Now().Add(drainTimeout))
	<-done
}

// drainTimeout bounds how long an upstream may keep sending after the
// client stopped.
const drainTimeout = 2 * time.Minute

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// refuse resets the connection and reports why.
func (p *Proxy) refuse(c net.Conn, ev Event) {
	p.cfg.OnDenied(ev)
	reset(c)
}

// reset closes c with a TCP reset, so the client fails at once.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// OriginalDst returns a redirected TCP connection's destination before
// the redirect (conntrack's, SO_ORIGINAL_DST).
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, errors.New("not a TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var ap netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		var mreq *unix.IPv6Mreq
		// struct sockaddr_in, read through the 16+ byte IPv6Mreq (the
		// usual way to get it from Go): port at 2:4, address at 4:8.
		mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.IPPROTO_IP, unix.SO_ORIGINAL_DST)
		if serr != nil {
			return
		}
		b := mreq.Multiaddr
		ap = netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), uint16(b[2])<<8|uint16(b[3]))
	})
	if err == nil {
		err = serr
	}
	if errors.Is(err, syscall.ENOENT) {
		return netip.AddrPort{}, errors.New("the connection was not redirected")
	}
	return ap, err
}
