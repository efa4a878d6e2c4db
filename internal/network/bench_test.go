package network

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// BenchmarkSetupContainer measures a container sandbox's network setup:
// namespace, veth pair, addresses, routes and its nftables chain and sets
// (SetupContainer), and the first SetPolicy after it. Teardown is not
// timed. It reports the medians as setup-p50-ms and policy-p50-ms.
func BenchmarkSetupContainer(b *testing.B) {
	e := newEnv(b)
	e.m.log = slog.New(slog.DiscardHandler)
	ctx := context.Background()
	policy := Policy{Allow: []Rule{
		{Prefix: netip.MustParsePrefix("203.0.113.0/24")},
		{Prefix: netip.MustParsePrefix("198.51.100.0/24"), Ports: []PortRange{Port(443), {First: 8000, Last: 8100}}},
	}}
	var setup, pol []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("bench-%d", i)
		subnet := subnetAt(e.m.Pool().Prefix(), uint32(i%e.m.Pool().Size()))
		start := time.Now()
		if _, err := e.m.SetupContainer(ctx, id, subnet); err != nil {
			b.Fatal(err)
		}
		mid := time.Now()
		if err := e.m.SetPolicy(ctx, id, policy); err != nil {
			b.Fatal(err)
		}
		end := time.Now()
		setup, pol = append(setup, mid.Sub(start)), append(pol, end.Sub(mid))
		b.StopTimer()
		if err := e.m.Teardown(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(median(setup), "setup-p50-ms")
	b.ReportMetric(median(pol), "policy-p50-ms")
}

func median(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[len(s)/2]) / float64(time.Millisecond)
}

// BenchmarkAllowLearned measures what the resolver adds to every answer:
// one learned address (with a timeout) in the sandbox's sets.
func BenchmarkAllowLearned(b *testing.B) {
	e := newEnv(b)
	e.m.log = slog.New(slog.DiscardHandler)
	ctx := context.Background()
	e.sandbox("bench-learn")
	a := netip.MustParseAddr("203.0.113.10")
	for b.Loop() {
		if err := e.m.AllowLearned(ctx, "bench-learn", a, nil, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllowLearnedNew measures learning addresses not learned before.
func BenchmarkAllowLearnedNew(b *testing.B) {
	e := newEnv(b)
	e.m.log = slog.New(slog.DiscardHandler)
	ctx := context.Background()
	e.sandbox("bench-learn")
	for i := 0; b.Loop(); i++ {
		a := netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)})
		if err := e.m.AllowLearned(ctx, "bench-learn", a, nil, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllowLearnedAtLimit measures learning new addresses when the
// sandbox is at its LearnedLimit: each evicts the least recently learned.
func BenchmarkAllowLearnedAtLimit(b *testing.B) {
	const limit = 256
	e := newEnv(b, func(c *Config) { c.LearnedLimit = limit })
	e.m.log = slog.New(slog.DiscardHandler)
	ctx := context.Background()
	e.sandbox("bench-learn")
	for i := 0; i < limit; i++ {
		if err := e.m.AllowLearned(ctx, "bench-learn", netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), nil, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; b.Loop(); i++ {
		a := netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)})
		if err := e.m.AllowLearned(ctx, "bench-learn", a, nil, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}
