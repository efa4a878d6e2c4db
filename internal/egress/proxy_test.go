package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeCheck allows the names in ok at any destination, raw TCP to raw.
type fakeCheck struct {
	ok   map[string]bool
	raw  bool
	open bool // every destination is open whatever the name
}

func (f fakeCheck) Open(netip.AddrPort) bool                { return f.open }
func (f fakeCheck) OpenName(string) (bool, string)          { return true, "" }
func (f fakeCheck) Resolved(name string, _ netip.Addr) bool { return f.ok[name] }

func (f fakeCheck) Name(name string, dst netip.AddrPort) (bool, string) {
	if f.ok[name] {
		return true, ""
	}
	return false, name + " is not allowed"
}
func (f fakeCheck) Raw(netip.AddrPort) (string, bool) { return "raw.test", f.raw }
func (f fakeCheck) Still(name string, _ netip.AddrPort, raw bool) bool {
	return raw && f.raw || f.ok[name]
}

// tlsGet GETs https://name/ through the proxy, naming name in the
// ClientHello (the upstream's certificate is not checked).
func (h *harness) tlsGet(name string) (string, error) {
	c := &http.Client{Transport: &http.Transport{
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return net.Dial("tcp4", h.proxyAddr) },
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true, ServerName: name},
	}, Timeout: 10 * time.Second}
	resp, err := c.Get("https://" + name + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), nil
}

// harness runs a Proxy whose every connection "was going to" upstream.
type harness struct {
	proxyAddr string
	mu        sync.Mutex
	events    []Event
}

func newHarness(t *testing.T, check Checker, upstream string) *harness {
	return newHarnessWith(t, check, upstream, nil)
}

func newHarnessWith(t *testing.T, check Checker, upstream string, ic Interceptor) *harness {
	t.Helper()
	h := &harness{}
	dst := netip.MustParseAddrPort(upstream)
	p := New(Config{Check: check,
		Intercept: func() Interceptor { return ic },
		Target:    func(net.Conn) (netip.AddrPort, error) { return dst, nil },
		OnDenied:  func(ev Event) { h.mu.Lock(); h.events = append(h.events, ev); h.mu.Unlock() },
	})
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(ln)
	t.Cleanup(func() { ln.Close(); p.Close() })
	h.proxyAddr = ln.Addr().String()
	return h
}

func (h *harness) lastEvent() Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.events) == 0 {
		return Event{}
	}
	return h.events[len(h.events)-1]
}

// A TLS client through the proxy reaches the upstream when its server name
// is allowed, and is reset when it is not (the upstream sees nothing).
func TestTLSServerName(t *testing.T) {
	var hits sync.Map
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Store(r.Host, true)
		fmt.Fprint(w, "upstream")
	}))
	defer up.Close()
	h := newHarness(t, fakeCheck{ok: map[string]bool{"allowed.test": true}}, strings.TrimPrefix(up.URL, "https://"))
	get := func(name string) (string, error) { return h.tlsGet(name) }
	if got, err := get("allowed.test"); err != nil || got != "upstream" {
		t.Fatalf("allowed name: %q %v", got, err)
	}
	for _, name := range []string{"evil.test", "allowed.test.evil.test"} {
		if got, err := get(name); err == nil {
			t.Fatalf("%s reached the upstream: %q", name, got)
		}
		if ev := h.lastEvent(); ev.Reason != ReasonName || ev.Name != name {
			t.Fatalf("%s: event %+v", name, ev)
		}
		if _, ok := hits.Load(name); ok {
			t.Fatalf("the upstream saw a request for %s", name)
		}
	}
	// Names are compared normalized: case and a trailing dot.
	if got, err := get("ALLOWED.test."); err != nil || got != "upstream" {
		t.Fatalf("ALLOWED.test.: %q %v", got, err)
	}
	// No server name at all (an IP literal): refused.
	c, err := tls.Dial("tcp4", h.proxyAddr, &tls.Config{InsecureSkipVerify: true})
	if err == nil {
		c.Close()
		t.Fatal("TLS without SNI went through")
	}
	if ev := h.lastEvent(); ev.Reason != ReasonNoName {
		t.Fatalf("no SNI: event %+v", ev)
	}
}

