package daemon

import (
	"net/netip"
	"testing"

	"github.com/nookhq/nook/internal/network/policy"
)

// Under @internet the kernel refuses the public DNS-over-HTTPS
// resolvers' addresses on 443, unless the policy names one.
func TestKernelPolicyRefusesDoH(t *testing.T) {
	n := &sandboxNets{}
	google := netip.MustParsePrefix("8.8.8.8/32")
	denies := func(allow ...string) bool {
		p, err := policy.Parse("", allow, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range n.kernelPolicy(p).Deny {
			if r.Prefix == google && len(r.Ports) == 1 && r.Ports[0].First == 443 && r.Ports[0].Last == 443 {
				return true
			}
		}
		return false
	}
	if !denies("@internet") {
		t.Error("@internet reaches 8.8.8.8:443")
	}
	if denies("@internet", "dns.google") || denies("@internet", "8.8.8.0/24") {
		t.Error("a policy that names a resolver still refuses it")
	}
	if denies("example.com") {
		t.Error("a policy without @internet got denies it does not need")
	}
}
