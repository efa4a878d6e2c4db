package dns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
	"golang.org/x/net/publicsuffix"

	"github.com/nookhq/nook/internal/network/policy"
)

// maxUDPReply is the largest UDP answer sent, whatever EDNS size the client
// offers (the DNS flag day 2020 value, safe from fragmentation).
const maxUDPReply = 1232

// commonTypes are the query types that are not budgeted per zone. TXT,
// NULL, ANY and everything else are: they are what tunnels use to carry
// data back.
var commonTypes = map[uint16]bool{
	mdns.TypeA: true, mdns.TypeAAAA: true, mdns.TypeCNAME: true, mdns.TypeMX: true,
	mdns.TypeSRV: true, mdns.TypeHTTPS: true, mdns.TypeSVCB: true, mdns.TypeSOA: true,
	mdns.TypeNS: true, mdns.TypeCAA: true, mdns.TypePTR: true, mdns.TypeDS: true,
	mdns.TypeDNSKEY: true,
}

// serveDNS is the miekg/dns handler of one sandbox.
func (sb *sandbox) serveDNS(w mdns.ResponseWriter, req *mdns.Msg) {
	udpSize := 0
	if _, ok := w.RemoteAddr().(*net.UDPAddr); ok {
		udpSize = mdns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			udpSize = min(max(int(opt.UDPSize()), mdns.MinMsgSize), maxUDPReply)
		}
	}
	resp := sb.handle(sb.ctx, req, udpSize)
	if resp == nil {
		return
	}
	if err := w.WriteMsg(resp); err != nil {
		sb.log.Debug("dns write answer", "err", err)
	}
}

