package dns

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	mdns "github.com/miekg/dns"
)

// Config configures a Server. The zero value of each field means its
// default, listed on the field; all defaults are set in one place,
// withDefaults.
type Config struct {
	// Local are names the resolver answers itself, whatever the policy
	// (lowercase, no trailing dot): an A query gets the address, any
	// other type an empty answer. nook's metadata.nook.internal.
	Local map[string]netip.Addr
	// Upstreams are the resolvers allowed queries are forwarded to, tried
	// in order. Default: the nameservers of /etc/resolv.conf.
	Upstreams []netip.AddrPort
	// UpstreamTimeout bounds one exchange with one upstream. Default 2s.
	UpstreamTimeout time.Duration
	// QueryTimeout bounds the whole handling of one query, all upstreams
	// included. Default 5s.
	QueryTimeout time.Duration

	// MinTTL and MaxTTL clamp the lifetime of a resolved address in the
	// sandbox's allow set (the ttl passed to Hooks.OnResolved). The TTLs
	// in the answer are capped at the same value, so a sandbox never
	// caches an address longer than the kernel lets it reach the address.
	// Defaults 30s and 1h.
	MinTTL, MaxTTL time.Duration

	// QPS and Burst are a sandbox's query rate limit, a token bucket;
	// queries beyond it are REFUSED. Defaults 50 and 100.
	QPS   float64
	Burst int

	// MaxNameLen and MaxLabelLen refuse longer question names and labels.
	// Defaults 150 and 40 (DNS allows 253 and 63; tunnels use all of it).
	MaxNameLen, MaxLabelLen int
	// RandomLabelLen is the label length (separators not counted) from
	// which a label is checked for looking like encoded data. Default 20.
	RandomLabelLen int
	// NamesPerZone is how many distinct names under one zone (registrable
	// domain, e.g. example.co.uk) a sandbox may look up per minute; new
	// names beyond it are REFUSED until the minute is over. Default 100.
	NamesPerZone int
	// RareTypesPerZone is how many TXT, NULL, ANY and other uncommon
	// queries a sandbox may send per zone per minute. Default 10.
	RareTypesPerZone int
	// MaxTCPConns bounds a sandbox's concurrent TCP connections to its
	// resolver. Default 16.
	MaxTCPConns int
	// EventRate and EventBurst bound how many OnDenied events a sandbox
	// produces per second; the rest are counted in the next event's
	// Suppressed field. Defaults 10 and 50.
	EventRate  float64
	EventBurst int

	// Logger receives the server's own logs. Default: slog.Default().
	Logger *slog.Logger

	// resolvConf is where default upstreams come from (tests change it).
	resolvConf string
}

func (c Config) withDefaults() (Config, error) {
	def := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	defInt := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.UpstreamTimeout, 2*time.Second)
	def(&c.QueryTimeout, 5*time.Second)
	def(&c.MinTTL, 30*time.Second)
	def(&c.MaxTTL, time.Hour)
	if c.QPS <= 0 {
		c.QPS = 50
	}
	defInt(&c.Burst, 100)
	defInt(&c.MaxNameLen, 150)
	defInt(&c.MaxLabelLen, 40)
	defInt(&c.RandomLabelLen, 20)
	defInt(&c.NamesPerZone, 100)
	defInt(&c.RareTypesPerZone, 10)
	defInt(&c.MaxTCPConns, 16)
	if c.EventRate <= 0 {
		c.EventRate = 10
	}
	defInt(&c.EventBurst, 50)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MinTTL > c.MaxTTL {
		return c, fmt.Errorf("dns config: MinTTL %s is more than MaxTTL %s", c.MinTTL, c.MaxTTL)
	}
	if len(c.Upstreams) == 0 {
		if c.resolvConf == "" {
			c.resolvConf = "/etc/resolv.conf"
		}
		ups, err := upstreamsFromResolvConf(c.resolvConf)
		if err != nil {
			return c, err
		}
		c.Upstreams = ups
	}
	return c, nil
}

// upstreamsFromResolvConf reads the nameservers of a resolv.conf file.
func upstreamsFromResolvConf(path string) ([]netip.AddrPort, error) {
	cc, err := mdns.ClientConfigFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("dns config: no upstreams configured and %s unreadable: %w", path, err)
	}
	var out []netip.AddrPort
	for _, s := range cc.Servers {
		ap, err := netip.ParseAddrPort(net.JoinHostPort(s, cc.Port))
		if err != nil {
			return nil, fmt.Errorf("dns config: nameserver %q in %s: %w", s, path, err)
		}
		out = append(out, ap)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("dns config: no upstreams configured and no nameserver in %s", path)
	}
	return out, nil
}
