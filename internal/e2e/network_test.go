package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/network/nettest"
	"github.com/nookhq/nook/internal/testutil"
)

// The simulated world of the network tests. Every address lives in a
// namespace the test made: nothing leaves the machine.
const (
	webAllowed = "203.0.113.10"  // allowed.test
	webCIDR    = "203.0.113.50"  // reached by a CIDR rule
	webDenied  = "198.51.100.20" // denied.test: resolvable only by the world
	worldDNS   = "203.0.113.53"  // the upstream resolver
	metadataIP = "169.254.169.254"
	debMirror  = "203.0.113.80" // deb.debian.org in the world: a proxy of Debian's mirror (serveMirror)
	webSecret  = "203.0.113.30" // *.secret.test: the hosts of secrets_test.go, one address
	hostPort   = "9090"         // a host service on 0.0.0.0 in the simulated host
)

// world is a simulated outside world: web servers, a DNS zone and a
// metadata listener, behind the uplink of a simulated host.
type world struct {
	topo *nettest.Topology
	mu   sync.Mutex
	seen []string // every name the world's DNS server was asked
}

func newWorld(t *testing.T) *world {
	t.Helper()
	nettest.RequireRoot(t)
	w := &world{topo: nettest.New(t)}
	for _, a := range []string{webAllowed, webCIDR, webDenied, worldDNS, metadataIP, debMirror, webSecret} {
		w.topo.AddWorldAddr(t, netip.MustParseAddr(a))
	}
	w.serveHTTP(t, w.topo.World, webAllowed+":80", "allowed-web")
	w.serveHTTP(t, w.topo.World, webAllowed+":8080", "allowed-web-8080")
	w.serveHTTP(t, w.topo.World, webCIDR+":80", "cidr-web")
	w.serveHTTP(t, w.topo.World, webDenied+":80", "denied-web")
	w.serveHTTP(t, w.topo.World, metadataIP+":80", "metadata")
	w.serveHTTP(t, w.topo.Host, "0.0.0.0:"+hostPort, "host-service")
	w.serveTLS(t, webAllowed+":443", "tls-web")
	nettest.Serve(t, w.topo.World, webAllowed+":7000", "220 raw\r\n")
	w.serveDNS(t)
	return w
}

// serveTLS serves HTTPS for any server name (a self-signed certificate:
// the sandboxes' curl runs with -k) answering body.
func (w *world) serveTLS(t *testing.T, addr, body string) {
	t.Helper()
	var ln net.Listener
	if err := nettest.Do(w.topo.World, func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { fmt.Fprint(rw, body) }))
	srv.Listener.Close()
	srv.Listener = ln
	srv.StartTLS()
	t.Cleanup(srv.Close)
}

func (w *world) serveHTTP(t *testing.T, ns netns.NsHandle, addr, body string) {
	t.Helper()
	var ln net.Listener
	if err := nettest.Do(ns, func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { fmt.Fprint(rw, body) }), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// serveDNS answers the zone test.: allowed.test and its subdomains,
// denied.test, and deb.debian.org (debMirror); everything else NXDOMAIN.
func (w *world) serveDNS(t *testing.T) {
	t.Helper()
	// evil.test and raw.test share allowed.test's address, as sites on one
	// CDN do.
	zone := map[string]string{"allowed.test.": webAllowed, "www.allowed.test.": webAllowed, "denied.test.": webDenied, "deb.debian.org.": debMirror,
		"evil.test.": webAllowed, "raw.test.": webAllowed,
		"api.secret.test.": webSecret, "other.secret.test.": webSecret, "git.secret.test.": webSecret, "pypi.secret.test.": webSecret}
	handler := dns.HandlerFunc(func(rw dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		if len(r.Question) == 1 {
			q := r.Question[0]
			w.mu.Lock()
			w.seen = append(w.seen, strings.ToLower(q.Name))
			w.mu.Unlock()
			if a, ok := zone[strings.ToLower(q.Name)]; ok && q.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.ParseIP(a)})
			} else if !ok {
				m.Rcode = dns.RcodeNameError
			}
		}
		rw.WriteMsg(m)
	})
	var pc net.PacketConn
	var ln net.Listener
	if err := nettest.Do(w.topo.World, func() (err error) {
		if pc, err = net.ListenPacket("udp4", worldDNS+":53"); err != nil {
			return err
		}
		ln, err = net.Listen("tcp4", worldDNS+":53")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	udp, tcp := &dns.Server{PacketConn: pc, Handler: handler}, &dns.Server{Listener: ln, Handler: handler}
	go udp.ActivateAndServe()
	go tcp.ActivateAndServe()
	t.Cleanup(func() { udp.Shutdown(); tcp.Shutdown() })
}

func (w *world) asked(label string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range w.seen {
		if strings.Contains(n, label) {
			return true
		}
	}
	return false
}

// hostPath is a path naming the simulated host's namespace, for nsenter.
func (w *world) hostPath() string {
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(w.topo.Host))
}

