package policy

import (
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/nookhq/nook/internal/errdefs"
)

func pr(from, to uint16) PortRange { return PortRange{From: from, To: to} }

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Rule
		str  string // String(); "" means same as in
	}{
		{"github.com", Rule{Kind: KindDomain, Name: "github.com"}, ""},
		{"GitHub.COM.", Rule{Kind: KindDomain, Name: "github.com"}, "github.com"},
		{"xn--bcher-kva.example", Rule{Kind: KindDomain, Name: "xn--bcher-kva.example"}, ""},
		{"_srv.a-b.example", Rule{Kind: KindDomain, Name: "_srv.a-b.example"}, ""},
		{"example.com:443", Rule{Kind: KindDomain, Name: "example.com", Ports: []PortRange{pr(443, 443)}}, ""},
		{"example.com:443,80", Rule{Kind: KindDomain, Name: "example.com", Ports: []PortRange{pr(80, 80), pr(443, 443)}}, "example.com:80,443"},
		{"example.com:80,81,82", Rule{Kind: KindDomain, Name: "example.com", Ports: []PortRange{pr(80, 82)}}, "example.com:80-82"},
		{"example.com:1-65535", Rule{Kind: KindDomain, Name: "example.com"}, "example.com"},
		{"example.com:080", Rule{Kind: KindDomain, Name: "example.com", Ports: []PortRange{pr(80, 80)}}, "example.com:80"},
		{"*.pythonhosted.org", Rule{Kind: KindWildcard, Name: "pythonhosted.org"}, ""},
		{"*.X.org:8000-8100", Rule{Kind: KindWildcard, Name: "x.org", Ports: []PortRange{pr(8000, 8100)}}, "*.x.org:8000-8100"},
		{"*.github.io", Rule{Kind: KindWildcard, Name: "github.io"}, ""},
		{"10.1.2.0/24", Rule{Kind: KindCIDR, Prefix: netip.MustParsePrefix("10.1.2.0/24")}, ""},
		{"10.0.0.0/8:80,443", Rule{Kind: KindCIDR, Prefix: netip.MustParsePrefix("10.0.0.0/8"), Ports: []PortRange{pr(80, 80), pr(443, 443)}}, ""},
		{"192.0.2.7", Rule{Kind: KindCIDR, Prefix: netip.MustParsePrefix("192.0.2.7/32")}, ""},
		{"192.0.2.7/32", Rule{Kind: KindCIDR, Prefix: netip.MustParsePrefix("192.0.2.7/32")}, "192.0.2.7"},
		{"192.0.2.7:22", Rule{Kind: KindCIDR, Prefix: netip.MustParsePrefix("192.0.2.7/32"), Ports: []PortRange{pr(22, 22)}}, ""},
		{"@registries", Rule{Kind: KindPreset, Name: "registries"}, ""},
		{"@Internet:443", Rule{Kind: KindPreset, Name: "internet", Ports: []PortRange{pr(443, 443)}}, "@internet:443"},
	} {
		got, err := ParseRule(tc.in)
		if err != nil {
			t.Errorf("ParseRule(%q): %v", tc.in, err)
			continue
		}
		if !got.Equal(tc.want) {
			t.Errorf("ParseRule(%q) = %#v, want %#v", tc.in, got, tc.want)
		}
		want := tc.str
		if want == "" {
			want = tc.in
		}
		if got.String() != want {
			t.Errorf("ParseRule(%q).String() = %q, want %q", tc.in, got.String(), want)
		}
		again, err := ParseRule(got.String())
		if err != nil || !again.Equal(got) {
			t.Errorf("round trip of %q: %v, %v", tc.in, again, err)
		}
	}
}

func TestParseRuleErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "empty rule"},
		{"exa mple.com", `not a domain name: invalid character ' ' in label "exa mple"`},
		{"example", `single label; write the full name, e.g. example.com`},
		{"a..b.com", "empty label"},
		{".example.com", "empty label"},
		{"-a.example.com", `label "-a" starts or ends with '-'`},
		{"a-.example.com", `starts or ends with '-'`},
		{strings.Repeat("a", 64) + ".com", "longer than 63 characters"},
		{strings.Repeat("abcdefghi.", 26) + "com", "more than 253"},
		{strings.Repeat("a", 301), "more than 300"},
		{"bücher.example", `punycode, here "xn--bcher-kva.example"`},
		{"example.123", "is numeric"},
		{"example.com:", "empty port list"},
		{"example.com:0", "port 0 out of range 1-65535"},
		{"example.com:70000", "port 70000 out of range 1-65535"},
		{"example.com:99999999999999999999", "out of range 1-65535"},
		{"example.com:http", `port "http" is not a number`},
		{"example.com:+80", `port "+80" is not a number`},
		{"example.com:80,", "empty port in port list"},
		{"example.com:8100-8000", `port range "8100-8000" is reversed (write 8000-8100)`},
		{"example.com:80:443", "more than one ':'"},
		{"*", "too broad: use @internet"},
		{"*.com", `rule "*.com" is too broad: a wildcard needs at least two labels`},
		{"*.co.uk", `rule "*.co.uk" is too broad: co.uk is a public suffix`},
		{"foo.*.com", "a wildcard must be written *.domain"},
		{"*foo.com", "a wildcard must be written *.domain"},
		{"*.*.foo.com", "a wildcard must be written *.domain"},
		{"10.0.0.300", "not an IPv4 address"},
		{"10.1.2.3/24", "did you mean 10.1.2.0/24?"},
		{"10.1.2.0/33", "not an IPv4 CIDR"},
		{"1.2.3", "not an IPv4 address"},
		{"2001:db8::/32", "IPv6 is not supported"},
		{"::1", "IPv6 is not supported"},
		{"[2001:db8::1]:443", "IPv6 is not supported"},
		{"fe80::1%eth0", "IPv6 is not supported"},
		{"@foo", `unknown preset "@foo" (known: @internet, @registries)`},
		{"@", `unknown preset "@"`},
	} {
		_, err := ParseRule(tc.in)
		if err == nil {
			t.Errorf("ParseRule(%q) succeeded, want error containing %q", tc.in, tc.want)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseRule(%q) error %q, want it to contain %q", tc.in, err, tc.want)
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseRule(%q) error is not ErrInvalidArgument", tc.in)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	p, err := Parse("", []string{"github.com:443", "@registries", "10.0.0.0/8"}, []string{"evil.example", "10.9.0.0/16"})
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != Allowlist || len(p.Allow) != 3 || len(p.Deny) != 2 {
		t.Fatalf("got %+v", p)
	}
	if got, want := p.String(), "allowlist allow=github.com:443,@registries,10.0.0.0/8 deny=evil.example,10.9.0.0/16"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if p, err := Parse("NONE", nil, nil); err != nil || p.Mode != None || p.String() != "none" {
		t.Errorf("Parse(NONE) = %v, %v", p, err)
	}
	var zero Policy
	if !zero.Equal(Policy{Mode: Allowlist}) {
		t.Error("zero policy should equal an empty allowlist")
	}
}

func TestParsePolicyErrors(t *testing.T) {
	for _, tc := range []struct {
		mode        string
		allow, deny []string
		want        []string
	}{
		{"open", nil, nil, []string{`unknown network mode "open" (known: none, allowlist)`}},
		{"none", []string{"github.com"}, nil, []string{"mode none allows nothing"}},
		{"none", nil, []string{"github.com"}, []string{"mode none allows nothing"}},
		{"", []string{"ok.example", "exa mple.com", "x.org:70000"}, []string{"@internet", "@nope"}, []string{
			`allow rule "exa mple.com": not a domain name`,
			`allow rule "x.org:70000": port 70000 out of range 1-65535`,
			`deny rule "@internet": @internet cannot be denied`,
			`deny rule "@nope": unknown preset`,
		}},
		{"", []string{"127.0.0.1"}, nil, []string{`allow rule "127.0.0.1": 127.0.0.1/32 overlaps 127.0.0.0/8, which is always blocked (loopback: the host itself)`}},
		{"", []string{"169.254.169.254"}, nil, []string{"169.254.0.0/16, which is always blocked (link-local and cloud metadata)"}},
		{"", []string{"0.0.0.0/0"}, nil, []string{"use @internet for every public address"}},
		{"", []string{"192.0.0.0/2"}, nil, []string{"overlaps 224.0.0.0/4, which is always blocked (multicast)"}},
		{"", []string{"255.255.255.255"}, nil, []string{"reserved and broadcast"}},
		{"", slices.Repeat([]string{"a.example"}, MaxRules+1), nil, []string{"257 allow rules, more than 256"}},
	} {
		_, err := Parse(tc.mode, tc.allow, tc.deny)
		if err == nil {
			t.Errorf("Parse(%q, %q, %q) succeeded", tc.mode, tc.allow, tc.deny)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Parse(%q, %q, %q) error %q, want it to contain %q", tc.mode, tc.allow, tc.deny, err, w)
			}
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("error %q is not ErrInvalidArgument", err)
		}
	}
	// Deny rules may name blocked ranges; that is harmless.
	if _, err := Parse("", nil, []string{"127.0.0.0/8", "0.0.0.0/0"}); err != nil {
		t.Errorf("deny of blocked ranges: %v", err)
	}
}

