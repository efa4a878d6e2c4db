package network

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The nftables layout. Everything lives in one table, "inet nook", that
// nook owns; see the package documentation for the rule order.
const (
	tableName = "nook"

	chainForward     = "forward"
	chainInput       = "input"
	chainPostrouting = "postrouting"
	chainPrerouting  = "prerouting" // nat: the metadata address to the sandbox's own gateway
	chainAdmit       = "admit"      // every accepted new connection: the conntrack limit
	chainSandbox     = "sandbox"    // every packet a sandbox forwards: its policy
	denyChainPrefix  = "deny-"

	setPool     = "pool"     // ipv4_addr interval: the sandbox pool
	setBlocked  = "blocked"  // ipv4_addr interval: always blocked
	setPrivate  = "private"  // ipv4_addr interval: private ranges
	setDNSPorts = "dnsports" // inet_proto . inet_service: DNS, DoT
	setIfaces   = "ifaces"   // ifname: every sandbox interface
	setDNS      = "dns"      // ifname . ipv4_addr . inet_proto . inet_service: own resolver

	// The policy sets, shared by every sandbox and keyed by its
	// interface: setting up, changing or removing a sandbox only adds and
	// deletes elements, so a commit never revalidates the table (which a
	// chain per sandbox, reached through a verdict map, cost: linear in
	// the sandboxes alive).
	setSrc         = "src"       // ifname . ipv4_addr: the sandbox's own address
	setAllow       = "allow"     // ifname . ipv4_addr interval
	setAllowPorts  = "allowp"    // ifname . ipv4_addr . inet_proto . inet_service interval
	setDeny        = "deny"      // ifname . ipv4_addr interval
	setDenyPorts   = "denyp"     // ifname . ipv4_addr . inet_proto . inet_service interval
	setLearn       = "learn"     // ifname . ipv4_addr, timeout
	setLearnPorts  = "learnp"    // ifname . ipv4_addr . inet_proto . inet_service, timeout
	setPublic      = "public"    // ifname: sandboxes whose policy is public
	setIntercept   = "intercept" // ifname: sandboxes whose TCP to ports 80 and 443 goes to their egress proxy
	legacySetFwd   = "fwd"       // nook before 2026-11-25: ifname : verdict, goto the sandbox chain
	legacyChainPfx = "sb-"       // nook before 2026-11-25: a chain per sandbox, with its own sets

	// Dynamic sets the kernel fills itself, one element per sandbox
	// interface, so setting up a sandbox writes nothing to them.
	setConnPrefix = "conn-" // ifname, ct count: "conn-<limit>"
	setLogPrefix  = "log-"  // ifname, limit rate: "log-<reason>"
	// dynSetSize bounds the dynamic sets; more interfaces than the pool
	// can hold sandboxes (16384 for a /16) never reach them.
	dynSetSize = 65535
	// logIdle is how long a sandbox's log rate limiter lives after its
	// last denial.
	logIdle = time.Minute

	// logPrefix starts every log prefix nook's rules write.
	logPrefix = "nook:"
)

var (
	typeProtoPort  = nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	typeIfDNS      = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)
	typeIfAddr     = nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)
	typeIfAddrPort = typeIfDNS

	// policySets are the sets keyed by a sandbox's interface, in the order
	// they are filled and emptied.
	policySets = []string{setIfaces, setSrc, setDNS, setDeny, setDenyPorts, setAllow, setAllowPorts, setLearn, setLearnPorts, setPublic, setIntercept}

	denyReasons = []string{ReasonSandbox, ReasonBlocked, ReasonDNS, ReasonDenied, ReasonPrivate, ReasonPolicy, ReasonHost, ReasonInbound, ReasonNotIPv4, ReasonConntrack, ReasonQUIC}
)

// Register numbers: 1 is the 16-byte register that also holds the 32-bit
// registers 8..11; concatenations fill 32-bit registers in order.
const (
	reg1    = 1
	reg32_1 = 9
	reg32_2 = 10
	reg32_4 = 12
	reg32_5 = 13
	reg32_6 = 14
)

// layout names the table's objects; it holds no kernel state.
type layout struct {
	table      *nftables.Table
	logGroup   uint16
	logRate    uint64
	connLimit  uint32
	pool       netip.Prefix
	sharedSets map[string]*nftables.Set
	// connSet counts each sandbox's tracked connections; logSets limit
	// each sandbox's log messages, per deny reason.
	connSet *nftables.Set
	logSets map[string]*nftables.Set
	// updatesTimeout: the kernel gives an element added again with
	// another timeout that timeout, counted from now (probeTimeoutUpdate).
	updatesTimeout bool
}

