package network

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	mdns "github.com/miekg/dns"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/network/dns"
	"github.com/nookhq/nook/internal/network/nettest"
	"github.com/nookhq/nook/internal/network/policy"
)

// A sandbox cannot hold more than ConntrackLimit connections at once (so it
// cannot fill the host's conntrack table for everyone); the one over the
// limit is refused and logged, another sandbox is not affected, and the
// sandbox gets its room back when a connection ends.
func TestEscapeConntrackLimit(t *testing.T) {
	const limit = 8
	e := newEnv(t, func(c *Config) { c.ConntrackLimit = limit })
	ctx := context.Background()
	nsA, _ := e.sandbox("sb-ct-a")
	nsB, _ := e.sandbox("sb-ct-b")
	allow := Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}}}
	e.setPolicy("sb-ct-a", allow)
	e.setPolicy("sb-ct-b", allow)
	echo := webA.String() + ":7" // the echo server keeps connections open

	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := 0; i < limit; i++ {
		c, err := nettest.DialNS(ctx, nsA, echo, 2*time.Second)
		if err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, limit, err)
		}
		conns = append(conns, c)
	}
	c, err := nettest.DialNS(ctx, nsA, echo, shortTimeout)
	if err == nil {
		c.Close()
		t.Fatalf("connection %d went through, want refused over the limit of %d\n%s", limit+1, limit, e.ruleset())
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connection over the limit: want ECONNREFUSED, got %v", err)
	}
	e.waitEvent("sb-ct-a", netip.AddrPortFrom(webA, 7), ReasonConntrack)

	// Another sandbox has its own count.
	cb, err := nettest.DialNS(ctx, nsB, echo, 2*time.Second)
	if err != nil {
		t.Fatalf("sandbox B while A is at its limit: %v", err)
	}
	cb.Close()

	// A closed connection frees its place (TIME_WAIT is not counted).
	conns[0].Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		c, err := nettest.DialNS(ctx, nsA, echo, shortTimeout)
		if err == nil {
			conns[0] = c
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox A after closing a connection: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// One sandbox flooding denied packets uses up only its own log limit:
// another sandbox's single denial is still logged.
func TestEscapeNFLOGFlood(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.LogRate = 5 })
	nsA, _ := e.sandbox("sb-flood-a")
	nsB, _ := e.sandbox("sb-flood-b")
	e.setPolicy("sb-flood-a", Policy{})
	e.setPolicy("sb-flood-b", Policy{})

	var conn *net.UDPConn
	if err := nettest.Do(nsA, func() error {
		var err error
		conn, err = net.ListenUDP("udp4", nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stop, done := make(chan struct{}), make(chan int)
	go func() {
		dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(webB, 80))
		n := 0
		for {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			conn.WriteToUDP([]byte("flood"), dst)
			n++
		}
	}()
	flooded := false
	defer func() {
		if !flooded {
			close(stop)
			<-done
		}
	}()
	e.waitEvent("sb-flood-a", netip.AddrPortFrom(webB, 80), ReasonPolicy)
	// The flood has used up A's limit.
	for len(e.events) > 0 {
		<-e.events
	}
	e.refused(nsB, webA.String()+":443")
	e.waitEvent("sb-flood-b", netip.AddrPortFrom(webA, 443), ReasonPolicy)
	close(stop)
	n := <-done
	flooded = true
	t.Logf("sandbox A sent %d denied packets", n)
}

// A restart with another connection limit replaces the counting set (an
// element keeps the limit it was made with); one with the same limit keeps
// it, and with it the counts of connections already open.
func TestConntrackLimitChange(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ConntrackLimit = 8 })
	connSets := func() []string {
		t.Helper()
		c, err := nftables.New(nftables.WithNetNSFd(int(e.topo.Host)))
		if err != nil {
			t.Fatal(err)
		}
		sets, err := c.GetSets(e.m.lay.table)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, s := range sets {
			if strings.HasPrefix(s.Name, setConnPrefix) {
				names = append(names, s.Name)
			}
		}
		return names
	}
	restart := func(limit int) {
		t.Helper()
		m, err := New(context.Background(), Config{NetnsDir: e.dir, HostNetns: e.topo.Host, ConntrackLimit: limit})
		if err != nil {
			t.Fatal(err)
		}
		m.Close()
	}
	if got := connSets(); !slices.Equal(got, []string{"conn-8"}) {
		t.Fatalf("sets %v, want [conn-8]", got)
	}
	restart(8)
	if got := connSets(); !slices.Equal(got, []string{"conn-8"}) {
		t.Fatalf("after a restart with the same limit: sets %v, want [conn-8]", got)
	}
	restart(16)
	if got := connSets(); !slices.Equal(got, []string{"conn-16"}) {
		t.Fatalf("after a restart with limit 16: sets %v, want [conn-16]\n%s", got, e.ruleset())
	}
}

