// Package policy parses, validates and matches a sandbox's network policy:
// its mode, the allow rules (domains, wildcards, CIDRs, presets, each with
// optional ports) and the deny rules that win over them.
//
// The package is pure Go and has no side effects. The DNS resolver
// (internal/network/dns) asks AllowsName which names a sandbox may resolve
// and CheckResolved which answers it may hand out; the kernel dataplane
// builds its nftables sets from CIDRs, Internet, AlwaysBlocked and Private.
//
// Evaluation order for a packet from a sandbox, as the dataplane implements
// it:
//
//  1. AlwaysBlocked ranges, host addresses and other sandboxes: drop.
//  2. Deny CIDR rules (on their ports): drop.
//  3. Allow CIDR rules (on their ports): accept. This is the only way to
//     reach a Private range.
//  4. Private ranges: drop.
//  5. @internet (on its ports): accept.
//  6. Addresses the resolver returned for allowed names, with the ports of
//     the rules that allowed the name, until their TTL runs out: accept.
//  7. Everything else: drop.
//
// Domain and wildcard deny rules act in the resolver only: the name gets
// NXDOMAIN. They do not block an address that an allow CIDR or @internet
// reaches by itself.
//
// Public DNS-over-HTTPS resolvers (doh.go: dns.google, cloudflare-dns.com
// and others, and their anycast addresses) stay refused under @internet
// and wildcards: AllowsName refuses their names unless a domain rule
// names one exactly, and the daemon adds deny rules for their addresses
// on port 443 unless a rule names one (NamesDoH). DNS over TLS (853) is
// refused everywhere.
package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nookhq/nook/internal/errdefs"
)

// Mode is a policy's overall stance.
type Mode string

// The modes.
const (
	// None allows nothing but the sandbox's own loopback.
	None Mode = "none"
	// Allowlist allows what the allow rules name, minus the deny rules.
	// It is the default.
	Allowlist Mode = "allowlist"
)

// MaxRules bounds the allow and the deny list each.
const MaxRules = 256

// Policy is a sandbox's network policy. The zero value is an allowlist that
// allows nothing. Build one with Parse; a Policy decoded from JSON is
// validated the same way.
type Policy struct {
	Mode  Mode   `json:"mode"`
	Allow []Rule `json:"allow,omitempty"`
	Deny  []Rule `json:"deny,omitempty"`
}

// invalidError marks a user-facing validation error as
// errdefs.ErrInvalidArgument while keeping its message and its own chain.
type invalidError struct{ err error }

func (e *invalidError) Error() string   { return e.err.Error() }
func (e *invalidError) Unwrap() []error { return []error{e.err, errdefs.ErrInvalidArgument} }

func invalid(err error) error {
	var ie *invalidError
	if errors.As(err, &ie) {
		return err
	}
	return &invalidError{err: err}
}

// ParseMode parses a mode name; "" is the default, Allowlist.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(strings.ToLower(s)); m {
	case "":
		return Allowlist, nil
	case None, Allowlist:
		return m, nil
	}
	return "", invalid(fmt.Errorf("unknown network mode %q (known: %s, %s)", s, None, Allowlist))
}

// Parse builds a policy from a mode ("" means allowlist) and the allow and
// deny rules as users write them (see Rule). Every bad rule is reported,
// one per line, as `allow rule "x": why`. Mode none takes no rules. Deny
// rules may not use @internet. Allow CIDRs may not reach AlwaysBlocked
// ranges; the daemon also calls CheckHostAddrs. The error wraps
// errdefs.ErrInvalidArgument.
func Parse(mode string, allow, deny []string) (Policy, error) {
	m, err := ParseMode(mode)
	if err != nil {
		return Policy{}, err
	}
	p := Policy{Mode: m}
	var errs []error
	if m == None && len(allow)+len(deny) > 0 {
		errs = append(errs, fmt.Errorf("network mode none allows nothing, so it takes no allow or deny rules; use mode allowlist"))
	}
	for _, list := range []struct {
		what  string
		texts []string
		dst   *[]Rule
	}{{"allow", allow, &p.Allow}, {"deny", deny, &p.Deny}} {
		if len(list.texts) > MaxRules {
			errs = append(errs, fmt.Errorf("%d %s rules, more than %d", len(list.texts), list.what, MaxRules))
			continue
		}
		for _, s := range list.texts {
			r, err := parseRule(s)
			if err == nil {
				err = r.check(list.what == "deny")
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s rule %q: %w", list.what, s, err))
				continue
			}
			*list.dst = append(*list.dst, r)
		}
	}
	if len(errs) > 0 {
		return Policy{}, invalid(errors.Join(errs...))
	}
	return p, nil
}

// check applies the rules that depend on whether r allows or denies.
func (r Rule) check(deny bool) error {
	switch {
	case deny && r.Kind == KindPreset && r.Name == PresetInternet:
		return fmt.Errorf("@internet cannot be denied; deny specific domains or CIDRs, or use mode none")
	case !deny && r.Kind == KindCIDR:
		return checkAllowCIDR(r.Prefix)
	}
	return nil
}

// Rules returns the text forms of rules, as Parse takes them.
func Rules(rules []Rule) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.String()
	}
	return out
}

// String returns a one-line summary such as
// "allowlist allow=github.com:443,@registries deny=evil.example" or "none".
func (p Policy) String() string {
	mode := p.Mode
	if mode == "" {
		mode = Allowlist
	}
	var b strings.Builder
	b.WriteString(string(mode))
	if len(p.Allow) > 0 {
		b.WriteString(" allow=" + strings.Join(Rules(p.Allow), ","))
	}
	if len(p.Deny) > 0 {
		b.WriteString(" deny=" + strings.Join(Rules(p.Deny), ","))
	}
	return b.String()
}

// Equal reports whether p and o are the same policy (a zero Mode equals
// Allowlist).
func (p Policy) Equal(o Policy) bool {
	eq := func(a, b []Rule) bool { return slices.EqualFunc(a, b, Rule.Equal) }
	return p.mode() == o.mode() && eq(p.Allow, o.Allow) && eq(p.Deny, o.Deny)
}

func (p Policy) mode() Mode {
	if p.Mode == "" {
		return Allowlist
	}
	return p.Mode
}

// policyJSON is the persisted form: rules as their text.
type policyJSON struct {
	Mode  string   `json:"mode"`
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// MarshalJSON encodes {"mode":"allowlist","allow":["github.com:443"],
// "deny":[...]}, the rules in their text form.
func (p Policy) MarshalJSON() ([]byte, error) {
	return json.Marshal(policyJSON{Mode: string(p.mode()), Allow: Rules(p.Allow), Deny: Rules(p.Deny)})
}

// UnmarshalJSON decodes and validates a policy with Parse.
func (p *Policy) UnmarshalJSON(b []byte) error {
	var v policyJSON
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("decode network policy: %w", err)
	}
	np, err := Parse(v.Mode, v.Allow, v.Deny)
	if err != nil {
		return err
	}
	*p = np
	return nil
}
