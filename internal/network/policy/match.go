package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// CIDRRule is an allow or deny CIDR with its ports (nil: every port).
type CIDRRule struct {
	Prefix netip.Prefix `json:"prefix"`
	Ports  []PortRange  `json:"ports,omitempty"`
}

// NormalizeName lower-cases a DNS name and drops one trailing dot, the form
// AllowsName compares.
func NormalizeName(name string) string {
	return strings.ToLower(strings.TrimSuffix(name, "."))
}

// AllowsName reports whether the policy lets a sandbox resolve name, on
// which ports the addresses it resolves to may then be reached (nil: every
// port), and why, for logs ("allowed by \"*.github.com\"", "denied by
// \"evil.example\"", "not allowed by any rule"). Allow rules that match
// add up their ports; deny rules that match take their ports away, and a
// deny rule without ports denies the name outright, so deny wins.
// @internet allows every name on its ports.
func (p Policy) AllowsName(name string) (allowed bool, ports []PortRange, why string) {
	if p.mode() == None {
		return false, nil, "network mode is none"
	}
	name = NormalizeName(name)
	var matched *Rule
	named := false // a domain rule names it exactly
	for _, r := range p.Allow {
		if r.Kind == KindPreset && r.Name == PresetInternet {
			if matched == nil {
				ports = r.Ports
			} else {
				ports = unionPorts(ports, r.Ports)
			}
			matched = &r
			continue
		}
		for _, er := range expand([]Rule{r}) {
			if !er.matchesName(name) {
				continue
			}
			if matched == nil {
				ports = slices.Clone(er.Ports)
			} else {
				ports = unionPorts(ports, er.Ports)
			}
			matched = &r
			named = named || er.Kind == KindDomain
		}
	}
	if matched == nil {
		return false, nil, "not allowed by any rule"
	}
	if !named && IsDoH(name) {
		return false, nil, "a public DNS-over-HTTPS resolver (the sandbox resolves through nook): allow it by name to reach it"
	}
	why = fmt.Sprintf("allowed by %q", matched.String())
	for _, r := range p.Deny {
		for _, er := range expand([]Rule{r}) {
			if !er.matchesName(name) {
				continue
			}
			ports = subtractPorts(ports, er.Ports)
			if ports != nil && len(ports) == 0 {
				return false, nil, fmt.Sprintf("denied by %q", r.String())
			}
			why += fmt.Sprintf(", ports limited by deny rule %q", r.String())
		}
	}
	return true, ports, why
}

// AllowsRaw reports whether a rule NAME[:PORTS]/tcp lets the sandbox reach
// name's addresses on port with any TCP protocol, not only TLS or HTTP
// (whose names the host checks). Deny rules apply as in AllowsName.
func (p Policy) AllowsRaw(name string, port uint16) bool {
	allowed, ports, _ := p.AllowsName(name)
	if !allowed || !PortsContain(ports, port) {
		return false
	}
	name = NormalizeName(name)
	for _, r := range expand(p.Allow) {
		if r.Raw && r.matchesName(name) && PortsContain(r.Ports, port) {
			return true
		}
	}
	return false
}

// Internet reports whether the policy allows every public address (the
// @internet preset), and on which ports (nil: every port).
func (p Policy) Internet() (allowed bool, ports []PortRange) {
	if p.mode() == None {
		return false, nil
	}
	for _, r := range p.Allow {
		if r.Kind != KindPreset || r.Name != PresetInternet {
			continue
		}
		if !allowed {
			allowed, ports = true, slices.Clone(r.Ports)
		} else {
			ports = unionPorts(ports, r.Ports)
		}
	}
	return allowed, ports
}

// CIDRs returns the policy's allow and deny CIDR rules with their ports, in
// the order they were written. Mode none has none.
func (p Policy) CIDRs() (allow, deny []CIDRRule) {
	if p.mode() == None {
		return nil, nil
	}
	pick := func(rules []Rule) []CIDRRule {
		var out []CIDRRule
		for _, r := range expand(rules) {
			if r.Kind == KindCIDR {
				out = append(out, CIDRRule{Prefix: r.Prefix, Ports: slices.Clone(r.Ports)})
			}
		}
		return out
	}
	return pick(p.Allow), pick(p.Deny)
}

// CheckResolved reports whether the resolver may hand a sandbox the address
// a, which an upstream server returned for a name the policy allows, and
// why not. It refuses what the sandbox could never reach or should not be
// steered to: non-IPv4 and always-blocked addresses, addresses a deny CIDR
// blocks on every port, and private addresses that no allow CIDR names (a
// public name resolving to a private address is DNS rebinding).
func (p Policy) CheckResolved(a netip.Addr) (ok bool, why string) {
	a = a.Unmap()
	if !a.Is4() {
		return false, fmt.Sprintf("%s is not an IPv4 address", a)
	}
	if b := rangeOf(alwaysBlocked, a); b != nil {
		return false, fmt.Sprintf("%s is always blocked (%s)", a, b.why)
	}
	allow, deny := p.CIDRs()
	for _, d := range deny {
		if d.Ports == nil && d.Prefix.Contains(a) {
			return false, fmt.Sprintf("%s is denied by %q", a, Rule{Kind: KindCIDR, Prefix: d.Prefix}.String())
		}
	}
	if b := rangeOf(private, a); b != nil {
		for _, c := range allow {
			if c.Prefix.Contains(a) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%s is a private address (%s) and no allow CIDR names it: possible DNS rebinding", a, b.why)
	}
	return true, ""
}

// HasDomain reports whether an allow rule names exactly name (a domain
// rule, directly or through a preset). Such a name is fixed by the user, so
// the resolver does not judge its shape.
func (p Policy) HasDomain(name string) bool {
	if p.mode() == None {
		return false
	}
	name = NormalizeName(name)
	for _, r := range expand(p.Allow) {
		if r.Kind == KindDomain && r.Name == name {
			return true
		}
	}
	return false
}
