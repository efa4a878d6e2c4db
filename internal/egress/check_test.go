package egress

import (
	"net/netip"
	"testing"

	"github.com/nookhq/nook/internal/network/policy"
)

// Open agrees with the kernel's order: always blocked, deny, allow
// (private ranges only by an allow rule), @internet (but not public
// DNS-over-HTTPS resolvers unless named).
func TestPolicyCheckerOpen(t *testing.T) {
	for _, tc := range []struct {
		allow, deny []string
		dst         string
		open        bool
	}{
		{[]string{"@internet"}, nil, "93.184.216.34:443", true},
		{[]string{"@internet"}, nil, "127.0.0.1:443", false},
		{[]string{"@internet"}, nil, "10.1.2.3:443", false},
		{[]string{"@internet"}, nil, "8.8.8.8:443", false},
		{[]string{"@internet", "dns.google"}, nil, "8.8.8.8:443", true},
		{[]string{"@internet"}, []string{"93.184.216.0/24"}, "93.184.216.34:443", false},
		{[]string{"10.0.0.0/8"}, nil, "10.1.2.3:443", true},
		{[]string{"10.0.0.0/8:80"}, nil, "10.1.2.3:443", false},
		{[]string{"example.com"}, nil, "93.184.216.34:443", false},
	} {
		p, err := policy.Parse("", tc.allow, tc.deny)
		if err != nil {
			t.Fatal(err)
		}
		c := &PolicyChecker{Policy: func() (policy.Policy, bool) { return p, true }, Names: NewNames(10)}
		if got := c.Open(netip.MustParseAddrPort(tc.dst)); got != tc.open {
			t.Errorf("allow %v deny %v: Open(%s) = %v", tc.allow, tc.deny, tc.dst, got)
		}
	}
}
