package egress

import (
	"fmt"
	"net/netip"

	"github.com/nookhq/nook/internal/network/policy"
)

// PolicyChecker checks connections against a sandbox's policy, read at
// each connection (a change applies to the next one), and the names its
// resolver answered it.
type PolicyChecker struct {
	// Policy returns the sandbox's policy (false: it has none any more).
	Policy func() (policy.Policy, bool)
	Names  *Names
}

var _ Checker = (*PolicyChecker)(nil)

// Name implements Checker.
func (c *PolicyChecker) Name(name string, dst netip.AddrPort) (bool, string) {
	p, ok := c.Policy()
	if !ok {
		return false, "the sandbox has no network policy"
	}
	allowed, ports, why := p.AllowsName(name)
	if !allowed {
		return false, fmt.Sprintf("%s is %s", name, why)
	}
	if !policy.PortsContain(ports, dst.Port()) {
		return false, fmt.Sprintf("%s is not allowed on port %d", name, dst.Port())
	}
	if !c.Names.Resolved(name, dst.Addr()) {
		return false, fmt.Sprintf("%s did not resolve to %s through the sandbox's resolver", name, dst.Addr())
	}
	return true, ""
}

// Raw implements Checker.
func (c *PolicyChecker) Raw(dst netip.AddrPort) (string, bool) {
	p, ok := c.Policy()
	if !ok {
		return "", false
	}
	for _, name := range c.Names.For(dst.Addr()) {
		if p.AllowsRaw(name, dst.Port()) {
			return name, true
		}
	}
	return "", false
}

// Still implements Checker.
func (c *PolicyChecker) Still(name string, dst netip.AddrPort, raw bool) bool {
	p, ok := c.Policy()
	if !ok {
		return false
	}
	if raw {
		return p.AllowsRaw(name, dst.Port())
	}
	allowed, ports, _ := p.AllowsName(name)
	return allowed && policy.PortsContain(ports, dst.Port())
}

// Open implements Checker: a CIDR rule or @internet allows dst, and no
// deny rule refuses it.
func (c *PolicyChecker) Open(dst netip.AddrPort) bool {
	p, ok := c.Policy()
	if !ok {
		return false
	}
	a, port := dst.Addr(), dst.Port()
	// In the kernel's order: always blocked, then deny, then allow
	// (private ranges only by an allow rule), then @internet.
	for _, pf := range policy.AlwaysBlocked() {
		if pf.Contains(a) {
			return false
		}
	}
	allow, deny := p.CIDRs()
	in := func(r policy.CIDRRule) bool {
		return r.Prefix.Contains(a) && (r.Ports == nil || policy.PortsContain(r.Ports, port))
	}
	for _, r := range deny {
		if in(r) {
			return false
		}
	}
	for _, r := range allow {
		if in(r) {
			return true
		}
	}
	for _, pf := range policy.Private() {
		if pf.Contains(a) {
			return false
		}
	}
	internet, ports := p.Internet()
	if internet && port == 443 && !p.NamesDoH() {
		for _, d := range policy.DoHAddrs() {
			if d.Contains(a) {
				return false // as the kernel's deny set says (daemon.kernelPolicy)
			}
		}
	}
	return internet && (ports == nil || policy.PortsContain(ports, port))
}

// Resolved implements Checker.
func (c *PolicyChecker) Resolved(name string, a netip.Addr) bool {
	return c.Names.Resolved(name, a)
}

// OpenName implements Checker.
func (c *PolicyChecker) OpenName(name string) (bool, string) {
	p, ok := c.Policy()
	if !ok {
		return false, "not allowed: the sandbox has no network policy"
	}
	if policy.IsDoH(name) && !p.NamesDoH() {
		return false, "a public DNS-over-HTTPS resolver (the sandbox resolves through nook): allow it by name to reach it"
	}
	return true, ""
}