func TestJSON(t *testing.T) {
	p, err := Parse("allowlist", []string{"*.Example.com:443", "@registries", "192.0.2.7"}, []string{"bad.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"mode":"allowlist","allow":["*.example.com:443","@registries","192.0.2.7"],"deny":["bad.example.com"]}`; got != want {
		t.Errorf("JSON = %s, want %s", got, want)
	}
	var back Policy
	if err := json.Unmarshal(b, &back); err != nil || !back.Equal(p) {
		t.Fatalf("unmarshal: %+v, %v", back, err)
	}
	if b, _ := json.Marshal(Policy{}); string(b) != `{"mode":"allowlist"}` {
		t.Errorf("zero policy JSON = %s", b)
	}
	for _, bad := range []string{`{"mode":"none","allow":["x.com"]}`, `{"allow":["x..com"]}`, `{"mode":7}`} {
		if err := json.Unmarshal([]byte(bad), &back); err == nil {
			t.Errorf("unmarshal %s succeeded", bad)
		}
	}
	// A Rule alone encodes as its text.
	r, _ := ParseRule("10.0.0.0/8:22")
	if b, _ := json.Marshal(r); string(b) != `"10.0.0.0/8:22"` {
		t.Errorf("rule JSON = %s", b)
	}
	if _, err := json.Marshal(Rule{}); err == nil {
		t.Error("marshaling a zero Rule should fail")
	}
}

func TestAllowsName(t *testing.T) {
	p, err := Parse("", []string{
		"github.com:443", "*.pythonhosted.org", "example.com:80", "example.com:443", "*.example.com:8000-8100",
		"ports.example:1-1000",
	}, []string{"evil.pythonhosted.org", "ports.example:22", "*.deny.pythonhosted.org:443"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		allowed bool
		ports   string // FormatPorts; "*" for nil
		why     string
	}{
		{"github.com", true, "443", `allowed by "github.com:443"`},
		{"GitHub.com.", true, "443", "allowed"},
		{"api.github.com", false, "", "not allowed by any rule"},
		{"files.pythonhosted.org", true, "*", `allowed by "*.pythonhosted.org"`},
		{"a.b.c.pythonhosted.org", true, "*", "allowed"},
		{"pythonhosted.org", false, "", "not allowed"},
		{"xpythonhosted.org", false, "", "not allowed"},
		{"evil.pythonhosted.org", false, "", `denied by "evil.pythonhosted.org"`},
		{"x.deny.pythonhosted.org", true, "1-442,444-65535", `ports limited by deny rule "*.deny.pythonhosted.org:443"`},
		{"example.com", true, "80,443", "allowed"},
		{"www.example.com", true, "8000-8100", "allowed"},
		{"ports.example", true, "1-21,23-1000", "allowed"},
		{"other.test", false, "", "not allowed"},
	} {
		ok, ports, why := p.AllowsName(tc.name)
		got := FormatPorts(ports)
		if ports == nil {
			got = "*"
		}
		if !ok {
			got = ""
		}
		if ok != tc.allowed || got != tc.ports || !strings.Contains(why, tc.why) {
			t.Errorf("AllowsName(%q) = %v, %q, %q; want %v, %q, %q", tc.name, ok, got, why, tc.allowed, tc.ports, tc.why)
		}
	}

	none, _ := Parse("none", nil, nil)
	if ok, _, why := none.AllowsName("github.com"); ok || why != "network mode is none" {
		t.Errorf("none: %v %q", ok, why)
	}
	// Deny with every port of an allowed range.
	p2, _ := Parse("", []string{"a.example:80"}, []string{"a.example:80-90"})
	if ok, _, why := p2.AllowsName("a.example"); ok || !strings.Contains(why, "denied by") {
		t.Errorf("port deny covering the allow: %v %q", ok, why)
	}
}

func TestPresets(t *testing.T) {
	p, err := Parse("", []string{"@registries"}, []string{"sum.golang.org"})
	if err != nil {
		t.Fatal(err)
	}
	for name, ports := range map[string]string{
		"github.com": "22,80,443", "api.github.com": "80,443", "raw.githubusercontent.com": "80,443",
		"deb.debian.org": "80,443", "security.debian.org": "80,443", "pypi.org": "80,443",
		"files.pythonhosted.org": "80,443", "registry.npmjs.org": "80,443", "proxy.golang.org": "80,443",
		"crates.io": "80,443", "static.crates.io": "80,443", "index.crates.io": "80,443",
	} {
		ok, got, why := p.AllowsName(name)
		if !ok || FormatPorts(got) != ports || why != `allowed by "@registries"` {
			t.Errorf("@registries %s: %v %v %q, want ports %s", name, ok, got, why, ports)
		}
	}
	for _, name := range []string{"sum.golang.org", "storage.googleapis.com", "githubusercontent.com", "evil.example"} {
		if ok, _, _ := p.AllowsName(name); ok {
			t.Errorf("@registries allows %s", name)
		}
	}
	p443, _ := Parse("", []string{"@registries:443"}, nil)
	if ok, ports, _ := p443.AllowsName("github.com"); !ok || FormatPorts(ports) != "443" {
		t.Errorf("@registries:443 github.com: %v %v", ok, ports)
	}
	if ok, _ := p.Internet(); ok {
		t.Error("@registries is not @internet")
	}

	inet, _ := Parse("", []string{"@internet:443", "@internet:80", "evil.example:22"}, []string{"evil.example"})
	if ok, ports := inet.Internet(); !ok || FormatPorts(ports) != "80,443" {
		t.Errorf("Internet() = %v %v", ok, ports)
	}
	if ok, ports, _ := inet.AllowsName("anything.example"); !ok || FormatPorts(ports) != "80,443" {
		t.Errorf("@internet name: %v %v", ok, ports)
	}
	if ok, _, _ := inet.AllowsName("evil.example"); ok {
		t.Error("deny should win over @internet")
	}
	all, _ := Parse("", []string{"@internet"}, nil)
	if ok, ports := all.Internet(); !ok || ports != nil {
		t.Errorf("@internet: %v %v", ok, ports)
	}
	if got := PresetNames(); !slices.Equal(got, []string{"@internet", "@registries"}) {
		t.Errorf("PresetNames() = %v", got)
	}
	// PresetRules returns a copy.
	was := presets[PresetRegistries][0].Ports[0].From
	PresetRules(PresetRegistries)[0].Ports[0].From = 1
	if presets[PresetRegistries][0].Ports[0].From != was {
		t.Error("PresetRules leaked the preset table")
	}
}

func TestCIDRs(t *testing.T) {
	p, err := Parse("", []string{"10.0.0.0/8:80,443", "github.com", "192.0.2.7"}, []string{"10.9.0.0/16", "evil.example"})
	if err != nil {
		t.Fatal(err)
	}
	allow, deny := p.CIDRs()
	want := []CIDRRule{
		{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Ports: []PortRange{pr(80, 80), pr(443, 443)}},
		{Prefix: netip.MustParsePrefix("192.0.2.7/32")},
	}
	if !slices.EqualFunc(allow, want, func(a, b CIDRRule) bool { return a.Prefix == b.Prefix && slices.Equal(a.Ports, b.Ports) }) {
		t.Errorf("allow CIDRs = %v", allow)
	}
	if len(deny) != 1 || deny[0].Prefix != netip.MustParsePrefix("10.9.0.0/16") || deny[0].Ports != nil {
		t.Errorf("deny CIDRs = %v", deny)
	}
	if a, d := (Policy{Mode: None}).CIDRs(); a != nil || d != nil {
		t.Error("mode none has CIDRs")
	}
}

func TestAddresses(t *testing.T) {
	for s, want := range map[string]bool{
		"8.8.8.8": true, "198.51.100.7": true, "192.0.2.1": true, "203.0.113.9": true, "1.1.1.1": true,
		"::ffff:8.8.8.8": true,
		"10.1.2.3":       false, "172.16.0.1": false, "172.31.255.255": false, "192.168.1.1": false,
		"100.64.0.1": false, "198.18.0.1": false, "192.0.0.8": false,
		"127.0.0.1": false, "0.0.0.0": false, "169.254.169.254": false, "224.0.0.1": false,
		"255.255.255.255": false, "240.0.0.1": false, "2001:db8::1": false, "::1": false,
		"172.32.0.1": true, "100.128.0.1": true,
	} {
		if got := IsPublic(netip.MustParseAddr(s)); got != want {
			t.Errorf("IsPublic(%s) = %v, want %v", s, got, want)
		}
	}
	if IsPublic(netip.Addr{}) {
		t.Error("zero address is public")
	}
	// Blocked and private ranges must not overlap: nftables interval sets
	// refuse overlapping elements.
	all := append(AlwaysBlocked(), Private()...)
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.Overlaps(b) {
				t.Errorf("%s overlaps %s", a, b)
			}
		}
	}
	if !slices.Contains(AlwaysBlocked(), netip.MustParsePrefix("169.254.0.0/16")) || !slices.Contains(Private(), netip.MustParsePrefix("10.0.0.0/8")) {
		t.Error("missing ranges")
	}
}

