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
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/idna"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/network/policy"
)

// Refusal reasons, as the net log shows them.
const (
	ReasonName     = "name"     // the name asked for is not allowed, or did not resolve to the address
	ReasonProtocol = "protocol" // neither TLS nor HTTP, and no rule allows raw TCP there
	ReasonNoName   = "no-name"  // TLS without a server name, HTTP without a valid Host
	ReasonECH      = "ech"      // TLS Encrypted Client Hello: the real name is hidden
	ReasonMismatch = "mismatch" // a later HTTP request on the connection named another host
	ReasonUpstream = "upstream" // the destination did not answer
	ReasonSecret   = "secret"   // a secret's placeholder where it may not go
)

// Limits of one connection.
const (
	peekTimeout  = 10 * time.Second // for the first bytes, the ClientHello, the first request's headers
	idleTimeout  = 2 * time.Minute  // between HTTP requests, and for each one's headers
	drainTimeout = 2 * time.Minute  // an upstream's answer after the client stopped sending
	dialTimeout  = 15 * time.Second
	maxHello     = 32 << 10 // bytes read to find a ClientHello's server name
	maxHeader    = 64 << 10 // an HTTP request's line and headers
)

// Checker decides what a sandbox may reach.
type Checker interface {
	// Name reports whether name may be reached at dst: allowed by the
	// sandbox's policy on dst's port, and resolved through its resolver
	// to dst's address; why says why not.
	Name(name string, dst netip.AddrPort) (ok bool, why string)
	// Raw returns the name whose rule (NAME:PORT/tcp) lets dst be reached
	// with any TCP protocol: a name the sandbox resolved to dst's address.
	Raw(dst netip.AddrPort) (name string, ok bool)
	// Still reports whether the policy, as it is now, still allows a
	// connection admitted to name at dst (raw: as raw TCP). Unlike Name,
	// it does not ask for the name's resolution again: a connection
	// outlives its address's TTL, as it does without the proxy.
	Still(name string, dst netip.AddrPort, raw bool) bool
	// Open reports whether the policy lets the sandbox reach dst whatever
	// the name (a CIDR rule or @internet): a connection redirected only
	// to be intercepted.
	Open(dst netip.AddrPort) bool
	// Resolved reports whether the sandbox's resolver resolved name to a.
	Resolved(name string, a netip.Addr) bool
	// OpenName reports whether name may be asked for at an open
	// destination (not a public DNS-over-HTTPS resolver the policy does
	// not name), and why not.
	OpenName(name string) (ok bool, why string)
}

// Interceptor terminates a sandbox's TLS connections to the hosts its
// secrets are bound to (internal/secrets).
type Interceptor interface {
	// Binds reports whether a secret is bound to name (normalized).
	Binds(name string) bool
	// InRequest returns the secret whose placeholder r carries, and
	// where ("" if none): such a request is not sent on plain HTTP.
	InRequest(r *http.Request) (secret, where string)
	// Serve handles the TLS connection c to name at dst until it ends,
	// its upstream connections made with dial.
	Serve(ctx context.Context, c net.Conn, name string, dst netip.AddrPort, dial func(context.Context) (net.Conn, error))
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
	// MaxConns bounds the connections held at once (0: no bound); more
	// wait in the listener's backlog.
	MaxConns int
	// Intercept returns the sandbox's interceptor (nil: it has no
	// secrets bound), asked at each connection.
	Intercept func() Interceptor
}

// Proxy checks and splices one sandbox's redirected connections.
type Proxy struct {
	cfg Config

	// ctx ends with Close: dials in progress stop.
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[net.Conn]*flow
	closed bool
	gen    uint64 // Recheck's count: a flow checked before one is checked again
	wg     sync.WaitGroup
}

// flow is what a connection was admitted for, to judge it again when the
// policy changes; up is its upstream connection.
type flow struct {
	name     string // "" until admitted
	raw      bool
	open     bool // admitted because the policy opens dst whatever the name
	dst      netip.AddrPort
	up       net.Conn
	checkGen uint64 // gen when it was checked
	admitted bool
}

// still reports whether the policy as it is now allows f.
func (p *Proxy) still(f *flow) bool {
	if f.open {
		return p.cfg.Check.Open(f.dst)
	}
	return p.cfg.Check.Still(f.name, f.dst, f.raw)
}