// netDaemonArgs are the flags of a daemon in the simulated host.
func netDaemonArgs(extra ...string) []string {
	return append([]string{"--network=true", "--dns-upstream", worldDNS + ":53"}, extra...)
}

// sh runs a shell command in a sandbox and returns the result.
func (d *daemon) sh(name, script string) result {
	d.t.Helper()
	r, err := d.nook("exec", name, "--", "sh", "-c", script)
	if err != nil {
		d.t.Fatal(err)
	}
	return r
}

// curl fetches url in a sandbox: the body, or curl's exit code (6: name
// not resolved, 7: connection refused, 28: timed out).
func (d *daemon) curl(name, url string) (string, int) {
	d.t.Helper()
	r := d.sh(name, "curl -sS -m 5 "+url)
	return r.stdout, r.code
}

func (d *daemon) mustReach(name, url, body string) {
	d.t.Helper()
	if got, code := d.curl(name, url); code != 0 || got != body {
		d.t.Fatalf("%s: curl %s: exit %d, %q; want %q", name, url, code, got, body)
	}
}

// mustRefuse checks that a connection is refused at once (nook's rules
// answer TCP with a reset): never a timeout, which a dropped packet or a
// missing route would give.
func (d *daemon) mustRefuse(name, url string, code int) {
	d.t.Helper()
	start := time.Now()
	if got, c := d.curl(name, url); c != code {
		d.t.Fatalf("%s: curl %s: exit %d, %q; want exit %d", name, url, c, got, code)
	}
	if time.Since(start) > 4*time.Second {
		d.t.Fatalf("%s: curl %s took %v: not refused at once", name, url, time.Since(start))
	}
}

func (d *daemon) network(name string) api.Network {
	d.t.Helper()
	var n api.Network
	if err := json.Unmarshal([]byte(d.must("net", name, "--json")), &n); err != nil {
		d.t.Fatal(err)
	}
	return n
}

func sandboxAddr(n api.Network) string { return strings.SplitN(n.Address, "/", 2)[0] }

