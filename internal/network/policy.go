package network

import (
	"container/list"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
)

// PortRange is an inclusive range of TCP and UDP ports. A single port has
// First == Last.
type PortRange struct {
	First, Last uint16
}

// Port returns the range holding the single port p.
func Port(p uint16) PortRange { return PortRange{First: p, Last: p} }

// Rule names destinations by IPv4 prefix and, optionally, ports. A rule
// without ports matches every protocol and port; a rule with ports matches
// TCP and UDP to those ports only.
type Rule struct {
	Prefix netip.Prefix
	Ports  []PortRange
}

// Policy is a sandbox's static egress policy. SetPolicy replaces the whole
// policy at once.
type Policy struct {
	// Allow lists what the sandbox may reach. An allow rule may name a
	// private range (10/8, 172.16/12, 192.168/16, 100.64/10), which is the
	// only way to reach one. It cannot open the always-blocked ranges
	// (0/8, 127/8, 169.254/16, 224/4, 240/4) or the sandbox pool.
	Allow []Rule
	// Deny lists destinations that stay refused whatever Allow, Public or a
	// DNS-learned address says.
	Deny []Rule
	// Public allows every public address: everything except the
	// always-blocked ranges, the pool and private ranges not named in Allow.
	Public bool
	// Intercept sends every new TCP connection to ports 80 and 443 that
	// the policy does not refuse to the sandbox's egress proxy, whatever
	// Allow or Public says (the proxy terminates TLS for hosts that
	// secrets are bound to).
	Intercept bool
	// ResetLearned also drops every DNS-learned address in the same
	// transaction, for a policy change that removes domains.
	ResetLearned bool
	// KeepFlows leaves existing connections alone: the caller judges
	// them later with CutFlows, once for many sandboxes (a restart that
	// restores every sandbox's policy reads the conntrack table once,
	// not once per sandbox).
	KeepFlows bool
}

// alwaysBlocked are refused whatever the policy says.
var alwaysBlocked = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// privateRanges are refused unless an allow rule names them.
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
}

// dnsPorts are refused towards any address but the sandbox's own gateway:
// DNS (53) and DNS over TLS or QUIC (853), TCP and UDP.
var dnsPorts = []uint16{53, 853}

const (
	protoTCP = 6
	protoUDP = 17
)

// ivl is an inclusive range of IPv4 addresses as integers.
type ivl struct{ lo, hi uint32 }

func prefixIvl(p netip.Prefix) ivl { return ivl{u32(p.Masked().Addr()), u32(lastAddr(p))} }

// box is an address range crossed with a port range; compiled port rules
// are a set of disjoint boxes, which is what a concatenated interval set
// in the kernel accepts.
type box struct {
	addr  ivl
	ports PortRange
}

// compiled is a Policy reduced to disjoint kernel set elements, plus what
// the userspace verdict needs.
type compiled struct {
	allowAny  []ivl
	allowPort []box
	denyAny   []ivl
	denyPort  []box
	public    bool
	intercept bool
}

// validateRules checks rules and, for allow rules, refuses a rule that only
// names always-blocked addresses or the pool.
func validateRules(kind string, rules []Rule, pool netip.Prefix) error {
	for _, r := range rules {
		if !r.Prefix.IsValid() || !r.Prefix.Addr().Is4() {
			return errdefs.Invalid("%s rule %v: want an IPv4 prefix", kind, r.Prefix)
		}
		if r.Prefix != r.Prefix.Masked() {
			return errdefs.Invalid("%s rule %v: host bits set (did you mean %v?)", kind, r.Prefix, r.Prefix.Masked())
		}
		for _, pr := range r.Ports {
			if pr.First == 0 || pr.Last < pr.First {
				return errdefs.Invalid("%s rule %v: bad port range %d-%d", kind, r.Prefix, pr.First, pr.Last)
			}
		}
		if kind != "allow" {
			continue
		}
		for _, b := range append([]netip.Prefix{pool}, alwaysBlocked...) {
			if b.Bits() <= r.Prefix.Bits() && b.Contains(r.Prefix.Addr()) {
				return errdefs.Invalid("allow rule %v: %v is always blocked", r.Prefix, b)
			}
		}
	}
	return nil
}

