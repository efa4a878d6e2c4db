package policy

import (
	"errors"
	"fmt"
	"net/netip"
)

// blockedRange is an address range with the reason it is treated specially,
// worded for a user reading an error message or a log line.
type blockedRange struct {
	prefix netip.Prefix
	why    string
}

// alwaysBlocked are never reachable from a sandbox, whatever its policy.
// The ranges do not overlap each other (nftables interval sets refuse
// overlapping elements), so 255.255.255.255/32 is covered by 240.0.0.0/4.
var alwaysBlocked = []blockedRange{
	{netip.MustParsePrefix("0.0.0.0/8"), `"this network" addresses`},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback: the host itself"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local and cloud metadata"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved and broadcast"},
}

// private are not globally routable. They are blocked unless an allow CIDR
// names them explicitly. The documentation ranges (192.0.2.0/24,
// 198.51.100.0/24, 203.0.113.0/24) are deliberately not here: they route
// nowhere on a real network, so they count as public, which lets tests build
// a simulated "outside world" out of them.
var private = []blockedRange{
	{netip.MustParsePrefix("10.0.0.0/8"), "private network (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "carrier-grade NAT shared space (RFC 6598)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private network (RFC 1918)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private network (RFC 1918)"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking network (RFC 2544)"},
}

func prefixes(rs []blockedRange) []netip.Prefix {
	out := make([]netip.Prefix, len(rs))
	for i, r := range rs {
		out[i] = r.prefix
	}
	return out
}

// AlwaysBlocked returns the IPv4 ranges no sandbox may reach whatever its
// policy: 0.0.0.0/8, 127.0.0.0/8 (the host), 169.254.0.0/16 (link-local and
// cloud metadata), 224.0.0.0/4 (multicast) and 240.0.0.0/4 (reserved,
// including 255.255.255.255). The daemon adds its own host addresses and the
// sandbox address pool to these. The ranges do not overlap one another or
// Private. The caller owns the returned slice.
func AlwaysBlocked() []netip.Prefix { return prefixes(alwaysBlocked) }

// Private returns the IPv4 ranges that are not globally routable (RFC 1918,
// CGNAT 100.64.0.0/10, 192.0.0.0/24, benchmarking 198.18.0.0/15). They are
// blocked unless an allow CIDR rule names them. The caller owns the slice.
func Private() []netip.Prefix { return prefixes(private) }

// IsPublic reports whether a is an IPv4 address outside AlwaysBlocked and
// Private, i.e. one the @internet preset reaches. IPv6 addresses are never
// public to a sandbox (sandboxes are IPv4-only); IPv4-mapped IPv6 addresses
// are judged by their IPv4 form.
func IsPublic(a netip.Addr) bool {
	a = a.Unmap()
	if !a.Is4() {
		return false
	}
	return rangeOf(alwaysBlocked, a) == nil && rangeOf(private, a) == nil
}

func rangeOf(rs []blockedRange, a netip.Addr) *blockedRange {
	for i := range rs {
		if rs[i].prefix.Contains(a) {
			return &rs[i]
		}
	}
	return nil
}

func overlapping(rs []blockedRange, p netip.Prefix) *blockedRange {
	for i := range rs {
		if rs[i].prefix.Overlaps(p) {
			return &rs[i]
		}
	}
	return nil
}

// checkAllowCIDR refuses an allow CIDR that reaches into an always-blocked
// range. raw is the rule as the user wrote it.
func checkAllowCIDR(p netip.Prefix) error {
	if p.Bits() == 0 {
		return fmt.Errorf("%s would include the host and metadata addresses, which are always blocked; use @internet for every public address and name private ranges with their own CIDR (e.g. 10.0.0.0/8)", p)
	}
	if b := overlapping(alwaysBlocked, p); b != nil {
		return fmt.Errorf("%s overlaps %s, which is always blocked (%s)", p, b.prefix, b.why)
	}
	return nil
}

// CheckHostAddrs refuses allow CIDR rules that would reach the host: an
// always-blocked range (loopback, link-local, ...) or any of host, which the
// daemon fills with every address of the host and the sandbox address pool
// (other sandboxes are never reachable either). IPv6 entries in host are
// ignored. All offending rules are reported; the error wraps
// errdefs.ErrInvalidArgument.
func (p Policy) CheckHostAddrs(host []netip.Prefix) error {
	var errs []error
	for _, r := range p.Allow {
		if r.Kind != KindCIDR {
			continue
		}
		if err := checkAllowCIDR(r.Prefix); err != nil {
			errs = append(errs, fmt.Errorf("allow rule %q: %w", r, err))
			continue
		}
		for _, h := range host {
			h = netip.PrefixFrom(h.Addr().Unmap(), h.Bits()-unmapBits(h))
			if !h.Addr().Is4() || !h.Overlaps(r.Prefix) {
				continue
			}
			what := "the host address " + h.Addr().String()
			if h.Bits() < 32 {
				what = "the host network " + h.Masked().String()
			}
			errs = append(errs, fmt.Errorf("allow rule %q: %s overlaps %s; the host and other sandboxes are always blocked, so name a range that leaves them out", r, r.Prefix, what))
			break
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return invalid(errors.Join(errs...))
}

// unmapBits is how many prefix bits an IPv4-mapped IPv6 prefix loses when
// unmapped (96), or 0.
func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return 96
	}
	return 0
}