// A sandbox resolving ever new names under a wildcard rule (each answered
// with another address) cannot grow its learned set, or the manager's
// record of it, past LearnedLimit: the least recently learned go, the
// newest stay reachable.
func TestEscapeLearnedAddressCap(t *testing.T) {
	const limit, names = 16, 40
	e := newEnv(t, func(c *Config) { c.LearnedLimit = limit })
	ctx := context.Background()
	id := "sb-learncap"
	ns, subnet := e.sandbox(id)
	e.setPolicy(id, Policy{})

	// The zone: n<i>.zone.test has 198.51.100.<100+i>. The upstream
	// listens on the test's own loopback.
	zoneAddr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 51, 100, byte(100 + i)}) }
	first, last := zoneAddr(0), zoneAddr(names-1)
	for _, a := range []netip.Addr{first, last} {
		e.topo.AddWorldAddr(t, a)
		nettest.Serve(t, e.topo.World, a.String()+":80", "world:"+a.String())
	}
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, req *mdns.Msg) {
		resp := new(mdns.Msg)
		resp.SetReply(req)
		var i int
		if _, err := fmt.Sscanf(req.Question[0].Name, "n%d.zone.test.", &i); err == nil && req.Question[0].Qtype == mdns.TypeA {
			resp.Answer = append(resp.Answer, &mdns.A{
				Hdr: mdns.RR_Header{Name: req.Question[0].Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 300},
				A:   zoneAddr(i).AsSlice(),
			})
		} else {
			resp.Rcode = mdns.RcodeNameError
		}
		w.WriteMsg(resp)
	})}
	started := make(chan struct{})
	up.NotifyStartedFunc = func() { close(started) }
	go up.ActivateAndServe()
	<-started
	t.Cleanup(func() { up.Shutdown() })

	// The sandbox's resolver, on its gateway in the simulated host, wired
	// to the manager as the daemon wires it.
	srv, err := dns.New(dns.Config{
		Upstreams: []netip.AddrPort{pc.LocalAddr().(*net.UDPAddr).AddrPort()},
		QPS:       1000, Burst: 1000, NamesPerZone: 1000,
		Logger: e.m.log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	pol, err := policy.Parse("allowlist", []string{"*.zone.test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.resolver.Close() // the pretend resolver holds TCP port 53
	gw := netip.AddrPortFrom(Gateway(subnet), 53)
	if err := nettest.Do(e.topo.Host, func() error {
		_, err := srv.Add(id, gw, pol, dns.Hooks{OnResolved: func(ctx context.Context, id string, r dns.Resolved) error {
			for _, a := range r.Addrs {
				if err := e.m.AllowLearned(ctx, id, a, nil, r.TTL); err != nil {
					return err
				}
			}
			return nil
		}})
		return err
	}); err != nil {
		t.Fatal(err)
	}

	for i := 0; i < names; i++ {
		q := new(mdns.Msg)
		q.SetQuestion(fmt.Sprintf("n%d.zone.test.", i), mdns.TypeA)
		var r *mdns.Msg
		err := nettest.Do(ns, func() error {
			var err error
			r, _, err = (&mdns.Client{Timeout: 2 * time.Second}).Exchange(q, gw.String())
			return err
		})
		if err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
		if r.Rcode != mdns.RcodeSuccess || len(r.Answer) != 1 {
			t.Fatalf("query %d: %s with %d answers", i, mdns.RcodeToString[r.Rcode], len(r.Answer))
		}
	}

	c, err := nftables.New(nftables.WithNetNSFd(int(e.topo.Host)))
	if err != nil {
		t.Fatal(err)
	}
	// count returns the live elements of a learned set, and all it holds
	// (evicted ones may wait for the kernel's gc).
	count := func(name string) (live, all int) {
		t.Helper()
		elems, err := c.GetSetElements(e.m.lay.sharedSets[name])
		if err != nil {
			t.Fatal(err)
		}
		for _, el := range elems {
			if !bytes.Equal(el.Key[:16], ifnameKey(IfaceName(id))) {
				continue
			}
			all++
			if el.Expires > 0 {
				live++
			}
		}
		return live, all
	}
	// An evicted element may live on for a jiffy and wait for the
	// kernel's gc a little longer.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		live, all := count(setLearn)
		if live > 0 && live <= limit && all <= limit {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("learned set holds %d elements, %d live, after %d names, want 1..%d", all, live, names, limit)
		}
	}
	e.m.mu.Lock()
	kept := len(e.m.sandboxes[id].learned)
	e.m.mu.Unlock()
	if kept > limit {
		t.Errorf("the manager remembers %d learned addresses, want at most %d", kept, limit)
	}
	e.reach(ns, last.String()+":80", "world:")
	e.refused(ns, first.String()+":80")

	// An address for some ports costs two elements a port and counts the
	// same; one that alone needs more than the limit is refused.
	if err := e.m.AllowLearned(ctx, id, learnIP, []PortRange{Port(80), Port(443)}, time.Minute); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		live, _ := count(setLearn)
		livePorts, _ := count(setLearnPorts)
		if live+livePorts <= limit && livePorts == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a ported address: %d + %d live elements, want 4 ported and at most %d in all", live, livePorts, limit)
		}
	}
	e.reach(ns, learnIP.String()+":443", "world:")
	err = e.m.AllowLearned(ctx, id, webA, []PortRange{{First: 1000, Last: 1000 + limit}}, time.Minute)
	if !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("an address needing more than the limit: got %v, want resource exhausted", err)
	}
}

