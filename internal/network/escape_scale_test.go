package network

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// A policy whose deny list is long (a blocklist of 1200 addresses) is
// reported applied, but the kernel holds only part of it: a denied
// address stays reachable under Public.
func TestEscapeLongDenyList(t *testing.T) {
	e := newEnv(t)
	ns, _ := e.sandbox("sb-deny")
	var deny []Rule
	for i := 0; i < 1199; i++ {
		deny = append(deny, Rule{Prefix: netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(i / 128), byte(2 * (i % 128))}), 32)})
	}
	deny = append(deny, Rule{Prefix: netip.PrefixFrom(webA, 32)})
	e.setPolicy("sb-deny", Policy{Public: true, Deny: deny})
	if n := len(liveElements(t, e.m.nft(), e.m.lay.sharedSets[setDeny], IfaceName("sb-deny"))); n != len(deny) {
		t.Errorf("SetPolicy succeeded, but the kernel holds %d of %d deny elements", n, len(deny))
	}
	e.refused(ns, webA.String()+":80")
}

// A narrowing policy change (ResetLearned) for a sandbox holding 1600
// learned addresses is reported done, but most learned elements stay in
// the kernel (up to the DNS MaxTTL, an hour by default): revoked
// destinations stay reachable.
func TestEscapeResetLearnedAtScale(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	id := "sb-reset"
	ns, _ := e.sandbox(id)
	e.setPolicy(id, Policy{})
	for i := 0; i < 1599; i++ {
		a := netip.AddrFrom4([4]byte{198, 51, byte(96 + i/256), byte(i % 256)})
		if err := e.m.AllowLearned(ctx, id, a, nil, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.m.AllowLearned(ctx, id, learnIP, nil, time.Hour); err != nil {
		t.Fatal(err)
	}
	e.reach(ns, learnIP.String()+":80", "world:")
	e.setPolicy(id, Policy{ResetLearned: true})
	if n := len(liveElements(t, e.m.nft(), e.m.lay.sharedSets[setLearn], IfaceName(id))); n != 0 {
		t.Errorf("ResetLearned succeeded, but %d learned elements are still in the kernel", n)
	}
	e.refused(ns, learnIP.String()+":80")
}