// httpGet fetches / from addr inside namespace ns.
func httpGet(t *testing.T, w *world, addr string) string {
	t.Helper()
	got, err := tryHTTPGet(w, addr)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func tryHTTPGet(w *world, addr string) (string, error) {
	c, err := nettest.DialNS(context.Background(), w.topo.Host, addr, 3*time.Second)
	if err != nil {
		return "", fmt.Errorf("dial %s from the simulated host: %w", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", addr, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, b), nil
}

// The egress policy end to end, with the real daemon in a simulated host:
// allowed names and CIDRs are reachable, everything else is refused; DNS
// answers only what is allowed and refuses tunnels; the host, other
// sandboxes and the metadata address are out of reach; a policy change
// takes effect at once; the policy survives pause, a restart and kill -9;
// exposed ports work from the host; and destroy leaves nothing.
//
// Both backends run the same suite: a container on a veth into its
// namespace, a vm on a tap device with the guest configuring eth0.
func TestNetworkPolicy(t *testing.T) {
	for _, iso := range []string{"container", "vm"} {
		t.Run(iso, func(t *testing.T) {
			if iso == "vm" {
				requireVMInSimulatedHost(t)
			}
			testNetworkPolicy(t, iso)
		})
	}
}

func testNetworkPolicy(t *testing.T, isolation string) {
	w := newWorld(t)
	d := newDaemonIn(t, w.hostPath(), netDaemonArgs()...)
	allow := []string{"--allow", "allowed.test", "--allow", "*.allowed.test", "--allow", webCIDR}
	create := []string{"create", "--isolation", isolation}
	if isolation == "vm" {
		create = append(create, "--cpus", "1", "--memory", "512M")
	}
	d.must(append(append(create, "--name", "egress"), allow...)...)
	d.must(append(create, "--name", "other")...)
	d.must(append(create, "--name", "closed", "--net", "none")...)

	// Addresses and resolver.
	n := d.network("egress")
	if n.Mode != "allowlist" || len(n.Allow) != 3 || !strings.HasPrefix(n.Address, "10.89.") || !strings.HasSuffix(n.Address, "/30") {
		t.Fatalf("nook net egress: %+v", n)
	}
	if got := d.sh("egress", "cat /etc/resolv.conf").stdout; !strings.Contains(got, "nameserver "+n.Gateway) {
		t.Fatalf("resolv.conf: %q", got)
	}
	if got := d.must("net", "egress"); !strings.Contains(got, "allow:") || !strings.Contains(got, "*.allowed.test") {
		t.Fatalf("nook net egress:\n%s", got)
	}

	checkSandbox := func(sb, when string) {
		t.Helper()
		t.Logf("checking the policy of %s %s", sb, when)
		gw := d.network(sb).Gateway
		d.mustReach(sb, "http://allowed.test/", "allowed-web")
		d.mustReach(sb, "http://www.allowed.test/", "allowed-web")
		d.mustReach(sb, "http://"+webCIDR+"/", "cidr-web") // the CIDR rule
		d.mustRefuse(sb, "http://denied.test/", 6)         // NXDOMAIN
		d.mustRefuse(sb, "http://"+webDenied+"/", 7)       // never resolved through nook, not allowed
		d.mustRefuse(sb, "http://"+metadataIP+":8080/", 7) // link-local, but for nook's metadata endpoint
		if got, code := d.curl(sb, "http://"+metadataIP+"/"); code != 0 || !strings.Contains(got, "Nook-Metadata") {
			t.Fatalf("%s: %s:80 is not nook's metadata endpoint: exit %d, %q", sb, metadataIP, code, got) // never the world's
		}
		d.mustRefuse(sb, "http://"+gw+":"+hostPort+"/", 7)                          // the host, at its sandbox-side address
		d.mustRefuse(sb, "http://"+nettest.HostUplink.String()+":"+hostPort+"/", 7) // and at its uplink address
		d.mustRefuse(sb, "http://"+worldDNS+":53/", 7)                              // DNS elsewhere than nook's resolver
		if r := d.sh(sb, "getent hosts denied.test"); r.code == 0 {
			t.Fatalf("denied.test resolved: %q", r.stdout)
		}
	}
	check := func(when string) { t.Helper(); checkSandbox("egress", when) }
	check("after create")

	// Another sandbox is out of reach, even on a port it serves; the host
	// reaches it only through an exposed port.
	d.must("exec", "-d", "other", "--", "python3", "-m", "http.server", "8000", "-d", "/etc")
	otherAddr := sandboxAddr(d.network("other"))
	waitFor(t, "the other sandbox's server", func() bool { return d.sh("other", "curl -s -o /dev/null http://127.0.0.1:8000/").code == 0 })
	d.mustRefuse("egress", "http://"+otherAddr+":8000/", 7)
	exposed := strings.TrimSpace(d.must("expose", "other", "8000"))
	if !strings.HasPrefix(exposed, "127.0.0.1:") {
		t.Fatalf("expose printed %q", exposed)
	}
	if got := httpGet(t, w, exposed); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("GET through the exposed port: %q", got)
	}
	if again := strings.TrimSpace(d.must("expose", "other", "8000")); again != exposed {
		t.Fatalf("exposing again gave %q, want %q", again, exposed)
	}
	// Stopped across a daemon restart, then started: its exposed port is
	// forwarded again, on the same host port, and it keeps its address.
	d.must("stop", "other")
	d.stop(syscall.SIGKILL)
	d.start()
	d.must("start", "other")
	if addr := sandboxAddr(d.network("other")); addr != otherAddr {
		t.Fatalf("after a stop, a daemon restart and a start the sandbox's address is %s, was %s", addr, otherAddr)
	}
	d.must("exec", "-d", "other", "--", "python3", "-m", "http.server", "8000", "-d", "/etc")
	waitFor(t, "the exposed port after a stop, a daemon restart and a start", func() bool {
		got, err := tryHTTPGet(w, exposed)
		return err == nil && strings.HasPrefix(got, "200 ")
	})

	// Mode none: nothing at all, not even the resolver.
	d.mustRefuse("closed", "http://"+webCIDR+"/", 7)
	if r := d.sh("closed", "getent hosts allowed.test"); r.code == 0 {
		t.Fatalf("a sandbox with --net none resolved a name: %q", r.stdout)
	}

	// A DNS tunnel: long random labels under an allowed zone are refused
	// and never reach the upstream.
	tunnel := "6a8f3e9c2b1d4f7a9e0c3b5d8f1a2c4e"
	if r := d.sh("egress", "getent hosts "+tunnel+".allowed.test"); r.code == 0 {
		t.Fatalf("a tunnel-shaped name resolved: %q", r.stdout)
	}
	if w.asked(tunnel) {
		t.Fatal("the tunnel query reached the upstream resolver")
	}

	// The log says what was denied and why.
	var log api.NetLog
	if err := json.Unmarshal([]byte(d.must("net", "log", "egress", "--json")), &log); err != nil {
		t.Fatal(err)
	}
	wantLog := map[string]bool{"denied.test A:not-allowed": false, "tunnel": false, webDenied + ":80/tcp:policy": false,
		metadataIP + ":8080/tcp:blocked": false, ":" + hostPort + "/tcp:host": false, otherAddr + ":8000/tcp:sandbox": false, worldDNS + ":53/tcp:dns": false}
	for _, e := range log.Entries {
		for k := range wantLog {
			if k == "tunnel" && e.Reason == "tunnel" && strings.Contains(e.Destination, tunnel) || strings.HasSuffix(e.Destination+":"+e.Reason, k) {
				wantLog[k] = true
			}
		}
	}
	for k, ok := range wantLog {
		if !ok {
			t.Errorf("net log lacks %s:\n%s", k, d.must("net", "log", "egress"))
		}
	}
	if out := d.must("net", "log", "egress"); !strings.Contains(out, "DESTINATION") || !strings.Contains(out, "not-allowed") {
		t.Fatalf("nook net log:\n%s", out)
	}

	// A runtime change takes effect at once, both ways.
	d.must(append([]string{"net", "egress", "--allow", webDenied + ":80"}, allow...)...)
	d.mustReach("egress", "http://"+webDenied+"/", "denied-web")
	d.must(append([]string{"net", "egress"}, allow...)...)
	d.mustRefuse("egress", "http://"+webDenied+"/", 7)
	// A deny rule wins over an allow rule.
	d.must(append([]string{"net", "egress", "--deny", "allowed.test"}, allow...)...)
	d.mustRefuse("egress", "http://allowed.test/", 6)
	d.must(append([]string{"net", "egress"}, allow...)...)

	// Pause and resume, a restart, kill -9: the policy and exposed port stay.
	d.must("pause", "egress")
	d.must("resume", "egress")
	check("after pause and resume")
	d.stop(syscall.SIGTERM)
	d.start(netDaemonArgs()...)
	check("after a daemon restart")
	if got := httpGet(t, w, exposed); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("GET through the exposed port after a restart: %q", got)
	}
	d.stop(syscall.SIGKILL)
	d.start(netDaemonArgs()...)
	check("after kill -9 of the daemon")
	d.mustRefuse("egress", "http://"+otherAddr+":8000/", 7)

	// A rollback keeps the policy; a fork inherits it on an address of its own.
	d.must("snapshot", "egress", "--name", "net")
	d.must("rollback", "egress", "net")
	check("after a rollback")
	d.must("fork", "egress:net", "--name", "egress-fork")
	if fn := d.network("egress-fork"); fn.Mode != "allowlist" || len(fn.Allow) != 3 || fn.Address == n.Address {
		t.Fatalf("the fork's network: %+v (the source's address %s)", fn, n.Address)
	}
	checkSandbox("egress-fork", "after a fork")
	d.must("rm", "egress-fork")
	// An exposed port stays exposed through a rollback (whose processes
	// start afresh on a container: the server is started again).
	d.must("snapshot", "other", "--name", "net")
	d.must("rollback", "other", "net")
	if isolation == "container" {
		d.must("exec", "-d", "other", "--", "python3", "-m", "http.server", "8000", "-d", "/etc")
	}
	waitFor(t, "the exposed port after a rollback", func() bool {
		got, err := tryHTTPGet(w, exposed)
		return err == nil && strings.HasPrefix(got, "200 ")
	})

	// Unexpose closes it; destroy leaves nothing in the simulated host.
	d.must("unexpose", "other", "8000")
	if c, err := nettest.DialNS(context.Background(), w.topo.Host, exposed, time.Second); err == nil {
		c.Close()
		t.Fatal("the unexposed port still answers")
	}
	d.must("rm", "egress", "other", "closed")
	checkNoNetworkLeft(t, w, d)
}

// checkNoNetworkLeft stops the daemon (which destroys its warm
// sandboxes) and checks the simulated host for sandbox interfaces,
// per-sandbox nftables chains and sets, namespace mounts and resolvers.
// The table itself stays: sandboxes outlive the daemon.
func checkNoNetworkLeft(t *testing.T, w *world, d *daemon) {
	t.Helper()
	// No resolver listens any more (warm sandboxes have none).
	var socks string
	nettest.Do(w.topo.Host, func() error {
		b, _ := os.ReadFile("/proc/thread-self/net/udp")
		socks = string(b)
		return nil
	})
	if strings.Contains(socks, ":0035 ") {
		t.Errorf("a resolver still listens on port 53:\n%s", socks)
	}
	d.stop(syscall.SIGTERM)
	h, err := netlink.NewHandleAt(w.topo.Host, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "nk") || strings.HasPrefix(l.Attrs().Alias, "nook:") {
			t.Errorf("interface left: %s (%s)", l.Attrs().Name, l.Attrs().Alias)
		}
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(w.topo.Host)))
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if strings.HasPrefix(ch.Name, "sb-") {
			t.Errorf("nftables chain left: %s", ch.Name)
		}
	}
	if tbl, err := c.ListTableOfFamily("nook", nftables.TableFamilyINet); err == nil && tbl != nil {
		sets, err := c.GetSets(tbl)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sets {
			if strings.HasPrefix(s.Name, "nk") {
				t.Errorf("nftables set left: %s", s.Name)
			}
			// The sets keyed by sandbox interface: nothing live in them
			// (an element removed by a 1 ms timeout may wait for the
			// kernel's gc).
			switch s.Name {
			case "ifaces", "dns", "src", "allow", "allowp", "deny", "denyp", "learn", "learnp", "public":
				els, _ := c.GetSetElements(s)
				live := 0
				for _, el := range els {
					if !el.IntervalEnd && (!s.HasTimeout || el.Expires > 0) {
						live++
					}
				}
				if live > 0 {
					t.Errorf("nftables set %s still has %d elements", s.Name, live)
				}
			}
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(d.run, "netns")); len(ents) > 0 {
		t.Errorf("namespace mounts left: %v", ents)
	}
}

