// Package dns is the resolver nook runs for its sandboxes. It is how domain
// rules of a network policy are enforced: a sandbox can only reach an
// allowed domain's addresses after resolving them here, because the
// resolver hands each address it returns to the dataplane (Hooks.OnResolved)
// before the sandbox sees it, and the kernel admits only such addresses.
//
// One Server serves many sandboxes, each on its own address (the gateway IP
// of its network, port 53), over UDP and TCP:
//
//	srv, _ := dns.New(dns.Config{})
//	addr, _ := srv.Add("sb1", netip.MustParseAddrPort("10.88.0.1:53"), pol, hooks)
//	srv.Update("sb1", newPol)     // takes effect with the next query
//	srv.Remove(ctx, "sb1")        // closes the listeners; no hook runs after it
//
// For each query the resolver, in order:
//
//  1. drops responses and answers malformed queries (opcode other than
//     QUERY: NOTIMP; not exactly one question: FORMERR; class other than
//     IN, zone transfers: REFUSED);
//  2. applies the sandbox's rate limit (REFUSED);
//  3. refuses tunnel-shaped names: too long, long labels, characters no
//     hostname has, labels that look like encoded data (REFUSED);
//  4. answers NXDOMAIN for names the policy does not allow;
//  5. applies per-zone budgets: distinct names per minute, and TXT, NULL,
//     ANY and other uncommon types per minute (REFUSED);
//  6. answers AAAA with an empty NOERROR (sandboxes are IPv4-only);
//  7. forwards a fresh query holding only the lower-cased question to the
//     upstreams (nothing else the sandbox wrote, no EDNS options, travels);
//  8. drops A records the sandbox must not be steered to (private, blocked
//     or denied addresses: DNS rebinding), strips AAAA and additional
//     records, caps TTLs, calls OnResolved, and only then answers.
//
// REFUSED marks queries refused for their shape or volume, NXDOMAIN names
// the policy does not allow. Neither carries an SOA record, so stub
// resolvers do not cache the refusal and a policy Update takes effect at
// once. Every refusal calls Hooks.OnDenied with an Event.
//
// The resolver has no cache: every allowed query goes upstream, so the
// addresses handed to OnResolved always carry fresh TTLs.
package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mdns "github.com/miekg/dns"
	"golang.org/x/net/netutil"
	"golang.org/x/time/rate"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/network/policy"
)

// Hooks connect a sandbox's resolver to the rest of the daemon. They are
// called from the goroutine serving a query and should return quickly.
type Hooks struct {
	// OnResolved receives the addresses of an answer before the answer is
	// sent: the dataplane adds them to the sandbox's allow set for
	// r.Ports and r.TTL. If it returns an error, the sandbox gets
	// SERVFAIL instead of addresses it could not reach. ctx ends when the
	// query's time is up or the sandbox is removed. May be nil.
	OnResolved func(ctx context.Context, sandboxID string, r Resolved) error
	// OnDenied receives each refused query and each dropped answer
	// record, for the sandbox's network log. May be nil.
	OnDenied func(sandboxID string, ev Event)
}

// Resolved is the outcome of one allowed A query.
type Resolved struct {
	// Name is the question name, lower case without a trailing dot.
	Name string
	// Addrs are the IPv4 addresses the answer holds (across any CNAME
	// chain), already checked with policy.Policy.CheckResolved.
	Addrs []netip.Addr
	// Ports are the ports the policy allows for Name (nil: every port).
	Ports []policy.PortRange
	// TTL is how long the addresses may be reached: the smallest TTL of
	// the answer's A records, clamped to [Config.MinTTL, Config.MaxTTL].
	// The answer's own TTLs are no larger.
	TTL time.Duration
}

// Reason classifies a refusal.
type Reason string