// Plain HTTP: every request's Host is checked, so a keep-alive
// connection to an allowed host cannot turn to another.
func TestHTTPHost(t *testing.T) {
	up, hosts := hostRecorder(t, func(string) string { return "ok" })
	h := newHarness(t, fakeCheck{ok: map[string]bool{"allowed.test": true}}, strings.TrimPrefix(up.URL, "http://"))
	c, err := net.Dial("tcp4", h.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	send := func(host string) (*http.Response, error) {
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		return http.ReadResponse(br, nil)
	}
	for i := 0; i < 2; i++ {
		resp, err := send("allowed.test")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("request %d: %v %v", i, resp, err)
		}
		io.ReadAll(resp.Body)
	}
	if resp, err := send("evil.test"); err == nil {
		t.Fatalf("a second host on the same connection answered: %v", resp.Status)
	}
	if ev := h.lastEvent(); ev.Reason != ReasonMismatch || ev.Name != "evil.test" {
		t.Fatalf("event %+v", ev)
	}
	for _, hh := range hosts() {
		if hh != "allowed.test" {
			t.Fatalf("the upstream saw Host %q", hh)
		}
	}
	// A first request for a host not allowed, and one without a Host.
	for _, req := range []string{"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", "GET / HTTP/1.0\r\n\r\n", "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test\r\n\r\n"} {
		c, err := net.Dial("tcp4", h.proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(c, req)
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			t.Fatalf("%q answered %s", req, resp.Status)
		}
		c.Close()
	}
}

