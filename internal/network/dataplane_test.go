package network

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/nookhq/nook/internal/egress"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/network/nettest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// World addresses. 203.0.113.0/24 and 198.51.100.0/24 are documentation
// ranges (public to nook); they exist only inside the test's world.
var (
	webA     = netip.MustParseAddr("203.0.113.10")
	webB     = netip.MustParseAddr("203.0.113.20")
	learnIP  = netip.MustParseAddr("198.51.100.7")
	metadata = netip.MustParseAddr("169.254.169.254")
	privIP   = netip.MustParseAddr("10.99.0.5")
)

const shortTimeout = 700 * time.Millisecond

// env is a simulated host with a Manager running against it and a world
// holding servers.
type env struct {
	// proxied counts the connections the sandboxes' egress proxies saw.
	proxied atomic.Int32
	t       testing.TB
	topo    *nettest.Topology
	m       *Manager
	dir     string
	events  chan deniedEvent
	// resolver pretends to be every sandbox's resolver (TCP port 53).
	resolver *nettest.Server
}

type deniedEvent struct {
	id string
	ev Event
}

// newEnv makes the simulated host and world and a Manager on it; opts
// change the Manager's configuration.
func newEnv(t testing.TB, opts ...func(*Config)) *env {
	t.Helper()
	nettest.RequireRoot(t)
	topo := nettest.New(t)
	e := &env{t: t, topo: topo, dir: filepath.Join(t.TempDir(), "netns"), events: make(chan deniedEvent, 1000)}
	for _, a := range []netip.Addr{webA, webB, learnIP, metadata, privIP} {
		topo.AddWorldAddr(t, a)
		for _, port := range []int{80, 443, 53, 853} {
			nettest.Serve(t, topo.World, fmt.Sprintf("%s:%d", a, port), "world:"+a.String())
		}
	}
	nettest.ServeEcho(t, topo.World, webA.String()+":7")
	// Host services: one on every address, one pretending to be the
	// resolver on port 53 of every address.
	nettest.Serve(t, topo.Host, "0.0.0.0:8080", "host")
	e.resolver = nettest.Serve(t, topo.Host, "0.0.0.0:53", "resolver")
	cfg := Config{
		NetnsDir:  e.dir,
		HostNetns: topo.Host,
		Log:       slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnDenied: func(id string, ev Event) {
			select {
			case e.events <- deniedEvent{id, ev}:
			default:
			}
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	m, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	t.Cleanup(func() {
		e.checkClean()
		// Whatever a failed test left, remove it so the next run starts clean.
		if _, err := m.Reconcile(context.Background(), nil); err != nil {
			t.Error(err)
		}
		if err := m.Uninstall(context.Background()); err != nil {
			t.Error(err)
		}
		m.Close()
		if tables := e.nftTables(); len(tables) != 0 {
			t.Errorf("nftables tables left in the simulated host: %v", tables)
		}
	})
	return e
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// sandbox sets up a container sandbox on the next free subnet and returns
// its namespace.
func (e *env) sandbox(id string) (netns.NsHandle, netip.Prefix) {
	e.t.Helper()
	var taken []netip.Prefix
	for _, a := range e.list() {
		taken = append(taken, a.Subnet)
	}
	subnet, err := e.m.Pool().Allocate(taken)
	if err != nil {
		e.t.Fatal(err)
	}
	path, err := e.m.SetupContainer(context.Background(), id, subnet)
	if err != nil {
		e.t.Fatalf("SetupContainer %s: %v", id, err)
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		e.t.Fatal(err)
	}
	// What the daemon runs on every gateway: an egress proxy, here one
	// that lets every connection through (the name checks are
	// internal/egress's), so these tests see the dataplane's verdicts.
	ln, err := e.m.ListenGateway(context.Background(), subnet, EgressPort)
	if err != nil {
		e.t.Fatal(err)
	}
	p := egress.New(egress.Config{Check: passAll{seen: &e.proxied}, Dial: e.m.DialHost})
	go p.Serve(ln)
	e.t.Cleanup(func() {
		ln.Close()
		p.Close()
		ns.Close()
		if err := e.m.Teardown(context.Background(), id); err != nil {
			e.t.Errorf("Teardown %s: %v", id, err)
		}
	})
	return ns, subnet
}

// passAll lets every redirected connection through, as raw TCP, and
// counts them. Open is false so that every connection is judged by Raw,
// which splices without reading first (the world's servers speak first).
type passAll struct{ seen *atomic.Int32 }

func (passAll) Name(string, netip.AddrPort) (bool, string) { return true, "" }
func (p passAll) Raw(netip.AddrPort) (string, bool)        { p.seen.Add(1); return "any", true }
func (passAll) Still(string, netip.AddrPort, bool) bool    { return true }
func (passAll) Open(netip.AddrPort) bool                   { return false }
func (passAll) Resolved(string, netip.Addr) bool           { return true }
func (passAll) OpenName(string) (bool, string)             { return true, "" }

// Only connections to learned addresses (domain rules') go through the
// egress proxy; a CIDR rule's go straight out as before.
func TestEgressRedirect(t *testing.T) {
	e := newEnv(t)
	ns, _ := e.sandbox("sb-eg")
	e.setPolicy("sb-eg", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}})
	if err := e.m.AllowLearned(context.Background(), "sb-eg", webB, nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.reach(ns, webA.String()+":80", "world:")
	if n := e.proxied.Load(); n != 0 {
		t.Fatalf("a CIDR rule's connection went through the proxy (%d)", n)
	}
	e.reach(ns, webB.String()+":80", "world:")
	if n := e.proxied.Load(); n != 1 {
		t.Fatalf("a learned address's connection: %d through the proxy, want 1", n)
	}
}

// An intercepting policy sends TCP to ports 80 and 443 that a CIDR rule
// or @internet admits to the egress proxy; other ports go straight out,
// and what the policy refuses is refused as before, not redirected.
func TestInterceptRedirect(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	nettest.Serve(t, e.topo.World, webA.String()+":8080", "world:"+webA.String())
	ns, _ := e.sandbox("sb-icpt")
	// via asserts that addr answers, through the egress proxy or not.
	via := func(addr string, proxied bool) {
		t.Helper()
		before := e.proxied.Load()
		e.reach(ns, addr, "world:")
		want := before
		if proxied {
			want++
		}
		if got := e.proxied.Load(); got != want {
			t.Fatalf("%s: %d connections through the proxy, want %d", addr, got-before, want-before)
		}
	}
	// refused asserts that addr is refused by the kernel, not redirected.
	refused := func(addr string) {
		t.Helper()
		before := e.proxied.Load()
		e.refused(ns, addr)
		if got := e.proxied.Load(); got != before {
			t.Fatalf("%s: refused, but %d connections through the proxy", addr, got-before)
		}
	}
	a := func(port int) string { return fmt.Sprintf("%s:%d", webA, port) }

	e.setPolicy("sb-icpt", Policy{Public: true})
	via(a(443), false)
	e.setPolicy("sb-icpt", Policy{Public: true, Intercept: true})
	via(a(443), true)
	via(a(80), true)
	via(a(8080), false)
	// What the forward chain refuses stays refused there: a private range
	// no allow rule names, the always-blocked ranges, a deny rule.
	refused(privIP.String() + ":443")
	refused(metadata.String() + ":443")
	e.setPolicy("sb-icpt", Policy{Public: true, Intercept: true, Deny: []Rule{{Prefix: netip.PrefixFrom(webB, 32)}}})
	refused(webB.String() + ":443")
	via(a(443), true)
	// A CIDR rule's addresses are intercepted too, a private one as well;
	// what nothing admits is refused.
	e.setPolicy("sb-icpt", Policy{Intercept: true, Allow: []Rule{
		{Prefix: netip.MustParsePrefix("10.99.0.0/24")},
		{Prefix: netip.PrefixFrom(webA, 32), Ports: []PortRange{Port(443), Port(8080)}},
	}})
	via(privIP.String()+":443", true)
	via(a(443), true)
	via(a(8080), false)
	refused(a(80))
	refused(webB.String() + ":443")
	// A domain rule's address goes to the proxy on every port, as before.
	if err := e.m.AllowLearned(ctx, "sb-icpt", webB, nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	via(webB.String()+":443", true)
	// Without Intercept, straight out again.
	e.setPolicy("sb-icpt", Policy{Public: true, ResetLearned: true})
	via(a(443), false)
	via(a(80), false)

	// The intercept set holds a sandbox's interface while its policy
	// intercepts, and nothing of it after a policy change or a teardown.
	c := e.m.nft()
	elems := func(id string) int {
		t.Helper()
		return len(liveElements(t, c, e.m.lay.sharedSets[setIntercept], IfaceName(id)))
	}
	if n := elems("sb-icpt"); n != 0 {
		t.Fatalf("intercept set: %d elements of a sandbox that no longer intercepts", n)
	}
	ns2, _ := e.sandbox("sb-icpt2")
	e.setPolicy("sb-icpt2", Policy{Public: true, Intercept: true})
	if n := elems("sb-icpt2"); n != 1 {
		t.Fatalf("intercept set: %d elements of an intercepting sandbox, want 1", n)
	}
	before := e.proxied.Load()
	e.reach(ns2, a(443), "world:")
	if e.proxied.Load() != before+1 {
		t.Fatal("the second sandbox's connection did not go through the proxy")
	}
	if err := e.m.Teardown(ctx, "sb-icpt2"); err != nil {
		t.Fatal(err)
	}
	if n := elems("sb-icpt2"); n != 0 {
		t.Fatalf("intercept set: %d elements left after Teardown", n)
	}
}

func (e *env) list() []Attachment {
	e.t.Helper()
	atts, err := e.m.List(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	return atts
}

func (e *env) setPolicy(id string, p Policy) {
	e.t.Helper()
	if err := e.m.SetPolicy(context.Background(), id, p); err != nil {
		e.t.Fatalf("SetPolicy %s: %v", id, err)
	}
}

// reach asserts that addr answers from ns with a banner starting with want.
func (e *env) reach(ns netns.NsHandle, addr, want string) string {
	e.t.Helper()
	got, err := nettest.Fetch(context.Background(), ns, addr, 2*time.Second)
	if err != nil {
		e.t.Fatalf("%s: want reachable, got %v\n%s", addr, err, e.ruleset())
	}
	if !strings.HasPrefix(got, want) {
		e.t.Fatalf("%s: got %q, want %q...", addr, got, want)
	}
	return got
}

// refused asserts that a TCP connection from ns to addr is refused by
// nook's rules: they answer TCP with a reset, so connect fails at once with
// ECONNREFUSED. Every address and port the tests refuse has a listener.
func (e *env) refused(ns netns.NsHandle, addr string) {
	e.t.Helper()
	start := time.Now()
	got, err := nettest.Fetch(context.Background(), ns, addr, shortTimeout)
	if err == nil {
		e.t.Fatalf("%s: want refused, got through: %q\n%s", addr, got, e.ruleset())
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		e.t.Fatalf("%s: want ECONNREFUSED (rejected), got %v after %v", addr, err, time.Since(start))
	}
}

// waitEvent waits for a denied event for id and dst.
func (e *env) waitEvent(id string, dst netip.AddrPort, reason string) Event {
	e.t.Helper()
	deadline := time.After(3 * time.Second)
	for {
		select {
		case de := <-e.events:
			if de.id == id && de.ev.Dst == dst && de.ev.Reason == reason {
				return de.ev
			}
		case <-deadline:
			e.t.Fatalf("no denied event for %s -> %v (%s)", id, dst, reason)
		}
	}
}

// ruleset dumps the simulated host's nook table, for failure messages.
func (e *env) ruleset() string {
	e.t.Helper()
	out, err := e.nftCmd("list", "table", "inet", tableName)
	if err != nil {
		e.t.Fatalf("nft list table inet %s in the simulated host (make deps installs nftables): %v: %s", tableName, err, out)
	}
	return out
}

// nftCmd runs the nft command line in the simulated host.
func (e *env) nftCmd(args ...string) (string, error) {
	fd, err := unix.Dup(int(e.topo.Host))
	if err != nil {
		return "", err
	}
	f := os.NewFile(uintptr(fd), "hostns")
	defer f.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=/proc/self/fd/3", "nft"}, args...)...)
	cmd.ExtraFiles = []*os.File{f}
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err = cmd.Run()
	return buf.String(), err
}

func (e *env) nftTables() []string {
	c, err := nftables.New(nftables.WithNetNSFd(int(e.topo.Host)))
	if err != nil {
		e.t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for _, t := range tables {
		names = append(names, t.Name)
	}
	return names
}

// checkClean asserts that no sandbox left anything in the simulated host:
// no nook interface, no namespace mount, no sandbox chain or set, and no
// entry in the shared sets.
func (e *env) checkClean() {
	e.t.Helper()
	h, err := netlink.NewHandleAt(e.topo.Host, unix.NETLINK_ROUTE)
	if err != nil {
		e.t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "nk") {
			e.t.Errorf("interface left: %s (%s)", l.Attrs().Name, l.Attrs().Alias)
		}
	}
	ents, _ := os.ReadDir(e.dir)
	for _, ent := range ents {
		e.t.Errorf("netns mount left: %s", ent.Name())
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(e.topo.Host)))
	if err != nil {
		e.t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, ch := range chains {
		if strings.HasPrefix(ch.Name, legacyChainPfx) {
			e.t.Errorf("chain left: %s", ch.Name)
		}
	}
	sets, err := c.GetSets(e.m.lay.table)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, s := range sets {
		if strings.HasPrefix(s.Name, ifacePrefix) || s.Name == legacySetFwd {
			e.t.Errorf("set left: %s", s.Name)
		}
	}
	for _, name := range policySets {
		if n := len(liveElements(e.t, c, e.m.lay.sharedSets[name], "")); n != 0 {
			e.t.Errorf("set %s has %d elements left", name, n)
		}
	}
}

// liveElements returns the elements of a set keyed by interface iface
// (every interface: ""), but those expired and waiting for the kernel's
// gc.
func liveElements(t testing.TB, c *nftables.Conn, s *nftables.Set, iface string) []nftables.SetElement {
	t.Helper()
	elems, err := c.GetSetElements(s)
	if err != nil {
		t.Fatal(err)
	}
	var out []nftables.SetElement
	for _, el := range elems {
		if el.IntervalEnd || (s.HasTimeout && el.Expires == 0) {
			continue
		}
		if iface != "" && !bytes.Equal(el.Key[:16], ifnameKey(iface)) {
			continue
		}
		out = append(out, el)
	}
	return out
}

func TestAllowedCIDR(t *testing.T) {
	e := newEnv(t)
	ns, _ := e.sandbox("sb-allow")
	e.refused(ns, webA.String()+":80") // deny-all until a policy is set
	e.setPolicy("sb-allow", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}})
	got := e.reach(ns, webA.String()+":80", "world:"+webA.String())
	// The world saw the simulated host's uplink address: masqueraded.
	if !strings.Contains(got, nettest.HostUplink.String()+":") {
		t.Errorf("world saw %q, want the source masqueraded to %v", got, nettest.HostUplink)
	}
	e.refused(ns, webB.String()+":80")
}

func TestPortRules(t *testing.T) {
	e := newEnv(t)
	ns, _ := e.sandbox("sb-ports")
	e.setPolicy("sb-ports", Policy{Allow: []Rule{
		{Prefix: netip.PrefixFrom(webA, 32), Ports: []PortRange{Port(80)}},
		{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Ports: []PortRange{{First: 440, Last: 450}}},
	}})
	e.reach(ns, webA.String()+":80", "world:")
	e.reach(ns, webA.String()+":443", "world:")
	e.reach(ns, webB.String()+":443", "world:")
	e.refused(ns, webB.String()+":80")
	e.refused(ns, webA.String()+":7")
}

func TestLearnedExpires(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ns, _ := e.sandbox("sb-learn")
	e.setPolicy("sb-learn", Policy{})
	addr := learnIP.String()
	e.refused(ns, addr+":80")
	// The timeout is what is tested: steps 2.5 s apart against 4 s leave
	// a loaded host 1.5 s of slack.
	const ttl, step = 4 * time.Second, 2500 * time.Millisecond
	if err := e.m.AllowLearned(ctx, "sb-learn", learnIP, nil, ttl); err != nil {
		t.Fatal(err)
	}
	e.reach(ns, addr+":80", "world:")
	// Learning again resets the timeout: 5 s after the first, it holds.
	time.Sleep(step)
	if err := e.m.AllowLearned(ctx, "sb-learn", learnIP, nil, ttl); err != nil {
		t.Fatal(err)
	}
	time.Sleep(step)
	e.reach(ns, addr+":80", "world:")
	// And it runs out.
	for deadline := time.Now().Add(3 * ttl); ; time.Sleep(100 * time.Millisecond) {
		c, err := nettest.DialNS(ctx, ns, addr+":80", shortTimeout)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatalf("learned address %s still reachable %v after its timeout", addr, 3*ttl)
		}
	}
	e.refused(ns, addr+":80")

	// A port-limited learned address.
	if err := e.m.AllowLearned(ctx, "sb-learn", learnIP, []PortRange{Port(443)}, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.reach(ns, addr+":443", "world:")
	e.refused(ns, addr+":80")
	// A learned private address stays blocked: DNS rebinding opens nothing.
	if err := e.m.AllowLearned(ctx, "sb-learn", privIP, nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.refused(ns, privIP.String()+":80")
	if err := e.m.AllowLearned(ctx, "sb-learn", metadata, nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.refused(ns, metadata.String()+":80")
	// ResetLearned drops learned addresses with the policy change.
	e.setPolicy("sb-learn", Policy{ResetLearned: true})
	e.refused(ns, addr+":443")
}

func TestDenyWins(t *testing.T) {
	e := newEnv(t)
	ns, _ := e.sandbox("sb-deny")
	deny := []Rule{{Prefix: netip.PrefixFrom(webB, 32)}, {Prefix: netip.PrefixFrom(webA, 32), Ports: []PortRange{Port(443)}}}
	e.setPolicy("sb-deny", Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("203.0.113.0/24")}}, Deny: deny})
	e.reach(ns, webA.String()+":80", "world:")
	e.refused(ns, webA.String()+":443")
	e.refused(ns, webB.String()+":80")
	e.setPolicy("sb-deny", Policy{Public: true, Deny: deny})
	e.reach(ns, learnIP.String()+":80", "world:")
	e.refused(ns, webB.String()+":80")
	if err := e.m.AllowLearned(context.Background(), "sb-deny", webB, nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.refused(ns, webB.String()+":80")
}

func TestPrivateRanges(t *testing.T) {
	e := newEnv(t)
	ns, _ := e.sandbox("sb-priv")
	e.setPolicy("sb-priv", Policy{Public: true})
	e.reach(ns, webA.String()+":80", "world:")
	e.refused(ns, privIP.String()+":80")
	e.setPolicy("sb-priv", Policy{Public: true, Allow: []Rule{{Prefix: netip.MustParsePrefix("10.99.0.0/24")}}})
	e.reach(ns, privIP.String()+":80", "world:"+privIP.String())
	// An allow rule covering the whole address space still leaves the
	// private ranges it does not name closed.
	e.setPolicy("sb-priv", Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("0.0.0.0/0")}}})
	e.reach(ns, webA.String()+":80", "world:")
	e.reach(ns, privIP.String()+":80", "world:") // 0.0.0.0/0 names 10/8 too
}