func TestCheckHostAddrs(t *testing.T) {
	host := []netip.Prefix{
		netip.MustParsePrefix("203.0.113.5/32"),
		netip.MustParsePrefix("10.88.0.0/16"), // sandbox pool
		netip.MustParsePrefix("2001:db8::1/128"),
		netip.MustParsePrefix("::ffff:192.0.2.200/128"),
	}
	for _, tc := range []struct {
		allow []string
		want  string
	}{
		{[]string{"github.com", "10.1.0.0/16", "203.0.113.6"}, ""},
		{[]string{"203.0.113.0/24"}, `allow rule "203.0.113.0/24": 203.0.113.0/24 overlaps the host address 203.0.113.5`},
		{[]string{"10.0.0.0/8:443"}, `allow rule "10.0.0.0/8:443": 10.0.0.0/8 overlaps the host network 10.88.0.0/16`},
		{[]string{"192.0.2.200"}, "overlaps the host address 192.0.2.200"},
	} {
		p, err := Parse("", tc.allow, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = p.CheckHostAddrs(host)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%v: %v", tc.allow, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%v: error %v, want %q", tc.allow, err, tc.want)
		}
	}
	// A policy built by hand (not through Parse) still gets the blocked
	// range check.
	p := Policy{Allow: []Rule{{Kind: KindCIDR, Prefix: netip.MustParsePrefix("169.254.169.254/32")}}}
	if err := p.CheckHostAddrs(nil); err == nil || !strings.Contains(err.Error(), "link-local and cloud metadata") {
		t.Errorf("metadata: %v", err)
	}
}

