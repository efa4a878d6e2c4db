package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/net/netutil"
	"golang.org/x/time/rate"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/egress"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/identity"
	"github.com/nookhq/nook/internal/network"
	"github.com/nookhq/nook/internal/network/dns"
	"github.com/nookhq/nook/internal/network/policy"
	"github.com/nookhq/nook/internal/secrets"
	"github.com/nookhq/nook/internal/store"
)

// NetConfig configures sandbox networking.
type NetConfig struct {
	// Enabled gives every sandbox its own network: an address from Pool,
	// an egress policy in the kernel and a DNS resolver (`nook serve`
	// turns it on). Off, sandboxes have loopback only; tests that run
	// several daemons in one network namespace turn it off, because the
	// dataplane (one nftables table) is one per namespace.
	Enabled bool
	// Pool is where sandbox subnets (/30 each) come from; default
	// network.DefaultPool (10.89.0.0/16).
	Pool netip.Prefix
	// DNSUpstreams are the resolvers allowed queries go to; default the
	// nameservers of /etc/resolv.conf.
	DNSUpstreams []netip.AddrPort
	// ConntrackLimit caps each sandbox's tracked connections (0: the
	// network package's default, 4096); see network.Config.
	ConntrackLimit int
	// LearnedLimit caps each sandbox's DNS-learned set elements (0: the
	// network package's default, 4096); see network.Config.
	LearnedLimit int
}

// netLogKeep is how many entries a sandbox's network log keeps.
const netLogKeep = 1000

// netLogQueue is the size of the queue of log entries waiting for the
// database, and netLogQueueEach how many of them one sandbox may hold: a
// sandbox's burst cannot fill the queue for the others.
const (
	netLogQueue     = 4096
	netLogQueueEach = 256
)

// netState is what the daemon knows of one sandbox's network; it mirrors
// the sandbox_net record.
type netState struct {
	subnet  netip.Prefix
	policy  policy.Policy
	exposed map[uint16]netip.AddrPort
	// unexposed: recorded exposed ports (sandbox port -> host port) not
	// forwarded yet: the sandbox had no interface when the daemon started
	// (stopped, paused to disk, or the host restarted); its next attach
	// exposes them.
	unexposed map[uint16]uint16
	// previews: each exposed port's preview URL settings (public, and the
	// nonce its tokens are signed with).
	previews map[uint16]store.Preview
}

