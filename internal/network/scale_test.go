package network

import (
	"bytes"
	"context"
	"fmt"
	"github.com/nookhq/nook/internal/network/nettest"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

type capWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	t   testing.TB
}

func (w *capWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.buf.Write(p)
	w.mu.Unlock()
	return len(p), nil
}

// Many sandboxes with policies and learned addresses: does the one-commit
// adoption commit, or fall back (ENOBUFS on the acks)?
func TestAdoptAllManyInOneCommit(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const n = 60
	simple := false
	subnets := map[string]netip.Prefix{}
	var taken []netip.Prefix
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("vm-%03d", i)
		sub, err := e.m.Pool().Allocate(taken)
		if err != nil {
			t.Fatal(err)
		}
		taken = append(taken, sub)
		if _, err := e.m.SetupTap(ctx, id, sub); err != nil {
			t.Fatal(err)
		}
		subnets[id] = sub
		p := Policy{
			Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32)}, {Prefix: netip.MustParsePrefix("198.18.0.0/15"), Ports: []PortRange{{First: 443, Last: 443}}}},
			Deny:  []Rule{{Prefix: netip.MustParsePrefix("203.0.113.128/25")}, {Prefix: netip.MustParsePrefix("8.8.8.0/24"), Ports: []PortRange{{First: 25, Last: 25}}}},
		}
		if simple {
			p = Policy{Public: true}
		}
		if err := e.m.SetPolicy(ctx, id, p); err != nil {
			t.Fatal(err)
		}
		if simple {
			continue
		}
		if err := e.m.AllowLearned(ctx, id, learnIP, nil, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := e.m.AllowLearned(ctx, id, webB, []PortRange{{First: 443, Last: 443}}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	w := &capWriter{t: t}
	m2, err := New(ctx, Config{NetnsDir: e.dir, HostNetns: e.topo.Host, Log: slog.New(slog.NewTextHandler(w, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	start := time.Now()
	errs := m2.AdoptAll(ctx, subnets)
	t.Logf("AdoptAll of %d took %v", n, time.Since(start))
	for id, err := range errs {
		if err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
	if strings.Contains(w.buf.String(), "one commit failed") {
		t.Errorf("AdoptAll fell back to one at a time: %s", w.buf.String())
	}
	// Nothing of the old policies must remain.
	c := m2.nft()
	for _, name := range []string{setAllow, setAllowPorts, setDeny, setDenyPorts, setLearn, setLearnPorts} {
		if k := len(liveElements(t, c, m2.lay.sharedSets[name], "")); k != 0 {
			t.Errorf("set %s: %d live elements after adoption", name, k)
		}
	}
	for id := range subnets {
		if err := m2.Teardown(ctx, id); err != nil {
			t.Error(err)
		}
	}
}

// Evicting many learned addresses in one AllowLearned: a batch with a
// message per victim. Does the kernel commit while Flush reports an error,
// leaving the manager's records apart from the kernel's?
func TestLearnedEvictMany(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.LearnedLimit = 700 })
	ctx := context.Background()
	_, sub := e.sandbox("sb-evict")
	_ = sub
	e.setPolicy("sb-evict", Policy{})
	for i := 0; i < 700; i++ {
		a := netip.AddrFrom4([4]byte{198, 51, byte(100 + i/250), byte(1 + i%250)})
		if err := e.m.AllowLearned(ctx, "sb-evict", a, nil, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	big := netip.MustParseAddr("203.0.113.99")
	err := e.m.AllowLearned(ctx, "sb-evict", big, []PortRange{{First: 1000, Last: 1349}}, time.Minute)
	c := e.m.nft()
	inKernel := len(liveElements(t, c, e.m.lay.sharedSets[setLearnPorts], IfaceName("sb-evict")))
	sb, _ := e.m.get("sb-evict")
	e.m.mu.Lock()
	_, recorded := sb.learned[big]
	n := len(sb.learned)
	e.m.mu.Unlock()
	t.Logf("AllowLearned err=%v; learnp elements in kernel: %d; recorded: %v; records: %d (all-port elements live: %d)",
		err, inKernel, recorded, n, len(liveElements(t, c, e.m.lay.sharedSets[setLearn], IfaceName("sb-evict"))))
	if err != nil || !recorded || inKernel != 700 {
		t.Errorf("AllowLearned of a 350-port address evicting 700: %v, recorded %v, %d elements in the kernel, want 700", err, recorded, inKernel)
	}
}

func internetOnPorts(ports ...PortRange) []Rule {
	var out []Rule
	for _, p := range []string{"1.0.0.0/8", "2.0.0.0/7", "4.0.0.0/6", "8.0.0.0/7", "11.0.0.0/8", "12.0.0.0/6", "16.0.0.0/4", "32.0.0.0/3", "64.0.0.0/3", "96.0.0.0/6", "100.0.0.0/10", "100.128.0.0/9", "101.0.0.0/8", "102.0.0.0/7", "104.0.0.0/5", "112.0.0.0/5", "120.0.0.0/6", "124.0.0.0/7", "126.0.0.0/8", "128.0.0.0/3", "160.0.0.0/5", "168.0.0.0/8", "169.0.0.0/9", "169.128.0.0/10", "169.192.0.0/11", "169.224.0.0/12", "169.240.0.0/13", "169.248.0.0/14", "169.252.0.0/15", "169.255.0.0/16", "170.0.0.0/7", "172.0.0.0/12", "172.32.0.0/11", "172.64.0.0/10", "172.128.0.0/9", "173.0.0.0/8", "174.0.0.0/7", "176.0.0.0/4", "192.0.0.0/9", "192.128.0.0/11", "192.160.0.0/13", "192.169.0.0/16", "192.170.0.0/15", "192.172.0.0/14", "192.176.0.0/12", "192.192.0.0/10", "193.0.0.0/8", "194.0.0.0/7", "196.0.0.0/6", "200.0.0.0/5", "208.0.0.0/4"} {
		out = append(out, Rule{Prefix: netip.MustParsePrefix(p), Ports: ports})
	}
	return out
}

// Realistic sequences; checkClean at the end asserts nothing is left.
func TestPolicySequencesLeaveNothing(t *testing.T) {
	for _, upd := range []bool{true, false} {
		t.Run(fmt.Sprintf("updatesTimeout=%v", upd), func(t *testing.T) {
			e := newEnv(t)
			e.m.lay.updatesTimeout = upd
			ctx := context.Background()
			ns, sub := e.sandbox("sb-seq")
			pA := Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("203.0.113.0/28")}, {Prefix: netip.MustParsePrefix("198.51.100.0/24"), Ports: []PortRange{{80, 80}, {443, 443}}}},
				Deny: []Rule{{Prefix: netip.MustParsePrefix("203.0.113.8/30")}}}
			pB := Policy{Allow: []Rule{{Prefix: netip.MustParsePrefix("203.0.113.0/27")}, {Prefix: netip.MustParsePrefix("198.51.100.0/25"), Ports: []PortRange{{80, 443}}}},
				Deny: []Rule{{Prefix: netip.MustParsePrefix("203.0.113.8/29"), Ports: []PortRange{{80, 80}}}}}
			pI := Policy{Allow: internetOnPorts(PortRange{80, 80}, PortRange{443, 443}, PortRange{8000, 8999})}
			for i, p := range []Policy{pA, pA, pB, pA, pI, pI, pB, {Public: true}, pI} {
				if err := e.m.SetPolicy(ctx, "sb-seq", p); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			e.reach(ns, webA.String()+":80", "world:")
			e.refused(ns, webA.String()+":7")
			// learned, some expire
			if err := e.m.AllowLearned(ctx, "sb-seq", learnIP, nil, 5*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if err := e.m.AllowLearned(ctx, "sb-seq", webB, []PortRange{{7, 7}}, 5*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			waitLearnedExpired(t, e.m, IfaceName("sb-seq"), learnIP, webB)
			if err := e.m.SetPolicy(ctx, "sb-seq", Policy{Allow: pA.Allow, ResetLearned: true}); err != nil {
				t.Fatalf("reset learned after expiry: %v", err)
			}
			if err := e.m.AllowLearned(ctx, "sb-seq", learnIP, nil, 5*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if err := e.m.AllowLearned(ctx, "sb-seq", webB, []PortRange{{7, 8}}, time.Minute); err != nil {
				t.Fatal(err)
			}
			waitLearnedExpired(t, e.m, IfaceName("sb-seq"), learnIP)
			// re-setup of a known sandbox (adopt path)
			if _, err := e.m.SetupContainer(ctx, "sb-seq", sub); err != nil {
				t.Fatalf("re-setup: %v", err)
			}
			e.refused(ns, webA.String()+":80")
			if err := e.m.SetPolicy(ctx, "sb-seq", pI); err != nil {
				t.Fatal(err)
			}
			if err := e.m.AllowLearned(ctx, "sb-seq", learnIP, nil, 5*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			// restart with state, adopt, then policy, then teardown
			m2, err := New(ctx, Config{NetnsDir: e.dir, HostNetns: e.topo.Host, Log: e.m.log})
			if err != nil {
				t.Fatal(err)
			}
			defer m2.Close()
			m2.lay.updatesTimeout = upd
			waitLearnedExpired(t, m2, IfaceName("sb-seq"), learnIP) // expired after m2 read it
			if errs := m2.AdoptAll(ctx, map[string]netip.Prefix{"sb-seq": sub}); errs["sb-seq"] != nil {
				t.Fatal(errs["sb-seq"])
			}
			if err := m2.SetPolicy(ctx, "sb-seq", pB); err != nil {
				t.Fatal(err)
			}
			if err := m2.SetPolicy(ctx, "sb-seq", pB); err != nil {
				t.Fatal(err)
			}
			if err := m2.AllowLearned(ctx, "sb-seq", learnIP, []PortRange{{80, 80}}, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := m2.Teardown(ctx, "sb-seq"); err != nil {
				t.Fatal(err)
			}
			if err := m2.Teardown(ctx, "sb-seq"); err != nil {
				t.Fatal(err)
			}
			c := m2.nft()
			for _, name := range policySets {
				if k := len(liveElements(t, c, m2.lay.sharedSets[name], "")); k != 0 {
					t.Errorf("set %s: %d elements left", name, k)
				}
			}
		})
	}
}

// Shared sets: one sandbox's allowances must not serve another, and the
// nftables anti-spoof rule alone (rp_filter off) drops a forged source.
func TestEscapeSharedSetsCrossSandbox(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	nsA, _ := e.sandbox("sb-x-a")
	nsB, subB := e.sandbox("sb-x-b")
	e.setPolicy("sb-x-a", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webA, 32), Ports: []PortRange{{80, 80}}}}})
	e.setPolicy("sb-x-b", Policy{Allow: []Rule{{Prefix: netip.PrefixFrom(webB, 32)}}, Deny: []Rule{{Prefix: netip.PrefixFrom(webA, 32), Ports: []PortRange{{443, 443}}}}})
	if err := e.m.AllowLearned(ctx, "sb-x-a", learnIP, nil, time.Minute); err != nil {
		t.Fatal(err)
	}
	e.reach(nsA, webA.String()+":80", "world:")
	e.refused(nsA, webA.String()+":443")
	e.refused(nsA, webB.String()+":80")
	e.reach(nsB, webB.String()+":80", "world:")
	e.refused(nsB, webA.String()+":80")
	e.refused(nsB, learnIP.String()+":80")
	e.reach(nsA, learnIP.String()+":80", "world:")

	// rp_filter off on A's host side: only the nft rule stands.
	for _, k := range []string{"net/ipv4/conf/" + IfaceName("sb-x-a") + "/rp_filter", "net/ipv4/conf/all/rp_filter"} {
		if err := nettest.Do(e.topo.Host, func() error { return writeSysctl(k, "0") }); err != nil {
			t.Fatal(err)
		}
	}
	dst := netip.AddrPortFrom(webA, 80)
	got := spoofOnlyOwnGetsOut(t, e, nsA, dst, SandboxAddr(subB), netip.MustParseAddr("198.51.100.77"))
	// The control: without the rule, a spoofed datagram gets out (the
	// test can fail).
	{
		out, _ := e.nftCmd("-a", "list", "chain", "inet", tableName, chainSandbox)
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "@src") {
				h := l[strings.LastIndex(l, " ")+1:]
				if o, err := e.nftCmd("delete", "rule", "inet", tableName, chainSandbox, "handle", h); err != nil {
					t.Fatal(o, err)
				}
				t.Logf("deleted %s", l)
			}
		}
		sendUDPFrom(t, nsA, netip.MustParseAddr("198.51.100.78"), dst, "as-outsider-2")
		select {
		case p := <-got:
			if p != "as-outsider-2" {
				t.Fatalf("control: got %q", p)
			}
		case <-time.After(3 * time.Second):
			t.Fatal("control: without the @src rule a spoofed datagram did not get out either: the test proves nothing")
		}
	}
}

// A sandbox at the default learned limit (4096 elements): can its
// elements still be removed (teardown, ResetLearned, adoption)?
func TestFullLearnedRemoval(t *testing.T) {
	for _, tc := range []struct {
		upd   bool
		ports bool
	}{{true, false}, {false, false}, {true, true}} {
		t.Run(fmt.Sprintf("updatesTimeout=%v,ports=%v", tc.upd, tc.ports), func(t *testing.T) {
			e := newEnv(t)
			e.m.lay.updatesTimeout = tc.upd
			ctx := context.Background()
			id := "sb-full"
			_, sub := e.sandbox(id)
			e.setPolicy(id, Policy{})
			fill := func(m *Manager) {
				for i := 0; i < 4096; i++ {
					a := netip.AddrFrom4([4]byte{198, 51, byte(96 + i/256), byte(i % 256)})
					var ports []PortRange
					n := 4096
					if tc.ports {
						ports = []PortRange{{443, 443}}
						n = 2048
					}
					if i >= n {
						break
					}
					if err := m.AllowLearned(ctx, id, a, ports, time.Hour); err != nil {
						t.Fatalf("learn %d: %v", i, err)
					}
				}
			}
			fill(e.m)
			if err := e.m.SetPolicy(ctx, id, Policy{ResetLearned: true}); err != nil {
				t.Errorf("ResetLearned at the limit: %v", err)
			}
			fill(e.m)
			m2, err := New(ctx, Config{NetnsDir: e.dir, HostNetns: e.topo.Host, Log: e.m.log})
			if err != nil {
				t.Fatal(err)
			}
			defer m2.Close()
			m2.lay.updatesTimeout = tc.upd
			if errs := m2.AdoptAll(ctx, map[string]netip.Prefix{id: sub}); errs[id] != nil {
				t.Errorf("AdoptAll at the limit: %v", errs[id])
			}
			if _, err := m2.SetupContainer(ctx, id, sub); err != nil {
				t.Errorf("re-setup: %v", err)
			}
			fill(m2)
			if err := m2.Teardown(ctx, id); err != nil {
				t.Errorf("Teardown at the limit: %v", err)
			}
			c := m2.nft()
			for _, name := range policySets {
				if k := len(liveElements(t, c, m2.lay.sharedSets[name], "")); k != 0 {
					t.Errorf("set %s: %d elements left after teardown", name, k)
				}
			}
		})
	}
}

// waitLearnedExpired waits until the kernel holds no live learned element
// of iface for any of addrs: their timeouts passed.
func waitLearnedExpired(t *testing.T, m *Manager, iface string, addrs ...netip.Addr) {
	t.Helper()
	c := m.nft()
	live := func() bool {
		for _, name := range []string{setLearn, setLearnPorts} {
			for _, el := range liveElements(t, c, m.lay.sharedSets[name], iface) {
				for _, a := range addrs {
					if bytes.Equal(el.Key[16:20], addrKey(a)) {
						return true
					}
				}
			}
		}
		return false
	}
	for deadline := time.Now().Add(5 * time.Second); live(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("learned elements of %v still live after 5s", addrs)
		}
	}
}