// The metadata address's port 80 leads a sandbox to its own gateway's
// MetadataPort, and to nothing of another sandbox's.
func TestEscapeMetadataEndpoint(t *testing.T) {
	e := newEnv(t)
	ns, subnet := e.sandbox("sb-md")
	e.setPolicy("sb-md", Policy{}) // deny all: the endpoint is not egress
	ln, err := e.m.ListenGateway(context.Background(), subnet, MetadataPort)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "gateway %s", c.RemoteAddr())
			c.Close()
		}
	}()
	e.reach(ns, metadata.String()+":80", "gateway "+SandboxAddr(subnet).String()+":")
	e.reach(ns, Gateway(subnet).String()+":"+fmt.Sprint(MetadataPort), "gateway "+SandboxAddr(subnet).String()+":")
	other, _ := e.sandbox("sb-md2")
	e.setPolicy("sb-md2", Policy{Public: true})
	e.refused(other, Gateway(subnet).String()+":"+fmt.Sprint(MetadataPort)) // the host: another sandbox's endpoint
	e.refused(other, Gateway(subnet).String()+":80")
	e.refused(other, metadata.String()+":80") // its own gateway, where nothing listens here

	// A socket the daemon did not mark (a host user's, bound first where
	// the port is unprivileged) never gets a sandbox's connection.
	ln.Close()
	var plain net.Listener
	if err := nettest.Do(e.topo.Host, func() (err error) {
		plain, err = net.Listen("tcp4", netip.AddrPortFrom(Gateway(subnet), MetadataPort).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	go func() {
		for {
			c, err := plain.Accept()
			if err != nil {
				return
			}
			fmt.Fprint(c, "hijacked")
			c.Close()
		}
	}()
	e.refused(ns, metadata.String()+":80")
	e.waitEvent("sb-md", netip.AddrPortFrom(Gateway(subnet), MetadataPort), ReasonHost)
}

func TestAlwaysBlocked(t *testing.T) {
	e := newEnv(t)
	ns, _ := e.sandbox("sb-meta")
	e.setPolicy("sb-meta", Policy{Public: true, Allow: []Rule{{Prefix: netip.MustParsePrefix("0.0.0.0/0")}}})
	e.reach(ns, webA.String()+":80", "world:")
	// Port 80 of the metadata address is nook's endpoint (TestEscapeMetadataEndpoint):
	// any other port, like any other link-local address, is blocked.
	e.refused(ns, metadata.String()+":8080")
	e.waitEvent("sb-meta", netip.AddrPortFrom(metadata, 8080), ReasonBlocked)
	err := e.m.SetPolicy(context.Background(), "sb-meta", Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("169.254.169.254/32")}}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("allow 169.254.169.254: got %v, want invalid argument", err)
	}
	err = e.m.SetPolicy(context.Background(), "sb-meta", Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("10.89.0.0/24")}}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("allow part of the pool: got %v, want invalid argument", err)
	}
	// The failed updates changed nothing.
	e.reach(ns, webA.String()+":80", "world:")
}