func newLayout(pool netip.Prefix, logGroup uint16, logRate uint64, connLimit uint32) *layout {
	t := &nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}
	l := &layout{table: t, logGroup: logGroup, logRate: logRate, connLimit: connLimit, pool: pool}
	// The limit is in the name: an element keeps the limit it was made
	// with, so a new limit needs a new set (installBase removes the old).
	l.connSet = &nftables.Set{Table: t, Name: fmt.Sprintf("%s%d", setConnPrefix, connLimit), KeyType: nftables.TypeIFName,
		KeyByteOrder: binaryutil.NativeEndian, Dynamic: true, Size: dynSetSize}
	l.logSets = map[string]*nftables.Set{}
	for _, r := range denyReasons {
		l.logSets[r] = &nftables.Set{Table: t, Name: setLogPrefix + r, KeyType: nftables.TypeIFName,
			KeyByteOrder: binaryutil.NativeEndian, Dynamic: true, HasTimeout: true, Size: dynSetSize}
	}
	l.sharedSets = map[string]*nftables.Set{
		setPool:       {Table: t, Name: setPool, KeyType: nftables.TypeIPAddr, Interval: true},
		setBlocked:    {Table: t, Name: setBlocked, KeyType: nftables.TypeIPAddr, Interval: true},
		setPrivate:    {Table: t, Name: setPrivate, KeyType: nftables.TypeIPAddr, Interval: true},
		setDNSPorts:   {Table: t, Name: setDNSPorts, KeyType: typeProtoPort, Concatenation: true},
		setIfaces:     {Table: t, Name: setIfaces, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian},
		setDNS:        {Table: t, Name: setDNS, KeyType: typeIfDNS, Concatenation: true},
		setSrc:        {Table: t, Name: setSrc, KeyType: typeIfAddr, Concatenation: true},
		setAllow:      {Table: t, Name: setAllow, KeyType: typeIfAddr, Interval: true, Concatenation: true},
		setAllowPorts: {Table: t, Name: setAllowPorts, KeyType: typeIfAddrPort, Interval: true, Concatenation: true},
		setDeny:       {Table: t, Name: setDeny, KeyType: typeIfAddr, Interval: true, Concatenation: true},
		setDenyPorts:  {Table: t, Name: setDenyPorts, KeyType: typeIfAddrPort, Interval: true, Concatenation: true},
		setLearn:      {Table: t, Name: setLearn, KeyType: typeIfAddr, Concatenation: true, HasTimeout: true},
		setLearnPorts: {Table: t, Name: setLearnPorts, KeyType: typeIfAddrPort, Concatenation: true, HasTimeout: true},
		setPublic:     {Table: t, Name: setPublic, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian},
		setIntercept:  {Table: t, Name: setIntercept, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian},
	}
	return l
}

func (l *layout) chain(name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: l.table}
}

func (l *layout) baseChain(name string, hook *nftables.ChainHook, prio *nftables.ChainPriority, typ nftables.ChainType) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{Name: name, Table: l.table, Hooknum: hook, Priority: prio, Type: typ, Policy: &accept}
}