// New returns a Proxy.
func New(cfg Config) *Proxy {
	if cfg.Dial == nil {
		cfg.Dial = func(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp4", dst.String())
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
	if cfg.Intercept == nil {
		cfg.Intercept = func() Interceptor { return nil }
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Proxy{cfg: cfg, conns: map[net.Conn]*flow{}, ctx: ctx, cancel: cancel}
}

// Serve handles the connections ln accepts until it is closed. A
// temporary failure to accept (no descriptors left) is retried, backing
// off, as net/http does.
func (p *Proxy) Serve(ln net.Listener) error {
	var delay time.Duration
	var slots chan struct{}
	if p.cfg.MaxConns > 0 {
		slots = make(chan struct{}, p.cfg.MaxConns)
	}
	for {
		if slots != nil {
			slots <- struct{}{}
		}
		c, err := ln.Accept()
		if err != nil && slots != nil {
			<-slots
		}
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			p.cfg.Log.Warn("egress: accept", "err", err, "retry", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		if !p.track(c) {
			c.Close()
			if slots != nil {
				<-slots
			}
			return net.ErrClosed
		}
		go func() {
			defer p.wg.Done()
			defer func() {
				if slots != nil {
					<-slots
				}
			}()
			defer p.untrack(c)
			p.handle(c)
		}()
	}
}

// Close closes every connection the proxy holds and waits for them.
func (p *Proxy) Close() {
	p.cancel()
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

// Recheck ends the connections the policy no longer allows (it changed);
// connections still being admitted are checked again before they are.
func (p *Proxy) Recheck() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.gen++
	for c, f := range p.conns {
		if !f.admitted || p.still(f) {
			continue
		}
		reset(c)
		if f.up != nil {
			f.up.Close()
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
	p.wg.Add(1) // under mu: Close's Wait sees it, or closed was set first
	return true
}

// checking notes that c's check starts now (a Recheck after it makes
// admitted check it again).
func (p *Proxy) checking(c net.Conn) {
	p.mu.Lock()
	if f := p.conns[c]; f != nil {
		f.checkGen = p.gen
	}
	p.mu.Unlock()
}

// admitted records what c was let through for, and its upstream
// connection; false if the proxy closed meanwhile, or the policy changed
// since the check and no longer allows it.
func (p *Proxy) admitted(c net.Conn, a admission, up net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.conns[c]
	if p.closed || f == nil {
		return false
	}
	next := flow{name: a.name, raw: a.raw, open: a.open, dst: a.dst, up: up, checkGen: f.checkGen, admitted: true}
	if f.checkGen != p.gen && !p.still(&next) {
		return false
	}
	*f = next
	return true
}

// admission is what a connection is let through for: a name (as raw TCP
// or not) at dst, or dst whatever the name (open).
type admission struct {
	name string
	raw  bool
	open bool
	dst  netip.AddrPort
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
// A destination the policy opens whatever the name (a CIDR rule,
// @internet: the connection came only to be intercepted) is spliced
// unchecked, but for TLS to a host a secret is bound to, which the
// Interceptor terminates, and plain HTTP, whose requests must not carry
// a secret's placeholder.
func (p *Proxy) handle(c net.Conn) {
	dst, err := p.cfg.Target(c)
	if err != nil {
		p.cfg.Log.Warn("egress: no original destination", "err", err)
		reset(c)
		return
	}
	p.checking(c)
	open := p.cfg.Check.Open(dst)
	ic := p.cfg.Intercept()
	if !open {
		if name, ok := p.cfg.Check.Raw(dst); ok {
			// Server-first protocols (SMTP, MySQL) send nothing to peek at.
			p.splice(c, nil, admission{name: name, raw: true, dst: dst})
			return
		}
	}
	c.SetReadDeadline(time.Now().Add(peekTimeout))
	lr := &io.LimitedReader{R: c, N: maxHello}
	br := bufio.NewReaderSize(lr, 4096)
	first, err := br.Peek(1)
	if err != nil {
		var ne net.Error
		if open && errors.As(err, &ne) && ne.Timeout() {
			// A client that waits for the server to speak first, to an
			// address open whatever the name: as the kernel would.
			c.SetReadDeadline(time.Time{})
			p.splice(c, nil, admission{open: true, dst: dst})
			return
		}
		reset(c)
		return
	}
	pending := func() []byte { b, _ := br.Peek(br.Buffered()); return b }
	switch {
	case first[0] == 0x16: // a TLS handshake record
		hello, raw, err := readHello(br)
		if err != nil || hello.ServerName == "" || hasECH(hello.Extensions) || !plainName(hello.ServerName) {
			if open {
				c.SetReadDeadline(time.Time{})
				p.splice(c, append(raw, pending()...), admission{open: true, dst: dst})
				return
			}
		}
		if err != nil || hello.ServerName == "" {
			p.refuse(c, Event{Dst: dst, Reason: ReasonNoName, Detail: "TLS without a server name (SNI)"})
			return
		}
		name := hello.ServerName
		if hasECH(hello.Extensions) {
			p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonECH,
				Detail: "TLS Encrypted Client Hello hides the server name from the check (Chrome: --disable-features=EncryptedClientHello)"})
			return
		}
		if !plainName(name) {
			p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonName, Detail: fmt.Sprintf("TLS server name %q is not a plain ASCII name", name)})
			return
		}
		a := admission{open: true, dst: dst}
		if open {
			if a.name, err = NormalizeName(name); err != nil {
				p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonName, Detail: fmt.Sprintf("TLS server name %q: %v", name, err)})
				return
			}
			if ok, why := p.cfg.Check.OpenName(a.name); !ok {
				p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonName, Detail: "TLS server name " + a.name + " is " + why})
				return
			}
		} else {
			n, ok, why := p.check(name, dst)
			if !ok {
				p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonName, Detail: "TLS server name " + why})
				return
			}
			a = admission{name: n, dst: dst}
		}
		c.SetReadDeadline(time.Time{})
		if ic != nil && ic.Binds(a.name) {
			if !p.cfg.Check.Resolved(a.name, dst.Addr()) {
				p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonName,
					Detail: fmt.Sprintf("TLS server name %s (a secret is bound to it) did not resolve to %s through the sandbox's resolver", a.name, dst.Addr())})
				return
			}
			p.intercept(c, append(raw, pending()...), a, ic)
			return
		}
		p.splice(c, append(raw, pending()...), a)
	case isTokenByte(first[0]):
		p.proxyHTTP(c, lr, br, dst, open, ic)
	case open:
		c.SetReadDeadline(time.Time{})
		p.splice(c, pending(), admission{open: true, dst: dst})
	default:
		p.refuse(c, Event{Dst: dst, Reason: ReasonProtocol, Detail: "neither TLS nor HTTP (allow raw TCP with a rule NAME:PORT/tcp)"})
	}
}