func TestHostUnreachable(t *testing.T) {
	e := newEnv(t)
	nsA, subA := e.sandbox("sb-host-a")
	_, subB := e.sandbox("sb-host-b")
	e.setPolicy("sb-host-a", Policy{Public: true, Allow: []Rule{{Prefix: netip.MustParsePrefix("0.0.0.0/0")}}})
	gwA, gwB := Gateway(subA).String(), Gateway(subB).String()
	// Every host address, for a service listening on 0.0.0.0.
	for _, a := range []string{gwA, gwB, nettest.HostUplink.String()} {
		e.refused(nsA, a+":8080")
	}
	e.waitEvent("sb-host-a", netip.MustParseAddrPort(gwA+":8080"), ReasonHost)
	// DNS only to its own gateway.
	e.reach(nsA, gwA+":53", "resolver")
	e.refused(nsA, gwB+":53")
	e.refused(nsA, nettest.HostUplink.String()+":53")
	// DNS and DNS over TLS to anywhere else, even where public traffic goes.
	e.refused(nsA, webA.String()+":53")
	e.refused(nsA, webA.String()+":853")
	e.waitEvent("sb-host-a", netip.AddrPortFrom(webA, 853), ReasonDNS)
	e.reach(nsA, webA.String()+":443", "world:")
}