func TestCheckResolved(t *testing.T) {
	p, err := Parse("", []string{"*.example.com", "10.5.0.0/16"}, []string{"198.51.100.0/24", "203.0.113.0/24:22"})
	if err != nil {
		t.Fatal(err)
	}
	for s, want := range map[string]string{
		"192.0.2.1":       "",
		"203.0.113.1":     "", // denied on one port only: still handed out
		"10.5.1.1":        "",
		"10.6.1.1":        "private address (private network (RFC 1918)) and no allow CIDR names it: possible DNS rebinding",
		"127.0.0.1":       "always blocked (loopback",
		"169.254.169.254": "always blocked (link-local",
		"198.51.100.7":    `denied by "198.51.100.0/24"`,
		"2001:db8::1":     "not an IPv4 address",
	} {
		ok, why := p.CheckResolved(netip.MustParseAddr(s))
		if ok != (want == "") || !strings.Contains(why, want) {
			t.Errorf("CheckResolved(%s) = %v %q, want %q", s, ok, why, want)
		}
	}
}

func TestPorts(t *testing.T) {
	all := []PortRange(nil)
	for _, tc := range []struct {
		a, b []PortRange
		want string // "*" for nil
	}{
		{all, []PortRange{pr(22, 22)}, "1-21,23-65535"},
		{[]PortRange{pr(80, 80), pr(443, 443)}, []PortRange{pr(443, 500)}, "80"},
		{[]PortRange{pr(80, 80)}, all, ""},
		{[]PortRange{pr(80, 90)}, []PortRange{pr(85, 85), pr(1, 81)}, "82-84,86-90"},
		{all, []PortRange{}, "*"},
	} {
		got := subtractPorts(tc.a, tc.b)
		s := FormatPorts(got)
		if got == nil {
			s = "*"
		}
		if s != tc.want {
			t.Errorf("%v - %v = %q, want %q", tc.a, tc.b, s, tc.want)
		}
	}
	if u := unionPorts([]PortRange{pr(1, 10)}, []PortRange{pr(11, 65535)}); u != nil {
		t.Errorf("union covering everything = %v, want nil", u)
	}
	if !PortsContain(nil, 1) || PortsContain(nil, 0) || !PortsContain([]PortRange{pr(80, 90)}, 85) || PortsContain([]PortRange{pr(80, 90)}, 91) {
		t.Error("PortsContain")
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"github.com", "*.pythonhosted.org:443", "10.0.0.0/8:80,443", "192.0.2.7", "@registries", "@internet:443",
		"*.x.org:8000-8100", "exa mple.com", "example.com:70000", "2001:db8::/32", "bücher.example", "a.b:1-2,3",
	} {
		f.Add("", s, "evil.example")
	}
	f.Add("none", "", "")
	f.Fuzz(func(t *testing.T, mode, allow, deny string) {
		split := func(s string) []string {
			if s == "" {
				return nil
			}
			return strings.Split(s, " ")
		}
		p, err := Parse(mode, split(allow), split(deny))
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("error not ErrInvalidArgument: %v", err)
			}
			return
		}
		back, err := Parse(string(p.Mode), Rules(p.Allow), Rules(p.Deny))
		if err != nil {
			t.Fatalf("reparse of %s: %v", p, err)
		}
		if !back.Equal(p) {
			t.Fatalf("round trip: %s became %s", p, back)
		}
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var fromJSON Policy
		if err := json.Unmarshal(b, &fromJSON); err != nil || !fromJSON.Equal(p) {
			t.Fatalf("JSON round trip of %s: %s, %v", p, fromJSON, err)
		}
		for i, r := range p.Allow {
			if i > 8 {
				break
			}
			if r.Kind == KindDomain {
				if ok, _, _ := p.AllowsName(r.Name); !ok && len(p.Deny) == 0 {
					t.Fatalf("%s does not allow its own domain %s", p, r.Name)
				}
			}
		}
		p.CIDRs()
		p.Internet()
	})
}