// installBase queues the table, base chains, deny chains and shared sets.
// It is idempotent: existing objects are kept, chains are flushed and
// refilled, and the sandboxes' elements of the shared sets are left
// alone. existing are the table's sets and chains now: connection-count
// sets of another limit go, and so does what an earlier nook kept per
// sandbox (a chain and sets each, and the verdict map leading to them);
// the daemon adopts those sandboxes into the shared sets.
func (l *layout) installBase(c *nftables.Conn, existing []*nftables.Set, chains []*nftables.Chain) error {
	c.AddTable(l.table)
	fwd := c.AddChain(l.baseChain(chainForward, nftables.ChainHookForward, nftables.ChainPriorityFilter, nftables.ChainTypeFilter))
	in := c.AddChain(l.baseChain(chainInput, nftables.ChainHookInput, nftables.ChainPriorityFilter, nftables.ChainTypeFilter))
	post := c.AddChain(l.baseChain(chainPostrouting, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource, nftables.ChainTypeNAT))
	pre := c.AddChain(l.baseChain(chainPrerouting, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest, nftables.ChainTypeNAT))
	for _, ch := range []*nftables.Chain{fwd, in, post, pre} {
		c.FlushChain(ch)
	}
	for _, name := range append([]string{setPool, setBlocked, setPrivate, setDNSPorts}, policySets...) {
		if err := c.AddSet(l.sharedSets[name], nil); err != nil {
			return fmt.Errorf("add set %s: %w", name, err)
		}
	}
	fill := map[string][]nftables.SetElement{
		setPool:    ivlElements([]ivl{prefixIvl(l.pool)}),
		setBlocked: ivlElements(prefixIvls(alwaysBlocked)),
		setPrivate: ivlElements(prefixIvls(privateRanges)),
	}
	for _, p := range []uint8{protoTCP, protoUDP} {
		for _, port := range dnsPorts {
			fill[setDNSPorts] = append(fill[setDNSPorts], nftables.SetElement{Key: cat(protoKey(p), portKey(port))})
		}
	}
	for _, name := range []string{setPool, setBlocked, setPrivate, setDNSPorts} {
		s := l.sharedSets[name]
		c.FlushSet(s)
		if err := addElements(c, s, fill[name]); err != nil {
			return fmt.Errorf("fill set %s: %w", name, err)
		}
	}
	for _, r := range denyReasons {
		ch := c.AddChain(l.chain(denyChainPrefix + r))
		c.FlushChain(ch)
		// Log at most logRate a second per sandbox and reason: the limit
		// lives in an element of the reason's set keyed by the sandbox's
		// interface, which the kernel makes on the sandbox's first denial
		// and drops logIdle after its last. One sandbox's flood uses up
		// only its own limit.
		ls := l.logSets[r]
		if err := c.AddSet(ls, nil); err != nil {
			return fmt.Errorf("add set %s: %w", ls.Name, err)
		}
		c.FlushSet(ls)
		key := expr.MetaKeyIIFNAME
		if r == ReasonInbound {
			key = expr.MetaKeyOIFNAME // the sandbox is where it was going
		}
		c.AddRule(&nftables.Rule{Table: l.table, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: key, Register: reg1},
			&expr.Dynset{SrcRegKey: reg1, SetName: ls.Name, SetID: ls.ID, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: logIdle,
				Exprs: []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: l.logRate, Unit: expr.LimitTimeSecond, Burst: uint32(2 * l.logRate)}}},
			&expr.Log{
				Key:     1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX | 1<<unix.NFTA_LOG_SNAPLEN | 1<<unix.NFTA_LOG_QTHRESHOLD,
				Group:   l.logGroup,
				Snaplen: 80,
				// Deliver each message at once instead of batching up to
				// 100 or a second.
				QThreshold: 1,
				Data:       []byte(logPrefix + r),
			},
		}})
		// TCP gets a reset, everything else "administratively prohibited":
		// both fail a connection at once, and resets escape the kernel's
		// ICMP rate limit.
		c.AddRule(&nftables.Rule{Table: l.table, Chain: ch, Exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{protoTCP}},
			&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
		}})
		c.AddRule(&nftables.Rule{Table: l.table, Chain: ch, Exprs: []expr.Any{
			&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED},
		}})
	}

	// admit: every new connection a sandbox may open passes here, and is
	// refused when the sandbox already has connLimit tracked connections.
	// The count lives in an element of connSet keyed by the sandbox's
	// interface (the kernel makes it, and drops it when the count is 0).
	if err := c.AddSet(l.connSet, nil); err != nil {
		return fmt.Errorf("add set %s: %w", l.connSet.Name, err)
	}
	admit := c.AddChain(l.chain(chainAdmit))
	c.FlushChain(admit)
	c.AddRule(&nftables.Rule{Table: l.table, Chain: admit, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Dynset{SrcRegKey: reg1, SetName: l.connSet.Name, SetID: l.connSet.ID, Operation: unix.NFT_DYNSET_OP_ADD,
			Exprs: []expr.Any{&expr.Connlimit{Count: l.connLimit, Flags: expr.NFT_CONNLIMIT_F_INV}}},
		gotoChain(denyChainPrefix + ReasonConntrack),
	}})
	c.AddRule(&nftables.Rule{Table: l.table, Chain: admit, Exprs: accept()})
	for _, s := range existing {
		if strings.HasPrefix(s.Name, setConnPrefix) && s.Name != l.connSet.Name {
			c.DelSet(s) // its only rule went with the flush of admit
		}
	}

	sbChain := c.AddChain(l.chain(chainSandbox))
	c.FlushChain(sbChain)
	ifaces, dns, pool := l.sharedSets[setIfaces], l.sharedSets[setDNS], l.sharedSets[setPool]
	rules := []struct {
		ch    *nftables.Chain
		exprs []expr.Any
	}{
		// forward: replies, then every sandbox's packets to the sandbox
		// chain, then refuse new connections into any sandbox.
		{fwd, cat(ctStateIn(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept())},
		{fwd, cat(metaIn(expr.MetaKeyIIFNAME, ifaces), ctStateIn(expr.CtStateBitINVALID), drop())},
		{fwd, cat(metaIn(expr.MetaKeyIIFNAME, ifaces), []expr.Any{gotoChain(chainSandbox)})},
		// A pool address from an interface not registered (yet, or any
		// more): a sandbox's link between its address and its elements.
		{fwd, cat(ipv4Only(), saddrInSet(pool), drop())},
		{fwd, cat(metaIn(expr.MetaKeyOIFNAME, ifaces), denyTo(ReasonInbound))},
		// input: replies to connections the host opened, the sandbox's own
		// resolver, and nothing else from a sandbox interface.
		{in, cat(ctStateIn(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), accept())},
		// The metadata and egress ports, into the daemon's own (marked)
		// sockets only.
		{in, markedOnly(ifaces, MetadataPort)},
		{in, markedOnly(ifaces, EgressPort)},
		{in, cat(ipv4Only(), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
			daddr(reg32_4),
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32_5},
			dport(reg32_6),
			&expr.Lookup{SourceRegister: reg1, SetName: dns.Name, SetID: dns.ID},
		}, admitted())},
		{in, cat(metaIn(expr.MetaKeyIIFNAME, ifaces), denyTo(ReasonHost))},
		{in, cat(ipv4Only(), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: ifnameKey("lo")}, // the host to its own gateway addresses
		}, saddrInSet(pool), drop())},
		// postrouting: masquerade the pool when it leaves by a non-sandbox
		// interface.
		{post, cat(ipv4Only(), saddrIn(l.pool), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: reg1},
			&expr.Lookup{SourceRegister: reg1, SetName: ifaces.Name, SetID: ifaces.ID, Invert: true},
			&expr.Masq{},
		})},
	}
	for _, r := range rules {
		c.AddRule(&nftables.Rule{Table: l.table, Chain: r.ch, Exprs: r.exprs})
	}
	for _, r := range l.sandboxRules(sbChain) {
		c.AddRule(r)
	}
	// prerouting: the metadata address, and intercepted TCP and domain
	// rules' TCP to the sandbox's egress proxy (the gateway's own ports;
	// the input rules admit them through the sandbox's elements of the
	// dns set).
	for _, r := range l.preroutingRules(pre) {
		c.AddRule(r)
	}
	l.removeLegacy(c, existing, chains)
	return nil
}

