package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"

	"github.com/google/nftables"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// AttachContainer attaches a container whose network namespace already
// exists, at netnsPath (e.g. /proc/PID/ns/net of its init process: the
// OCI runtime made the namespace, or a warm container runs in it). It does
// what SetupContainer does, without creating or bind-mounting a namespace:
// a veth pair whose host end (IfaceName) holds the gateway address and
// whose peer is eth0 inside with the sandbox address, loopback up, a
// default route via the gateway and IPv6 disabled inside. The namespace
// lives as long as the container; when it goes, the kernel removes the
// veth pair with it, and Teardown removes the rest.
//
// The sandbox starts deny-all. Calling it again for the same namespace
// adopts the interfaces and resets the rules to deny-all; for a different
// namespace it replaces the old attachment.
func (m *Manager) AttachContainer(ctx context.Context, id string, subnet netip.Prefix, netnsPath string) error {
	if err := m.checkArgs(ctx, id, subnet); err != nil {
		return err
	}
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return fmt.Errorf("open sandbox netns %s: %w", netnsPath, err)
	}
	defer ns.Close()
	unlock := m.lock(id)
	defer unlock()
	iface := IfaceName(id)
	gw, addr := Gateway(subnet), SandboxAddr(subnet)

	if link, err := m.nl.LinkByName(iface); err == nil {
		if link.Type() == "veth" && link.Attrs().Alias == aliasPrefix+id && m.hasAddr(link, gw) && peerIn(ns, link.Attrs().Index) {
			if err := m.nl.LinkSetUp(link); err != nil {
				return fmt.Errorf("set %s up: %w", iface, err)
			}
			if err := configureInside(ns, addr, gw, subnet, true); err != nil {
				return err
			}
			return m.finishSetup(id, iface, KindVeth, subnet, "", link.Attrs().Index, true)
		}
		if err := m.teardown(ctx, id); err != nil {
			return err
		}
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: iface, Flags: net.FlagUp},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(ns),
	}
	fail := func(err error) error {
		m.nl.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: iface}})
		return err
	}
	if err := m.nl.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return errdefs.Exists("sandbox netns %s already has an eth0", netnsPath)
		}
		return fmt.Errorf("create veth %s: %w", iface, err)
	}
	if err := m.nl.LinkSetAlias(veth, aliasPrefix+id); err != nil {
		return fail(fmt.Errorf("alias %s: %w", iface, err))
	}
	if err := m.nl.AddrAdd(veth, &netlink.Addr{IPNet: ipNet(gw, subnet)}); err != nil {
		return fail(fmt.Errorf("address %s: %w", iface, err))
	}
	if err := inNetns(ns, func() error {
		for _, s := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/default/disable_ipv6"} {
			if err := writeSysctl(s, "1"); err != nil && !errors.Is(err, unix.ENOENT) {
				return err
			}
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	if err := configureInside(ns, addr, gw, subnet, false); err != nil {
		return fail(err)
	}
	if err := m.finishSetup(id, iface, KindVeth, subnet, "", veth.Attrs().Index, false); err != nil {
		return fail(err)
	}
	if err := m.waitOperUp(ctx, ns, veth.Attrs().Index); err != nil {
		m.log.WarnContext(ctx, "network: sandbox link not up yet", "sandbox", id, "err", err)
	}
	return nil
}

// peerIn reports whether namespace ns holds eth0 as the peer of the host
// interface with index hostIndex.
func peerIn(ns netns.NsHandle, hostIndex int) bool {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return false
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	return err == nil && eth.Type() == "veth" && eth.Attrs().ParentIndex == hostIndex
}

// Adopt takes over a sandbox attachment that a previous Manager made and
// that still exists in the kernel (a daemon restart), without touching the
// inside of the sandbox: it checks the host interface, sets it up and
// resets its rules to deny-all, so the caller applies the policy next.
// It is NotFound if the interface is gone (the sandbox's namespace ended).
func (m *Manager) Adopt(ctx context.Context, id string, subnet netip.Prefix) (Kind, error) {
	if err := m.checkArgs(ctx, id, subnet); err != nil {
		return "", err
	}
	unlock := m.lock(id)
	defer unlock()
	a, err := m.checkAdopt(id, subnet)
	if err != nil {
		return "", err
	}
	return a.kind, m.finishSetup(id, a.iface, a.kind, subnet, "", a.ifindex, true)
}

// adoption is an attachment found in the kernel, ready to be adopted.
type adoption struct {
	id, iface string
	kind      Kind
	subnet    netip.Prefix
	ifindex   int
}

// checkAdopt checks that sandbox id's interface is there and its own,
// sets it up and sets its reverse-path filtering. The caller holds id's
// lock.
func (m *Manager) checkAdopt(id string, subnet netip.Prefix) (adoption, error) {
	iface := IfaceName(id)
	link, err := m.nl.LinkByName(iface)
	if err != nil {
		if errors.As(err, new(netlink.LinkNotFoundError)) {
			return adoption{}, errdefs.NotFound("sandbox %s has no network interface %s", id, iface)
		}
		return adoption{}, fmt.Errorf("look up %s: %w", iface, err)
	}
	if link.Attrs().Alias != aliasPrefix+id || !m.hasAddr(link, Gateway(subnet)) {
		return adoption{}, errdefs.NotFound("interface %s is not sandbox %s's attachment on %v", iface, id, subnet)
	}
	kind := KindTap
	if link.Type() == "veth" {
		kind = KindVeth
	}
	if err := m.nl.LinkSetUp(link); err != nil {
		return adoption{}, fmt.Errorf("set %s up: %w", iface, err)
	}
	if err := m.prepareSetup(iface); err != nil {
		return adoption{}, err
	}
	return adoption{id: id, iface: iface, kind: kind, subnet: subnet, ifindex: link.Attrs().Index}, nil
}

// AdoptAll is Adopt for many sandboxes (by ID, with their subnets) with
// one nftables commit for all of them: a commit that removes elements
// waits for an RCU grace period (milliseconds), and a daemon's start
// adopts every sandbox at once. It returns each sandbox's error, nil for
// those adopted.
func (m *Manager) AdoptAll(ctx context.Context, subnets map[string]netip.Prefix) map[string]error {
	errs := make(map[string]error, len(subnets))
	ids := make([]string, 0, len(subnets))
	for id, subnet := range subnets {
		if err := m.checkArgs(ctx, id, subnet); err != nil {
			errs[id] = err
			continue
		}
		ids = append(ids, id)
	}
	sort.Strings(ids) // locks in one order
	for _, id := range ids {
		defer m.lock(id)()
	}
	// Every sandbox's elements in one list per set: a message each per
	// set, not per sandbox (every message gets an answer, and too many
	// overflow the socket).
	var found []adoption
	var stale, base []map[string][]nftables.SetElement
	for _, id := range ids {
		a, err := m.checkAdopt(id, subnets[id])
		if err != nil {
			errs[id] = err
			continue
		}
		st, b := m.setupElements(id, a.iface, a.subnet)
		stale, base = append(stale, st), append(base, b)
		found = append(found, a)
	}
	if err := m.commit(
		func(c *nftables.Conn) error { return m.lay.removeAll(c, mergeElements(stale...)) },
		func(c *nftables.Conn) error { return m.lay.addAll(c, mergeElements(base...)) },
	); err != nil {
		// One at a time, so that one sandbox's trouble stays its own.
		m.log.WarnContext(ctx, "network: adopting sandboxes in one commit failed; one at a time", "err", err)
		for _, a := range found {
			errs[a.id] = m.finishSetup(a.id, a.iface, a.kind, a.subnet, "", a.ifindex, true)
		}
		return errs
	}
	for _, a := range found {
		m.recordSetup(a.id, a.iface, a.kind, a.subnet, "", a.ifindex, true)
		errs[a.id] = nil
	}
	return errs
}

// Subnets adds to taken the subnets of every sandbox the manager has
// attached or adopted, or is tearing down, but id's.
func (m *Manager) Subnets(id string, taken *Taken) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for sid, sb := range m.sandboxes {
		if sid != id && sb.subnet.IsValid() {
			taken.Add(sb.subnet)
		}
	}
	for sid, s := range m.tearing {
		if sid != id && s.IsValid() {
			taken.Add(s)
		}
	}
}

// Subnet returns the subnet of a sandbox this Manager attached or adopted.
func (m *Manager) Subnet(id string) (netip.Prefix, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if sb := m.sandboxes[id]; sb != nil {
		return sb.subnet, true
	}
	return netip.Prefix{}, false
}