// Anything else (here SSH's banner) is refused unless raw TCP is allowed,
// and then goes through untouched, even a server-first protocol.
func TestRawTCP(t *testing.T) {
	ln := serveTCP(t, func(c net.Conn) {
		fmt.Fprint(c, "220 server first\r\n")
		io.Copy(c, c)
	})
	refused := newHarness(t, fakeCheck{}, ln.Addr().String())
	c, err := net.Dial("tcp4", refused.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(c, "SSH-2.0-test\r\n")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(c); err == nil && len(b) > 0 {
		t.Fatalf("raw TCP went through: %q", b)
	}
	c.Close()
	if ev := refused.lastEvent(); ev.Reason != ReasonProtocol {
		t.Fatalf("event %+v", ev)
	}
	allowed := newHarness(t, fakeCheck{raw: true}, ln.Addr().String())
	c, err = net.Dial("tcp4", allowed.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "220 server first\r\n" {
		t.Fatalf("server-first banner: %q %v", line, err)
	}
}

func TestNormalizeName(t *testing.T) {
	for in, want := range map[string]string{"Example.COM.": "example.com", "bücher.example": "xn--bcher-kva.example", "a.b": "a.b"} {
		if got, err := NormalizeName(in); err != nil || got != want {
			t.Errorf("NormalizeName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", ".", strings.Repeat("a", 300)} {
		if _, err := NormalizeName(bad); err == nil {
			t.Errorf("NormalizeName(%q) took it", bad)
		}
	}
}

// Names expire with their TTL, and the table holds at most max pairs.
func TestNames(t *testing.T) {
	now := time.Unix(1000, 0)
	n := NewNames(3)
	n.now = func() time.Time { return now }
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	n.Learn("x.test", []netip.Addr{a}, time.Minute)
	n.Learn("y.test", []netip.Addr{a, b}, 2*time.Minute)
	if !n.Resolved("x.test", a) || n.Resolved("x.test", b) || !n.Resolved("y.test", b) {
		t.Fatal("resolved")
	}
	if got := len(n.For(a)); got != 2 {
		t.Fatalf("For(a) = %d names", got)
	}
	now = now.Add(90 * time.Second)
	if n.Resolved("x.test", a) || !n.Resolved("y.test", a) {
		t.Fatal("expiry")
	}
	n.Learn("z.test", []netip.Addr{b}, time.Minute) // full: x.test's expired pair goes
	if n.n != 3 || n.Resolved("x.test", a) || !n.Resolved("z.test", b) {
		t.Fatalf("eviction: %d pairs", n.n)
	}
}

// FuzzClassify feeds arbitrary first bytes to the proxy: it never
// panics, and nothing reaches the upstream unless an allowed name was
// asked for.
func FuzzClassify(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"))
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00})
	f.Add([]byte("SSH-2.0-x\r\n"))
	f.Fuzz(func(t *testing.T, first []byte) {
		if len(first) > 8192 {
			return
		}
		got := make(chan []byte, 1)
		up, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Skip(err)
		}
		defer up.Close()
		go func() {
			c, err := up.Accept()
			if err != nil {
				got <- nil
				return
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			b, _ := io.ReadAll(io.LimitReader(c, 1<<20))
			c.Close()
			got <- b
		}()
		h := newHarness(t, fakeCheck{ok: map[string]bool{"allowed.test": true}}, up.Addr().String())
		c, err := net.Dial("tcp4", h.proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(first)
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		io.ReadAll(c)
		c.Close()
		up.Close()
		if b := <-got; len(b) > 0 && !strings.Contains(strings.ToLower(string(b)), "allowed.test") {
			t.Fatalf("the upstream received %q", b)
		}
	})
}

// toggleCheck admits raw TCP while allow is set.
type toggleCheck struct{ allow *atomic.Bool }

func (t toggleCheck) Name(string, netip.AddrPort) (bool, string) {
	return t.allow.Load(), "toggled off"
}
func (t toggleCheck) Raw(netip.AddrPort) (string, bool)       { return "raw.test", t.allow.Load() }
func (t toggleCheck) Still(string, netip.AddrPort, bool) bool { return t.allow.Load() }
func (t toggleCheck) Open(netip.AddrPort) bool                { return false }
func (t toggleCheck) Resolved(string, netip.Addr) bool        { return false }
func (t toggleCheck) OpenName(string) (bool, string)          { return true, "" }

// A policy change ends the connections it no longer allows.
func TestRecheck(t *testing.T) {
	ln := serveTCP(t, func(c net.Conn) { io.Copy(c, c) })
	var allow atomic.Bool
	allow.Store(true)
	dst := netip.MustParseAddrPort(ln.Addr().String())
	p := New(Config{Check: toggleCheck{&allow}, Target: func(net.Conn) (netip.AddrPort, error) { return dst, nil }})
	pl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.Serve(pl)
	defer func() { pl.Close(); p.Close() }()
	c, err := net.Dial("tcp4", pl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	fmt.Fprint(c, "one\n")
	if l, err := br.ReadString('\n'); err != nil || l != "one\n" {
		t.Fatalf("echo: %q %v", l, err)
	}
	p.Recheck() // still allowed: nothing happens
	fmt.Fprint(c, "two\n")
	if l, err := br.ReadString('\n'); err != nil || l != "two\n" {
		t.Fatalf("echo after a recheck that allows it: %q %v", l, err)
	}
	allow.Store(false)
	p.Recheck()
	fmt.Fprint(c, "three\n")
	if l, err := br.ReadString('\n'); err == nil {
		t.Fatalf("the connection outlived the policy that ended it: %q", l)
	}
}

// serveTCP serves handle on a loopback port until the test ends.
func serveTCP(t *testing.T, handle func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { handle(c); c.Close() }()
		}
	}()
	return ln
}

// The attacks a review found, as tests: a request smuggled behind an
// Upgrade the upstream does not answer with 101, an h2c upgrade, junk
// around the Host's name, a header without end.
func TestHTTPAttacks(t *testing.T) {
	up, hosts := hostRecorder(t, func(host string) string { return "vhost=" + host })
	h := newHarness(t, fakeCheck{ok: map[string]bool{"allowed.test": true}}, strings.TrimPrefix(up.URL, "http://"))
	send := func(raw string) string {
		c, err := net.Dial("tcp4", h.proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprint(c, raw)
		b, _ := io.ReadAll(c)
		return string(b)
	}
	for what, raw := range map[string]string{
		"a request behind an Upgrade": "GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nGET /secret HTTP/1.1\r\nHost: evil.test\r\n\r\n",
		"h2c":                         "GET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n",
		"userinfo after the port":     "GET / HTTP/1.1\r\nHost: allowed.test:1@evil.test\r\n\r\n",
		"a non-numeric port":          "GET / HTTP/1.1\r\nHost: allowed.test:x\r\n\r\n",
		"an upgrade second":           "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET / HTTP/1.1\r\nHost: allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
	} {
		got := send(raw)
		servedOnce := what == "an upgrade second" || what == "a request behind an Upgrade"
		if strings.Contains(got, "evil.test") || strings.Count(got, "vhost=") > 1 || !servedOnce && strings.Contains(got, "vhost=") {
			t.Errorf("%s: %q", what, got)
		}
	}
	for _, hh := range hosts() {
		if hh != "allowed.test" {
			t.Errorf("the upstream served Host %q", hh)
		}
	}
	// Headers without end: cut at the limit, not buffered.
	c, err := net.Dial("tcp4", h.proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: allowed.test\r\nX: ")
	junk := []byte(strings.Repeat("a", 1<<20))
	sent := 0
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	for sent < 8<<20 {
		n, err := c.Write(junk)
		sent += n
		if err != nil {
			break
		}
	}
	if sent >= 8<<20 {
		t.Fatalf("the proxy took %d MiB of one header", sent>>20)
	}
}

func TestNameShapes(t *testing.T) {
	if !hasECH([]uint16{0, 0xfe0d}) || !hasECH([]uint16{0xffce}) || hasECH([]uint16{0, 16, 43}) {
		t.Fatal("hasECH")
	}
	for name, want := range map[string]bool{"allowed.test": true, "ALLOWED.test.": true, "a_b.test": true,
		"ＡＬＬＯＷＥＤ.test": false, "allowed.test\u200b": false, "allowed.test\x00": false, "a b.test": false} {
		if plainName(name) != want {
			t.Errorf("plainName(%q) = %v", name, !want)
		}
	}
	for host, want := range map[string]string{"allowed.test": "allowed.test|", "allowed.test:8080": "allowed.test|8080",
		"allowed.test:1@evil.test": "", "allowed.test:x": "", "[::1]:80": "", "": "", "a b": "", "allowed.test:99999": ""} {
		name, port, ok := splitHost(host)
		got := ""
		if ok {
			got = name + "|" + port
		}
		if got != want {
			t.Errorf("splitHost(%q) = %q, want %q", host, got, want)
		}
	}
}

// hostRecorder is an HTTP upstream answering body(Host), and the Hosts
// it served so far.
func hostRecorder(t *testing.T, body func(host string) string) (*httptest.Server, func() []string) {
	var mu sync.Mutex
	var hosts []string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		hosts = append(hosts, r.Host)
		mu.Unlock()
		fmt.Fprint(w, body(r.Host))
	}))
	t.Cleanup(up.Close)
	return up, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(hosts)
	}
}

// dohCheck opens every destination but to dns.google.
type dohCheck struct{ fakeCheck }

func (dohCheck) OpenName(name string) (bool, string) {
	if name == "dns.google" {
		return false, "a public DNS-over-HTTPS resolver"
	}
	return true, ""
}

// At an open destination (a CIDR rule, @internet: the connection came to
// be intercepted) any name goes through unchecked but a public
// DNS-over-HTTPS resolver's.
func TestOpenDestination(t *testing.T) {
	up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "upstream") }))
	defer up.Close()
	h := newHarness(t, dohCheck{fakeCheck{open: true}}, strings.TrimPrefix(up.URL, "https://"))
	get := func(name string) (string, error) { return h.tlsGet(name) }
	if got, err := get("anything.test"); err != nil || got != "upstream" {
		t.Fatalf("an open destination: %q %v", got, err)
	}
	if got, err := get("dns.google"); err == nil {
		t.Fatalf("a DoH resolver's name went through: %q", got)
	}
	if ev := h.lastEvent(); ev.Reason != ReasonName || !strings.Contains(ev.Detail, "DNS-over-HTTPS") {
		t.Fatalf("event %+v", ev)
	}
}