// sandboxNets gives sandboxes their networks: it is the backends'
// core.NetHooks (attach and detach, through network.Manager), runs each
// sandbox's DNS resolver, applies and persists policies, and keeps the
// network logs.
type sandboxNets struct {
	mgr   *network.Manager
	dns   *dns.Server
	store *store.Store
	log   *slog.Logger

	// allocMu guards choosing a free subnet: a subnet chosen is pending
	// (reserved for its sandbox) until the attachment holds it, and the
	// attachment's kernel work runs without the lock, so that creates
	// attach in parallel.
	allocMu sync.Mutex
	pending map[string]netip.Prefix
	// reconciled: the daemon's start has adopted every attachment the
	// kernel holds, so network.Manager's own records name every subnet in
	// use (before that, subnetFor lists the kernel's links).
	reconciled atomic.Bool

	mu    sync.Mutex
	state map[string]*netState // sandboxes with a record, by ID

	// hostMu guards hostAddrs, the host's own addresses (hostPrefixes),
	// read again only after an address outside the pool changed (a
	// netlink subscription clears hostValid): listing them reads every
	// sandbox's gateway address too.
	hostMu    sync.Mutex
	hostAddrs []netip.Prefix
	hostValid bool
	hostWatch bool // the subscription runs

	// metadata makes the handler of a sandbox's metadata endpoint
	// (identity.go); metaSrv are the endpoints served, by sandbox ID, each
	// on its own gateway (metaMu).
	metadata func(id string, caller netip.Addr) http.Handler
	metaMu   sync.Mutex
	metaSrv  map[string]*http.Server
	// egress are the sandboxes' egress proxies (internal/egress), and
	// names what each sandbox's resolver answered it (metaMu).
	egress map[string]*egressProxy
	names  map[string]*egress.Names
	// intercept returns a sandbox's interceptor (secrets.go; nil: it has
	// no secrets bound): its TCP to ports 80 and 443 goes to its egress
	// proxy whatever its policy.
	intercept func(id string) egress.Interceptor
	// closeIntercept closes the upstream connections a sandbox's
	// interceptor keeps, when its network goes.
	closeIntercept func(id string)
	// obs counts refusals for the metrics (nil: none; stats.go).
	obs Observer

	logc chan store.NetLogEntry
	// qmu guards queued (entries of each sandbox in logc) and dropped
	// (entries of each sandbox not queued since its last queued one,
	// which that one's Suppressed then counts).
	qmu     sync.Mutex
	queued  map[string]int
	dropped map[string]int
	flushc  chan chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

var _ core.NetHooks = (*sandboxNets)(nil)

func newSandboxNets(ctx context.Context, cfg Config, st *store.Store, metadata func(string, netip.Addr) http.Handler) (*sandboxNets, error) {
	n := &sandboxNets{
		store: st, log: cfg.Log, obs: cfg.Observer, state: map[string]*netState{}, metadata: metadata, metaSrv: map[string]*http.Server{},
		egress: map[string]*egressProxy{}, names: map[string]*egress.Names{},
		logc: make(chan store.NetLogEntry, netLogQueue), flushc: make(chan chan struct{}),
		queued: map[string]int{}, dropped: map[string]int{},
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	mgr, err := network.New(ctx, network.Config{
		Pool: cfg.Net.Pool, NetnsDir: filepath.Join(cfg.RunDir, "netns"), Log: cfg.Log, OnDenied: n.packetDenied,
		ConntrackLimit: cfg.Net.ConntrackLimit, LearnedLimit: cfg.Net.LearnedLimit,
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox networking: %w", err)
	}
	srv, err := dns.New(dns.Config{Upstreams: cfg.Net.DNSUpstreams, Logger: cfg.Log,
		Local: map[string]netip.Addr{identity.MetadataName: network.MetadataAddr}})
	if err != nil {
		mgr.Close()
		return nil, fmt.Errorf("sandbox DNS resolver: %w", err)
	}
	n.mgr, n.dns = mgr, srv
	if mgr.UnprivilegedMetadataPort() {
		cfg.Log.Warn("net.ipv4.ip_unprivileged_port_start lets any user bind the sandboxes' metadata port: one could keep a sandbox from its metadata endpoint (never reach its requests: they go only to the daemon's marked sockets)", "port", network.MetadataPort)
	}
	n.watchHostAddrs()
	go n.writeLog()
	return n, nil
}

// watchHostAddrs clears the cache of host addresses whenever an address
// outside the sandbox pool comes or goes. Without the subscription every
// hostPrefixes lists them afresh.
func (n *sandboxNets) watchHostAddrs() {
	ch := make(chan netlink.AddrUpdate, 256)
	err := netlink.AddrSubscribeWithOptions(ch, n.stop, netlink.AddrSubscribeOptions{
		ErrorCallback: func(err error) { n.log.Warn("host address updates", "err", err) },
	})
	if err != nil {
		n.log.Warn("host address updates: not subscribed; host addresses are listed for every policy", "err", err)
		return
	}
	n.hostMu.Lock()
	n.hostWatch = true
	n.hostMu.Unlock()
	pool := n.mgr.Pool().Prefix()
	go func() {
		for u := range ch {
			if !hostAddrUpdate(u, pool) {
				continue
			}
			n.hostMu.Lock()
			n.hostValid = false
			n.hostMu.Unlock()
		}
		// The subscription ended (an error, or close): no more caching.
		n.hostMu.Lock()
		n.hostWatch, n.hostValid = false, false
		n.hostMu.Unlock()
	}()
}

// hostAddrUpdate says whether an address update can change what
// hostPrefixes lists: an IPv4 address outside the sandbox pool. A
// sandbox's gateway is in the pool, and the IPv6 link-local address the
// kernel gives each sandbox's host-side link as it comes up is not IPv4:
// counting those, each create and each destroy cleared the cache, and at
// 1,000 sandboxes each create's policy then listed the host's 2,000
// addresses again (40 ms), one create at a time under hostMu.
func hostAddrUpdate(u netlink.AddrUpdate, pool netip.Prefix) bool {
	a, ok := netip.AddrFromSlice(u.LinkAddress.IP)
	if !ok {
		return true // not understood: list again
	}
	a = a.Unmap()
	return a.Is4() && !pool.Contains(a)
}

// close stops the resolvers and the log writer. Sandbox interfaces and
// rules stay: sandboxes outlive the daemon, and the next one adopts them.
func (n *sandboxNets) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n.metaMu.Lock()
	srvs, eps := n.metaSrv, n.egress
	n.metaSrv, n.egress = map[string]*http.Server{}, map[string]*egressProxy{}
	n.metaMu.Unlock()
	for _, srv := range srvs {
		srv.Close()
	}
	for _, ep := range eps {
		ep.close()
	}
	n.dns.Close(ctx)
	n.mgr.Close()
	close(n.stop)
	<-n.done
}

// AttachNetns implements core.NetHooks.
func (n *sandboxNets) AttachNetns(ctx context.Context, id, netnsPath string) error {
	subnet, done, err := n.reserve(ctx, id)
	if err != nil {
		return err
	}
	defer done()
	if err := n.mgr.AttachContainer(ctx, id, subnet, netnsPath); err != nil {
		return err
	}
	return n.restore(ctx, id, false)
}

// AttachTap implements core.NetHooks.
func (n *sandboxNets) AttachTap(ctx context.Context, id string) (string, error) {
	subnet, done, err := n.reserve(ctx, id)
	if err != nil {
		return "", err
	}
	defer done()
	tap, err := n.mgr.SetupTap(ctx, id, subnet)
	if err != nil {
		return "", err
	}
	return tap, n.restore(ctx, id, false)
}

// Detach implements core.NetHooks.
func (n *sandboxNets) Detach(ctx context.Context, id string) error {
	if err := n.dns.Remove(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	n.stopMetadata(id)
	n.mu.Lock()
	delete(n.state, id)
	n.mu.Unlock()
	n.qmu.Lock()
	delete(n.dropped, id)
	n.qmu.Unlock()
	return n.mgr.Teardown(ctx, id)
}

// reserve chooses a sandbox's subnet and holds it pending until done is
// called (once the attachment has it, or has failed).
func (n *sandboxNets) reserve(ctx context.Context, id string) (netip.Prefix, func(), error) {
	n.allocMu.Lock()
	defer n.allocMu.Unlock()
	subnet, err := n.subnetFor(ctx, id)
	if err != nil {
		return netip.Prefix{}, nil, err
	}
	if n.pending == nil {
		n.pending = map[string]netip.Prefix{}
	}
	n.pending[id] = subnet
	return subnet, func() {
		n.allocMu.Lock()
		if n.pending[id] == subnet {
			delete(n.pending, id)
		}
		n.allocMu.Unlock()
	}, nil
}

// subnetFor returns the subnet a sandbox has (attached now, pending, or
// recorded), or the lowest free one. The caller holds allocMu.
func (n *sandboxNets) subnetFor(ctx context.Context, id string) (netip.Prefix, error) {
	if s, ok := n.mgr.Subnet(id); ok {
		return s, nil
	}
	if s, ok := n.pending[id]; ok {
		return s, nil
	}
	pool := n.mgr.Pool()
	taken := pool.NewTaken()
	n.mu.Lock()
	st := n.state[id]
	for _, s := range n.state {
		taken.Add(s.subnet)
	}
	n.mu.Unlock()
	if st != nil {
		return st.subnet, nil
	}
	// Recorded but not loaded yet (a sandbox the backend starts while the
	// daemon reconciles): its own subnet, and every recorded one is taken.
	var own netip.Prefix
	if err := n.store.NetSubnets(ctx, func(rid, subnet string) {
		p, err := netip.ParsePrefix(subnet)
		if err != nil {
			return
		}
		if rid == id {
			own = p
		}
		taken.Add(p)
	}); err != nil {
		return netip.Prefix{}, err
	}
	if own.IsValid() {
		return own, nil
	}
	for pid, s := range n.pending {
		if pid != id {
			taken.Add(s)
		}
	}
	if n.reconciled.Load() {
		// The manager's records: every attachment since the start's
		// adoption was made through it (no listing of the kernel's links
		// and addresses, which costs per sandbox alive).
		n.mgr.Subnets(id, taken)
		return pool.AllocateFrom(taken)
	}
	atts, err := n.mgr.List(ctx)
	if err != nil {
		return netip.Prefix{}, err
	}
	for _, a := range atts {
		if a.Subnet.IsValid() && a.ID != id {
			taken.Add(a.Subnet)
		}
	}
	return pool.AllocateFrom(taken)
}

// restore applies a known sandbox's policy again after an attachment,
// which starts deny-all (a vm's tap made again on resume).
func (n *sandboxNets) restore(ctx context.Context, id string, keepFlows bool) error {
	n.mu.Lock()
	st := n.state[id]
	var unexposed map[uint16]uint16
	if st != nil {
		unexposed, st.unexposed = st.unexposed, nil
	}
	n.mu.Unlock()
	if st == nil {
		return nil // a new sandbox: the daemon applies its policy after create
	}
	if err := n.applyKeep(ctx, id, st.subnet, st.policy, false, keepFlows); err != nil {
		return err
	}
	n.reexpose(ctx, id, st, unexposed)
	return nil
}

// reexpose forwards a sandbox's recorded exposed ports again, on their
// old host ports where those are free, and records any that moved.
func (n *sandboxNets) reexpose(ctx context.Context, id string, st *netState, ports map[uint16]uint16) {
	changed := false
	for port, hostPort := range ports {
		addr, err := n.mgr.Expose(ctx, id, port, hostPort)
		if err != nil {
			// The old host port is taken: take another and say so.
			if addr, err = n.mgr.Expose(ctx, id, port, 0); err != nil {
				n.log.Error("expose port again", "sandbox", id, "port", port, "err", err)
				// Dropped: its preview goes too, so that a later expose
				// gets a new nonce and the old tokens stay revoked.
				n.mu.Lock()
				if st.previews != nil {
					delete(st.previews, port)
				}
				n.mu.Unlock()
				changed = true
				continue
			}
			n.log.Warn("exposed port moved to a new host address", "sandbox", id, "port", port, "address", addr.String())
			changed = true
		}
		n.mu.Lock()
		st.exposed[port] = addr
		n.mu.Unlock()
	}
	if changed {
		cp, _ := n.get(id)
		if err := n.persist(ctx, id, &cp); err != nil {
			n.log.Error("record exposed ports", "sandbox", id, "err", err)
		}
	}
}

// apply puts a policy into the kernel and the resolver.
func (n *sandboxNets) apply(ctx context.Context, id string, subnet netip.Prefix, p policy.Policy, resetLearned bool) error {
	return n.applyKeep(ctx, id, subnet, p, resetLearned, false)
}

// applyKeep is apply; keepFlows leaves the sandbox's connections for a
// later network.Manager.CutFlows.
func (n *sandboxNets) applyKeep(ctx context.Context, id string, subnet netip.Prefix, p policy.Policy, resetLearned, keepFlows bool) error {
	kp := n.kernelPolicy(p)
	kp.Intercept = p.Mode != policy.None && n.intercept != nil && n.intercept(id) != nil
	kp.ResetLearned = resetLearned
	kp.KeepFlows = keepFlows
	if err := n.mgr.SetPolicy(ctx, id, kp); err != nil {
		return err
	}
	n.serveGateway(ctx, id, subnet)
	if p.Mode == policy.None {
		if err := n.dns.Remove(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
		return nil
	}
	if _, ok := n.dns.Addr(id); ok {
		return n.dns.Update(id, p)
	}
	_, err := n.dns.Add(id, netip.AddrPortFrom(network.Gateway(subnet), 53), p, dns.Hooks{
		OnResolved: n.resolved,
		OnDenied:   n.dnsDenied,
	})
	return err
}

// serveGateway serves a sandbox's metadata endpoint and egress proxy on its gateway, if
// it is not served yet. A failure is logged: the sandbox runs without it.
func (n *sandboxNets) serveGateway(ctx context.Context, id string, subnet netip.Prefix) {
	if n.metadata == nil {
		return
	}
	n.metaMu.Lock()
	defer n.metaMu.Unlock()
	n.serveEgress(ctx, id, subnet)
	if n.metaSrv[id] != nil {
		return
	}
	ln, err := n.mgr.ListenGateway(ctx, subnet, network.MetadataPort)
	if err != nil {
		n.log.Error("sandbox metadata endpoint: not served", "sandbox", id, "err", err)
		return
	}
	caller := network.SandboxAddr(subnet)
	srv := &http.Server{
		Handler:           n.metadata(id, caller),
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second,
		IdleTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10,
		ErrorLog: slog.NewLogLogger(n.log.Handler(), slog.LevelDebug),
	}
	n.metaSrv[id] = srv
	// At most metadataConns connections at once, and only the sandbox's:
	// a connection from any other address (a process on the host) is
	// closed before anything is read from it.
	go srv.Serve(netutil.LimitListener(&callerOnly{Listener: ln, caller: caller}, metadataConns))
}

// metadataConns bounds a sandbox's connections to its metadata endpoint.
const metadataConns = 16

// callerOnly accepts connections from one address only.
type callerOnly struct {
	net.Listener
	caller netip.Addr
}

func (l *callerOnly) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil && ap.Addr().Unmap() == l.caller {
			return c, nil
		}
		c.Close()
	}
}

// stopMetadata closes a sandbox's metadata endpoint and egress proxy,
// and their connections, and forgets the names it resolved.
func (n *sandboxNets) stopMetadata(id string) {
	n.metaMu.Lock()
	srv, ep := n.metaSrv[id], n.egress[id]
	delete(n.metaSrv, id)
	delete(n.egress, id)
	delete(n.names, id)
	n.metaMu.Unlock()
	if srv != nil {
		srv.Close()
	}
	if ep != nil {
		ep.close()
	}
	if n.closeIntercept != nil {
		n.closeIntercept(id)
	}
}

// egressProxy is a sandbox's egress proxy and its listener.
type egressProxy struct {
	ln net.Listener
	p  *egress.Proxy
}

func (e *egressProxy) close() {
	e.ln.Close()
	e.p.Close()
}

// serveEgress runs a sandbox's egress proxy on its gateway, if it does
// not run yet. The caller holds metaMu. A failure is logged: the
// sandbox's connections to domain rules' addresses are then refused.
func (n *sandboxNets) serveEgress(ctx context.Context, id string, subnet netip.Prefix) {
	if n.egress[id] != nil {
		return
	}
	ln, err := n.mgr.ListenGateway(ctx, subnet, network.EgressPort)
	if err != nil {
		n.log.Error("sandbox egress proxy: not served (its connections to domain rules' addresses are refused)", "sandbox", id, "err", err)
		return
	}
	names := n.namesFor(id)
	limiter := rate.NewLimiter(egressLogRate, 2*egressLogRate)
	var suppressed atomic.Int64
	p := egress.New(egress.Config{
		Check: &egress.PolicyChecker{Names: names, Policy: func() (policy.Policy, bool) {
			st, ok := n.get(id)
			return st.policy, ok
		}},
		Dial: func(ctx context.Context, dst netip.AddrPort) (net.Conn, error) {
			// The proxy dials from the host: never to the host itself (a
			// name an attacker's zone points at the host's public address)
			// or a sandbox.
			for _, hp := range n.hostPrefixes() {
				if hp.Contains(dst.Addr()) {
					return nil, fmt.Errorf("%s is the host itself or a sandbox", dst.Addr())
				}
			}
			return n.mgr.DialHost(ctx, dst)
		},
		OnDenied: func(ev egress.Event) {
			n.countDenied(deniedConnection, ev.Reason, 1)
			// At most egressLogRate a second (burst twice that), the rest
			// counted in the next entry, as the kernel's denials are.
			if !limiter.Allow() {
				suppressed.Add(1)
				return
			}
			n.record(store.NetLogEntry{SandboxID: id, Time: time.Now(), Kind: api.NetLogConnection, Destination: ev.Dst.String() + "/tcp",
				Reason: ev.Reason, Detail: ev.Detail, Suppressed: int(suppressed.Swap(0))})
		},
		Log:      n.log,
		MaxConns: egressConns,
		Intercept: func() egress.Interceptor {
			if n.intercept == nil {
				return nil
			}
			return n.intercept(id)
		},
	})
	n.egress[id] = &egressProxy{ln: ln, p: p}
	go p.Serve(&callerOnly{Listener: ln, caller: network.SandboxAddr(subnet)})
}

// egressConns bounds a sandbox's connections through its egress proxy at
// once (each holds two descriptors and two goroutines of the daemon's).
const egressConns = 1024

// egressLogRate is how many refusals of its egress proxy a sandbox's
// network log takes a second.
const egressLogRate = 10

// egressNames bounds the names (name-address pairs) kept per sandbox for
// its egress proxy, as the kernel's learned sets are bounded.
const egressNames = 4096

// namesFor returns what a sandbox's resolver answered it, made on first
// use. The caller holds metaMu.
func (n *sandboxNets) namesFor(id string) *egress.Names {
	names := n.names[id]
	if names == nil {
		names = egress.NewNames(egressNames)
		n.names[id] = names
	}
	return names
}

// learnName tells a sandbox's egress proxy what its resolver answered.
func (n *sandboxNets) learnName(id string, r dns.Resolved) {
	n.metaMu.Lock()
	names := n.namesFor(id)
	n.metaMu.Unlock()
	names.Learn(r.Name, r.Addrs, r.TTL)
}

// kernelPolicy turns a policy's CIDR rules and @internet into the
// dataplane's sets; domains are the resolver's (it adds what it answers).
func (n *sandboxNets) kernelPolicy(p policy.Policy) network.Policy {
	var kp network.Policy
	if p.Mode == policy.None {
		return kp
	}
	allow, deny := p.CIDRs()
	for _, r := range allow {
		kp.Allow = append(kp.Allow, network.Rule{Prefix: r.Prefix, Ports: kernelPorts(r.Ports)})
	}
	for _, r := range deny {
		kp.Deny = append(kp.Deny, network.Rule{Prefix: r.Prefix, Ports: kernelPorts(r.Ports)})
	}
	if ok, ports := p.Internet(); ok {
		if !p.NamesDoH() {
			// Public DNS-over-HTTPS resolvers stay out of reach unless
			// named (policy/doh.go); DNS over TLS is refused everywhere.
			for _, a := range policy.DoHAddrs() {
				kp.Deny = append(kp.Deny, network.Rule{Prefix: a, Ports: []network.PortRange{{First: 443, Last: 443}}})
			}
		}
		if ports == nil {
			kp.Public = true
		} else {
			// @internet on some ports: every public range, on those ports.
			exclude := append(append(policy.AlwaysBlocked(), policy.Private()...), n.mgr.Pool().Prefix())
			for _, pf := range complement(exclude) {
				kp.Allow = append(kp.Allow, network.Rule{Prefix: pf, Ports: kernelPorts(ports)})
			}
		}
	}
	return kp
}

func kernelPorts(ps []policy.PortRange) []network.PortRange {
	var out []network.PortRange
	for _, p := range ps {
		out = append(out, network.PortRange{First: p.From, Last: p.To})
	}
	return out
}

// complement returns the IPv4 prefixes that cover everything outside
// exclude.
func complement(exclude []netip.Prefix) []netip.Prefix {
	type ivl struct{ lo, hi uint64 }
	var ex []ivl
	for _, p := range exclude {
		p = p.Masked()
		if !p.Addr().Is4() {
			continue
		}
		b := p.Addr().As4()
		lo := uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])
		ex = append(ex, ivl{lo, lo + 1<<(32-p.Bits()) - 1})
	}
	sort.Slice(ex, func(i, j int) bool { return ex[i].lo < ex[j].lo })
	var out []netip.Prefix
	add := func(lo, hi uint64) { // the CIDR blocks of [lo, hi]
		for lo <= hi {
			bits := 32
			for bits > 0 {
				size := uint64(1) << (32 - bits + 1)
				if lo%size != 0 || lo+size-1 > hi {
					break
				}
				bits--
			}
			a := netip.AddrFrom4([4]byte{byte(lo >> 24), byte(lo >> 16), byte(lo >> 8), byte(lo)})
			out = append(out, netip.PrefixFrom(a, bits))
			lo += uint64(1) << (32 - bits)
		}
	}
	next := uint64(0)
	for _, e := range ex {
		if e.lo > next {
			add(next, e.lo-1)
		}
		next = max(next, e.hi+1)
	}
	if next <= 0xffffffff {
		add(next, 0xffffffff)
	}
	return out
}