func TestSandboxIsolation(t *testing.T) {
	e := newEnv(t)
	nsA, _ := e.sandbox("sb-iso-a")
	nsB, subB := e.sandbox("sb-iso-b")
	for _, id := range []string{"sb-iso-a", "sb-iso-b"} {
		e.setPolicy(id, Policy{Public: true, Allow: []Rule{{Prefix: netip.MustParsePrefix("0.0.0.0/0")}}})
	}
	inB := nettest.Serve(t, nsB, "0.0.0.0:9000", "sandbox-b")
	bAddr := netip.AddrPortFrom(SandboxAddr(subB), inB.Addr.Port()).String()
	e.reach(nsB, "127.0.0.1:9000", "sandbox-b")
	e.refused(nsA, bAddr)
	e.waitEvent("sb-iso-a", netip.MustParseAddrPort(bAddr), ReasonSandbox)
	// Nothing outside may open a connection into a sandbox either.
	e.topo.RouteWorldTo(t, DefaultPool)
	e.refused(e.topo.World, bAddr)
	e.waitEvent("sb-iso-b", netip.MustParseAddrPort(bAddr), ReasonInbound)
}

func TestSetPolicyRuntime(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ns, _ := e.sandbox("sb-rt")
	e.setPolicy("sb-rt", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}})
	conn, err := nettest.DialNS(ctx, ns, webA.String()+":7", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	echo := func() error {
		if _, err := conn.Write([]byte("ping")); err != nil {
			return err
		}
		conn.SetReadDeadline(time.Now().Add(shortTimeout))
		buf := make([]byte, 4)
		_, err := conn.Read(buf)
		return err
	}
	if err := echo(); err != nil {
		t.Fatalf("echo before the change: %v", err)
	}
	// Still allowed after an unrelated change: the connection lives on.
	e.setPolicy("sb-rt", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}, {Prefix: netip.PrefixFrom(webB, 32)}}})
	if err := echo(); err != nil {
		t.Fatalf("echo after an unrelated change: %v", err)
	}
	e.reach(ns, webB.String()+":80", "world:")
	// No longer allowed: new connections are refused at once and the
	// existing one is cut.
	e.setPolicy("sb-rt", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webB, 32)}}})
	e.refused(ns, webA.String()+":80")
	if err := echo(); err == nil {
		t.Fatal("echo went through after the policy stopped allowing it")
	}
}

