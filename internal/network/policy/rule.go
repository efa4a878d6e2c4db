package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/net/idna"
	"golang.org/x/net/publicsuffix"
)

// Kind says what a Rule names.
type Kind string

// The rule kinds.
const (
	// KindDomain is one exact name, e.g. github.com.
	KindDomain Kind = "domain"
	// KindWildcard is every subdomain of a zone at any depth, not the zone
	// itself: *.pythonhosted.org matches files.pythonhosted.org and
	// a.b.pythonhosted.org but not pythonhosted.org.
	KindWildcard Kind = "wildcard"
	// KindCIDR is an IPv4 range; a bare address is a /32.
	KindCIDR Kind = "cidr"
	// KindPreset is a named group of rules, e.g. @registries.
	KindPreset Kind = "preset"
)

// Limits on rule text.
const (
	maxRuleLen = 300
	maxNameLen = 253
)

// Rule is one allow or deny entry. Its text form (String, ParseRule) is
// what users write and what is persisted:
//
//	github.com              a domain, every port
//	example.com:443         a domain, one port
//	*.pythonhosted.org      every subdomain of pythonhosted.org
//	10.1.2.0/24:80,443      a CIDR with two ports
//	192.0.2.7               one address (/32)
//	*.x.org:8000-8100       a port range
//	@registries             a preset (see Presets)
//	db.example.com:5432/tcp a domain, any TCP protocol (Raw)
//
// Ports apply to TCP and UDP alike. The host checks the name behind every
// TCP connection to a domain rule's addresses (the TLS server name, the
// HTTP Host: internal/egress), so TCP that is neither TLS nor HTTP needs a
// rule that says /tcp.
type Rule struct {
	Kind Kind
	// Name is the domain for KindDomain, the zone under "*." for
	// KindWildcard, and the preset name without "@" for KindPreset: always
	// lower case ASCII without a trailing dot.
	Name string
	// Prefix is the masked IPv4 range for KindCIDR.
	Prefix netip.Prefix
	// Ports limits the rule to these ports, normalized (sorted, merged); nil
	// means every port. For a preset, nil means the preset's own ports.
	Ports []PortRange
	// Raw (written NAME[:PORTS]/tcp, domain and wildcard rules only) allows
	// any TCP protocol to the name's addresses, not only TLS and HTTP,
	// whose names the host checks.
	Raw bool
}

// ParseRule parses one rule as a user writes it (see Rule). Names are
// lower-cased and a trailing dot is dropped. Errors are actionable and wrap
// errdefs.ErrInvalidArgument.
func ParseRule(s string) (Rule, error) {
	r, err := parseRule(s)
	if err != nil {
		return Rule{}, invalid(err)
	}
	return r, nil
}

func parseRule(s string) (Rule, error) {
	if s == "" {
		return Rule{}, fmt.Errorf("empty rule")
	}
	if len(s) > maxRuleLen {
		return Rule{}, fmt.Errorf("rule is %d characters long, more than %d", len(s), maxRuleLen)
	}
	if t, ok := strings.CutSuffix(s, "/tcp"); ok {
		r, err := parseRule(t)
		if err != nil {
			return Rule{}, err
		}
		if r.Kind != KindDomain && r.Kind != KindWildcard || r.Raw {
			return Rule{}, fmt.Errorf("/tcp applies once, to a domain rule (a CIDR rule allows any protocol already)")
		}
		r.Raw = true
		return r, nil
	}
	if strings.Count(s, ":") > 1 {
		if looksIPv6(s) {
			return Rule{}, fmt.Errorf("IPv6 is not supported: sandboxes are IPv4-only")
		}
		return Rule{}, fmt.Errorf("more than one ':' in rule; list ports after a single ':' (e.g. example.com:80,443)")
	}
	target, portText, hasPorts := strings.Cut(s, ":")
	var r Rule
	var err error
	switch {
	case strings.HasPrefix(target, "@"):
		r, err = parsePreset(target)
	case looksNumeric(target):
		r, err = parseCIDR(target)
	case strings.Contains(target, "*"):
		r, err = parseWildcard(target)
	default:
		var name string
		name, err = parseDomain(target)
		r = Rule{Kind: KindDomain, Name: name}
	}
	if err != nil {
		return Rule{}, err
	}
	if hasPorts {
		if r.Ports, err = parsePorts(portText); err != nil {
			return Rule{}, err
		}
	}
	return r, nil
}

// looksIPv6 reports whether s is written like an IPv6 address or CIDR,
// optionally in brackets and followed by ports.
func looksIPv6(s string) bool {
	if strings.HasPrefix(s, "[") || strings.Contains(s, "::") {
		return true
	}
	if _, err := netip.ParsePrefix(s); err == nil {
		return true
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}

// looksNumeric reports whether s is written like an IPv4 address or CIDR:
// digits, dots and a slash only. Such text is never taken as a domain (a
// top-level domain is never all digits).
func looksNumeric(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && c != '.' && c != '/' {
			return false
		}
	}
	return true
}

func parseCIDR(s string) (Rule, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return Rule{}, fmt.Errorf("not an IPv4 CIDR (write e.g. 10.1.2.0/24): %w", err)
		}
		if m := p.Masked(); m != p {
			return Rule{}, fmt.Errorf("%s has bits set after the /%d prefix; did you mean %s?", s, p.Bits(), m)
		}
		return Rule{Kind: KindCIDR, Prefix: p}, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return Rule{}, fmt.Errorf("not an IPv4 address (write e.g. 192.0.2.7 or 10.1.2.0/24): %w", err)
	}
	return Rule{Kind: KindCIDR, Prefix: netip.PrefixFrom(a, 32)}, nil
}

