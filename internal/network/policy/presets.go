package policy

import (
	"maps"
	"slices"
)

// Preset names.
const (
	// PresetRegistries is the package registries and code hosts a build
	// needs: GitHub, Debian, PyPI, npm, the Go module proxy and crates.io.
	PresetRegistries = "registries"
	// PresetInternet is every public IPv4 address (see IsPublic) and every
	// domain name. Always-blocked and private ranges stay blocked.
	PresetInternet = "internet"
)

// webPorts are the ports registry presets open unless the user names others
// (@registries:443).
var webPorts = []PortRange{{From: 80, To: 80}, {From: 443, To: 443}}

// presets maps a preset name to its rules. A nil slice marks @internet,
// which is not a list of names but a flag (see Policy.Internet).
//
// storage.googleapis.com is deliberately absent from @registries: it serves
// every Google Cloud Storage bucket, so allowing it would let a sandbox
// upload to any bucket an attacker owns.
var presets = map[string][]Rule{
	PresetRegistries: {
		// GitHub: web, API, git over HTTPS and SSH, raw files, release assets.
		{Kind: KindDomain, Name: "github.com", Ports: webPorts},
		{Kind: KindDomain, Name: "github.com", Ports: []PortRange{{From: 22, To: 22}}, Raw: true}, // SSH: any TCP
		{Kind: KindWildcard, Name: "github.com", Ports: webPorts},
		{Kind: KindWildcard, Name: "githubusercontent.com", Ports: webPorts},
		// Debian archive (apt uses plain HTTP by default).
		{Kind: KindDomain, Name: "deb.debian.org", Ports: webPorts},
		{Kind: KindDomain, Name: "security.debian.org", Ports: webPorts},
		// PyPI.
		{Kind: KindDomain, Name: "pypi.org", Ports: webPorts},
		{Kind: KindDomain, Name: "files.pythonhosted.org", Ports: webPorts},
		// npm.
		{Kind: KindDomain, Name: "registry.npmjs.org", Ports: webPorts},
		// Go module proxy and checksum database.
		{Kind: KindDomain, Name: "proxy.golang.org", Ports: webPorts},
		{Kind: KindDomain, Name: "sum.golang.org", Ports: webPorts},
		// crates.io.
		{Kind: KindDomain, Name: "crates.io", Ports: webPorts},
		{Kind: KindDomain, Name: "static.crates.io", Ports: webPorts},
		{Kind: KindDomain, Name: "index.crates.io", Ports: webPorts},
	},
	PresetInternet: nil,
}

// PresetNames returns the known presets as users write them, sorted:
// "@internet", "@registries".
func PresetNames() []string {
	names := slices.Sorted(maps.Keys(presets))
	for i, n := range names {
		names[i] = "@" + n
	}
	return names
}

// PresetRules returns the rules a preset stands for, or nil for @internet
// and unknown names. The caller owns the result.
func PresetRules(name string) []Rule {
	rs := presets[name]
	out := make([]Rule, len(rs))
	for i, r := range rs {
		r.Ports = slices.Clone(r.Ports)
		out[i] = r
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// expand replaces preset rules by the rules they stand for. A preset written
// with ports (@registries:443) gives each of its rules those ports. The
// @internet preset is dropped: callers handle it through Policy.Internet.
func expand(rules []Rule) []Rule {
	var out []Rule
	for _, r := range rules {
		if r.Kind != KindPreset {
			out = append(out, r)
			continue
		}
		for _, pr := range PresetRules(r.Name) {
			if r.Ports != nil {
				// The user's ports: HTTP and TLS on them, as the rule's
				// name says nothing of other protocols.
				pr.Ports = slices.Clone(r.Ports)
				pr.Raw = false
			}
			out = append(out, pr)
		}
	}
	return out
}
