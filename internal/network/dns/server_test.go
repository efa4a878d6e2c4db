package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"go.uber.org/goleak"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/network/policy"
)

var loopback = netip.MustParseAddrPort("127.0.0.1:0")

// testUpstream is an authoritative-looking server on loopback serving the
// test zone. Addresses in it are data only: no packet goes to them.
type testUpstream struct {
	addr    netip.AddrPort
	queries atomic.Int64
	slow    chan struct{} // slow.test waits for it
	mu      sync.Mutex
	names   []string
}

func rr(t testing.TB, s string) mdns.RR {
	t.Helper()
	r, err := mdns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func startUpstream(t *testing.T) *testUpstream {
	t.Helper()
	u := &testUpstream{slow: make(chan struct{})}
	zone := map[string][]string{
		"allowed.test.":      {"allowed.test. 300 IN A 198.51.100.7"},
		"short.test.":        {"short.test. 5 IN A 198.51.100.8"},
		"long.test.":         {"long.test. 86400 IN A 198.51.100.10"},
		"cdn.test.":          {"cdn.test. 600 IN CNAME edge.cdnprovider.test.", "edge.cdnprovider.test. 60 IN A 203.0.113.9"},
		"rebind.test.":       {"rebind.test. 300 IN A 10.0.0.5", "rebind.test. 300 IN A 198.51.100.9"},
		"metadata.test.":     {"metadata.test. 300 IN A 169.254.169.254"},
		"loop.test.":         {"loop.test. 300 IN A 127.0.0.1"},
		"txt.test.":          {`txt.test. 300 IN TXT "hello"`},
		"dual.test.":         {"dual.test. 300 IN A 192.0.2.5"},
		"slow.test.":         {"slow.test. 300 IN A 192.0.2.6"},
		"private-only.test.": {"private-only.test. 300 IN A 192.168.1.1"},
	}
	var many []string
	for i := 1; i <= 60; i++ {
		many = append(many, fmt.Sprintf("many.test. 300 IN A 198.51.100.%d", i))
	}
	zone["many.test."] = many
	handler := mdns.HandlerFunc(func(w mdns.ResponseWriter, req *mdns.Msg) {
		u.queries.Add(1)
		q := req.Question[0]
		u.mu.Lock()
		u.names = append(u.names, strings.ToLower(q.Name)+"/"+mdns.TypeToString[q.Qtype])
		u.mu.Unlock()
		m := new(mdns.Msg)
		m.SetReply(req)
		m.Authoritative = true
		name := strings.ToLower(q.Name)
		if name == "slow.test." {
			<-u.slow
		}
		recs, ok := zone[name]
		switch {
		case name == "nx.test.":
			m.Rcode = mdns.RcodeNameError
			m.Ns = append(m.Ns, rr(t, "test. 60 IN SOA ns.test. admin.test. 1 60 60 60 60"))
		case q.Qtype == mdns.TypeAAAA:
			m.Answer = append(m.Answer, rr(t, q.Name+" 300 IN AAAA 2001:db8::1"))
		case ok:
			for _, s := range recs {
				r := rr(t, s)
				if r.Header().Rrtype == q.Qtype || r.Header().Rrtype == mdns.TypeCNAME || q.Qtype == mdns.TypeA && r.Header().Rrtype == mdns.TypeA {
					m.Answer = append(m.Answer, r)
				}
			}
			m.Extra = append(m.Extra, rr(t, "glue.test. 300 IN A 198.51.100.99"))
		default: // a catch-all, so refused queries would have been answered
			if q.Qtype == mdns.TypeA {
				m.Answer = append(m.Answer, rr(t, q.Name+" 300 IN A 192.0.2.200"))
			} else if q.Qtype == mdns.TypeTXT {
				m.Answer = append(m.Answer, rr(t, q.Name+` 300 IN TXT "data"`))
			}
		}
		if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
			size := mdns.MinMsgSize
			if opt := req.IsEdns0(); opt != nil {
				size = int(opt.UDPSize())
			}
			m.Truncate(size)
		}
		w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := pc.LocalAddr().(*net.UDPAddr).Port
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		pc.Close()
		t.Skipf("tcp port %d taken: %v", port, err)
	}
	u.addr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port))
	for _, srv := range []*mdns.Server{{PacketConn: pc, Handler: handler}, {Listener: l, Handler: handler}} {
		done, err := start(srv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			srv.Shutdown()
			<-done
		})
	}
	t.Cleanup(func() {
		select {
		case <-u.slow:
		default:
			close(u.slow)
		}
	})
	return u
}