// resolved lets a sandbox reach the addresses its resolver just answered.
func (n *sandboxNets) resolved(ctx context.Context, id string, r dns.Resolved) error {
	n.learnName(id, r)
	for _, a := range r.Addrs {
		if err := n.mgr.AllowLearned(ctx, id, a, kernelPorts(r.Ports), r.TTL); err != nil {
			return err
		}
	}
	return nil
}

// secretRefused logs a request to a bound host refused for a secret.
func (n *sandboxNets) secretRefused(id string, r secrets.Refusal) {
	detail := r.Reason
	if r.Secret != "" {
		detail = "secret " + r.Secret + ": " + detail
	}
	n.record(store.NetLogEntry{SandboxID: id, Time: time.Now(), Kind: api.NetLogConnection, Destination: r.Host + ":443/tcp",
		Reason: egress.ReasonSecret, Detail: detail})
}

func (n *sandboxNets) dnsDenied(id string, ev dns.Event) {
	n.countDenied(deniedDNS, string(ev.Reason), 1+ev.Suppressed)
	n.record(store.NetLogEntry{SandboxID: id, Time: ev.Time, Kind: api.NetLogDNS, Destination: ev.Name + " " + ev.QType,
		Reason: string(ev.Reason), Detail: ev.Detail, Suppressed: ev.Suppressed})
}