// dial connects to dst, ending with the proxy.
func (p *Proxy) dial(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	stop := context.AfterFunc(p.ctx, cancel)
	defer stop()
	return p.cfg.Dial(ctx, dst)
}

// intercept hands a TLS connection to a bound host to the Interceptor,
// with what was read of it already.
func (p *Proxy) intercept(c net.Conn, pending []byte, a admission, ic Interceptor) {
	if !p.admitted(c, a, nil) {
		reset(c)
		return
	}
	ic.Serve(p.ctx, &replayConn{Conn: c, pending: pending}, a.name, a.dst, func(ctx context.Context) (net.Conn, error) {
		return p.dial(ctx, a.dst)
	})
}

// replayConn is a connection whose first reads return what was read from
// it already.
type replayConn struct {
	net.Conn
	pending []byte
}

func (r *replayConn) Read(b []byte) (int, error) {
	if len(r.pending) > 0 {
		n := copy(b, r.pending)
		r.pending = r.pending[n:]
		return n, nil
	}
	return r.Conn.Read(b)
}

// check normalizes a name the client sent and asks the Checker; it
// returns the normalized name.
func (p *Proxy) check(name string, dst netip.AddrPort) (string, bool, string) {
	n, err := NormalizeName(name)
	if err != nil {
		return "", false, fmt.Sprintf("%q is not a valid name: %v", name, err)
	}
	ok, why := p.cfg.Check.Name(n, dst)
	return n, ok, why
}