func TestDeniedEvents(t *testing.T) {
	e := newEnv(t)
	ns, _ := e.sandbox("sb-events")
	e.setPolicy("sb-events", Policy{})
	e.refused(ns, webB.String()+":80")
	ev := e.waitEvent("sb-events", netip.AddrPortFrom(webB, 80), ReasonPolicy)
	if ev.Proto != "tcp" || time.Since(ev.Time) > time.Minute {
		t.Errorf("event %+v: want tcp, recent", ev)
	}
	e.refused(ns, privIP.String()+":443")
	e.waitEvent("sb-events", netip.AddrPortFrom(privIP, 443), ReasonPrivate)
	// A flood is rate limited: far fewer events than packets arrive.
	for len(e.events) > 0 {
		<-e.events
	}
	for i := 0; i < 200; i++ {
		nettest.DialNS(context.Background(), ns, webB.String()+":443", 50*time.Millisecond)
	}
	// Events come through NFLOG: wait for the first, however loaded the host.
	for deadline := time.Now().Add(10 * time.Second); len(e.events) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n := len(e.events); n == 0 || n > 60 {
		t.Errorf("200 denied connections gave %d events, want 1..60", n)
	}
}

func TestExpose(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ns, _ := e.sandbox("sb-expose")
	nettest.Serve(t, ns, "0.0.0.0:8000", "inside")
	hostAddr, err := e.m.Expose(ctx, "sb-expose", 8000, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !hostAddr.Addr().IsLoopback() || hostAddr.Port() == 0 {
		t.Fatalf("exposed at %v, want a loopback port", hostAddr)
	}
	got := e.reach(e.topo.Host, hostAddr.String(), "inside")
	t.Logf("through the forwarder: %q", got)
	again, err := e.m.Expose(ctx, "sb-expose", 8000, 0)
	if err != nil || again != hostAddr {
		t.Fatalf("Expose again: %v, %v; want %v", again, err, hostAddr)
	}
	if ex := e.m.Exposures("sb-expose"); len(ex) != 1 || ex[0].HostAddr != hostAddr {
		t.Fatalf("Exposures: %+v", ex)
	}
	if err := e.m.Unexpose(ctx, "sb-expose", 8000); err != nil {
		t.Fatal(err)
	}
	if _, err := nettest.Fetch(ctx, e.topo.Host, hostAddr.String(), shortTimeout); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("after Unexpose: %v, want connection refused", err)
	}
	// A fixed host port, as the daemon asks for after a restart.
	fixed, err := e.m.Expose(ctx, "sb-expose", 8000, hostAddr.Port())
	if err != nil || fixed != hostAddr {
		t.Fatalf("Expose at %v: %v, %v", hostAddr, fixed, err)
	}
	e.reach(e.topo.Host, hostAddr.String(), "inside")
}

func TestTap(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	subnet, err := e.m.Pool().Allocate(nil)
	if err != nil {
		t.Fatal(err)
	}
	name, err := e.m.SetupTap(ctx, "vm-1", subnet)
	if err != nil {
		t.Fatal(err)
	}
	if name != IfaceName("vm-1") {
		t.Fatalf("tap %q, want %q", name, IfaceName("vm-1"))
	}
	atts := e.list()
	if len(atts) != 1 || atts[0].Kind != KindTap || atts[0].Subnet != subnet || atts[0].ID != "vm-1" {
		t.Fatalf("List: %+v", atts)
	}
	// Open it by name the way the vm backend does for QEMU (openTap).
	err = nettest.Do(e.topo.Host, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	})
	if err != nil {
		t.Fatalf("attach to tap %s: %v", name, err)
	}
	if !strings.Contains(e.ruleset(), name) {
		t.Fatalf("no rules for %s", name)
	}
	// Setting it up again adopts it.
	if _, err := e.m.SetupTap(ctx, "vm-1", subnet); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Teardown(ctx, "vm-1"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Teardown(ctx, "vm-1"); err != nil {
		t.Fatalf("second Teardown: %v", err)
	}
	e.checkClean()
}