// handle answers one query; see the package comment for the steps. udpSize
// is the largest answer the client takes over UDP, or 0 over TCP. A nil
// answer means none is sent.
func (sb *sandbox) handle(ctx context.Context, req *mdns.Msg, udpSize int) *mdns.Msg {
	if req.Response {
		return nil
	}
	if req.Opcode != mdns.OpcodeQuery {
		sb.deny("", "", ReasonMalformed, fmt.Sprintf("opcode %s is not served", opcodeString(req.Opcode)))
		return reply(req, mdns.RcodeNotImplemented, udpSize)
	}
	if len(req.Question) != 1 {
		sb.deny("", "", ReasonMalformed, fmt.Sprintf("%d questions in one query", len(req.Question)))
		return reply(req, mdns.RcodeFormatError, udpSize)
	}
	q := req.Question[0]
	name := policy.NormalizeName(q.Name)
	qtype := typeString(q.Qtype)
	if !sb.limiter.Allow() {
		sb.deny(name, qtype, ReasonRateLimit, fmt.Sprintf("more than %g queries per second (burst %d)", sb.cfg.QPS, sb.cfg.Burst))
		return reply(req, mdns.RcodeRefused, udpSize)
	}
	switch {
	case q.Qclass != mdns.ClassINET:
		sb.deny(name, qtype, ReasonMalformed, fmt.Sprintf("class %s is not served", classString(q.Qclass)))
		return reply(req, mdns.RcodeRefused, udpSize)
	case q.Qtype == mdns.TypeAXFR || q.Qtype == mdns.TypeIXFR || q.Qtype == mdns.TypeMAILA || q.Qtype == mdns.TypeMAILB || q.Qtype == mdns.TypeOPT:
		sb.deny(name, qtype, ReasonMalformed, fmt.Sprintf("query type %s is not served", qtype))
		return reply(req, mdns.RcodeRefused, udpSize)
	}
	if a, ok := sb.cfg.Local[name]; ok {
		resp := reply(req, mdns.RcodeSuccess, 0)
		if q.Qtype == mdns.TypeA {
			resp.Answer = append(resp.Answer, &mdns.A{
				Hdr: mdns.RR_Header{Name: q.Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 300},
				A:   a.AsSlice(),
			})
		}
		return finish(resp, req, udpSize)
	}
	pol := sb.pol.Load()
	if !pol.HasDomain(name) {
		if err := checkShape(name, sb.cfg); err != nil {
			sb.deny(name, qtype, ReasonTunnel, err.Error())
			return reply(req, mdns.RcodeRefused, udpSize)
		}
	}
	allowed, ports, why := pol.AllowsName(name)
	if !allowed {
		sb.deny(name, qtype, ReasonNotAllowed, why)
		return reply(req, mdns.RcodeNameError, udpSize)
	}
	if err := sb.zones.admit(time.Now(), name, !commonTypes[q.Qtype], sb.cfg); err != nil {
		sb.deny(name, qtype, ReasonZoneBudget, err.Error())
		return reply(req, mdns.RcodeRefused, udpSize)
	}
	// No IPv6; and no HTTPS or SVCB records: they carry ECH keys, which
	// would hide the TLS server name the egress proxy checks.
	if q.Qtype == mdns.TypeAAAA || q.Qtype == mdns.TypeHTTPS || q.Qtype == mdns.TypeSVCB {
		return reply(req, mdns.RcodeSuccess, udpSize)
	}

	ctx, cancel := context.WithTimeout(ctx, sb.cfg.QueryTimeout)
	defer cancel()
	up, err := sb.up.exchange(ctx, name, q.Qtype)
	if err != nil {
		if ctx.Err() != nil && sb.ctx.Err() != nil {
			return nil // the sandbox is being removed
		}
		sb.log.Warn("dns upstream query failed", "name", name, "qtype", qtype, "err", err)
		return reply(req, mdns.RcodeServerFailure, udpSize)
	}
	resp := reply(req, up.Rcode, 0)
	if up.Rcode != mdns.RcodeSuccess && up.Rcode != mdns.RcodeNameError {
		resp.Rcode = mdns.RcodeServerFailure
	}
	var addrs []netip.Addr
	var minTTL uint32
	for _, rr := range up.Answer {
		switch rr := rr.(type) {
		case *mdns.A:
			a, ok := netip.AddrFromSlice(rr.A.To4())
			if !ok {
				continue
			}
			if ok, why := pol.CheckResolved(a); !ok {
				sb.deny(name, qtype, ReasonRebinding, fmt.Sprintf("answer dropped: %s", why))
				continue
			}
			if len(addrs) == 0 || rr.Hdr.Ttl < minTTL {
				minTTL = rr.Hdr.Ttl
			}
			addrs = append(addrs, a)
			resp.Answer = append(resp.Answer, rr)
		case *mdns.CNAME, *mdns.DNAME:
			resp.Answer = append(resp.Answer, rr)
		default:
			if rr.Header().Rrtype == q.Qtype && q.Qtype != mdns.TypeAAAA {
				resp.Answer = append(resp.Answer, rr)
			}
		}
	}
	for _, rr := range up.Ns {
		if _, ok := rr.(*mdns.SOA); ok {
			resp.Ns = append(resp.Ns, rr)
		}
	}
	ttl := sb.cfg.MaxTTL
	if len(addrs) > 0 {
		ttl = min(max(time.Duration(minTTL)*time.Second, sb.cfg.MinTTL), sb.cfg.MaxTTL)
	}
	capTTL := uint32(ttl / time.Second)
	for _, rr := range append(resp.Answer[:len(resp.Answer):len(resp.Answer)], resp.Ns...) {
		if h := rr.Header(); h.Ttl > capTTL {
			h.Ttl = capTTL
		}
	}
	if len(addrs) > 0 && sb.hooks.OnResolved != nil {
		if err := sb.hooks.OnResolved(ctx, sb.id, Resolved{Name: name, Addrs: addrs, Ports: ports, TTL: ttl}); err != nil {
			if sb.ctx.Err() != nil {
				return nil
			}
			sb.log.Error("dns: dataplane refused resolved addresses", "name", name, "addrs", addrs, "err", err)
			return reply(req, mdns.RcodeServerFailure, udpSize)
		}
	}
	if sb.ctx.Err() != nil {
		return nil
	}
	return finish(resp, req, udpSize)
}