// removeLegacy queues the removal of what nook kept per sandbox before
// the shared policy sets: the verdict map, the chains it led to and their
// sets (named after the interface). The forward chain that used the map
// was flushed earlier in the same batch.
func (l *layout) removeLegacy(c *nftables.Conn, sets []*nftables.Set, chains []*nftables.Chain) {
	for _, s := range sets {
		if s.Name == legacySetFwd {
			c.DelSet(s)
		}
	}
	for _, ch := range chains {
		if ch.Table.Name == tableName && strings.HasPrefix(ch.Name, legacyChainPfx) {
			c.FlushChain(ch)
			c.DelChain(ch)
		}
	}
	for _, s := range sets {
		if iface, _, ok := strings.Cut(s.Name, "-"); ok && strings.HasPrefix(iface, ifacePrefix) {
			c.DelSet(s)
		}
	}
}

// sandboxRules is the chain every sandbox's forwarded packets go through;
// see the package docs. It never changes: a sandbox lives in the sets
// alone, as elements keyed by its interface.
func lookupAddr(s *nftables.Set) []expr.Any {
	return []expr.Any{daddr(reg1), &expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID}}
}

// lookupIfAddr matches interface . destination in s: the interface fills
// register 1 (16 bytes, the 32-bit registers 8 to 11); the fields after it
// go to 12, 13 and 14.
func lookupIfAddr(s *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		daddr(reg32_4),
		&expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID},
	}
}

// lookupIfAddrPort matches interface . destination . protocol . port in s.
func lookupIfAddrPort(s *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		daddr(reg32_4),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg32_5},
		dport(reg32_6),
		&expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID},
	}
}

// markedOnly refuses a sandbox's TCP to port unless the socket it reaches
// carries the daemon's mark (gatewayMark).
func markedOnly(ifaces *nftables.Set, port uint16) []expr.Any {
	return cat(metaIn(expr.MetaKeyIIFNAME, ifaces), isTCP(), []expr.Any{
		dport(reg1),
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binary.BigEndian.AppendUint16(nil, port)},
		&expr.Socket{Key: expr.SocketKeyMark, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: binary.NativeEndian.AppendUint32(nil, gatewayMark)},
	}, denyTo(ReasonHost))
}

// isQUIC matches UDP to port 443.
func isQUIC() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{protoUDP}},
		dport(reg1),
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binary.BigEndian.AppendUint16(nil, 443)},
	}
}

func isTCP() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{protoTCP}},
	}
}