// Bad policies, ports and an exhausted pool are refused with one line,
// and leave nothing half made.
func TestNetworkBadInput(t *testing.T) {
	w := newWorld(t)
	d := newDaemonIn(t, w.hostPath(), netDaemonArgs("--net-pool", "10.89.0.0/29", "--warm-pool", "-1")...)
	d.must("create", "--name", "good", "--allow", "allowed.test")
	before := d.must("net", "good", "--json")
	d.expectCLI(t, []cliCase{
		{[]string{"create", "--allow", "bad..domain"}, 1, `allow rule "bad..domain"`},
		{[]string{"create", "--allow", "10.0.0.0/33"}, 1, `allow rule "10.0.0.0/33"`},
		{[]string{"create", "--allow", "example.com:99999"}, 1, `allow rule "example.com:99999"`},
		{[]string{"create", "--allow", "@nosuch"}, 1, `allow rule "@nosuch"`},
		{[]string{"create", "--deny", "@internet"}, 1, `deny rule "@internet"`},
		{[]string{"create", "--allow", nettest.HostUplink.String()}, 1, "host address " + nettest.HostUplink.String()},
		{[]string{"create", "--allow", "127.0.0.1"}, 1, `allow rule "127.0.0.1"`},
		{[]string{"create", "--allow", "10.89.0.0/24"}, 1, "overlaps"},
		{[]string{"create", "--net", "none", "--allow", "allowed.test"}, 1, "takes no allow or deny rules"},
		{[]string{"create", "--net", "open"}, 1, "open"},
		{[]string{"create", "--allow", "bad..domain", "--allow", "10.0.0.0/33"}, 1, `allow rule "10.0.0.0/33"`},
		{[]string{"net", "good", "--allow", "allowed.test", "--allow", "-x-.test"}, 1, `allow rule "-x-.test"`},
		{[]string{"net", "good", "--allow", "169.254.169.254"}, 1, `allow rule "169.254.169.254"`},
		{[]string{"net", "nosuch"}, 1, "no sandbox named"},
		{[]string{"expose", "good", "0"}, 1, "not valid"},
		{[]string{"expose", "good", "70000"}, 1, "not valid"},
		{[]string{"expose", "good", "http"}, 2, "PORT must be a number"},
		{[]string{"unexpose", "good", "8000"}, 1, "not exposed"},
	})
	if after := d.must("net", "good", "--json"); after != before {
		t.Fatalf("a refused change changed the policy:\n%s\nwas\n%s", after, before)
	}
	d.mustReach("good", "http://allowed.test/", "allowed-web")

	// The pool holds two sandboxes.
	d.must("create", "--name", "second", "--net", "none")
	d.expectCLI(t, []cliCase{{[]string{"create", "--name", "third"}, 1, "network address pool exhausted"}})
	var sbs []api.Sandbox
	json.Unmarshal([]byte(d.must("ls", "--json")), &sbs)
	if len(sbs) != 2 {
		t.Fatalf("after an exhausted pool: %d sandboxes, want 2", len(sbs))
	}
	d.must("rm", "second")
	d.must("create", "--name", "third")
	d.must("rm", "good", "third")
	checkNoNetworkLeft(t, w, d)
}

