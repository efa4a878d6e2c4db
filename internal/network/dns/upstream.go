package dns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	mdns "github.com/miekg/dns"
)

// exchanger sends one question upstream. Tests replace it.
type exchanger interface {
	// exchange asks for name (lower case, no trailing dot) and qtype and
	// returns a response whose ID and question match the query.
	exchange(ctx context.Context, name string, qtype uint16) (*mdns.Msg, error)
}

// upstream forwards to a list of resolvers, in order, over UDP, and over
// TCP when the UDP answer is truncated.
type upstream struct {
	addrs   []netip.AddrPort
	timeout time.Duration
}

func (u *upstream) exchange(ctx context.Context, name string, qtype uint16) (*mdns.Msg, error) {
	q := new(mdns.Msg)
	q.SetQuestion(mdns.Fqdn(name), qtype)
	q.RecursionDesired = true
	q.SetEdns0(maxUDPReply, false)
	var errs []error
	for _, addr := range u.addrs {
		r, err := u.exchangeOne(ctx, q, addr)
		if err == nil {
			return r, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func (u *upstream) exchangeOne(ctx context.Context, q *mdns.Msg, addr netip.AddrPort) (*mdns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, u.timeout)
	defer cancel()
	c := &mdns.Client{Net: "udp", UDPSize: maxUDPReply, Timeout: u.timeout}
	r, _, err := c.ExchangeContext(ctx, q, addr.String())
	if err == nil && r.Truncated {
		c.Net = "tcp"
		r, _, err = c.ExchangeContext(ctx, q, addr.String())
	}
	if err != nil {
		return nil, err
	}
	if len(r.Question) != 1 || !strings.EqualFold(r.Question[0].Name, q.Question[0].Name) || r.Question[0].Qtype != q.Question[0].Qtype {
		return nil, fmt.Errorf("answer for a different question")
	}
	if r.Rcode != mdns.RcodeSuccess && r.Rcode != mdns.RcodeNameError {
		return nil, fmt.Errorf("upstream answered %s", mdns.RcodeToString[r.Rcode])
	}
	return r, nil
}