// reply returns an empty answer to req with rcode, and an OPT record if
// req had one.
func reply(req *mdns.Msg, rcode, udpSize int) *mdns.Msg {
	m := new(mdns.Msg)
	m.SetRcode(req, rcode)
	m.RecursionAvailable = true
	m.Authoritative = false
	m.AuthenticatedData = false
	m.CheckingDisabled = false
	if len(req.Question) > 1 {
		m.Question = m.Question[:1]
	}
	return finish(m, req, udpSize)
}

// finish adds EDNS and truncates an answer to what the client takes.
func finish(m, req *mdns.Msg, udpSize int) *mdns.Msg {
	m.Extra = nil
	if opt := req.IsEdns0(); opt != nil {
		m.SetEdns0(maxUDPReply, false)
	}
	m.Compress = true
	if udpSize > 0 {
		m.Truncate(udpSize)
	}
	return m
}

// deny reports a refusal through OnDenied, within the event rate limit.
func (sb *sandbox) deny(name, qtype string, reason Reason, detail string) {
	sb.log.Debug("dns query refused", "name", name, "qtype", qtype, "reason", reason, "detail", detail)
	if sb.hooks.OnDenied == nil {
		return
	}
	if !sb.events.Allow() {
		sb.suppressed.Add(1)
		return
	}
	sb.hooks.OnDenied(sb.id, Event{
		Time: time.Now(), Name: name, QType: qtype, Reason: reason, Detail: detail,
		Suppressed: int(sb.suppressed.Swap(0)),
	})
}

func typeString(t uint16) string {
	if s, ok := mdns.TypeToString[t]; ok {
		return s
	}
	return fmt.Sprintf("TYPE%d", t)
}

func classString(c uint16) string {
	if s, ok := mdns.ClassToString[c]; ok {
		return s
	}
	return fmt.Sprintf("CLASS%d", c)
}

func opcodeString(o int) string {
	if s, ok := mdns.OpcodeToString[o]; ok {
		return s
	}
	return fmt.Sprintf("OPCODE%d", o)
}

// zoneTracker counts, per zone and per one-minute window, the distinct
// names a sandbox looked up and its uncommon-type queries. Its memory is
// bounded by the sandbox's rate limit: at most one new name per query.
type zoneTracker struct {
	mu     sync.Mutex
	window time.Time
	zones  map[string]*zoneCount
}

type zoneCount struct {
	names map[string]struct{}
	rare  int
}

// zoneOf returns the registrable domain of name (example.co.uk for
// a.b.example.co.uk; each name under a public suffix such as github.io is
// its own zone), or name itself when it has none.
func zoneOf(name string) string {
	if z, err := publicsuffix.EffectiveTLDPlusOne(name); err == nil {
		return z
	}
	return name
}

// admit counts a query for name and refuses it if it goes over a budget.
func (z *zoneTracker) admit(now time.Time, name string, rare bool, cfg *Config) error {
	zone := zoneOf(name)
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.zones == nil || now.Sub(z.window) >= time.Minute || now.Before(z.window) {
		z.window = now
		z.zones = make(map[string]*zoneCount)
	}
	c := z.zones[zone]
	if c == nil {
		c = &zoneCount{names: make(map[string]struct{})}
		z.zones[zone] = c
	}
	if _, seen := c.names[name]; !seen {
		if len(c.names) >= cfg.NamesPerZone {
			return fmt.Errorf("more than %d distinct names under %s this minute (DNS tunnels use a new name per query)", cfg.NamesPerZone, zone)
		}
		c.names[name] = struct{}{}
	}
	if rare {
		if c.rare >= cfg.RareTypesPerZone {
			return fmt.Errorf("more than %d TXT, NULL, ANY or other uncommon queries under %s this minute", cfg.RareTypesPerZone, zone)
		}
		c.rare++
	}
	return nil
}