func TestRestartAndReconcile(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	nsA, _ := e.sandbox("sb-keep")
	subB, _ := e.m.Pool().Allocate([]netip.Prefix{e.list()[0].Subnet})
	if _, err := e.m.SetupContainer(ctx, "sb-orphan", subB); err != nil {
		t.Fatal(err)
	}
	subC, _ := e.m.Pool().Allocate([]netip.Prefix{e.list()[0].Subnet, subB})
	if _, err := e.m.SetupTap(ctx, "vm-orphan", subC); err != nil {
		t.Fatal(err)
	}
	e.setPolicy("sb-keep", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}})
	e.reach(nsA, webA.String()+":80", "world:")

	// A daemon restart: a second manager on the same host adopts the kernel
	// state. Rules survive the restart until it sets them again.
	m2, err := New(ctx, Config{NetnsDir: e.dir, HostNetns: e.topo.Host, Log: e.m.log})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	e.reach(nsA, webA.String()+":80", "world:")
	atts, err := m2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 3 {
		t.Fatalf("List after restart: %+v", atts)
	}
	path, err := m2.SetupContainer(ctx, "sb-keep", e.list()[0].Subnet)
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(e.dir, "sb-keep") {
		t.Fatalf("adopted path %s", path)
	}
	if err := m2.SetPolicy(ctx, "sb-keep", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}}); err != nil {
		t.Fatal(err)
	}
	e.reach(nsA, webA.String()+":80", "world:") // the same namespace, still connected
	removed, err := m2.Reconcile(ctx, []string{"sb-keep"})
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 2 {
		t.Fatalf("Reconcile removed %v, want the two orphans", removed)
	}
	atts, _ = m2.List(ctx)
	if len(atts) != 1 || atts[0].ID != "sb-keep" {
		t.Fatalf("after Reconcile: %+v", atts)
	}
	e.reach(nsA, webA.String()+":80", "world:")
}

func TestBadInput(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sub := netip.MustParsePrefix("10.89.0.4/30")
	for _, tc := range []struct {
		id     string
		subnet netip.Prefix
	}{
		{"", sub},
		{"../etc", sub},
		{"a/b", sub},
		{"ok", netip.MustParsePrefix("10.90.0.0/30")},
		{"ok", netip.MustParsePrefix("10.89.0.4/29")},
		{"ok", netip.MustParsePrefix("10.89.0.5/30")},
	} {
		if _, err := e.m.SetupContainer(ctx, tc.id, tc.subnet); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SetupContainer(%q, %v): %v, want invalid argument", tc.id, tc.subnet, err)
		}
	}
	e.sandbox("sb-bad")
	if _, err := e.m.SetupContainer(ctx, "sb-other", e.list()[0].Subnet); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("subnet in use: %v, want already exists", err)
	}
	for _, p := range []Policy{
		{Allow: []Rule{{Prefix: netip.MustParsePrefix("2001:db8::/32")}}},
		{Allow: []Rule{{Prefix: netip.MustParsePrefix("203.0.113.1/24")}}},
		{Deny: []Rule{{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Ports: []PortRange{{First: 0, Last: 10}}}}},
		{Allow: []Rule{{Prefix: netip.MustParsePrefix("203.0.113.0/24"), Ports: []PortRange{{First: 90, Last: 80}}}}},
		{Allow: []Rule{{Prefix: netip.MustParsePrefix("127.0.0.1/32")}}},
	} {
		if err := e.m.SetPolicy(ctx, "sb-bad", p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SetPolicy(%+v): %v, want invalid argument", p, err)
		}
	}
	if err := e.m.SetPolicy(ctx, "nope", Policy{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("SetPolicy on unknown sandbox: %v", err)
	}
	if err := e.m.AllowLearned(ctx, "sb-bad", netip.MustParseAddr("2001:db8::1"), nil, time.Minute); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("AllowLearned IPv6: %v", err)
	}
	if err := e.m.AllowLearned(ctx, "sb-bad", learnIP, []PortRange{{First: 1, Last: 65535}}, time.Minute); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("AllowLearned all ports: %v", err)
	}
}

func TestContainerInside(t *testing.T) {
	e := newEnv(t)
	ns, subnet := e.sandbox("sb-inside")
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(eth, unix.AF_UNSPEC)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || !addrs[0].IP.Equal(SandboxAddr(subnet).AsSlice()) {
		t.Fatalf("eth0 addresses %v: want only %v (no IPv6)", addrs, SandboxAddr(subnet))
	}
	routes, err := h.RouteList(eth, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	var gw bool
	for _, r := range routes {
		gw = gw || (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.Equal(Gateway(subnet).AsSlice())
	}
	if !gw {
		t.Fatalf("no default route via %v: %v", Gateway(subnet), routes)
	}
	var v6 string
	nettest.Do(ns, func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6")
		v6 = strings.TrimSpace(string(b))
		return err
	})
	if v6 != "1" {
		t.Fatalf("disable_ipv6 = %q inside the sandbox", v6)
	}
	e.setPolicy("sb-inside", Policy{Public: true})
	e.reach(ns, webA.String()+":80", "world:")
}

// isolatedEnv marks the test binary re-executed in a network namespace of
// its own (see TestMain).
const isolatedEnv = "NOOK_NETWORK_TEST_ISOLATED"

// TestMain runs the tests in a network namespace of their own, a stand-in
// for the real host, and checks after all tests that nothing was made in
// it: every test works in the simulated hosts it creates, so a nook
// interface or table there is a test's own leak. The real host is never
// touched, and a nook daemon running on it (or one that ran before and
// left its table) neither breaks these tests nor is broken by them.
func TestMain(m *testing.M) {
	if os.Geteuid() == 0 && os.Getenv(isolatedEnv) == "" {
		os.Exit(runIsolated())
	}
	if os.Geteuid() == 0 {
		if err := netlink.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo"}}); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: loopback of the test namespace: %v\n", err)
			os.Exit(1)
		}
	}
	code := m.Run()
	if os.Geteuid() == 0 {
		if links, err := netlink.LinkList(); err == nil {
			for _, l := range links {
				if strings.HasPrefix(l.Attrs().Name, "nk") || strings.HasPrefix(l.Attrs().Alias, "nook:") {
					fmt.Fprintf(os.Stderr, "FAIL: interface %s created outside the simulated hosts\n", l.Attrs().Name)
					code = 1
				}
			}
		}
		// No namespace mount left under these tests' temporary directories
		// (t.TempDir: /tmp/TestName...; other packages' tests, running at
		// the same time, hold their sandboxes' namespaces elsewhere).
		if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				f := strings.Fields(line)
				if len(f) > 4 && strings.Contains(line, " - nsfs ") && strings.HasPrefix(f[4], filepath.Join(os.TempDir(), "Test")) {
					fmt.Fprintf(os.Stderr, "FAIL: namespace mount left at %s\n", f[4])
					code = 1
				}
			}
		}
		if c, err := nftables.New(); err == nil {
			if tables, err := c.ListTables(); err == nil && len(tables) > 0 {
				for _, t := range tables {
					fmt.Fprintf(os.Stderr, "FAIL: nftables table %s created outside the simulated hosts\n", t.Name)
				}
				code = 1
			}
		}
	}
	os.Exit(code)
}