// NormalizeName is a name as the policy compares it: IDNA's ASCII form,
// lower case, without a trailing dot.
func NormalizeName(name string) (string, error) {
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > 253 {
		return "", errors.New("empty or too long")
	}
	if plainName(name) {
		// ASCII as the resolver takes it (names such as
		// r3---sn-x.googlevideo.com or a_b.example.com, which IDNA's
		// stricter rules refuse, resolve and are checked the same).
		return policy.NormalizeName(name), nil
	}
	ascii, err := idna.Lookup.ToASCII(name)
	if err != nil {
		return "", err
	}
	return strings.ToLower(ascii), nil
}

// plainName reports whether a name the client sent is plain ASCII
// (letters, digits, '-', '_', '.'): what the upstream receives is what was
// checked, not a Unicode form that normalizes to it.
func plainName(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// hasECH reports whether a ClientHello offers Encrypted Client Hello
// (the extension of RFC 9849, or an earlier draft's).
func hasECH(exts []uint16) bool {
	for _, e := range exts {
		if e == 0xfe0d || e == 0xffce {
			return true
		}
	}
	return false
}

// errHello ends the handshake once the ClientHello is read.
var errHello = errors.New("client hello read")

// readHello reads a TLS ClientHello with crypto/tls's own parser and
// returns it and the bytes read, to replay upstream.
func readHello(r io.Reader) (*tls.ClientHelloInfo, []byte, error) {
	rec := &recorder{r: r}
	var hello *tls.ClientHelloInfo
	srv := tls.Server(rec, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		hello = h
		return nil, errHello
	}})
	err := srv.Handshake()
	if hello == nil {
		if err == nil {
			err = errors.New("no ClientHello")
		}
		return nil, nil, err
	}
	return hello, rec.buf, nil
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
// checked: a keep-alive connection cannot switch to another host. Every
// request goes upstream with the Host that was checked, in Go's framing
// (a smuggled second request cannot hide in the first). A WebSocket
// upgrade, as the connection's first request only, is spliced once the
// upstream answers 101; any other upgrade (h2c) is refused.
//
// With open, the destination is open whatever the name: the first Host is
// not checked. With an Interceptor, a request that carries a secret's
// placeholder gets a 403 naming the secret and the connection ends.
func (p *Proxy) proxyHTTP(c net.Conn, lr *io.LimitedReader, br *bufio.Reader, dst netip.AddrPort, open bool, ic Interceptor) {
	var up net.Conn
	var host string // the checked name, normalized
	defer func() {
		if up != nil {
			up.Close()
		}
	}()
	respDone := make(chan struct{})
	for {
		if up != nil {
			c.SetReadDeadline(time.Now().Add(idleTimeout))
		}
		lr.N = maxHeader
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
		lr.N = math.MaxInt64 // the body
		c.SetReadDeadline(time.Time{})
		name, port, ok := splitHost(req.Host)
		if !ok {
			p.refuse(c, Event{Dst: dst, Reason: ReasonNoName, Detail: fmt.Sprintf("HTTP request without a valid Host (%q)", req.Host)})
			return
		}
		if req.Method == http.MethodConnect {
			p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonProtocol, Detail: "HTTP CONNECT"})
			return
		}
		n, nerr := NormalizeName(name)
		if host != "" && (nerr != nil || n != host) {
			p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonMismatch, Detail: fmt.Sprintf("a request for %s on a connection to %s", name, host)})
			return
		}
		upgrade := req.Header.Get("Upgrade")
		if upgrade != "" && (host != "" || !strings.EqualFold(strings.TrimSpace(upgrade), "websocket")) {
			p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonProtocol, Detail: fmt.Sprintf("HTTP Upgrade: %s (only websocket, as a connection's first request)", upgrade)})
			return
		}
		if ic != nil {
			if sec, where := ic.InRequest(req); sec != "" {
				if up != nil { // the answers before it go first
					closeWrite(up)
					up.SetReadDeadline(time.Now().Add(drainTimeout))
					<-respDone
				}
				p.forbid(c, Event{Dst: dst, Name: name, Reason: ReasonSecret,
					Detail: fmt.Sprintf("secret %s: its placeholder in %s of a plain HTTP request (a secret goes only over TLS, to the hosts it is bound to)", sec, where)})
				return
			}
		}
		if host == "" {
			a := admission{open: true, dst: dst}
			if open {
				if nerr != nil {
					p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonNoName, Detail: fmt.Sprintf("HTTP Host %q: %v", name, nerr)})
					return
				}
				if ok, why := p.cfg.Check.OpenName(n); !ok {
					p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonName, Detail: "HTTP Host " + n + " is " + why})
					return
				}
				a.name = n
			} else {
				n, ok, why := p.check(name, dst)
				if !ok {
					p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonName, Detail: "HTTP Host " + why})
					return
				}
				a = admission{name: n, dst: dst}
			}
			n := a.name
			up, err = p.dial(p.ctx, dst)
			if err != nil {
				p.refuse(c, Event{Dst: dst, Name: name, Reason: ReasonUpstream, Detail: err.Error()})
				return
			}
			if !p.admitted(c, a, up) {
				reset(c)
				return
			}
			host = n
			if upgrade == "" {
				go func() {
					defer close(respDone)
					// While an answer flows, the client is not idle: its
					// next request's deadline moves on with every write.
					io.Copy(&activeWriter{c: c}, up)
					closeWrite(c)
				}()
			}
		}
		// The name that was checked, nothing the client wrote around it.
		req.Host = host
		if port != "" {
			req.Host += ":" + port
		}
		if _, ok := req.Header["User-Agent"]; !ok {
			req.Header["User-Agent"] = []string{""} // not Go's own
		}
		if err := req.Write(&protoWriter{w: up, proto: req.Proto}); err != nil {
			return
		}
		if upgrade != "" {
			p.upgrade(c, br, up, req)
			return
		}
	}
}