// redirectTo sends the packet to port of the incoming interface's own
// address (a sandbox's gateway).
func redirectTo(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: reg1, Data: binary.BigEndian.AppendUint16(nil, port)},
		&expr.Redir{RegisterProtoMin: reg1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

// preroutingRules are the nat prerouting chain's: the metadata address
// to the sandbox's gateway; for a sandbox whose policy intercepts, every
// new TCP connection to port 80 or 443 that a CIDR rule or @internet
// admits to its egress proxy (the forward chain would admit it; what the
// forward chain refuses is not redirected); and every new TCP connection
// to a DNS-learned address (a domain rule's), unless a CIDR rule,
// @internet or a deny rule decides it, to the egress proxy too. The
// proxy, on the sandbox's gateway, checks the name the connection asks
// for (internal/egress). What the chain accepts goes on unchanged to the
// forward chain.
func (l *layout) preroutingRules(ch *nftables.Chain) []*nftables.Rule {
	set := func(name string) *nftables.Set { return l.sharedSets[name] }
	dnsPortSet := set(setDNSPorts)
	exprs := [][]expr.Any{
		cat(metaIn(expr.MetaKeyIIFNAME, set(setIfaces)), ipv4Only(), []expr.Any{
			daddr(reg1),
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: addrKey(MetadataAddr)},
		}, isTCP(), []expr.Any{
			dport(reg1),
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binary.BigEndian.AppendUint16(nil, 80)},
		}, redirectTo(MetadataPort)),
		// What the forward chain refuses whatever was learned or
		// intercepted: DNS to anywhere but the gateway, other sandboxes,
		// the always-blocked ranges, and what a deny rule names.
		cat(ipv4Only(), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			dport(reg32_1),
			&expr.Lookup{SourceRegister: reg1, SetName: dnsPortSet.Name, SetID: dnsPortSet.ID},
		}, accept()),
		cat(ipv4Only(), lookupAddr(set(setPool)), accept()),
		cat(ipv4Only(), lookupAddr(set(setBlocked)), accept()),
		cat(ipv4Only(), lookupIfAddr(set(setDeny)), accept()),
		cat(ipv4Only(), lookupIfAddrPort(set(setDenyPorts)), accept()),
	}
	// Intercepted: what a CIDR rule admits (a private address too), then,
	// past the private ranges (the forward chain refuses those no allow
	// rule names), what @internet admits.
	exprs = append(exprs, l.intercepted(lookupIfAddr(set(setAllow)))...)
	exprs = append(exprs, l.intercepted(lookupIfAddrPort(set(setAllowPorts)))...)
	exprs = append(exprs, cat(ipv4Only(), lookupAddr(set(setPrivate)), accept()))
	exprs = append(exprs, l.intercepted(metaIn(expr.MetaKeyIIFNAME, set(setPublic)))...)
	exprs = append(exprs,
		cat(metaIn(expr.MetaKeyIIFNAME, set(setPublic)), accept()),
		cat(ipv4Only(), lookupIfAddr(set(setAllow)), accept()),
		cat(ipv4Only(), lookupIfAddrPort(set(setAllowPorts)), accept()),
		cat(ipv4Only(), isTCP(), lookupIfAddr(set(setLearn)), redirectTo(EgressPort)),
		cat(ipv4Only(), isTCP(), lookupIfAddrPort(set(setLearnPorts)), redirectTo(EgressPort)),
	)
	rules := make([]*nftables.Rule, len(exprs))
	for i, e := range exprs {
		rules[i] = &nftables.Rule{Table: l.table, Chain: ch, Exprs: e}
	}
	return rules
}

// interceptPorts are the TCP ports an intercepting policy sends to the
// sandbox's egress proxy.
var interceptPorts = []uint16{80, 443}

// intercepted returns the rules, one per port of interceptPorts, that
// redirect a new TCP connection from a sandbox in the intercept set to
// that port to the sandbox's egress proxy, when the connection also
// matches every expression list of also.
func (l *layout) intercepted(also ...[]expr.Any) [][]expr.Any {
	var out [][]expr.Any
	for _, port := range interceptPorts {
		out = append(out, cat(
			metaIn(expr.MetaKeyIIFNAME, l.sharedSets[setIntercept]), ipv4Only(), isTCP(),
			[]expr.Any{
				dport(reg1),
				&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binary.BigEndian.AppendUint16(nil, port)},
			},
			cat(also...),
			redirectTo(EgressPort),
		))
	}
	return out
}