// runIsolated runs this test binary again, with the same arguments, in a
// new network namespace (loopback up, nothing else), and returns its exit
// code.
func runIsolated() int {
	cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
	cmd.Env = append(os.Environ(), isolatedEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit) && exit.ExitCode() >= 0:
		return exit.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "FAIL: run the tests in a network namespace of their own: %v\n", err)
		return 1
	}
}

// TestVerdictMatchesKernel checks the userspace verdict (used to cut
// connections on a policy change) against the kernel's, for every world
// server under several policies.
func TestVerdictMatchesKernel(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ns, _ := e.sandbox("sb-verdict")
	pfx := netip.MustParsePrefix
	policies := []Policy{
		{},
		{Public: true},
		{Allow: []Rule{{Prefix: pfx("203.0.113.0/24"), Ports: []PortRange{Port(443)}}, {Prefix: pfx("10.0.0.0/8")}}},
		{Public: true, Deny: []Rule{{Prefix: pfx("198.51.100.0/24"), Ports: []PortRange{{First: 80, Last: 100}}}}},
		{Allow: []Rule{{Prefix: pfx("0.0.0.0/0"), Ports: []PortRange{Port(80), Port(53)}}}, Deny: []Rule{{Prefix: pfx("203.0.113.20/32")}}},
	}
	// Intercepting admits the same (the test's proxy lets everything
	// through): it changes where a connection goes, not whether.
	for _, p := range policies { // the range is the list before the appends
		p.Intercept = true
		policies = append(policies, p)
	}
	for i, p := range policies {
		e.setPolicy("sb-verdict", p)
		comp, _ := compilePolicy(p, e.m.Pool().Prefix())
		for _, a := range []netip.Addr{webA, webB, learnIP, metadata, privIP} {
			for _, port := range []uint16{80, 443, 53, 853} {
				dst := netip.AddrPortFrom(a, port)
				want := verdict(&comp, e.m.Pool().Prefix(), nil, time.Now(), a, protoTCP, port) == reasonAccepted
				c, err := nettest.DialNS(ctx, ns, dst.String(), shortTimeout)
				if err == nil {
					c.Close()
				} else if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Fatalf("policy %d, %v: %v", i, dst, err)
				}
				if got := err == nil; got != want {
					t.Errorf("policy %d (%+v), %v: kernel allows = %v, verdict allows = %v", i, p, dst, got, want)
				}
			}
		}
	}
}

// AttachContainer joins a namespace someone else made (runc's), and a
// restarted Manager adopts it without touching the inside.
func TestAttachExistingNetns(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ns, err := nettest.NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	path := fmt.Sprintf("/proc/self/fd/%d", int(ns))
	subnet := netip.MustParsePrefix("10.89.0.8/30")
	if err := e.m.AttachContainer(ctx, "sb-runc", subnet, path); err != nil {
		t.Fatal(err)
	}
	// The manager that last set the sandbox up tears it down: it alone
	// knows what it put in the sets.
	owner := e.m
	t.Cleanup(func() {
		if err := owner.Teardown(ctx, "sb-runc"); err != nil {
			t.Error(err)
		}
		if owner != e.m {
			owner.Close()
		}
	})
	if got, ok := e.m.Subnet("sb-runc"); !ok || got != subnet {
		t.Fatalf("Subnet = %v %v", got, ok)
	}
	e.refused(ns, webA.String()+":80") // deny-all until a policy
	e.setPolicy("sb-runc", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}})
	e.reach(ns, webA.String()+":80", "world:")
	// Attaching the same namespace again adopts it.
	if err := e.m.AttachContainer(ctx, "sb-runc", subnet, path); err != nil {
		t.Fatal(err)
	}
	e.refused(ns, webA.String()+":80")

	m2, err := New(ctx, Config{NetnsDir: e.dir, HostNetns: e.topo.Host, Log: e.m.log})
	if err != nil {
		t.Fatal(err)
	}
	owner = m2 // closed after its Teardown
	if kind, err := m2.Adopt(ctx, "sb-runc", subnet); err != nil || kind != KindVeth {
		t.Fatalf("Adopt: %v %v", kind, err)
	}
	if err := m2.SetPolicy(ctx, "sb-runc", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}}); err != nil {
		t.Fatal(err)
	}
	e.reach(ns, webA.String()+":80", "world:")
	if _, err := m2.Adopt(ctx, "sb-none", netip.MustParsePrefix("10.89.0.12/30")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Adopt of a missing attachment: %v", err)
	}
}

// TestSpoofedSource: a sandbox (root inside) that sends from an address
// not its own, one the masquerade would not rewrite or another sandbox's,
// gets nothing out: the world's UDP listener sees the sandbox's own
// datagram and none of the spoofed ones.
func TestSpoofedSource(t *testing.T) {
	e := newEnv(t)
	ns, _ := e.sandbox("sb-spoof")
	e.sandbox("sb-victim")
	e.setPolicy("sb-spoof", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}})
	victim, _ := e.m.Subnet("sb-victim")
	spoofOnlyOwnGetsOut(t, e, ns, netip.AddrPortFrom(webA, 9999), SandboxAddr(victim), netip.MustParseAddr("198.51.100.77"))
}

