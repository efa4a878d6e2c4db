package daemon

import (
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/nookhq/nook/internal/network/nettest"
)

// The cache of the host's addresses is cleared only by an update that
// can change it: an IPv4 address outside the sandbox pool. A link
// coming up (its IPv6 link-local address, which every sandbox's
// host-side link gets) and a sandbox's gateway address are not, or each
// create would list every address on the host again. The updates are
// the kernel's own, from a network namespace the test makes.
func TestHostAddrUpdateIgnoresSandboxLinks(t *testing.T) {
	nettest.RequireRoot(t)
	ns, err := nettest.NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	updates := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{Namespace: &ns}); err != nil {
		t.Fatal(err)
	}

	pool := netip.MustParsePrefix("10.250.0.0/16")
	// A veth pair, as a sandbox's (with both ends up it has a carrier,
	// and IPv6 gives each end its link-local address).
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nktest0"}, PeerName: "nktest1"}
	if err := h.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"nktest1", "nktest0"} {
		l, err := h.LinkByName(name)
		if err == nil {
			err = h.LinkSetUp(l)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// next reads updates until one of want's address, checking each.
	next := func(want func(netip.Addr) bool, what string) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case u := <-updates:
				a, _ := netip.AddrFromSlice(u.LinkAddress.IP)
				a = a.Unmap()
				if got, want := hostAddrUpdate(u, pool), a.Is4() && !pool.Contains(a); got != want {
					t.Errorf("update of %s: hostAddrUpdate = %v, want %v", a, got, want)
				}
				if want(a) {
					return
				}
			case <-timeout:
				t.Fatalf("no update of %s within 10s", what)
			}
		}
	}
	if _, err := os.Stat("/proc/net/if_inet6"); err == nil {
		next(func(a netip.Addr) bool { return a.Is6() && a.IsLinkLocalUnicast() }, "an IPv6 link-local address")
	} else {
		t.Log("this kernel has no IPv6: no link-local addresses to ignore")
	}
	gateway := netip.MustParsePrefix("10.250.0.1/30")
	hostAddr := netip.MustParsePrefix("192.0.2.7/24")
	for _, p := range []netip.Prefix{gateway, hostAddr} {
		if err := h.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}}); err != nil {
			t.Fatal(err)
		}
	}
	next(func(a netip.Addr) bool { return a == hostAddr.Addr() }, hostAddr.Addr().String())
	if !hostAddrUpdate(netlink.AddrUpdate{LinkAddress: net.IPNet{IP: net.IPv4(192, 0, 2, 7)}}, pool) ||
		hostAddrUpdate(netlink.AddrUpdate{LinkAddress: net.IPNet{IP: net.IPv4(10, 250, 3, 1)}}, pool) {
		t.Error("a v4-in-v6 address is judged by its IPv4 address")
	}
}