func TestMergePortsAndElems(t *testing.T) {
	got := mergePorts([]PortRange{Port(443), {First: 80, Last: 81}, Port(82), {First: 440, Last: 450}, Port(65535)})
	want := []PortRange{{First: 80, Last: 82}, {First: 440, Last: 450}, Port(65535)}
	if !slices.Equal(got, want) {
		t.Errorf("mergePorts: %v, want %v", got, want)
	}
	if mergePorts(nil) != nil {
		t.Error("mergePorts(nil) is not nil")
	}
	if n := (learnedEntry{kall: true, kports: want}).elems(); n != 1+2*(3+11+1) {
		t.Errorf("elems: %d", n)
	}
}

// Refreshing a learned address gives the kernel's element the new timeout,
// and evicting one makes it unreachable, both on a kernel that updates an
// element's timeout when it is added again (eviction by a timeout of 1 ms)
// and, as on older kernels, by delete.
func TestLearnedRefreshAndEvict(t *testing.T) {
	for _, update := range []bool{true, false} {
		t.Run(fmt.Sprintf("updatesTimeout=%v", update), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.LearnedLimit = 2 })
			if update && !e.m.lay.updatesTimeout {
				t.Skip("this kernel does not update the timeout of an element added again")
			}
			e.m.lay.updatesTimeout = update
			ctx := context.Background()
			id := "sb-refresh"
			ns, _ := e.sandbox(id)
			e.setPolicy(id, Policy{})
			c, err := nftables.New(nftables.WithNetNSFd(int(e.topo.Host)))
			if err != nil {
				t.Fatal(err)
			}
			learnSet := e.m.lay.sharedSets[setLearn]
			live := func() map[netip.Addr]time.Duration {
				t.Helper()
				elems, err := c.GetSetElements(learnSet)
				if err != nil {
					t.Fatal(err)
				}
				out := map[netip.Addr]time.Duration{}
				for _, el := range elems {
					if el.Expires > 0 && bytes.Equal(el.Key[:16], ifnameKey(IfaceName(id))) {
						out[netip.AddrFrom4([4]byte(el.Key[16:20]))] = el.Timeout
					}
				}
				return out
			}
			for _, ttl := range []time.Duration{10 * time.Second, time.Minute} {
				if err := e.m.AllowLearned(ctx, id, learnIP, nil, ttl); err != nil {
					t.Fatal(err)
				}
			}
			if got := live(); len(got) != 1 || got[learnIP] != time.Minute {
				t.Fatalf("after a refresh to 1m: elements %v", got)
			}
			e.reach(ns, learnIP.String()+":80", "world:")
			for _, a := range []netip.Addr{webA, webB} {
				if err := e.m.AllowLearned(ctx, id, a, nil, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			// An evicted element may live on for a jiffy (its timeout is
			// the shortest the kernel has).
			for deadline := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
				got := live()
				if len(got) == 2 && got[learnIP] == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after learning two more with a limit of 2: elements %v, want webA and webB", got)
				}
			}
			e.refused(ns, learnIP.String()+":80")
			e.reach(ns, webA.String()+":80", "world:")
			e.reach(ns, webB.String()+":80", "world:")
		})
	}
}