func (n *sandboxNets) packetDenied(id string, ev network.Event) {
	n.countDenied(deniedConnection, ev.Reason, 1+ev.Suppressed)
	dst := ev.Dst.Addr().String()
	if ev.Dst.Port() != 0 {
		dst = ev.Dst.String()
	}
	n.record(store.NetLogEntry{SandboxID: id, Time: ev.Time, Kind: api.NetLogConnection, Destination: dst + "/" + ev.Proto,
		Reason: ev.Reason, Detail: denyDetail[ev.Reason], Suppressed: ev.Suppressed})
}

var denyDetail = map[string]string{
	network.ReasonSandbox:   "another sandbox",
	network.ReasonBlocked:   "always blocked (loopback, link-local and metadata, multicast, reserved)",
	network.ReasonDNS:       "DNS goes only to the sandbox's own resolver",
	network.ReasonDenied:    "a deny rule",
	network.ReasonPrivate:   "a private range no allow rule names",
	network.ReasonPolicy:    "not allowed by the policy (a domain is reachable only after resolving it through nook)",
	network.ReasonHost:      "the host itself",
	network.ReasonInbound:   "a connection into the sandbox",
	network.ReasonNotIPv4:   "sandboxes have IPv4 only",
	network.ReasonConntrack: "conntrack limit: the sandbox has as many connections open as it may (they free up as connections end)",
	network.ReasonQUIC:      "QUIC to a domain rule's address (its name cannot be checked): clients fall back to TCP",
}

