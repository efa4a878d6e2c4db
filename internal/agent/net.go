package agent

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
)

// configureNet points the sandbox's resolver at nook's DNS resolver for
// it, and in a vm gives eth0 its address and default route (IPv4 only:
// IPv6 is turned off, nook does not route it).
func configureNet(n *NetConfig) error {
	resolv := fmt.Sprintf("# written by nook: the resolver nook runs for this sandbox\nnameserver %s\noptions edns0\n", n.Gateway)
	os.Remove("/etc/resolv.conf") // may be a symlink into a read-only place
	if err := os.WriteFile("/etc/resolv.conf", []byte(resolv), 0o644); err != nil {
		return err
	}
	if !n.SetLink {
		return nil
	}
	prefix, err := netip.ParsePrefix(n.Address)
	if err != nil {
		return err
	}
	gw, err := netip.ParseAddr(n.Gateway)
	if err != nil {
		return err
	}
	for _, f := range []string{"/proc/sys/net/ipv6/conf/all/disable_ipv6", "/proc/sys/net/ipv6/conf/default/disable_ipv6"} {
		os.WriteFile(f, []byte("1"), 0)
	}
	link, err := netlink.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("eth0: %w", err)
	}
	addr, err := netlink.ParseAddr(prefix.String())
	if err != nil {
		return err
	}
	// Replace whatever a snapshot or an earlier configure left.
	if old, err := netlink.AddrList(link, netlink.FAMILY_V4); err == nil {
		for _, a := range old {
			if !a.Equal(*addr) {
				netlink.AddrDel(link, &a)
			}
		}
	}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("eth0 address: %w", err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("eth0 up: %w", err)
	}
	route := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw.AsSlice()}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}