// recorder collects hook calls.
type recorder struct {
	mu       sync.Mutex
	resolved []Resolved
	events   []Event
	// block, if set, makes OnResolved wait for it.
	entered chan struct{}
	block   chan struct{}
	fail    error
}

func (r *recorder) hooks() Hooks {
	return Hooks{
		OnResolved: func(ctx context.Context, id string, res Resolved) error {
			if id != "sb" {
				panic("wrong sandbox id " + id)
			}
			if r.block != nil {
				r.entered <- struct{}{}
				select {
				case <-r.block:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			r.resolved = append(r.resolved, res)
			return r.fail
		},
		OnDenied: func(id string, ev Event) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.events = append(r.events, ev)
		},
	}
}

func (r *recorder) lastEvent(t *testing.T) Event {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.events) == 0 {
		t.Fatal("no OnDenied event")
	}
	return r.events[len(r.events)-1]
}

func (r *recorder) resolvedAt(i int) Resolved {
	r.mu.Lock()
	defer r.mu.Unlock()
	if i >= len(r.resolved) {
		return Resolved{}
	}
	return r.resolved[i]
}

func (r *recorder) nResolved() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.resolved)
}

type env struct {
	t    *testing.T
	up   *testUpstream
	srv  *Server
	addr netip.AddrPort
	rec  *recorder
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newEnv starts an upstream and a Server with sandbox "sb" under a policy
// built from allow and deny.
func newEnv(t *testing.T, cfg Config, allow, deny []string) *env {
	t.Helper()
	e := &env{t: t, up: startUpstream(t), rec: &recorder{}}
	if cfg.Upstreams == nil {
		cfg.Upstreams = []netip.AddrPort{e.up.addr}
	}
	cfg.Logger = testLogger(t)
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = srv
	t.Cleanup(func() {
		if err := srv.Close(context.Background()); err != nil {
			t.Error(err)
		}
	})
	e.addr, err = srv.Add("sb", loopback, mustPolicy(t, "", allow, deny), e.rec.hooks())
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func mustPolicy(t testing.TB, mode string, allow, deny []string) policy.Policy {
	t.Helper()
	p, err := policy.Parse(mode, allow, deny)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func (e *env) query(net, name string, qtype uint16) *mdns.Msg {
	e.t.Helper()
	r, err := query(e.addr, net, name, qtype)
	if err != nil {
		e.t.Fatalf("query %s %s over %s: %v", name, mdns.TypeToString[qtype], net, err)
	}
	return r
}

func query(addr netip.AddrPort, network, name string, qtype uint16) (*mdns.Msg, error) {
	c := &mdns.Client{Net: network, Timeout: 5 * time.Second}
	m := new(mdns.Msg)
	m.SetQuestion(mdns.Fqdn(name), qtype)
	r, _, err := c.Exchange(m, addr.String())
	return r, err
}

func answerAddrs(m *mdns.Msg) []string {
	var out []string
	for _, r := range m.Answer {
		if a, ok := r.(*mdns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out
}

func wantRcode(t *testing.T, m *mdns.Msg, rcode int) {
	t.Helper()
	if m.Rcode != rcode {
		t.Fatalf("rcode %s, want %s:\n%v", mdns.RcodeToString[m.Rcode], mdns.RcodeToString[rcode], m)
	}
}

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestAllowedName(t *testing.T) {
	e := newEnv(t, Config{}, []string{"allowed.test:443"}, nil)
	for _, network := range []string{"udp", "tcp"} {
		r := e.query(network, "Allowed.Test", mdns.TypeA)
		wantRcode(t, r, mdns.RcodeSuccess)
		if got := answerAddrs(r); !slices.Equal(got, []string{"198.51.100.7"}) {
			t.Fatalf("%s: answer %v", network, got)
		}
		if r.Answer[0].Header().Ttl != 300 || len(r.Extra) != 0 || !r.RecursionAvailable {
			t.Errorf("%s: answer %v", network, r)
		}
	}
	if n := e.rec.nResolved(); n != 2 {
		t.Fatalf("OnResolved called %d times, want 2", n)
	}
	res := e.rec.resolvedAt(0)
	if res.Name != "allowed.test" || !slices.Equal(res.Addrs, []netip.Addr{netip.MustParseAddr("198.51.100.7")}) ||
		policy.FormatPorts(res.Ports) != "443" || res.TTL != 300*time.Second {
		t.Errorf("OnResolved got %+v", res)
	}
}

func TestHookRunsBeforeAnswer(t *testing.T) {
	e := newEnv(t, Config{}, []string{"allowed.test"}, nil)
	e.rec.entered = make(chan struct{}, 1)
	e.rec.block = make(chan struct{})
	got := make(chan *mdns.Msg, 1)
	go func() {
		r, err := query(e.addr, "udp", "allowed.test", mdns.TypeA)
		if err != nil {
			t.Error(err)
		}
		got <- r
	}()
	<-e.rec.entered
	select {
	case <-got:
		t.Fatal("answer arrived while OnResolved was still running")
	case <-time.After(200 * time.Millisecond):
	}
	close(e.rec.block)
	if r := <-got; r == nil || len(answerAddrs(r)) != 1 {
		t.Fatalf("answer %v", r)
	}
}

func TestDeniedName(t *testing.T) {
	e := newEnv(t, Config{}, []string{"allowed.test", "*.wild.test"}, []string{"bad.wild.test"})
	for _, tc := range []struct{ name, why string }{
		{"other.test", "not allowed by any rule"},
		{"sub.allowed.test", "not allowed by any rule"},
		{"wild.test", "not allowed by any rule"},
		{"bad.wild.test", `denied by "bad.wild.test"`},
	} {
		for _, network := range []string{"udp", "tcp"} {
			r := e.query(network, tc.name, mdns.TypeA)
			wantRcode(t, r, mdns.RcodeNameError)
			if len(r.Answer)+len(r.Ns) != 0 {
				t.Errorf("NXDOMAIN carries records (would be cached): %v", r)
			}
			ev := e.rec.lastEvent(t)
			if ev.Name != tc.name || ev.QType != "A" || ev.Reason != ReasonNotAllowed || ev.Detail != tc.why || ev.Time.IsZero() {
				t.Errorf("event %+v, want name %s why %q", ev, tc.name, tc.why)
			}
		}
	}
	if n := e.up.queries.Load(); n != 0 {
		t.Errorf("upstream got %d queries for denied names", n)
	}
}

func TestWildcard(t *testing.T) {
	e := newEnv(t, Config{}, []string{"*.wild.test:80"}, nil)
	for _, name := range []string{"a.wild.test", "x.y.wild.test"} {
		r := e.query("udp", name, mdns.TypeA)
		wantRcode(t, r, mdns.RcodeSuccess)
		if got := answerAddrs(r); !slices.Equal(got, []string{"192.0.2.200"}) {
			t.Errorf("%s: %v", name, got)
		}
	}
	if n := e.rec.nResolved(); n != 2 || policy.FormatPorts(e.rec.resolvedAt(1).Ports) != "80" {
		t.Errorf("resolved %d, %+v", n, e.rec.resolvedAt(1))
	}
}

func TestAAAAIsEmpty(t *testing.T) {
	e := newEnv(t, Config{}, []string{"dual.test"}, nil)
	r := e.query("udp", "dual.test", mdns.TypeAAAA)
	wantRcode(t, r, mdns.RcodeSuccess)
	if len(r.Answer) != 0 || e.up.queries.Load() != 0 {
		t.Errorf("AAAA answered %v after %d upstream queries", r.Answer, e.up.queries.Load())
	}
	// AAAA of a denied name is still NXDOMAIN.
	wantRcode(t, e.query("udp", "nope.test", mdns.TypeAAAA), mdns.RcodeNameError)
}

// HTTPS and SVCB records (which carry ECH keys, hiding the TLS server
// name the egress proxy checks) are answered empty, never asked upstream.
func TestHTTPSRecordsAreEmpty(t *testing.T) {
	e := newEnv(t, Config{}, []string{"dual.test"}, nil)
	for _, qt := range []uint16{mdns.TypeHTTPS, mdns.TypeSVCB} {
		r := e.query("udp", "dual.test", qt)
		wantRcode(t, r, mdns.RcodeSuccess)
		if len(r.Answer) != 0 || e.up.queries.Load() != 0 {
			t.Errorf("type %d answered %v after %d upstream queries", qt, r.Answer, e.up.queries.Load())
		}
	}
}

// metadata.nook.internal is the resolver's own answer, whatever the policy.
func TestLocalName(t *testing.T) {
	e := newEnv(t, Config{Local: map[string]netip.Addr{"metadata.nook.internal": netip.MustParseAddr("169.254.169.254")}}, nil, nil)
	r := e.query("udp", "Metadata.Nook.Internal.", mdns.TypeA)
	wantRcode(t, r, mdns.RcodeSuccess)
	if len(r.Answer) != 1 || r.Answer[0].(*mdns.A).A.String() != "169.254.169.254" || e.up.queries.Load() != 0 {
		t.Errorf("metadata.nook.internal: %v", r.Answer)
	}
}

func TestTTL(t *testing.T) {
	e := newEnv(t, Config{}, []string{"short.test", "long.test", "nx.test"}, nil)
	r := e.query("udp", "short.test", mdns.TypeA)
	if r.Answer[0].Header().Ttl != 5 || e.rec.resolvedAt(0).TTL != 30*time.Second {
		t.Errorf("short TTL: answer %d, hook %s; want 5 and the 30s minimum", r.Answer[0].Header().Ttl, e.rec.resolvedAt(0).TTL)
	}
	r = e.query("udp", "long.test", mdns.TypeA)
	if r.Answer[0].Header().Ttl != 3600 || e.rec.resolvedAt(1).TTL != time.Hour {
		t.Errorf("long TTL: answer %d, hook %s; want both capped at 1h", r.Answer[0].Header().Ttl, e.rec.resolvedAt(1).TTL)
	}
	// An upstream NXDOMAIN for an allowed name passes through, with its SOA.
	r = e.query("udp", "nx.test", mdns.TypeA)
	wantRcode(t, r, mdns.RcodeNameError)
	if len(r.Ns) != 1 || e.rec.nResolved() != 2 {
		t.Errorf("upstream NXDOMAIN: %v", r)
	}
}

func TestCNAMEChain(t *testing.T) {
	e := newEnv(t, Config{}, []string{"cdn.test"}, nil)
	r := e.query("udp", "cdn.test", mdns.TypeA)
	wantRcode(t, r, mdns.RcodeSuccess)
	if len(r.Answer) != 2 || answerAddrs(r)[0] != "203.0.113.9" {
		t.Fatalf("answer %v", r.Answer)
	}
	res := e.rec.resolvedAt(0)
	if res.Name != "cdn.test" || res.Addrs[0] != netip.MustParseAddr("203.0.113.9") || res.TTL != 60*time.Second {
		t.Errorf("resolved %+v", res)
	}
	// The CNAME target itself is not allowed.
	wantRcode(t, e.query("udp", "edge.cdnprovider.test", mdns.TypeA), mdns.RcodeNameError)
}

func TestRebinding(t *testing.T) {
	e := newEnv(t, Config{}, []string{"rebind.test", "metadata.test", "loop.test", "private-only.test"}, nil)
	r := e.query("udp", "rebind.test", mdns.TypeA)
	if got := answerAddrs(r); !slices.Equal(got, []string{"198.51.100.9"}) {
		t.Errorf("rebind.test answer %v, want the private address dropped", got)
	}
	if ev := e.rec.lastEvent(t); ev.Reason != ReasonRebinding || !strings.Contains(ev.Detail, "10.0.0.5 is a private address") {
		t.Errorf("event %+v", ev)
	}
	for _, name := range []string{"metadata.test", "loop.test", "private-only.test"} {
		r := e.query("udp", name, mdns.TypeA)
		wantRcode(t, r, mdns.RcodeSuccess)
		if len(r.Answer) != 0 {
			t.Errorf("%s: answer %v", name, r.Answer)
		}
		if ev := e.rec.lastEvent(t); ev.Reason != ReasonRebinding || ev.Name != name {
			t.Errorf("%s: event %+v", name, ev)
		}
	}
	if n := e.rec.nResolved(); n != 1 || len(e.rec.resolvedAt(0).Addrs) != 1 {
		t.Errorf("resolved %d, %+v", n, e.rec.resolvedAt(0))
	}
	// An allow CIDR naming the private range lets it through.
	if err := e.srv.Update("sb", mustPolicy(t, "", []string{"rebind.test", "10.0.0.0/24"}, nil)); err != nil {
		t.Fatal(err)
	}
	if got := answerAddrs(e.query("udp", "rebind.test", mdns.TypeA)); !slices.Equal(got, []string{"10.0.0.5", "198.51.100.9"}) {
		t.Errorf("with 10.0.0.0/24 allowed: %v", got)
	}
}

func TestTunnelShapes(t *testing.T) {
	e := newEnv(t, Config{}, []string{"*.tunnel.test", "@internet"}, nil)
	wantRcode(t, e.query("udp", "www.tunnel.test", mdns.TypeA), mdns.RcodeSuccess)
	before := e.up.queries.Load()
	for _, tc := range []struct{ name, why string }{
		{"3f9a1c0b7d2e4a6f8b0c1d2e3f4a5b6c.tunnel.test", "looks like encoded data (hex digits)"},
		{"mfrggzdfmztwq2lknnwg23tpobyxe43u.tunnel.test", "looks like encoded data"},
		{strings.Repeat("a", 41) + ".tunnel.test", "label of 41 characters, over the limit of 40"},
		{strings.Repeat("abcdefghi.", 15) + "tunnel.test", "over the limit of 150"},
		{"a\\032b.tunnel.test", "a character no hostname has"},
		{"ab.cd.ef.0123456789012345678901.tunnel.test", "a long number"},
		{"3f9a1c0b7d2e4a6f8b0c1d2e3f4a5b6c.evil.example", "hex digits"},
	} {
		r := e.query("udp", tc.name, mdns.TypeA)
		wantRcode(t, r, mdns.RcodeRefused)
		if ev := e.rec.lastEvent(t); ev.Reason != ReasonTunnel || !strings.Contains(ev.Detail, tc.why) {
			t.Errorf("%s: event %+v, want %q", tc.name, ev, tc.why)
		}
	}
	if n := e.up.queries.Load() - before; n != 0 {
		t.Errorf("%d tunnel-shaped queries reached the upstream", n)
	}
	// A name the user allowed exactly is not judged by its shape.
	name := "3f9a1c0b7d2e4a6f8b0c1d2e3f4a5b6c.tunnel.test"
	if err := e.srv.Update("sb", mustPolicy(t, "", []string{name}, nil)); err != nil {
		t.Fatal(err)
	}
	wantRcode(t, e.query("udp", name, mdns.TypeA), mdns.RcodeSuccess)
}

func TestTXTFlood(t *testing.T) {
	e := newEnv(t, Config{RareTypesPerZone: 3}, []string{"txt.test", "*.txt.test", "allowed.test"}, nil)
	for i := range 3 {
		r := e.query("udp", "txt.test", mdns.TypeTXT)
		wantRcode(t, r, mdns.RcodeSuccess)
		if len(r.Answer) != 1 {
			t.Fatalf("TXT %d: %v", i, r)
		}
	}
	for _, qt := range []uint16{mdns.TypeTXT, mdns.TypeNULL, mdns.TypeANY} {
		wantRcode(t, e.query("udp", "x.txt.test", qt), mdns.RcodeRefused)
		if ev := e.rec.lastEvent(t); ev.Reason != ReasonZoneBudget || !strings.Contains(ev.Detail, "more than 3 TXT, NULL, ANY or other uncommon queries under txt.test") {
			t.Errorf("event %+v", ev)
		}
	}
	// A queries for the zone, and other zones, go on.
	wantRcode(t, e.query("udp", "txt.test", mdns.TypeA), mdns.RcodeSuccess)
	wantRcode(t, e.query("udp", "allowed.test", mdns.TypeTXT), mdns.RcodeSuccess)
}

func TestDistinctNamesPerZone(t *testing.T) {
	e := newEnv(t, Config{NamesPerZone: 5}, []string{"*.zone.test"}, nil)
	for i := range 5 {
		wantRcode(t, e.query("udp", fmt.Sprintf("n%d.zone.test", i), mdns.TypeA), mdns.RcodeSuccess)
	}
	wantRcode(t, e.query("udp", "n5.zone.test", mdns.TypeA), mdns.RcodeRefused)
	if ev := e.rec.lastEvent(t); ev.Reason != ReasonZoneBudget || !strings.Contains(ev.Detail, "more than 5 distinct names under zone.test") {
		t.Errorf("event %+v", ev)
	}
	// Names already seen this minute still resolve.
	wantRcode(t, e.query("tcp", "n1.zone.test", mdns.TypeA), mdns.RcodeSuccess)

	var z zoneTracker
	cfg := &Config{NamesPerZone: 1, RareTypesPerZone: 1}
	now := time.Now()
	if z.admit(now, "a.x.test", false, cfg) != nil || z.admit(now, "b.x.test", false, cfg) == nil {
		t.Error("budget not applied")
	}
	if err := z.admit(now.Add(time.Minute), "b.x.test", false, cfg); err != nil {
		t.Errorf("budget not reset after a minute: %v", err)
	}
	if zoneOf("a.b.example.co.uk") != "example.co.uk" || zoneOf("x.user.github.io") != "user.github.io" || zoneOf("com") != "com" {
		t.Error("zoneOf")
	}
}

func TestRateLimit(t *testing.T) {
	e := newEnv(t, Config{QPS: 5, Burst: 10, EventRate: 1, EventBurst: 2}, []string{"allowed.test"}, nil)
	refused := 0
	for range 40 {
		if e.query("udp", "allowed.test", mdns.TypeA).Rcode == mdns.RcodeRefused {
			refused++
		}
	}
	if refused < 20 {
		t.Errorf("%d of 40 queries refused, want most beyond the burst of 10", refused)
	}
	e.rec.mu.Lock()
	n := len(e.rec.events)
	ev := e.rec.events[0]
	e.rec.mu.Unlock()
	if ev.Reason != ReasonRateLimit || n > 4 {
		t.Errorf("%d events (first %+v), want few rate-limit events", n, ev)
	}
	time.Sleep(1100 * time.Millisecond)
	wantRcode(t, e.query("udp", "allowed.test", mdns.TypeA), mdns.RcodeSuccess)
	wantRcode(t, e.query("udp", "nope.test", mdns.TypeA), mdns.RcodeNameError)
	if ev := e.rec.lastEvent(t); ev.Reason != ReasonNotAllowed || ev.Suppressed < refused-4 {
		t.Errorf("event after the flood %+v, want about %d suppressed", ev, refused-2)
	}
}

func TestUpdate(t *testing.T) {
	e := newEnv(t, Config{}, nil, nil)
	wantRcode(t, e.query("udp", "allowed.test", mdns.TypeA), mdns.RcodeNameError)
	if err := e.srv.Update("sb", mustPolicy(t, "", []string{"allowed.test"}, nil)); err != nil {
		t.Fatal(err)
	}
	wantRcode(t, e.query("udp", "allowed.test", mdns.TypeA), mdns.RcodeSuccess)
	if err := e.srv.Update("sb", mustPolicy(t, "none", nil, nil)); err != nil {
		t.Fatal(err)
	}
	wantRcode(t, e.query("tcp", "allowed.test", mdns.TypeA), mdns.RcodeNameError)
	if ev := e.rec.lastEvent(t); ev.Detail != "network mode is none" {
		t.Errorf("event %+v", ev)
	}
	if err := e.srv.Update("nosuch", policy.Policy{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Update of unknown sandbox: %v", err)
	}
}

func TestRemove(t *testing.T) {
	e := newEnv(t, Config{}, []string{"allowed.test", "slow.test"}, nil)
	// A TCP connection left open must not keep Remove waiting.
	conn, err := net.Dial("tcp", e.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// A query stuck upstream is cut off by Remove, and no hook runs after.
	stuck := make(chan error, 1)
	go func() {
		_, err := query(e.addr, "udp", "slow.test", mdns.TypeA)
		stuck <- err
	}()
	for e.up.queries.Load() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	if err := e.srv.Remove(context.Background(), "sb"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Remove took %s", d)
	}
	close(e.up.slow)
	if err := <-stuck; err == nil {
		t.Error("the stuck query got an answer after Remove")
	}
	if n := e.rec.nResolved(); n != 0 {
		t.Errorf("OnResolved ran %d times for a removed sandbox", n)
	}
	// The port is free again, for UDP and TCP.
	udp, tcp, err := listen2(e.addr)
	if err != nil {
		t.Fatalf("port still taken after Remove: %v", err)
	}
	udp.Close()
	tcp.Close()
	if err := e.srv.Remove(context.Background(), "sb"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Remove: %v", err)
	}
	if _, ok := e.srv.Addr("sb"); ok {
		t.Error("Addr of removed sandbox")
	}
}

func TestAddErrors(t *testing.T) {
	e := newEnv(t, Config{}, nil, nil)
	if got, ok := e.srv.Addr("sb"); !ok || got != e.addr || e.addr.Port() == 0 {
		t.Errorf("Addr = %v %v", got, ok)
	}
	if _, err := e.srv.Add("sb", loopback, policy.Policy{}, Hooks{}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("duplicate Add: %v", err)
	}
	if _, err := e.srv.Add("other", e.addr, policy.Policy{}, Hooks{}); !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, syscall_EADDRINUSE) {
		t.Errorf("Add on a taken address: %v", err)
	}
	// Several sandboxes on one server, each on its own address.
	addr2, err := e.srv.Add("sb2", loopback, mustPolicy(t, "", []string{"allowed.test"}, nil), Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	wantRcode(t, e.query("udp", "allowed.test", mdns.TypeA), mdns.RcodeNameError)
	if r, err := query(addr2, "udp", "allowed.test", mdns.TypeA); err != nil || r.Rcode != mdns.RcodeSuccess {
		t.Errorf("second sandbox: %v %v", r, err)
	}
	if err := e.srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.srv.Add("sb3", loopback, policy.Policy{}, Hooks{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Add after Close: %v", err)
	}
}

func TestMalformed(t *testing.T) {
	e := newEnv(t, Config{}, []string{"allowed.test"}, nil)
	exchange := func(m *mdns.Msg) *mdns.Msg {
		t.Helper()
		r, err := mdns.Exchange(m, e.addr.String())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	m := new(mdns.Msg)
	m.SetQuestion("allowed.test.", mdns.TypeA)
	m.Question = append(m.Question, m.Question[0])
	if r := exchange(m); r.Rcode != mdns.RcodeFormatError {
		t.Errorf("two questions: %v", r)
	}
	m = new(mdns.Msg)
	m.SetQuestion("version.bind.", mdns.TypeTXT)
	m.Question[0].Qclass = mdns.ClassCHAOS
	if r := exchange(m); r.Rcode != mdns.RcodeRefused {
		t.Errorf("CHAOS: %v", r)
	}
	m = new(mdns.Msg)
	m.SetNotify("allowed.test.")
	if r := exchange(m); r.Rcode != mdns.RcodeNotImplemented {
		t.Errorf("NOTIFY: %v", r)
	}
	wantRcode(t, e.query("tcp", "allowed.test", mdns.TypeAXFR), mdns.RcodeRefused)
	if ev := e.rec.lastEvent(t); ev.Reason != ReasonMalformed {
		t.Errorf("event %+v", ev)
	}
	if n := e.up.queries.Load(); n != 0 {
		t.Errorf("upstream got %d malformed queries", n)
	}
}

func TestTruncation(t *testing.T) {
	e := newEnv(t, Config{}, []string{"many.test"}, nil)
	r := e.query("udp", "many.test", mdns.TypeA)
	if !r.Truncated || len(r.Answer) >= 60 {
		t.Errorf("UDP answer of 60 records: truncated=%v, %d records", r.Truncated, len(r.Answer))
	}
	r = e.query("tcp", "many.test", mdns.TypeA)
	if r.Truncated || len(r.Answer) != 60 {
		t.Errorf("TCP answer: truncated=%v, %d records", r.Truncated, len(r.Answer))
	}
}

func TestUpstreamFailover(t *testing.T) {
	// A closed loopback port answers with ICMP port unreachable at once.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := netip.MustParseAddrPort(pc.LocalAddr().String())
	pc.Close()
	up := startUpstream(t)
	e := newEnv(t, Config{Upstreams: []netip.AddrPort{dead, up.addr}, UpstreamTimeout: time.Second}, []string{"allowed.test"}, nil)
	wantRcode(t, e.query("udp", "allowed.test", mdns.TypeA), mdns.RcodeSuccess)

	if err := e.srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	e2 := newEnv(t, Config{Upstreams: []netip.AddrPort{dead}, UpstreamTimeout: time.Second}, []string{"allowed.test"}, nil)
	wantRcode(t, e2.query("udp", "allowed.test", mdns.TypeA), mdns.RcodeServerFailure)
}

func TestHookError(t *testing.T) {
	e := newEnv(t, Config{}, []string{"allowed.test"}, nil)
	e.rec.fail = errors.New("nft: set full")
	r := e.query("udp", "allowed.test", mdns.TypeA)
	wantRcode(t, r, mdns.RcodeServerFailure)
	if len(r.Answer) != 0 {
		t.Errorf("answer despite the dataplane failing: %v", r.Answer)
	}
}

func TestConfig(t *testing.T) {
	dir := t.TempDir()
	rc := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(rc, []byte("search example\nnameserver 192.0.2.53\nnameserver 2001:db8::53\noptions ndots:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := Config{resolvConf: rc}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53"), netip.MustParseAddrPort("[2001:db8::53]:53")}
	if !slices.Equal(cfg.Upstreams, want) || cfg.QPS != 50 || cfg.Burst != 100 || cfg.MinTTL != 30*time.Second || cfg.MaxTTL != time.Hour || cfg.MaxLabelLen != 40 {
		t.Errorf("defaults: %+v", cfg)
	}
	if err := os.WriteFile(rc, []byte("search example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := (Config{resolvConf: rc}).withDefaults(); err == nil || !strings.Contains(err.Error(), "no nameserver") {
		t.Errorf("empty resolv.conf: %v", err)
	}
	if _, err := (Config{resolvConf: filepath.Join(dir, "missing")}).withDefaults(); err == nil {
		t.Error("missing resolv.conf accepted")
	}
	if _, err := New(Config{Upstreams: want, MinTTL: time.Hour, MaxTTL: time.Minute}); err == nil {
		t.Error("MinTTL > MaxTTL accepted")
	}
}