// record queues a log entry. When the queue is full, or holds as many of
// the sandbox's entries as one sandbox may, the entry is dropped rather
// than slowing down the dataplane, and counted in the Suppressed of the
// sandbox's next entry that is queued.
func (n *sandboxNets) record(e store.NetLogEntry) {
	id := e.SandboxID
	n.qmu.Lock()
	defer n.qmu.Unlock()
	if n.queued[id] < netLogQueueEach {
		e.Suppressed += n.dropped[id]
		select {
		case n.logc <- e:
			n.queued[id]++
			delete(n.dropped, id)
			return
		default:
		}
		e.Suppressed -= n.dropped[id]
	}
	n.dropped[id] += 1 + e.Suppressed
}

// dequeued counts an entry taken from the queue.
func (n *sandboxNets) dequeued(e store.NetLogEntry) {
	n.qmu.Lock()
	if n.queued[e.SandboxID]--; n.queued[e.SandboxID] <= 0 {
		delete(n.queued, e.SandboxID)
	}
	n.qmu.Unlock()
}

// writeLog writes queued log entries in batches, one transaction each.
func (n *sandboxNets) writeLog() {
	defer close(n.done)
	var batch []store.NetLogEntry
	drain := func() {
		for {
			select {
			case e := <-n.logc:
				n.dequeued(e)
				batch = append(batch, e)
				if len(batch) < 512 {
					continue
				}
			default:
			}
			if len(batch) == 0 {
				return
			}
			if err := n.store.AppendNetLog(context.Background(), batch, netLogKeep); err != nil {
				n.log.Warn("write network log", "entries", len(batch), "err", err)
			}
			batch = batch[:0]
		}
	}
	for {
		select {
		case e := <-n.logc:
			n.dequeued(e)
			batch = append(batch, e)
			drain()
		case ch := <-n.flushc:
			drain()
			close(ch)
		case <-n.stop:
			drain()
			return
		}
	}
}