func parseWildcard(s string) (Rule, error) {
	if s == "*" || s == "*." {
		return Rule{}, fmt.Errorf("rule %q is too broad: use @internet for every public address", s)
	}
	zone, ok := strings.CutPrefix(s, "*.")
	if !ok || strings.Contains(zone, "*") {
		return Rule{}, fmt.Errorf("a wildcard must be written *.domain (the * stands for any subdomain, e.g. *.pythonhosted.org)")
	}
	if !strings.Contains(strings.TrimSuffix(zone, "."), ".") {
		return Rule{}, fmt.Errorf("rule %q is too broad: a wildcard needs at least two labels after \"*.\" (e.g. *.example.com)", s)
	}
	name, err := parseDomain(zone)
	if err != nil {
		return Rule{}, err
	}
	if suffix, icann := publicsuffix.PublicSuffix(name); icann && suffix == name {
		return Rule{}, fmt.Errorf("rule %q is too broad: %s is a public suffix that anyone can register names under", s, name)
	}
	return Rule{Kind: KindWildcard, Name: name}, nil
}

// parseDomain validates and normalizes a domain name: lower case ASCII
// letters, digits, '-' and '_', labels of 1-63 characters that do not start
// or end with '-', at least two labels, at most 253 characters, a top-level
// label that is not all digits. A single trailing dot is dropped.
func parseDomain(s string) (string, error) {
	name := strings.ToLower(strings.TrimSuffix(s, "."))
	if name == "" {
		return "", fmt.Errorf("not a domain name: empty")
	}
	for i := 0; i < len(name); i++ {
		if name[i] >= 0x80 {
			if ascii, err := idna.Lookup.ToASCII(name); err == nil {
				return "", fmt.Errorf("not a domain name: non-ASCII names must be written in punycode, here %q", ascii)
			}
			return "", fmt.Errorf("not a domain name: non-ASCII character in %q and no valid punycode form", s)
		}
	}
	if len(name) > maxNameLen {
		return "", fmt.Errorf("not a domain name: %d characters, more than %d", len(name), maxNameLen)
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if err := checkLabel(l); err != nil {
			return "", fmt.Errorf("not a domain name: %w", err)
		}
	}
	if len(labels) < 2 {
		return "", fmt.Errorf("not a domain name: %q has a single label; write the full name, e.g. %s.com", name, name)
	}
	if looksNumeric(labels[len(labels)-1]) {
		return "", fmt.Errorf("not a domain name: the last label %q is numeric", labels[len(labels)-1])
	}
	return name, nil
}

func checkLabel(l string) error {
	switch {
	case l == "":
		return fmt.Errorf("empty label (two dots in a row, or a leading dot)")
	case len(l) > 63:
		return fmt.Errorf("label %q is longer than 63 characters", l)
	case l[0] == '-' || l[len(l)-1] == '-':
		return fmt.Errorf("label %q starts or ends with '-'", l)
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return fmt.Errorf("invalid character %q in label %q", c, l)
		}
	}
	return nil
}

func parsePreset(s string) (Rule, error) {
	name := strings.ToLower(strings.TrimPrefix(s, "@"))
	if _, ok := presets[name]; !ok {
		return Rule{}, fmt.Errorf("unknown preset %q (known: %s)", s, strings.Join(PresetNames(), ", "))
	}
	return Rule{Kind: KindPreset, Name: name}, nil
}

// String returns the rule as a user writes it; ParseRule(r.String())
// returns r.
func (r Rule) String() string {
	var s string
	switch r.Kind {
	case KindDomain:
		s = r.Name
	case KindWildcard:
		s = "*." + r.Name
	case KindPreset:
		s = "@" + r.Name
	case KindCIDR:
		if r.Prefix.Bits() == 32 {
			s = r.Prefix.Addr().String()
		} else {
			s = r.Prefix.String()
		}
	default:
		return fmt.Sprintf("invalid rule kind %q", string(r.Kind))
	}
	if r.Ports != nil {
		s += ":" + FormatPorts(r.Ports)
	}
	if r.Raw {
		s += "/tcp"
	}
	return s
}

// Equal reports whether r and o are the same rule.
func (r Rule) Equal(o Rule) bool {
	return r.Kind == o.Kind && r.Name == o.Name && r.Prefix == o.Prefix && r.Raw == o.Raw &&
		(r.Ports == nil) == (o.Ports == nil) && slices.Equal(r.Ports, o.Ports)
}

// MarshalText returns the rule's text form, so policies persist as the
// rules users wrote.
func (r Rule) MarshalText() ([]byte, error) {
	if r.Kind != KindDomain && r.Kind != KindWildcard && r.Kind != KindCIDR && r.Kind != KindPreset {
		return nil, fmt.Errorf("policy: cannot marshal rule of kind %q", string(r.Kind))
	}
	return []byte(r.String()), nil
}

// UnmarshalText parses a rule with ParseRule.
func (r *Rule) UnmarshalText(b []byte) error {
	v, err := ParseRule(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// matchesName reports whether the domain or wildcard rule r covers name
// (lower case, no trailing dot).
func (r Rule) matchesName(name string) bool {
	switch r.Kind {
	case KindDomain:
		return name == r.Name
	case KindWildcard:
		return len(name) > len(r.Name)+1 && strings.HasSuffix(name, r.Name) && name[len(name)-len(r.Name)-1] == '.'
	}
	return false
}