func compilePolicy(p Policy, pool netip.Prefix) (compiled, error) {
	if err := validateRules("allow", p.Allow, pool); err != nil {
		return compiled{}, err
	}
	if err := validateRules("deny", p.Deny, pool); err != nil {
		return compiled{}, err
	}
	var c compiled
	c.allowAny, c.allowPort = compileRules(p.Allow)
	c.denyAny, c.denyPort = compileRules(p.Deny)
	c.public = p.Public
	c.intercept = p.Intercept
	return c, nil
}

func compileRules(rules []Rule) ([]ivl, []box) {
	var anyPort []ivl
	var withPorts []box
	for _, r := range rules {
		a := prefixIvl(r.Prefix)
		if len(r.Ports) == 0 {
			anyPort = append(anyPort, a)
			continue
		}
		for _, pr := range r.Ports {
			withPorts = append(withPorts, box{addr: a, ports: pr})
		}
	}
	return mergeIvls(anyPort), disjointBoxes(withPorts)
}

// mergeIvls sorts ranges and merges overlapping and adjacent ones.
func mergeIvls(in []ivl) []ivl {
	if len(in) == 0 {
		return nil
	}
	s := slices.Clone(in)
	slices.SortFunc(s, func(a, b ivl) int {
		switch {
		case a.lo < b.lo:
			return -1
		case a.lo > b.lo:
			return 1
		}
		return 0
	})
	out := []ivl{s[0]}
	for _, v := range s[1:] {
		last := &out[len(out)-1]
		if last.hi == ^uint32(0) || v.lo <= last.hi+1 {
			last.hi = max(last.hi, v.hi)
			continue
		}
		out = append(out, v)
	}
	return out
}