// flushLog waits until every entry queued so far is written.
func (n *sandboxNets) flushLog(ctx context.Context) {
	ch := make(chan struct{})
	select {
	case n.flushc <- ch:
		select {
		case <-ch:
		case <-ctx.Done():
		}
	case <-ctx.Done():
	}
}

// setup gives a sandbox the backend just created its policy, and records
// both. A backend without network hooks leaves the sandbox loopback only.
func (n *sandboxNets) setup(ctx context.Context, sb *core.Sandbox, p policy.Policy) error {
	subnet, ok := n.mgr.Subnet(sb.ID)
	if !ok {
		if p.Mode != policy.None && (len(p.Allow) > 0 || len(p.Deny) > 0) {
			return errdefs.Precondition("the %s backend does not give sandboxes a network yet: leave out --allow and --deny", sb.Isolation)
		}
		n.log.Warn("sandbox has no network: its backend did not attach one", "sandbox", sb.Name, "isolation", sb.Isolation)
		return nil
	}
	if err := n.apply(ctx, sb.ID, subnet, p, false); err != nil {
		return err
	}
	st := &netState{subnet: subnet, policy: p, exposed: map[uint16]netip.AddrPort{}}
	if err := n.persist(ctx, sb.ID, st); err != nil {
		return err
	}
	n.mu.Lock()
	n.state[sb.ID] = st
	n.mu.Unlock()
	return nil
}

func (n *sandboxNets) persist(ctx context.Context, id string, st *netState) error {
	pol, err := json.Marshal(st.policy)
	if err != nil {
		return err
	}
	rec := store.Net{Subnet: st.subnet.String(), Policy: pol, Exposed: map[uint16]uint16{}}
	for p, a := range st.exposed {
		rec.Exposed[p] = a.Port()
	}
	for p := range st.unexposed {
		if _, ok := rec.Exposed[p]; !ok {
			rec.Exposed[p] = st.unexposed[p]
		}
	}
	rec.Previews = st.previews
	return n.store.PutNet(ctx, id, rec)
}

// get returns a copy of a sandbox's network state.
func (n *sandboxNets) get(id string) (netState, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.state[id]
	if st == nil {
		return netState{}, false
	}
	cp := *st
	cp.exposed = maps.Clone(st.exposed)
	cp.previews = maps.Clone(st.previews)
	cp.unexposed = maps.Clone(st.unexposed)
	return cp, true
}

// change replaces a sandbox's policy at once: kernel sets and resolver
// first (all or nothing), then the record; a failed record puts the old
// policy back.
func (n *sandboxNets) change(ctx context.Context, sb *core.Sandbox, p policy.Policy) error {
	st, ok := n.get(sb.ID)
	if !ok {
		return errdefs.Precondition("sandbox %s has no network", sb.Name)
	}
	_, attached := n.mgr.Subnet(sb.ID)
	if attached {
		if err := n.apply(ctx, sb.ID, st.subnet, p, narrows(st.policy, p)); err != nil {
			if rerr := n.apply(ctx, sb.ID, st.subnet, st.policy, false); rerr != nil {
				n.log.Error("restore network policy", "sandbox", sb.Name, "err", rerr)
			}
			return err
		}
	}
	old := st.policy
	st.policy = p
	if err := n.persist(ctx, sb.ID, &st); err != nil {
		if attached {
			if rerr := n.apply(ctx, sb.ID, st.subnet, old, false); rerr != nil {
				n.log.Error("restore network policy", "sandbox", sb.Name, "err", rerr)
			}
		}
		return err
	}
	n.mu.Lock()
	if cur := n.state[sb.ID]; cur != nil {
		cur.policy = p
	}
	n.mu.Unlock()
	// Connections through the egress proxy that the new policy refuses
	// end, as the kernel's flows do.
	n.metaMu.Lock()
	ep := n.egress[sb.ID]
	n.metaMu.Unlock()
	if ep != nil {
		ep.p.Recheck()
	}
	return nil
}