// activeWriter writes to c and moves c's read deadline idleTimeout past
// each write.
type activeWriter struct {
	c    net.Conn
	last time.Time
}

func (w *activeWriter) Write(b []byte) (int, error) {
	if now := time.Now(); now.Sub(w.last) > time.Second {
		w.last = now
		w.c.SetReadDeadline(now.Add(idleTimeout))
	}
	return w.c.Write(b)
}

// upgrade finishes a WebSocket handshake: a tunnel only if the upstream
// answers 101; any other answer is passed on and the connection ends.
func (p *Proxy) upgrade(c net.Conn, br *bufio.Reader, up net.Conn, req *http.Request) {
	up.SetReadDeadline(time.Now().Add(idleTimeout))
	ubr := bufio.NewReader(up)
	resp, err := http.ReadResponse(ubr, req)
	if err != nil {
		return
	}
	up.SetReadDeadline(time.Time{})
	if resp.StatusCode != http.StatusSwitchingProtocols {
		resp.Write(c)
		return
	}
	resp.Write(c)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if b, _ := ubr.Peek(ubr.Buffered()); len(b) > 0 {
			c.Write(b)
		}
		io.Copy(c, up)
		closeWrite(c)
	}()
	if b, _ := br.Peek(br.Buffered()); len(b) > 0 {
		up.Write(b)
	}
	io.Copy(up, c)
	closeWrite(up)
	up.SetReadDeadline(time.Now().Add(drainTimeout))
	<-done
}

// splitHost splits a Host header into a name and a numeric port ("":
// none); false when it is not a valid host (userinfo, spaces, junk after
// the port).
func splitHost(h string) (name, port string, ok bool) {
	if h == "" || !httpguts.ValidHostHeader(h) || strings.ContainsAny(h, "@/[]") {
		return "", "", false
	}
	name, port, err := net.SplitHostPort(h)
	if err != nil {
		name, port = h, ""
	} else if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", "", false
	}
	if name == "" || !plainName(name) {
		return "", "", false
	}
	return name, port, true
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
func (p *Proxy) splice(c net.Conn, pending []byte, a admission) {
	up, err := p.dial(p.ctx, a.dst)
	if err != nil {
		p.refuse(c, Event{Dst: a.dst, Reason: ReasonUpstream, Detail: err.Error()})
		return
	}
	defer up.Close()
	if !p.admitted(c, a, up) {
		reset(c)
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

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// forbid answers an HTTP request with a 403 that says why, reports it,
// and ends the connection.
func (p *Proxy) forbid(c net.Conn, ev Event) {
	p.cfg.OnDenied(ev)
	body := "nook: refused: " + ev.Detail + "\n"
	fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nNook-Refused: %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		ev.Detail, len(body), body)
	closeWrite(c)
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
