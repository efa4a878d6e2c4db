package network

import (
	"fmt"
	"math/bits"
	"net/netip"

	"github.com/nookhq/nook/internal/errdefs"
)

// SubnetBits is the size of every sandbox subnet: a /30 holds the network
// address, the gateway (the host end, .1), the sandbox (.2) and the
// broadcast address. A /31 would halve the address use, but a /30 is what
// every guest network stack configures without special cases, and the
// default pool still holds 16384 sandboxes.
const SubnetBits = 30

// DefaultPool is the address pool sandboxes draw their subnets from when the
// configuration names none.
var DefaultPool = netip.MustParsePrefix("10.89.0.0/16")

// ErrPoolExhausted is returned when every subnet of the pool is taken. It
// wraps errdefs.ErrResourceExhausted so the API edge maps it to a status code.
var ErrPoolExhausted = fmt.Errorf("network address pool exhausted: %w", errdefs.ErrResourceExhausted)

// Pool hands out sandbox subnets from an IPv4 prefix. It keeps no state of
// its own: the caller persists which sandbox holds which subnet (the daemon
// keeps it with the sandbox record) and passes the taken subnets in, so the
// allocation is deterministic and survives restarts.
type Pool struct {
	prefix netip.Prefix
}

// NewPool returns a pool over prefix, which must be an IPv4 prefix of at
// most SubnetBits bits.
func NewPool(prefix netip.Prefix) (*Pool, error) {
	if !prefix.IsValid() || !prefix.Addr().Is4() {
		return nil, errdefs.Invalid("address pool %v: not an IPv4 prefix", prefix)
	}
	if prefix.Bits() > SubnetBits {
		return nil, errdefs.Invalid("address pool %v: smaller than one /%d sandbox subnet", prefix, SubnetBits)
	}
	return &Pool{prefix: prefix.Masked()}, nil
}

// Prefix returns the pool's prefix.
func (p *Pool) Prefix() netip.Prefix { return p.prefix }

// Size returns how many sandbox subnets the pool holds.
func (p *Pool) Size() int { return 1 << (SubnetBits - p.prefix.Bits()) }

// Contains reports whether subnet is one of the pool's sandbox subnets.
func (p *Pool) Contains(subnet netip.Prefix) bool {
	return subnet.IsValid() && subnet.Bits() == SubnetBits && subnet == subnet.Masked() && p.prefix.Contains(subnet.Addr())
}

// Allocate returns the lowest subnet of the pool that is not in taken.
// Entries of taken outside the pool are ignored. When every subnet is taken
// it returns an error wrapping ErrPoolExhausted.
func (p *Pool) Allocate(taken []netip.Prefix) (netip.Prefix, error) {
	t := p.NewTaken()
	for _, s := range taken {
		t.Add(s)
	}
	return p.AllocateFrom(t)
}

// Taken is a set of a pool's subnets that an allocation's caller fills
// from its records, one bit a subnet in words of 64 (a map of them, so that
// a pool of millions of subnets costs only the words in use): no list of
// every sandbox's subnet is built and searched to choose one.
type Taken struct {
	pool  *Pool
	words map[uint32]uint64
}

// NewTaken returns an empty set of the pool's subnets.
func (p *Pool) NewTaken() *Taken {
	return &Taken{pool: p, words: map[uint32]uint64{}}
}

// Add marks subnet taken; a subnet outside the pool is ignored.
func (t *Taken) Add(subnet netip.Prefix) {
	if t.pool.Contains(subnet) {
		i := subnetIndex(t.pool.prefix, subnet)
		t.words[i/64] |= 1 << (i % 64)
	}
}

// AllocateFrom returns the lowest subnet of the pool that is not in t
// (it looks at the words up to the first with a free bit). When every
// subnet is taken it returns an error wrapping ErrPoolExhausted.
func (p *Pool) AllocateFrom(t *Taken) (netip.Prefix, error) {
	n := uint32(p.Size())
	for w := uint32(0); w*64 < n; w++ {
		if b := t.words[w]; b != ^uint64(0) {
			if i := w*64 + uint32(bits.TrailingZeros64(^b)); i < n {
				return subnetAt(p.prefix, i), nil
			}
			break
		}
	}
	return netip.Prefix{}, fmt.Errorf("all %d subnets of %v are in use: %w", n, p.prefix, ErrPoolExhausted)
}

// Gateway returns the host-side address of a sandbox subnet (.1).
func Gateway(subnet netip.Prefix) netip.Addr { return addrAdd(subnet.Masked().Addr(), 1) }

// SandboxAddr returns the sandbox-side address of a subnet (.2).
func SandboxAddr(subnet netip.Prefix) netip.Addr { return addrAdd(subnet.Masked().Addr(), 2) }

func checkSubnet(subnet netip.Prefix) error {
	if !subnet.IsValid() || !subnet.Addr().Is4() || subnet.Bits() != SubnetBits || subnet != subnet.Masked() {
		return errdefs.Invalid("sandbox subnet %v: want an IPv4 /%d network address", subnet, SubnetBits)
	}
	return nil
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func fromU32(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func addrAdd(a netip.Addr, n uint32) netip.Addr { return fromU32(u32(a) + n) }

func subnetIndex(pool, subnet netip.Prefix) uint32 {
	return (u32(subnet.Addr()) - u32(pool.Addr())) >> (32 - SubnetBits)
}

func subnetAt(pool netip.Prefix, i uint32) netip.Prefix {
	return netip.PrefixFrom(fromU32(u32(pool.Addr())+i<<(32-SubnetBits)), SubnetBits)
}

// lastAddr returns the highest address of an IPv4 prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	return fromU32(u32(p.Addr()) | (^uint32(0) >> p.Bits()))
}
