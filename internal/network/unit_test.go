package network

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
)

func TestPoolAllocate(t *testing.T) {
	p, err := NewPool(netip.MustParsePrefix("10.89.0.0/28"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Size() != 4 {
		t.Fatalf("size %d, want 4", p.Size())
	}
	var taken []netip.Prefix
	for _, want := range []string{"10.89.0.0/30", "10.89.0.4/30", "10.89.0.8/30", "10.89.0.12/30"} {
		got, err := p.Allocate(taken)
		if err != nil || got != netip.MustParsePrefix(want) {
			t.Fatalf("Allocate(%v) = %v, %v; want %s", taken, got, err, want)
		}
		taken = append(taken, got)
	}
	_, err = p.Allocate(taken)
	if !errors.Is(err, ErrPoolExhausted) || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("full pool: %v, want ErrPoolExhausted", err)
	}
	// A freed subnet is handed out again; foreign entries are ignored.
	got, err := p.Allocate([]netip.Prefix{taken[0], taken[2], taken[3], netip.MustParsePrefix("192.168.0.0/30")})
	if err != nil || got != taken[1] {
		t.Fatalf("Allocate with a hole = %v, %v; want %v", got, err, taken[1])
	}
	if g, a := Gateway(got), SandboxAddr(got); g.String() != "10.89.0.5" || a.String() != "10.89.0.6" {
		t.Fatalf("gateway %v, sandbox %v", g, a)
	}
	for _, bad := range []string{"10.89.0.0/31", "2001:db8::/64"} {
		if _, err := NewPool(netip.MustParsePrefix(bad)); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("NewPool(%s): %v", bad, err)
		}
	}
}

// The set of taken subnets is kept in words of 64 bits: the lowest free
// subnet is found across words, in sets of any density, as the obvious
// search finds it; a pool of 2^30 subnets costs only the words in use.
func TestPoolAllocateWords(t *testing.T) {
	p, err := NewPool(DefaultPool)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		used := map[uint32]bool{}
		var taken []netip.Prefix
		n, density := rng.IntN(600), rng.Float64()
		for i := 0; i < n; i++ {
			if rng.Float64() < density || i < 64 && round%2 == 0 {
				used[uint32(i)] = true
				taken = append(taken, subnetAt(p.prefix, uint32(i)))
			}
		}
		var want uint32
		for used[want] {
			want++
		}
		got, err := p.Allocate(taken)
		if err != nil || got != subnetAt(p.prefix, want) {
			t.Fatalf("round %d: Allocate = %v, %v; want %v", round, got, err, subnetAt(p.prefix, want))
		}
	}
	all, err := NewPool(netip.MustParsePrefix("0.0.0.0/0"))
	if err != nil {
		t.Fatal(err)
	}
	tk := all.NewTaken()
	for i := uint32(0); i < 1000; i++ {
		tk.Add(subnetAt(all.prefix, i))
	}
	if got, err := all.AllocateFrom(tk); err != nil || got != subnetAt(all.prefix, 1000) {
		t.Fatalf("a /0 pool: %v, %v; want %v", got, err, subnetAt(all.prefix, 1000))
	}
}

func TestIfaceName(t *testing.T) {
	seen := map[string]bool{}
	for i := range 1000 {
		id := string(rune('a'+i%26)) + netip.AddrFrom4([4]byte{byte(i >> 8), byte(i), 0, 1}).String()
		n := IfaceName(id)
		if len(n) > 15 || n[:2] != "nk" || n != IfaceName(id) {
			t.Fatalf("IfaceName(%q) = %q", id, n)
		}
		if seen[n] {
			t.Fatalf("collision at %q", id)
		}
		seen[n] = true
	}
}

func TestValidateID(t *testing.T) {
	for _, ok := range []string{"a", "0123abcd", "happy-otter-12ab", "x.y_z"} {
		if err := validateID(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", ".hidden", "a/b", "a b", "ä", string(make([]byte, 129))} {
		if err := validateID(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestDisjointBoxes checks on random rules that the compiled boxes are
// pairwise disjoint (the kernel refuses overlapping elements) and cover
// exactly the union of the rules.
func TestDisjointBoxes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		var rules []Rule
		for range 1 + r.IntN(6) {
			bits := 26 + r.IntN(7)
			a := netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(256))})
			var ports []PortRange
			for range 1 + r.IntN(3) {
				f := uint16(1 + r.IntN(20))
				ports = append(ports, PortRange{First: f, Last: f + uint16(r.IntN(6))})
			}
			rules = append(rules, Rule{Prefix: netip.PrefixFrom(a, bits).Masked(), Ports: ports})
		}
		_, boxes := compileRules(rules)
		for i := range boxes {
			for j := i + 1; j < len(boxes); j++ {
				a, b := boxes[i], boxes[j]
				if a.addr.lo <= b.addr.hi && b.addr.lo <= a.addr.hi && a.ports.First <= b.ports.Last && b.ports.First <= a.ports.Last {
					t.Fatalf("round %d: boxes overlap: %+v %+v", round, a, b)
				}
			}
		}
		for v := uint32(10 << 24); v < 10<<24+256; v++ {
			for port := uint16(1); port < 30; port++ {
				want := false
				for _, rl := range rules {
					if rl.Prefix.Contains(fromU32(v)) {
						for _, pr := range rl.Ports {
							want = want || pr.First <= port && port <= pr.Last
						}
					}
				}
				if got := inBoxes(boxes, v, port); got != want {
					t.Fatalf("round %d: %v:%d in boxes = %v, rules say %v", round, fromU32(v), port, got, want)
				}
			}
		}
	}
}