// spoofOnlyOwnGetsOut sends a datagram from inside ns to dst in the world
// from the sandbox's own address, which must arrive, then one from each
// spoofed address, none of which may. It returns the world's sink.
func spoofOnlyOwnGetsOut(t *testing.T, e *env, ns netns.NsHandle, dst netip.AddrPort, spoofed ...netip.Addr) <-chan string {
	t.Helper()
	got := udpSink(t, e, dst)
	sendUDPFrom(t, ns, netip.Addr{}, dst, "own")
	select {
	case p := <-got:
		if p != "own" {
			t.Fatalf("got %q", p)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the sandbox's own datagram did not arrive")
	}
	for _, src := range spoofed {
		sendUDPFrom(t, ns, src, dst, "as-"+src.String())
	}
	select {
	case p := <-got:
		t.Fatalf("a spoofed datagram got out: %q", p)
	case <-time.After(time.Second):
	}
	return got
}

// udpSink listens on UDP at addr in the world and hands on each datagram
// it reads.
func udpSink(t *testing.T, e *env, addr netip.AddrPort) <-chan string {
	t.Helper()
	var ln net.PacketConn
	if err := nettest.Do(e.topo.World, func() (err error) {
		ln, err = net.ListenPacket("udp4", addr.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan string, 16)
	go func() {
		buf := make([]byte, 64)
		for {
			n, _, err := ln.ReadFrom(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	}()
	return got
}

// sendUDPFrom sends payload to dst from inside ns, from src (a valid
// address is added to eth0 first: a spoofed source) or, invalid, from
// the sandbox's own address.
func sendUDPFrom(t *testing.T, ns netns.NsHandle, src netip.Addr, dst netip.AddrPort, payload string) {
	t.Helper()
	err := nettest.Do(ns, func() error {
		laddr := &net.UDPAddr{}
		if src.IsValid() {
			link, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: src.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
				return err
			}
			laddr.IP = src.AsSlice()
		}
		c, err := net.DialUDP("udp4", laddr, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A table an earlier nook made (a chain and sets per sandbox, reached
// through a verdict map) loses those objects when a Manager starts; the
// sandboxes' elements in the shared sets stay for adoption.
func TestLegacyLayoutRemoved(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ns, _ := e.sandbox("sb-new")
	e.setPolicy("sb-new", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}})
	e.reach(ns, webA.String()+":80", "world:")

	c, err := nftables.New(nftables.WithNetNSFd(int(e.topo.Host)))
	if err != nil {
		t.Fatal(err)
	}
	old := IfaceName("sb-legacy")
	tbl := e.m.lay.table
	ch := c.AddChain(&nftables.Chain{Name: legacyChainPfx + old, Table: tbl})
	set := &nftables.Set{Table: tbl, Name: old + "-allow", KeyType: nftables.TypeIPAddr, Interval: true}
	fwd := &nftables.Set{Table: tbl, Name: legacySetFwd, KeyType: nftables.TypeIFName, IsMap: true, DataType: nftables.TypeVerdict, KeyByteOrder: binaryutil.NativeEndian}
	for _, s := range []*nftables.Set{set, fwd} {
		if err := c.AddSet(s, nil); err != nil {
			t.Fatal(err)
		}
	}
	c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{daddr(reg1), &expr.Lookup{SourceRegister: reg1, SetName: set.Name, SetID: set.ID}, &expr.Verdict{Kind: expr.VerdictDrop}}})
	if err := c.SetAddElements(fwd, []nftables.SetElement{{Key: ifnameKey(old), VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: ch.Name}}}); err != nil {
		t.Fatal(err)
	}
	fwdChain := &nftables.Chain{Name: chainForward, Table: tbl}
	c.AddRule(&nftables.Rule{Table: tbl, Chain: fwdChain, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Lookup{SourceRegister: reg1, SetName: fwd.Name, SetID: fwd.ID, IsDestRegSet: true, DestRegister: 0},
	}})
	if err := c.Flush(); err != nil {
		t.Fatalf("make the legacy objects: %v", err)
	}

	m2, err := New(ctx, Config{NetnsDir: e.dir, HostNetns: e.topo.Host, Log: e.m.log})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if strings.HasPrefix(ch.Name, legacyChainPfx) {
			t.Errorf("legacy chain %s left", ch.Name)
		}
	}
	sets, err := c.GetSets(tbl)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		if s.Name == legacySetFwd || strings.HasPrefix(s.Name, ifacePrefix) {
			t.Errorf("legacy set %s left", s.Name)
		}
	}
	// The live sandbox kept its elements: still reaching what it may.
	e.reach(ns, webA.String()+":80", "world:")
	if n := len(m2.stale[IfaceName("sb-new")][setAllow]); n != 1 {
		t.Errorf("the new manager found %d allow elements of the live sandbox, want 1", n)
	}
}

// AdoptAll adopts every sandbox a restarted Manager is given in one
// commit: each deny-all until its policy comes back (the old one's
// elements gone), and one whose interface is gone is NotFound without
// failing the others.
func TestAdoptAll(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	nsA, subA := e.sandbox("sb-a")
	nsB, subB := e.sandbox("sb-b")
	e.setPolicy("sb-a", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}})
	e.setPolicy("sb-b", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webB, 32)}}})
	e.reach(nsA, webA.String()+":80", "world:")

	m2, err := New(ctx, Config{NetnsDir: e.dir, HostNetns: e.topo.Host, Log: e.m.log})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	errs := m2.AdoptAll(ctx, map[string]netip.Prefix{"sb-a": subA, "sb-b": subB, "sb-gone": netip.MustParsePrefix("10.89.0.100/30")})
	if errs["sb-a"] != nil || errs["sb-b"] != nil || !errors.Is(errs["sb-gone"], errdefs.ErrNotFound) || len(errs) != 3 {
		t.Fatalf("AdoptAll = %v", errs)
	}
	e.refused(nsA, webA.String()+":80")
	e.refused(nsB, webB.String()+":80")
	if err := m2.SetPolicy(ctx, "sb-a", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webB, 32)}}}); err != nil {
		t.Fatal(err)
	}
	e.reach(nsA, webB.String()+":80", "world:")
	e.refused(nsA, webA.String()+":80") // the old policy's element went at adoption
	e.refused(nsB, webB.String()+":80")
	for _, id := range []string{"sb-a", "sb-b"} {
		if err := m2.Teardown(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}