// Creates attach their networks in parallel (the subnet lock is held only
// for the choice): each gets a subnet of its own and reaches what its
// policy allows; a pool too small for all of them refuses the rest
// cleanly, and a subnet freed by rm is given out again.
func TestNetworkParallelCreates(t *testing.T) {
	w := newWorld(t)
	// 10.89.0.0/27 holds 8 /30s: 8 places for 10 creates.
	d := newDaemonIn(t, w.hostPath(), netDaemonArgs("--net-pool", "10.89.0.0/27", "--warm-pool", "-1")...)
	const n = 10
	var wg sync.WaitGroup
	results := make([]result, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			results[i], _ = d.nook("create", "--name", fmt.Sprintf("p%d", i), "--allow", "allowed.test")
		}(i)
	}
	wg.Wait()
	subnets := map[string]string{}
	made := 0
	for i, r := range results {
		name := fmt.Sprintf("p%d", i)
		if r.code != 0 {
			if !strings.Contains(r.stderr, "network address pool exhausted") {
				t.Fatalf("create %s: exit %d: %s", name, r.code, r.stderr)
			}
			continue
		}
		made++
		addr := d.network(name).Address
		if other, ok := subnets[addr]; ok {
			t.Fatalf("%s and %s both have %s", name, other, addr)
		}
		subnets[addr] = name
		d.mustReach(name, "http://allowed.test/", "allowed-web")
	}
	if made != 8 {
		t.Fatalf("%d of %d parallel creates succeeded with 8 subnets free", made, n)
	}
	var sbs []api.Sandbox
	json.Unmarshal([]byte(d.must("ls", "--json")), &sbs)
	if len(sbs) != made {
		t.Fatalf("ls shows %d sandboxes after %d creates", len(sbs), made)
	}
	victim := sbs[0].Name
	d.must("rm", victim)
	d.must("create", "--name", "again", "--allow", "allowed.test")
	d.mustReach("again", "http://allowed.test/", "allowed-web")
	for _, sb := range sbs[1:] {
		d.must("rm", sb.Name)
	}
	d.must("rm", "again")
	checkNoNetworkLeft(t, w, d)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	// A bound, not a speed check: python's first start in a TCG vm on a
	// loaded host takes well over 15 s.
	waitWithin(t, what, 90*time.Second, ok)
}