func TestMergeIvls(t *testing.T) {
	got := mergeIvls([]ivl{{10, 20}, {0, 5}, {21, 30}, {6, 8}, {40, 50}, {45, 46}, {0xfffffff0, 0xffffffff}, {0xffffff00, 0xfffffff5}})
	want := []ivl{{0, 8}, {10, 30}, {40, 50}, {0xffffff00, 0xffffffff}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestVerdict(t *testing.T) {
	pool := DefaultPool
	pol := func(p Policy) *compiled {
		c, err := compilePolicy(p, pool)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	pfx := netip.MustParsePrefix
	ip := netip.MustParseAddr
	now := time.Now()
	learned := map[netip.Addr]learnedEntry{
		ip("198.51.100.7"): {expires: now.Add(time.Minute)},
		ip("198.51.100.8"): {expires: now.Add(-time.Second)},
		ip("198.51.100.9"): {ports: []PortRange{Port(443)}, expires: now.Add(time.Minute)},
		ip("10.1.1.1"):     {expires: now.Add(time.Minute)},
	}
	allow := pol(Policy{
		Allow: []Rule{{Prefix: pfx("203.0.113.0/24")}, {Prefix: pfx("10.99.0.0/16"), Ports: []PortRange{Port(80)}}, {Prefix: pfx("0.0.0.0/0"), Ports: []PortRange{Port(22)}}},
		Deny:  []Rule{{Prefix: pfx("203.0.113.20/32")}},
	})
	public := pol(Policy{Public: true})
	for _, tc := range []struct {
		c     *compiled
		dst   string
		proto uint8
		port  uint16
		want  string
	}{
		{allow, "203.0.113.10", protoTCP, 80, reasonAccepted},
		{allow, "203.0.113.10", 1, 0, reasonAccepted},
		{allow, "203.0.113.20", protoTCP, 80, ReasonDenied},
		{allow, "203.0.113.10", protoUDP, 53, ReasonDNS},
		{allow, "203.0.113.10", protoTCP, 853, ReasonDNS},
		{allow, "10.99.1.1", protoTCP, 80, reasonAccepted},
		{allow, "10.99.1.1", protoTCP, 81, ReasonPrivate},
		{allow, "10.89.0.6", protoTCP, 80, ReasonSandbox},
		{allow, "169.254.169.254", protoTCP, 80, ReasonBlocked},
		{allow, "127.0.0.1", protoTCP, 22, ReasonBlocked},
		{allow, "224.0.0.1", protoUDP, 5353, ReasonBlocked},
		{allow, "8.8.8.8", protoTCP, 22, reasonAccepted},
		{allow, "8.8.8.8", protoTCP, 443, ReasonPolicy},
		{allow, "198.51.100.7", protoTCP, 443, reasonAccepted},
		{allow, "198.51.100.8", protoTCP, 443, ReasonPolicy},
		{allow, "198.51.100.9", protoTCP, 443, reasonAccepted},
		{allow, "198.51.100.9", protoTCP, 80, ReasonPolicy},
		{allow, "10.1.1.1", protoTCP, 80, ReasonPrivate},
		{public, "8.8.8.8", protoTCP, 443, reasonAccepted},
		{public, "192.168.1.1", protoTCP, 443, ReasonPrivate},
		{public, "100.64.0.1", protoTCP, 443, ReasonPrivate},
		{public, "169.254.169.254", protoTCP, 80, ReasonBlocked},
		{public, "2001:db8::1", protoTCP, 80, ReasonNotIPv4},
	} {
		if got := verdict(tc.c, pool, learned, now, ip(tc.dst), tc.proto, tc.port); got != tc.want {
			t.Errorf("%s proto %d port %d: %q, want %q", tc.dst, tc.proto, tc.port, got, tc.want)
		}
	}
}

func TestParsePacket(t *testing.T) {
	// IPv4 TCP SYN to 203.0.113.10:443.
	pkt := make([]byte, 40)
	pkt[0] = 0x45
	pkt[9] = protoTCP
	copy(pkt[12:16], []byte{10, 89, 0, 2})
	copy(pkt[16:20], []byte{203, 0, 113, 10})
	pkt[22], pkt[23] = 0x01, 0xbb
	ev, err := parsePacket(pkt)
	if err != nil || ev.Proto != "tcp" || ev.Dst != netip.MustParseAddrPort("203.0.113.10:443") {
		t.Fatalf("parsePacket = %+v, %v", ev, err)
	}
	// ICMP has no port.
	pkt[9] = 1
	if ev, _ := parsePacket(pkt); ev.Proto != "icmp" || ev.Dst.Port() != 0 {
		t.Fatalf("icmp: %+v", ev)
	}
	for _, bad := range [][]byte{nil, {0x45}, {0x60, 0, 0}, {0x10}} {
		if _, err := parsePacket(bad); err == nil {
			t.Errorf("parsePacket(%x) accepted", bad)
		}
	}
}

func FuzzParsePacket(f *testing.F) {
	f.Add([]byte{0x45, 0, 0, 40, 0, 0, 0, 0, 64, 6, 0, 0, 10, 89, 0, 2, 203, 0, 113, 10, 0, 80, 1, 187})
	f.Fuzz(func(t *testing.T, b []byte) { parsePacket(b) })
}

func TestEventLimit(t *testing.T) {
	b := newEventLimit(10)
	now := time.Now()
	passed := 0
	for range 100 {
		if ok, _ := b.take(now); ok {
			passed++
		}
	}
	if passed != 20 {
		t.Fatalf("burst passed %d, want 20", passed)
	}
	ok, suppressed := b.take(now.Add(time.Second))
	if !ok || suppressed != 80 {
		t.Fatalf("after a second: %v, suppressed %d; want true, 80", ok, suppressed)
	}
}