// disjointBoxes turns overlapping (addresses, ports) boxes into disjoint
// ones covering the same union: the port axis is cut at every range edge,
// and within each piece the address ranges that cover it are merged.
func disjointBoxes(in []box) []box {
	if len(in) == 0 {
		return nil
	}
	// Cut points: every First and every Last+1, as uint32 to hold 65536.
	var cuts []uint32
	for _, b := range in {
		cuts = append(cuts, uint32(b.ports.First), uint32(b.ports.Last)+1)
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	type piece struct {
		ports PortRange
		addrs []ivl
	}
	var pieces []piece
	for i := 0; i+1 < len(cuts); i++ {
		pr := PortRange{First: uint16(cuts[i]), Last: uint16(cuts[i+1] - 1)}
		var addrs []ivl
		for _, b := range in {
			if b.ports.First <= pr.First && pr.Last <= b.ports.Last {
				addrs = append(addrs, b.addr)
			}
		}
		if len(addrs) == 0 {
			continue
		}
		addrs = mergeIvls(addrs)
		// Join with the previous piece when it is adjacent and identical.
		if n := len(pieces); n > 0 && uint32(pieces[n-1].ports.Last)+1 == uint32(pr.First) && slices.Equal(pieces[n-1].addrs, addrs) {
			pieces[n-1].ports.Last = pr.Last
			continue
		}
		pieces = append(pieces, piece{ports: pr, addrs: addrs})
	}
	var out []box
	for _, p := range pieces {
		for _, a := range p.addrs {
			out = append(out, box{addr: a, ports: p.ports})
		}
	}
	return out
}

func inIvls(s []ivl, v uint32) bool {
	for _, i := range s {
		if i.lo <= v && v <= i.hi {
			return true
		}
	}
	return false
}

func inBoxes(s []box, v uint32, port uint16) bool {
	for _, b := range s {
		if b.addr.lo <= v && v <= b.addr.hi && b.ports.First <= port && port <= b.ports.Last {
			return true
		}
	}
	return false
}

func inPrefixes(s []netip.Prefix, a netip.Addr) bool {
	for _, p := range s {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// learnedEntry is a DNS-learned address as the manager remembers it, to
// judge existing connections when the policy changes and to bound what
// the kernel holds.
type learnedEntry struct {
	ports   []PortRange // nil: every port
	expires time.Time
	lru     *list.Element // in sandbox.learnedLRU
	// What the kernel's sets hold for the address: an element in the
	// learn set (kall), and TCP and UDP elements in the learnp set for
	// every port of kports. Both may be held at once.
	kall   bool
	kports []PortRange
}

// elems is the number of kernel set elements the entry holds.
func (e learnedEntry) elems() int {
	n := 2 * countPorts(e.kports)
	if e.kall {
		n++
	}
	return n
}

// mergePorts sorts port ranges and merges overlapping and adjacent ones;
// nil stays nil.
func mergePorts(ps []PortRange) []PortRange {
	if len(ps) == 0 {
		return nil
	}
	s := slices.Clone(ps)
	slices.SortFunc(s, func(a, b PortRange) int { return int(a.First) - int(b.First) })
	out := []PortRange{s[0]}
	for _, p := range s[1:] {
		last := &out[len(out)-1]
		if uint32(p.First) <= uint32(last.Last)+1 {
			last.Last = max(last.Last, p.Last)
			continue
		}
		out = append(out, p)
	}
	return out
}

func countPorts(ps []PortRange) int {
	n := 0
	for _, p := range ps {
		n += int(p.Last-p.First) + 1
	}
	return n
}

// Deny reasons, as reported in Event.Reason and in the kernel log prefix.
const (
	ReasonSandbox = "sandbox"  // another sandbox (the address pool)
	ReasonBlocked = "blocked"  // always blocked: loopback, link-local and metadata, multicast, reserved
	ReasonDNS     = "dns"      // DNS or DNS over TLS to anything but the sandbox's resolver
	ReasonDenied  = "denied"   // a deny rule
	ReasonPrivate = "private"  // a private range no allow rule names
	ReasonPolicy  = "policy"   // not allowed by the policy
	ReasonHost    = "host"     // the host itself
	ReasonInbound = "inbound"  // a new connection into a sandbox from outside
	ReasonNotIPv4 = "not-ipv4" // IPv6 or another non-IPv4 protocol
	// ReasonConntrack: the sandbox already has Config.ConntrackLimit
	// connections tracked; a new one must wait for one to end.
	ReasonConntrack = "conntrack-limit"
	// ReasonQUIC: UDP 443 to a domain rule's address (QUIC hides the
	// name the egress proxy checks on TCP).
	ReasonQUIC     = "quic"
	reasonAccepted = ""
)

// verdict mirrors the kernel's per-sandbox forward chain in userspace. It
// returns the deny reason, or "" when the packet is accepted. proto is the
// IP protocol number; port is only used for TCP and UDP.
func verdict(c *compiled, pool netip.Prefix, learned map[netip.Addr]learnedEntry, now time.Time, dst netip.Addr, proto uint8, port uint16) string {
	if !dst.Is4() {
		return ReasonNotIPv4
	}
	v := u32(dst)
	l4 := proto == protoTCP || proto == protoUDP
	switch {
	case pool.Contains(dst):
		return ReasonSandbox
	case inPrefixes(alwaysBlocked, dst):
		return ReasonBlocked
	case l4 && slices.Contains(dnsPorts, port):
		return ReasonDNS
	case inIvls(c.denyAny, v), l4 && inBoxes(c.denyPort, v, port):
		return ReasonDenied
	case inIvls(c.allowAny, v), l4 && inBoxes(c.allowPort, v, port):
		return reasonAccepted
	case inPrefixes(privateRanges, dst):
		return ReasonPrivate
	}
	if c.public {
		return reasonAccepted
	}
	if e, ok := learned[dst]; ok && now.Before(e.expires) {
		if proto == protoUDP && port == 443 {
			return ReasonQUIC
		}
		if len(e.ports) == 0 {
			return reasonAccepted
		}
		for _, pr := range e.ports {
			if l4 && pr.First <= port && port <= pr.Last {
				return reasonAccepted
			}
		}
	}
	if c.public {
		return reasonAccepted
	}
	return ReasonPolicy
}

func (r PortRange) String() string {
	if r.First == r.Last {
		return fmt.Sprint(r.First)
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}