// waitWithin waits until ok, failing the test after bound.
func waitWithin(t *testing.T, what string, bound time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A Dockerfile build's RUN steps run under the build's network policy
// (--allow): what it allows is reached, what it does not is refused, and
// the build's error names the denied destination. Its step sandboxes
// leave no network behind.
func TestNetworkDockerfileBuild(t *testing.T) {
	w := newWorld(t)
	d := newDaemonIn(t, w.hostPath(), netDaemonArgs("--warm-pool", "-1")...)
	tpl := testutil.RandomName("netdf")
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, "Dockerfile"), []byte("FROM base\nRUN curl -sf --max-time 5 http://"+webDenied+"/\n"), 0o644)
	r, _ := d.nookWithin(5*time.Minute, []string{"NOOK_HOST=unix://" + d.socket()}, "template", "build", tpl+"-bad", bad, "--allow", "allowed.test")
	if r.code != 1 || !strings.Contains(r.stderr, "denied: "+webDenied+":80/tcp") || !strings.Contains(r.stderr, "--allow") {
		t.Errorf("a step the policy refuses: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(testutil.TemplatesDir(), tpl+"-bad")); !os.IsNotExist(err) {
		t.Errorf("a failed build left the template's directory: %v", err)
	}
	// (The failed build's layers stay as cache until a GC: the removal
	// of the template below collects them.)
	ctxDir := t.TempDir()
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM base\nRUN curl -sf --max-time 10 http://allowed.test/ > /fetched\n"), 0o644)
	t.Cleanup(func() { d.nook("template", "rm", tpl) })
	if r, _ := d.nookWithin(5*time.Minute, []string{"NOOK_HOST=unix://" + d.socket()}, "template", "build", tpl, ctxDir, "--allow", "allowed.test"); r.code != 0 {
		t.Fatalf("a build whose step reaches what it allows: %+v", r)
	}
	d.must("create", "--name", "netdf", "--template", tpl, "--net", "none")
	if got := d.must("exec", "netdf", "--", "cat", "/fetched"); got != "allowed-web" {
		t.Errorf("what the step fetched: %q", got)
	}
	d.must("rm", "netdf")
	d.must("template", "rm", tpl)
	checkNoNetworkLeft(t, w, d)
}