func (l *layout) sandboxRules(ch *nftables.Chain) []*nftables.Rule {
	set := func(name string) *nftables.Set { return l.sharedSets[name] }
	src := set(setSrc)
	dnsPortSet := set(setDNSPorts)
	exprs := [][]expr.Any{
		{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{unix.NFPROTO_IPV4}}, gotoChain(denyChainPrefix + ReasonNotIPv4)},
		// Only the sandbox's own address may send: no spoofing another
		// sandbox or an address the masquerade would not rewrite.
		{
			&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
			&expr.Payload{DestRegister: reg32_4, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Lookup{SourceRegister: reg1, SetName: src.Name, SetID: src.ID, Invert: true},
			&expr.Verdict{Kind: expr.VerdictDrop},
		},
		cat(lookupAddr(set(setPool)), denyTo(ReasonSandbox)),
		cat(lookupAddr(set(setBlocked)), denyTo(ReasonBlocked)),
		{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			dport(reg32_1),
			&expr.Lookup{SourceRegister: reg1, SetName: dnsPortSet.Name, SetID: dnsPortSet.ID},
			gotoChain(denyChainPrefix + ReasonDNS),
		},
		cat(lookupIfAddr(set(setDeny)), denyTo(ReasonDenied)),
		cat(lookupIfAddrPort(set(setDenyPorts)), denyTo(ReasonDenied)),
		cat(lookupIfAddr(set(setAllow)), admitted()),
		cat(lookupIfAddrPort(set(setAllowPorts)), admitted()),
		cat(lookupAddr(set(setPrivate)), denyTo(ReasonPrivate)),
		cat(metaIn(expr.MetaKeyIIFNAME, set(setPublic)), admitted()),
		// QUIC to a domain rule's address: its name is encrypted; refused
		// at once so that clients fall back to TCP, where it is checked.
		cat(isQUIC(), lookupIfAddr(set(setLearn)), denyTo(ReasonQUIC)),
		cat(isQUIC(), lookupIfAddrPort(set(setLearnPorts)), denyTo(ReasonQUIC)),
		cat(lookupIfAddr(set(setLearn)), admitted()),
		cat(lookupIfAddrPort(set(setLearnPorts)), admitted()),
		denyTo(ReasonPolicy),
	}
	rules := make([]*nftables.Rule, len(exprs))
	for i, e := range exprs {
		rules[i] = &nftables.Rule{Table: l.table, Chain: ch, Exprs: e}
	}
	return rules
}

// baseElements are a sandbox's elements whatever its policy: its
// interface, its address and its resolver.
func baseElements(iface string, subnet netip.Prefix) map[string][]nftables.SetElement {
	name := ifnameKey(iface)
	gw := Gateway(subnet)
	out := map[string][]nftables.SetElement{
		setIfaces: {{Key: name}},
		setSrc:    {{Key: cat(name, addrKey(SandboxAddr(subnet)))}},
	}
	for _, p := range []uint8{protoTCP, protoUDP} {
		out[setDNS] = append(out[setDNS], nftables.SetElement{Key: cat(name, addrKey(gw), protoKey(p), portKey(53))})
	}
	for _, port := range []uint16{MetadataPort, EgressPort} {
		out[setDNS] = append(out[setDNS], nftables.SetElement{Key: cat(name, addrKey(gw), protoKey(protoTCP), portKey(port))})
	}
	return out
}

// policyElements are the elements a compiled policy gives a sandbox's
// interface in the static policy sets.
func policyElements(iface string, p *compiled) map[string][]nftables.SetElement {
	name := ifnameKey(iface)
	out := map[string][]nftables.SetElement{
		setAllow:      ifIvlElements(name, p.allowAny),
		setAllowPorts: ifBoxElements(name, p.allowPort),
		setDeny:       ifIvlElements(name, p.denyAny),
		setDenyPorts:  ifBoxElements(name, p.denyPort),
	}
	if p.public {
		out[setPublic] = []nftables.SetElement{{Key: name}}
	}
	if p.intercept {
		out[setIntercept] = []nftables.SetElement{{Key: name}}
	}
	return out
}

func (l *layout) addAll(c *nftables.Conn, elems map[string][]nftables.SetElement) error {
	for _, name := range policySets {
		if es := elems[name]; len(es) > 0 {
			if err := addElements(c, l.sharedSets[name], es); err != nil {
				return fmt.Errorf("add to set %s: %w", name, err)
			}
		}
	}
	return nil
}

// removeAll queues the removal of elements that may or may not be in the
// kernel: each is added (a no-op if it is there) and deleted, so the
// batch succeeds either way. Elements of timeout sets are added with a
// timeout of a millisecond, so that one the kernel has let expire meanwhile
// is not made to live on; a kernel that updates timeouts needs no delete
// (the element expires within a jiffy, without the RCU grace period a
// delete costs the commit).
func (l *layout) removeAll(c *nftables.Conn, elems map[string][]nftables.SetElement) error {
	for _, name := range policySets {
		es := elems[name]
		if len(es) == 0 {
			continue
		}
		s := l.sharedSets[name]
		add := make([]nftables.SetElement, len(es))
		for i, e := range es {
			add[i] = nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd}
			if s.HasTimeout {
				add[i].Timeout = time.Millisecond
			}
		}
		if err := addElements(c, s, add); err != nil {
			return fmt.Errorf("remove from set %s: %w", name, err)
		}
		if s.HasTimeout && l.updatesTimeout {
			continue
		}
		del := make([]nftables.SetElement, len(es))
		for i, e := range es {
			del[i] = nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd}
		}
		if err := deleteElements(c, s, del); err != nil {
			return fmt.Errorf("remove from set %s: %w", name, err)
		}
	}
	return nil
}

