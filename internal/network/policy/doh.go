package policy

import (
	"net/netip"
	"slices"
)

// Public resolvers that answer DNS over HTTPS (and over TLS, port 853,
// which the dataplane refuses everywhere): a sandbox that reached one
// could resolve names, and carry data out in its lookups, around the
// resolver nook gives it. They stay refused, under @internet and
// wildcards too, unless a rule names one: a domain rule naming it
// exactly, or a CIDR rule holding one of its addresses.
var (
	dohNames = []string{
		"dns.google", "dns.google.com", "8888.google",
		"cloudflare-dns.com", "one.one.one.one", "1dot1dot1dot1.cloudflare-dns.com", "mozilla.cloudflare-dns.com",
		"security.cloudflare-dns.com", "family.cloudflare-dns.com", "chrome.cloudflare-dns.com",
		"dns.quad9.net", "dns9.quad9.net", "dns10.quad9.net", "dns11.quad9.net", "dns12.quad9.net",
		"doh.opendns.com", "dns.opendns.com", "doh.familyshield.opendns.com",
		"dns.adguard.com", "dns.adguard-dns.com", "unfiltered.adguard-dns.com", "family.adguard-dns.com",
		"dns.nextdns.io", "doh.cleanbrowsing.org", "doh.mullvad.net", "dns.mullvad.net", "all.dns.mullvad.net",
		"doh.dns.sb", "dns.twnic.tw", "ordns.he.net", "dns.alidns.com", "doh.pub", "doh.360.cn",
		"dns.controld.com", "freedns.controld.com", "doh.libredns.gr", "dns.switch.ch", "dns0.eu", "open.dns0.eu",
	}
	dohAddrs = []string{
		"8.8.8.8", "8.8.4.4", "1.1.1.1", "1.0.0.1", "1.1.1.2", "1.0.0.2", "1.1.1.3", "1.0.0.3",
		"9.9.9.9", "149.112.112.112", "9.9.9.10", "149.112.112.10", "9.9.9.11", "149.112.112.11",
		"208.67.222.222", "208.67.220.220", "208.67.222.123", "208.67.220.123",
		"94.140.14.14", "94.140.15.15", "94.140.14.140", "94.140.14.141",
		"185.228.168.168", "185.228.169.168", "185.228.168.9", "185.228.169.9",
		"45.90.28.0", "45.90.30.0", "194.242.2.2", "194.242.2.3", "185.222.222.222", "45.11.45.11",
		"223.5.5.5", "223.6.6.6", "1.12.12.12", "120.53.53.53", "76.76.2.0", "76.76.10.0", "193.110.81.0", "185.253.5.0",
		// cloudflare-dns.com and its browser names, doh.opendns.com
		"104.16.248.249", "104.16.249.249", "162.159.61.3", "162.159.61.4", "172.64.41.3", "172.64.41.4", "146.112.41.2", "146.112.41.3",
	}
)

// IsDoH reports whether name (normalized) is a known public DNS-over-HTTPS
// resolver.
func IsDoH(name string) bool { return slices.Contains(dohNames, name) }

// DoHAddrs are the known public DNS-over-HTTPS resolvers' IPv4 addresses.
func DoHAddrs() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(dohAddrs))
	for _, a := range dohAddrs {
		out = append(out, netip.PrefixFrom(netip.MustParseAddr(a), 32))
	}
	return out
}

// NamesDoH reports whether an allow rule names a known DNS-over-HTTPS
// resolver: a domain rule naming one exactly, or a CIDR rule holding one
// of their addresses. Then none of them is refused for being one.
func (p Policy) NamesDoH() bool {
	if p.mode() == None {
		return false
	}
	for _, r := range expand(p.Allow) {
		switch r.Kind {
		case KindDomain:
			if IsDoH(r.Name) {
				return true
			}
		case KindCIDR:
			for _, a := range DoHAddrs() {
				if r.Prefix.Contains(a.Addr()) {
					return true
				}
			}
		}
	}
	return false
}