// NAME[:PORTS]/tcp allows any TCP protocol to a domain's addresses; the
// suffix round-trips, and is refused where it means nothing.
func TestRawRules(t *testing.T) {
	for _, s := range []string{"db.example.com:5432/tcp", "*.example.com/tcp", "git.example.com:22,2222/tcp"} {
		r, err := ParseRule(s)
		if err != nil || !r.Raw || r.String() != s {
			t.Errorf("ParseRule(%q) = %+v (%q), %v", s, r, r.String(), err)
		}
	}
	for _, s := range []string{"10.0.0.0/8/tcp", "10.0.0.1:22/tcp", "@registries/tcp", "/tcp", "a.example/tcp/tcp"} {
		if r, err := ParseRule(s); err == nil {
			t.Errorf("ParseRule(%q) took it: %+v", s, r)
		}
	}
	p, err := Parse("", []string{"db.example.com:5432/tcp", "web.example.com", "*.svc.example.com:22/tcp"}, []string{"bad.svc.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		port uint16
		want bool
	}{
		{"db.example.com", 5432, true},
		{"DB.example.com.", 5432, true},
		{"db.example.com", 5433, false},
		{"web.example.com", 443, false}, // allowed, but TLS/HTTP only
		{"a.svc.example.com", 22, true},
		{"bad.svc.example.com", 22, false}, // denied
		{"other.example.com", 22, false},
	} {
		if got := p.AllowsRaw(tc.name, tc.port); got != tc.want {
			t.Errorf("AllowsRaw(%s, %d) = %v, want %v", tc.name, tc.port, got, tc.want)
		}
	}
}

// @registries keeps git over SSH to GitHub: its port 22 is raw TCP (no
// name to check), its web ports TLS and HTTP only.
func TestRegistriesSSH(t *testing.T) {
	p, err := Parse("", []string{"@registries"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p.AllowsRaw("github.com", 22) || p.AllowsRaw("github.com", 443) || p.AllowsRaw("api.github.com", 22) {
		t.Error("@registries: raw TCP should be github.com:22 alone")
	}
	if ok, ports, _ := p.AllowsName("github.com"); !ok || FormatPorts(ports) != "22,80,443" {
		t.Errorf("github.com: %v %s", ok, FormatPorts(ports))
	}
	narrowed, _ := Parse("", []string{"@registries:443"}, nil)
	if narrowed.AllowsRaw("github.com", 443) {
		t.Error("@registries:443 made github.com:443 raw")
	}
}

// Public DNS-over-HTTPS resolvers are refused under @internet and
// wildcards, unless a rule names one.
func TestDoHRefusedUnlessNamed(t *testing.T) {
	for _, tc := range []struct {
		allow []string
		name  string
		ok    bool
		named bool
	}{
		{[]string{"@internet"}, "dns.google", false, false},
		{[]string{"@internet"}, "DNS.Google.", false, false},
		{[]string{"@internet"}, "example.com", true, false},
		{[]string{"*.quad9.net"}, "dns.quad9.net", false, false},
		{[]string{"@internet", "dns.google"}, "dns.google", true, true},
		{[]string{"cloudflare-dns.com:443"}, "cloudflare-dns.com", true, true},
		{[]string{"@internet", "1.1.1.0/24"}, "one.one.one.one", false, true},
	} {
		p, err := Parse("", tc.allow, nil)
		if err != nil {
			t.Fatal(err)
		}
		ok, _, why := p.AllowsName(tc.name)
		if ok != tc.ok {
			t.Errorf("%v: %s allowed %v (%s), want %v", tc.allow, tc.name, ok, why, tc.ok)
		}
		if p.NamesDoH() != tc.named {
			t.Errorf("%v: NamesDoH %v", tc.allow, !tc.named)
		}
	}
}