// applyPolicy queues the atomic replacement of a sandbox's static policy
// elements: old's (what the kernel holds) go, p's come.
func (l *layout) applyPolicy(c *nftables.Conn, iface string, old, p *compiled) error {
	prev, next := policyElements(iface, old), policyElements(iface, p)
	for _, name := range policySets {
		s := l.sharedSets[name]
		if len(prev[name]) > 0 {
			if err := deleteElements(c, s, prev[name]); err != nil {
				return fmt.Errorf("replace set %s: %w", name, err)
			}
		}
		if len(next[name]) > 0 {
			if err := addElements(c, s, next[name]); err != nil {
				return fmt.Errorf("replace set %s: %w", name, err)
			}
		}
	}
	return nil
}

// learnKeys returns the set and keys that let a sandbox reach addr on
// ports (every port when empty).
func (l *layout) learnKeys(iface string, addr netip.Addr, ports []PortRange) (*nftables.Set, [][]byte) {
	name := ifnameKey(iface)
	if len(ports) == 0 {
		return l.sharedSets[setLearn], [][]byte{cat(name, addrKey(addr))}
	}
	var keys [][]byte
	for _, pr := range ports {
		for p := uint32(pr.First); p <= uint32(pr.Last); p++ {
			for _, proto := range []uint8{protoTCP, protoUDP} {
				keys = append(keys, cat(name, addrKey(addr), protoKey(proto), portKey(uint16(p))))
			}
		}
	}
	return l.sharedSets[setLearnPorts], keys
}

// learnedElements are the elements the kernel may hold for a sandbox's
// learned addresses.
func (l *layout) learnedElements(iface string, learned map[netip.Addr]learnedEntry) map[string][]nftables.SetElement {
	out := map[string][]nftables.SetElement{}
	for addr, e := range learned {
		var groups [][]PortRange
		if e.kall {
			groups = append(groups, nil)
		}
		if len(e.kports) > 0 {
			groups = append(groups, e.kports)
		}
		for _, ports := range groups {
			s, keys := l.learnKeys(iface, addr, ports)
			for _, k := range keys {
				out[s.Name] = append(out[s.Name], nftables.SetElement{Key: k})
			}
		}
	}
	return out
}

// learn queues a DNS-learned address with a timeout. With refresh (the
// kernel may hold it already) the element is added, deleted and added
// again so that an existing element gets the new timeout and a missing
// one does not fail the delete; that costs the commit an RCU grace period
// (milliseconds), so a new element is only added. (A kernel that updates
// timeouts, see probeTimeoutUpdate, renews an element's expiry only when
// its timeout changes, or when told the expiry, which google/nftables
// cannot send.)
func (l *layout) learn(c *nftables.Conn, iface string, addr netip.Addr, ports []PortRange, ttl time.Duration, refresh bool) error {
	s, keys := l.learnKeys(iface, addr, ports)
	add := make([]nftables.SetElement, len(keys))
	for i, k := range keys {
		add[i] = nftables.SetElement{Key: k, Timeout: ttl}
	}
	if err := addElements(c, s, add); err != nil {
		return err
	}
	if !refresh {
		return nil
	}
	if err := deleteElements(c, s, keysOnly(keys)); err != nil {
		return err
	}
	return addElements(c, s, add)
}

func keysOnly(keys [][]byte) []nftables.SetElement {
	out := make([]nftables.SetElement, len(keys))
	for i, k := range keys {
		out[i] = nftables.SetElement{Key: k}
	}
	return out
}

// probeTimeoutUpdate reports whether the kernel updates the timeout of a
// set element that is added again with another one (Linux 6.10 and
// later), on a scratch set it removes again.
func (l *layout) probeTimeoutUpdate(newConn func() *nftables.Conn) (bool, error) {
	s := &nftables.Set{Table: l.table, Name: "probe-timeout", KeyType: nftables.TypeIPAddr, HasTimeout: true}
	key := []byte{192, 0, 2, 1}
	defer func() {
		c := newConn()
		c.DelSet(s)
		c.Flush()
	}()
	for _, tmo := range []time.Duration{time.Hour, time.Minute} {
		c := newConn()
		if err := c.AddSet(s, nil); err != nil {
			return false, err
		}
		if err := addElements(c, s, []nftables.SetElement{{Key: key, Timeout: tmo}}); err != nil {
			return false, err
		}
		if err := c.Flush(); err != nil {
			return false, fmt.Errorf("probe set element timeouts: %w", err)
		}
	}
	elems, err := newConn().GetSetElements(s)
	if err != nil {
		return false, fmt.Errorf("probe set element timeouts: %w", err)
	}
	return len(elems) == 1 && elems[0].Timeout == time.Minute, nil
}