// The reasons.
const (
	// ReasonNotAllowed: the policy does not allow the name (NXDOMAIN).
	ReasonNotAllowed Reason = "not-allowed"
	// ReasonTunnel: the name is shaped like DNS tunnel traffic (REFUSED).
	ReasonTunnel Reason = "tunnel"
	// ReasonZoneBudget: too many distinct names, or too many uncommon
	// query types, under one zone this minute (REFUSED).
	ReasonZoneBudget Reason = "zone-budget"
	// ReasonRateLimit: the sandbox queries faster than its limit (REFUSED).
	ReasonRateLimit Reason = "rate-limit"
	// ReasonRebinding: an upstream answer held an address the sandbox may
	// not be given; the record was dropped from the answer.
	ReasonRebinding Reason = "rebinding"
	// ReasonMalformed: a query the resolver does not serve (REFUSED,
	// FORMERR or NOTIMP).
	ReasonMalformed Reason = "malformed"
)

// Event describes one refused query or dropped answer record.
type Event struct {
	Time time.Time `json:"time"`
	// Name is the question name, lower case without a trailing dot.
	Name string `json:"name"`
	// QType is the question type, e.g. "A" or "TXT".
	QType  string `json:"qtype"`
	Reason Reason `json:"reason"`
	// Detail says why in words, e.g. `not allowed by any rule` or
	// `label "3f9a..." looks like encoded data (hex digits)`.
	Detail string `json:"detail"`
	// Suppressed counts events of this sandbox dropped by the event rate
	// limit since the previous event.
	Suppressed int `json:"suppressed,omitempty"`
}

// Server is the resolver for many sandboxes. Its methods are safe for
// concurrent use.
type Server struct {
	cfg Config
	up  exchanger

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	closed    bool
}

// New returns a Server with no sandboxes. It fails only on a bad Config.
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Server{
		cfg:       cfg,
		up:        &upstream{addrs: cfg.Upstreams, timeout: cfg.UpstreamTimeout},
		sandboxes: make(map[string]*sandbox),
	}, nil
}

// sandbox is one sandbox's resolver state.
type sandbox struct {
	id    string
	cfg   *Config
	up    exchanger
	log   *slog.Logger
	hooks Hooks
	addr  netip.AddrPort

	pol        atomic.Pointer[policy.Policy]
	limiter    *rate.Limiter
	events     *rate.Limiter
	suppressed atomic.Int64
	zones      zoneTracker

	// ctx ends when the sandbox is removed; it bounds upstream queries and
	// hook calls.
	ctx    context.Context
	cancel context.CancelFunc

	servers []*mdns.Server
	done    []chan struct{}
}

// Add starts serving sandbox id on listen over UDP and TCP and returns the
// address actually bound (listen with port 0 gets a free port, the same for
// UDP and TCP). The daemon passes the gateway address of the sandbox's
// network, port 53. Errors wrap errdefs categories: an id already served is
// ErrAlreadyExists, an address in use ErrUnavailable.
func (s *Server) Add(id string, listen netip.AddrPort, pol policy.Policy, hooks Hooks) (netip.AddrPort, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return netip.AddrPort{}, errdefs.Precondition("dns server is closed")
	}
	if _, ok := s.sandboxes[id]; ok {
		return netip.AddrPort{}, errdefs.Exists("sandbox %q already has a resolver", id)
	}
	udp, tcp, err := listen2(listen)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: %w", errdefs.Unavailable("resolver for sandbox %q cannot listen on %s", id, listen), err)
	}
	sb := &sandbox{
		id:      id,
		cfg:     &s.cfg,
		up:      s.up,
		log:     s.cfg.Logger.With("sandbox", id),
		hooks:   hooks,
		addr:    netip.AddrPortFrom(listen.Addr(), uint16(udp.LocalAddr().(*net.UDPAddr).Port)),
		limiter: rate.NewLimiter(rate.Limit(s.cfg.QPS), s.cfg.Burst),
		events:  rate.NewLimiter(rate.Limit(s.cfg.EventRate), s.cfg.EventBurst),
	}
	sb.pol.Store(&pol)
	sb.ctx, sb.cancel = context.WithCancel(context.Background())
	handler := mdns.HandlerFunc(sb.serveDNS)
	sb.servers = []*mdns.Server{
		// A read with no deadline to speak of: miekg/dns wakes the UDP
		// loop whenever its read times out (2 s by default), which for a
		// thousand idle sandboxes is 500 wakeups a second. Shutdown
		// closes the socket, which ends the read.
		{PacketConn: udp, Handler: handler, UDPSize: 4096, ReadTimeout: 24 * time.Hour},
		{Listener: netutil.LimitListener(tcp, s.cfg.MaxTCPConns), Handler: handler, MaxTCPQueries: 256},
	}
	for _, srv := range sb.servers {
		done, err := start(srv)
		if err != nil {
			sb.stop(context.Background())
			udp.Close()
			tcp.Close()
			return netip.AddrPort{}, fmt.Errorf("start resolver for sandbox %q: %w", id, err)
		}
		sb.done = append(sb.done, done)
	}
	s.sandboxes[id] = sb
	sb.log.Debug("dns resolver started", "addr", sb.addr, "policy", pol.String())
	return sb.addr, nil
}

