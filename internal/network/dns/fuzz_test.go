package dns

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	mdns "github.com/miekg/dns"
	"golang.org/x/time/rate"

	"github.com/nookhq/nook/internal/network/policy"
)

func FuzzCheckShape(f *testing.F) {
	for _, s := range append(legitLabels, "3f9a1c0b7d2e4a6f8b0c1d2e3f4a5b6c.tunnel.test", "www.example.com", "", "a..b", "a\\000b", "mfrggzdfmztwq2lknnwg23tpobyxe43u") {
		f.Add(s)
	}
	cfg, err := Config{Upstreams: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}}.withDefaults()
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := checkShape(name, &cfg)
		if err == nil {
			if len(name) > cfg.MaxNameLen {
				t.Fatalf("accepted %d-character name", len(name))
			}
			for l := range strings.SplitSeq(name, ".") {
				if len(l) > cfg.MaxLabelLen {
					t.Fatalf("accepted %d-character label", len(l))
				}
			}
		}
		for l := range strings.SplitSeq(name, ".") {
			why := randomLabel(l, cfg.RandomLabelLen)
			if why != "" && len(l) < cfg.RandomLabelLen {
				t.Fatalf("short label %q judged random: %s", l, why)
			}
		}
	})
}

// fakeUpstream answers with a message decoded from fuzz input.
type fakeUpstream struct{ raw []byte }

func (f fakeUpstream) exchange(ctx context.Context, name string, qtype uint16) (*mdns.Msg, error) {
	m := new(mdns.Msg)
	if err := m.Unpack(f.raw); err != nil {
		return nil, err
	}
	return m, nil
}

// FuzzHandle feeds raw packets from a sandbox, and raw upstream answers, to
// the query handler.
func FuzzHandle(f *testing.F) {
	seed := func(name string, qtype uint16, answers ...string) {
		q := new(mdns.Msg)
		q.SetQuestion(name, qtype)
		q.SetEdns0(4096, true)
		qb, err := q.Pack()
		if err != nil {
			f.Fatal(err)
		}
		a := new(mdns.Msg)
		a.SetReply(q)
		for _, s := range answers {
			a.Answer = append(a.Answer, rr(f, s))
		}
		ab, err := a.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(qb, ab)
	}
	seed("allowed.test.", mdns.TypeA, "allowed.test. 300 IN A 198.51.100.7", "allowed.test. 300 IN A 10.0.0.1")
	seed("cdn.test.", mdns.TypeA, "cdn.test. 10 IN CNAME x.other.", "x.other. 99999 IN A 203.0.113.1")
	seed("x.test.", mdns.TypeTXT, `x.test. 300 IN TXT "a"`)
	seed("x.test.", mdns.TypeAAAA, "x.test. 300 IN AAAA 2001:db8::1")
	seed("denied.example.", mdns.TypeA)
	seed("3f9a1c0b7d2e4a6f8b0c1d2e3f4a5b6c.test.", mdns.TypeA)

	f.Fuzz(func(t *testing.T, query, answer []byte) {
		req := new(mdns.Msg)
		if err := req.Unpack(query); err != nil {
			return
		}
		cfg, err := Config{Upstreams: []netip.AddrPort{netip.MustParseAddrPort("192.0.2.53:53")}}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		pol, err := policy.Parse("", []string{"*.x.test", "allowed.test:443", "@internet:80"}, []string{"bad.x.test"})
		if err != nil {
			t.Fatal(err)
		}
		var got []Resolved
		sb := &sandbox{
			id: "fz", cfg: &cfg, up: fakeUpstream{answer}, log: slog.New(slog.DiscardHandler),
			limiter: rate.NewLimiter(rate.Inf, 0), events: rate.NewLimiter(rate.Inf, 0), ctx: context.Background(),
			hooks: Hooks{OnResolved: func(ctx context.Context, id string, r Resolved) error {
				got = append(got, r)
				return nil
			}},
		}
		sb.pol.Store(&pol)
		for _, size := range []int{0, 512} {
			resp := sb.handle(context.Background(), req, size)
			if resp == nil {
				if !req.Response {
					t.Fatal("no answer to a query")
				}
				continue
			}
			b, err := resp.Pack()
			if err != nil {
				t.Fatalf("answer does not pack: %v\n%v", err, resp)
			}
			if size > 0 && len(b) > size {
				t.Fatalf("UDP answer of %d bytes, client takes %d", len(b), size)
			}
			if resp.Id != req.Id || !resp.Response {
				t.Fatal("answer header does not match the query")
			}
			for _, r := range resp.Answer {
				if r.Header().Rrtype == mdns.TypeAAAA {
					t.Fatalf("AAAA in answer: %v", resp)
				}
				if r.Header().Ttl > uint32(cfg.MaxTTL.Seconds()) {
					t.Fatalf("TTL %d over the cap", r.Header().Ttl)
				}
			}
		}
		for _, r := range got {
			if len(r.Addrs) == 0 || r.TTL < cfg.MinTTL || r.TTL > cfg.MaxTTL {
				t.Fatalf("resolved %+v", r)
			}
			for _, a := range r.Addrs {
				if !policy.IsPublic(a) {
					t.Fatalf("handed out non-public %s", a)
				}
			}
		}
	})
}