// narrows reports whether a new policy may refuse a name the old one
// allowed, so addresses learned under the old one must go.
func narrows(old, p policy.Policy) bool {
	if p.Mode == policy.None {
		return true
	}
	has := func(rules []policy.Rule, r policy.Rule) bool {
		for _, o := range rules {
			if o.Equal(r) {
				return true
			}
		}
		return false
	}
	for _, r := range old.Allow {
		if !has(p.Allow, r) {
			return true
		}
	}
	for _, r := range p.Deny {
		if !has(old.Deny, r) {
			return true
		}
	}
	return false
}

// expose makes a sandbox's TCP port reachable from the host; public says
// whether its preview URL needs no token (exposing it again changes that,
// and keeps the tokens minted so far).
func (n *sandboxNets) expose(ctx context.Context, sb *core.Sandbox, port uint16, public bool) (netip.AddrPort, error) {
	st, ok := n.get(sb.ID)
	if !ok {
		return netip.AddrPort{}, errdefs.Precondition("sandbox %s has no network", sb.Name)
	}
	if st.previews == nil {
		st.previews = map[uint16]store.Preview{}
	}
	addr, ok := st.exposed[port]
	pv, had := st.previews[port]
	if ok && had && pv.Public == public {
		return addr, nil
	}
	if !ok {
		var err error
		if addr, err = n.mgr.Expose(ctx, sb.ID, port, 0); err != nil {
			return netip.AddrPort{}, err
		}
	}
	if !had {
		pv.Nonce = newNonce()
	}
	pv.Public = public
	st.exposed[port] = addr
	st.previews[port] = pv
	if err := n.persist(ctx, sb.ID, &st); err != nil {
		if !ok {
			n.mgr.Unexpose(ctx, sb.ID, port)
		}
		return netip.AddrPort{}, err
	}
	n.mu.Lock()
	if cur := n.state[sb.ID]; cur != nil {
		cur.exposed[port] = addr
		cur.previews = st.previews
	}
	n.mu.Unlock()
	return addr, nil
}

// newNonce is a preview exposure's nonce: 8 random bytes, hex.
func newNonce() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// previewPort says whether a sandbox's port is exposed (forwarded, or
// recorded to be forwarded again once the sandbox runs), and its preview
// settings.
func (n *sandboxNets) previewPort(id string, port uint16) (bool, store.Preview) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.state[id]
	if st == nil {
		return false, store.Preview{}
	}
	_, exposed := st.exposed[port]
	if !exposed {
		_, exposed = st.unexposed[port]
	}
	pv, ok := st.previews[port]
	if !exposed || !ok {
		// A port exposed before previews existed gets its nonce at its
		// next expose; until then it has no preview.
		return false, store.Preview{}
	}
	return true, pv
}

// unexpose closes an exposed port (or forgets one recorded to be
// forwarded again), and revokes its preview URL's tokens.
func (n *sandboxNets) unexpose(ctx context.Context, sb *core.Sandbox, port uint16) error {
	st, ok := n.get(sb.ID)
	if !ok {
		return errdefs.Precondition("sandbox %s has no network", sb.Name)
	}
	_, forwarded := st.exposed[port]
	_, pending := st.unexposed[port]
	if !forwarded && !pending {
		return errdefs.NotFound("port %d of sandbox %s is not exposed", port, sb.Name)
	}
	delete(st.exposed, port)
	delete(st.unexposed, port)
	delete(st.previews, port)
	if err := n.persist(ctx, sb.ID, &st); err != nil {
		return err
	}
	n.mu.Lock()
	if cur := n.state[sb.ID]; cur != nil {
		delete(cur.exposed, port)
		delete(cur.unexposed, port)
		cur.previews = st.previews
	}
	n.mu.Unlock()
	if !forwarded {
		return nil
	}
	if err := n.mgr.Unexpose(ctx, sb.ID, port); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	return nil
}

// view is the API's description of a sandbox's network, or nil.
func (n *sandboxNets) view(id string) *api.Network {
	st, ok := n.get(id)
	if !ok {
		return nil
	}
	v := &api.Network{
		Mode: string(st.policy.Mode), Allow: policy.Rules(st.policy.Allow), Deny: policy.Rules(st.policy.Deny),
		Address: netip.PrefixFrom(network.SandboxAddr(st.subnet), st.subnet.Bits()).String(),
		Gateway: network.Gateway(st.subnet).String(),
	}
	if v.Mode == "" {
		v.Mode = api.NetAllowlist
	}
	for p, a := range st.exposed {
		v.Exposed = append(v.Exposed, api.ExposedPort{Port: int(p), HostAddress: a.String(), Public: st.previews[p].Public})
	}
	sort.Slice(v.Exposed, func(i, j int) bool { return v.Exposed[i].Port < v.Exposed[j].Port })
	return v
}