// listen2 binds UDP and TCP on the same address. With port 0 it retries
// until a port free for both is found.
func listen2(ap netip.AddrPort) (*net.UDPConn, *net.TCPListener, error) {
	var lastErr error
	for range 20 {
		udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
		if err != nil {
			return nil, nil, err
		}
		bound := netip.AddrPortFrom(ap.Addr(), uint16(udp.LocalAddr().(*net.UDPAddr).Port))
		tcp, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(bound))
		if err == nil {
			return udp, tcp, nil
		}
		udp.Close()
		lastErr = err
		if ap.Port() != 0 || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	return nil, nil, lastErr
}

// start runs srv until it is shut down. It returns once srv is serving, and
// a channel closed when its serve loop has returned.
func start(srv *mdns.Server) (chan struct{}, error) {
	started := make(chan struct{})
	done := make(chan struct{})
	errc := make(chan error, 1)
	srv.NotifyStartedFunc = func() { close(started) }
	go func() {
		defer close(done)
		errc <- srv.ActivateAndServe()
	}()
	select {
	case <-started:
		return done, nil
	case err := <-errc:
		return nil, err
	}
}

// stop shuts down the sandbox's listeners, cancelling its in-flight
// queries first, and waits for every handler to return.
func (sb *sandbox) stop(ctx context.Context) error {
	sb.cancel()
	var errs []error
	for _, srv := range sb.servers[:len(sb.done)] {
		if err := srv.ShutdownContext(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range sb.done {
		select {
		case <-d:
		case <-ctx.Done():
			errs = append(errs, ctx.Err())
		}
	}
	return errors.Join(errs...)
}

// Update replaces sandbox id's policy. Queries handled after Update returns
// use the new policy. Addresses already handed to OnResolved are the
// dataplane's to flush.
func (s *Server) Update(id string, pol policy.Policy) error {
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	s.mu.Unlock()
	if !ok {
		return errdefs.NotFound("sandbox %q has no resolver", id)
	}
	sb.pol.Store(&pol)
	sb.log.Debug("dns policy updated", "policy", pol.String())
	return nil
}

// Addr returns the address sandbox id's resolver listens on.
func (s *Server) Addr(id string) (netip.AddrPort, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return netip.AddrPort{}, false
	}
	return sb.addr, true
}

// Remove stops serving sandbox id: it cancels the sandbox's in-flight
// queries, closes its listeners and waits (bounded by ctx) until its
// handlers have returned, so no hook runs for id after Remove returns nil.
func (s *Server) Remove(ctx context.Context, id string) error {
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	delete(s.sandboxes, id)
	s.mu.Unlock()
	if !ok {
		return errdefs.NotFound("sandbox %q has no resolver", id)
	}
	if err := sb.stop(ctx); err != nil {
		return fmt.Errorf("stop resolver for sandbox %q: %w", id, err)
	}
	sb.log.Debug("dns resolver stopped")
	return nil
}

// Close removes every sandbox and refuses further Adds.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	sbs := s.sandboxes
	s.sandboxes = make(map[string]*sandbox)
	s.mu.Unlock()
	var errs []error
	for id, sb := range sbs {
		if err := sb.stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stop resolver for sandbox %q: %w", id, err))
		}
	}
	return errors.Join(errs...)
}