// maxElemBytes bounds the encoded elements of one message. A netlink
// attribute's length is 16 bits, and the encoder under google/nftables
// (mdlayher/netlink) truncates a longer list of elements without an
// error: the kernel then gets part of the list, or rejects the message.
const maxElemBytes = 32 << 10

// elemOverhead is an upper bound on what one element's attributes add to
// its key and key end (nests, flags, timeout, padding).
const elemOverhead = 64

// chunks splits elements into lists that each encode within maxElemBytes.
func chunks(elems []nftables.SetElement) [][]nftables.SetElement {
	var out [][]nftables.SetElement
	start, size := 0, 0
	for i, e := range elems {
		n := len(e.Key) + len(e.KeyEnd) + elemOverhead
		if i > start && size+n > maxElemBytes {
			out = append(out, elems[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(elems) {
		out = append(out, elems[start:])
	}
	return out
}

// addElements queues the addition of elems to s, in as many messages as
// their size needs.
func addElements(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement) error {
	for _, ch := range chunks(elems) {
		if err := c.SetAddElements(s, ch); err != nil {
			return err
		}
	}
	return nil
}

// deleteElements queues the deletion of elems from s, in as many messages
// as their size needs.
func deleteElements(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement) error {
	for _, ch := range chunks(elems) {
		if err := c.SetDeleteElements(s, ch); err != nil {
			return err
		}
	}
	return nil
}

// Expression helpers.

func cat[T any](parts ...[]T) []T {
	var out []T
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func accept() []expr.Any { return []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}} }
func drop() []expr.Any   { return []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}} }

// admitted accepts a new connection within the sandbox's connection limit.
func admitted() []expr.Any { return []expr.Any{gotoChain(chainAdmit)} }

func denyTo(reason string) []expr.Any { return []expr.Any{gotoChain(denyChainPrefix + reason)} }

func gotoChain(name string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictGoto, Chain: name} }

func ipv4Only() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// saddrInSet matches an IPv4 source address in s.
func saddrInSet(s *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID},
	}
}

func metaIn(key expr.MetaKey, s *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg1},
		&expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID},
	}
}

func ctStateIn(mask uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}
}

func daddr(reg uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
}

func dport(reg uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

func saddrIn(p netip.Prefix) []expr.Any {
	mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
	if p.Bits() == 0 {
		mask = make([]byte, 4)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: addrKey(p.Masked().Addr())},
	}
}

// Set element encodings. Concatenated keys pad every field to 4 bytes.

func ifnameKey(name string) []byte {
	b := make([]byte, 16)
	copy(b, name)
	return b
}

func addrKey(a netip.Addr) []byte { b := a.As4(); return b[:] }

func u32Key(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func protoKey(p uint8) []byte { return []byte{p, 0, 0, 0} }

func portKey(p uint16) []byte { return []byte{byte(p >> 8), byte(p), 0, 0} }

func prefixIvls(ps []netip.Prefix) []ivl {
	out := make([]ivl, len(ps))
	for i, p := range ps {
		out[i] = prefixIvl(p)
	}
	return mergeIvls(out)
}

// ivlElements encodes disjoint ranges for an rbtree interval set: a start
// element and an end element one past the range, except at the top of
// the address space.
func ivlElements(s []ivl) []nftables.SetElement {
	var out []nftables.SetElement
	for _, v := range s {
		out = append(out, nftables.SetElement{Key: u32Key(v.lo)})
		if v.hi != ^uint32(0) {
			out = append(out, nftables.SetElement{Key: u32Key(v.hi + 1), IntervalEnd: true})
		}
	}
	return out
}

// ifIvlElements encodes disjoint address ranges of one interface for a
// concatenated interval set: key the low corner, key end the high one
// (inclusive), the interface the same in both.
func ifIvlElements(name []byte, s []ivl) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, len(s))
	for _, v := range s {
		out = append(out, nftables.SetElement{Key: cat(name, u32Key(v.lo)), KeyEnd: cat(name, u32Key(v.hi))})
	}
	return out
}

// ifBoxElements encodes disjoint boxes of one interface, TCP and UDP
// each, for a concatenated interval set.
func ifBoxElements(name []byte, s []box) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, 2*len(s))
	for _, b := range s {
		for _, p := range []uint8{protoTCP, protoUDP} {
			out = append(out, nftables.SetElement{
				Key:    cat(name, u32Key(b.addr.lo), protoKey(p), portKey(b.ports.First)),
				KeyEnd: cat(name, u32Key(b.addr.hi), protoKey(p), portKey(b.ports.Last)),
			})
		}
	}
	return out
}