// reconcile adopts the networks of the sandboxes a previous daemon left
// running, paused or stopped: their policies, resolvers and exposed ports come
// back, and attachments no record owns are removed.
func (n *sandboxNets) reconcile(ctx context.Context, sbs []*core.Sandbox) error {
	recs, err := n.store.ListNets(ctx)
	if err != nil {
		return err
	}
	var keep []string
	subnets := map[string]netip.Prefix{}
	names := map[string]string{}
	for _, sb := range sbs {
		keep = append(keep, sb.ID)
		rec, ok := recs[sb.ID]
		if !ok || (sb.State != core.StateRunning && sb.State != core.StatePaused && sb.State != core.StateStopped) {
			continue
		}
		st := &netState{exposed: map[uint16]netip.AddrPort{}}
		if st.subnet, err = netip.ParsePrefix(rec.Subnet); err != nil {
			n.log.Error("sandbox network record", "sandbox", sb.Name, "err", err)
			continue
		}
		if err := json.Unmarshal(rec.Policy, &st.policy); err != nil {
			n.log.Error("sandbox network policy", "sandbox", sb.Name, "err", err)
			continue
		}
		st.unexposed, st.previews = rec.Exposed, rec.Previews
		n.mu.Lock()
		n.state[sb.ID] = st
		n.mu.Unlock()
		subnets[sb.ID], names[sb.ID] = st.subnet, sb.Name
	}
	// Every interface in one commit, then each policy (adds only).
	for id, err := range n.mgr.AdoptAll(ctx, subnets) {
		if err != nil {
			// A vm paused to disk or a stopped sandbox may have no
			// interface: its next attach restores its policy and ports.
			n.log.Warn("adopt sandbox network", "sandbox", names[id], "err", err)
			continue
		}
		// Connections are judged once for all, below.
		if err := n.restore(ctx, id, true); err != nil {
			n.log.Error("restore sandbox network policy", "sandbox", names[id], "err", err)
			continue
		}
		n.mu.Lock()
		st := n.state[id]
		n.mu.Unlock()
		n.log.Info("re-adopted sandbox network", "sandbox", names[id], "subnet", st.subnet.String(), "policy", st.policy.String())
	}
	n.mgr.CutFlows(ctx)
	removed, err := n.mgr.Reconcile(ctx, keep)
	if len(removed) > 0 {
		n.log.Info("removed orphaned sandbox networks", "ids", strings.Join(removed, ","))
	}
	if err == nil {
		n.reconciled.Store(true)
	}
	return err
}

// parsePolicy validates a policy as a create or a change gives it: every
// rule well formed, no allow rule reaching the host or other sandboxes.
// Several bad rules come back as one line.
func (n *sandboxNets) parsePolicy(mode string, allow, deny []string) (policy.Policy, error) {
	p, err := policy.Parse(mode, allow, deny)
	if err == nil {
		err = p.CheckHostAddrs(n.hostPrefixes())
	}
	if err != nil {
		msg := strings.ReplaceAll(err.Error(), "\n", "; ")
		if errors.Is(err, errdefs.ErrInvalidArgument) {
			return policy.Policy{}, errdefs.Invalid("%s", msg)
		}
		return policy.Policy{}, errors.New(msg)
	}
	return p, nil
}

// hostPrefixes are the host's own addresses and the sandbox pool: no
// allow rule may name them.
func (n *sandboxNets) hostPrefixes() []netip.Prefix {
	n.hostMu.Lock()
	defer n.hostMu.Unlock()
	if n.hostValid {
		return n.hostAddrs
	}
	// Valid from here: an update while the list is read clears it again.
	n.hostValid = n.hostWatch
	pool := n.mgr.Pool().Prefix()
	out := []netip.Prefix{pool}
	// IPv4 only, and no list of links: at 1,000 sandboxes the host has
	// 1,000 links and 2,000 addresses. A dump that links or addresses
	// changed under is read again; the last one is used, not cached.
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	for try := 0; errors.Is(err, netlink.ErrDumpInterrupted) && try < 3; try++ {
		addrs, err = netlink.AddrList(nil, netlink.FAMILY_V4)
	}
	ips := make([]net.IP, 0, len(addrs))
	for _, a := range addrs {
		ips = append(ips, a.IP)
	}
	if err != nil {
		// The list may miss an address (a dump interrupted each time
		// returns what it read): it fails closed, with every address
		// known before and what the standard library lists added, and
		// is not cached, so the next policy asks again.
		n.hostValid = false
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			n.log.Warn("list the host's addresses", "err", err)
		}
		for _, p := range n.hostAddrs[min(1, len(n.hostAddrs)):] {
			ips = append(ips, p.Addr().AsSlice())
		}
		if more, err := net.InterfaceAddrs(); err == nil {
			for _, a := range more {
				if ipn, ok := a.(*net.IPNet); ok {
					ips = append(ips, ipn.IP)
				}
			}
		}
	}
	seen := map[netip.Addr]bool{}
	for _, b := range ips {
		// The sandboxes' gateways are the pool's, which is listed whole.
		if ip, ok := netip.AddrFromSlice(b); ok && ip.Unmap().Is4() && !pool.Contains(ip.Unmap()) && !seen[ip.Unmap()] {
			seen[ip.Unmap()] = true
			out = append(out, netip.PrefixFrom(ip.Unmap(), 32))
		}
	}
	n.hostAddrs = out
	return out
}

// agentNet is the network the agent configures in a sandbox, or nil.
func (n *sandboxNets) agentNet(sb *core.Sandbox) (address, gateway string, ok bool) {
	subnet, ok := n.mgr.Subnet(sb.ID)
	if !ok {
		return "", "", false
	}
	return netip.PrefixFrom(network.SandboxAddr(subnet), subnet.Bits()).String(), network.Gateway(subnet).String(), true
}
