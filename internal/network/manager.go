package network

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/keylock"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Kind is how a sandbox is attached to the host.
type Kind string

// The attachment kinds.
const (
	// KindVeth is a container: a named network namespace with a veth pair.
	KindVeth Kind = "veth"
	// KindTap is a VM: a tap device on the host that the vm backend opens
	// by name (TUNSETIFF) and hands its QEMU as a descriptor.
	KindTap Kind = "tap"
)

// aliasPrefix marks nook's interfaces; the alias is "nook:<sandbox id>", so
// List can map an interface back to its sandbox after a restart.
const aliasPrefix = "nook:"

// Config configures a Manager. The zero value of every field but HostNetns
// has a working default.
type Config struct {
	// Pool is the IPv4 prefix sandbox subnets come from (DefaultPool).
	Pool netip.Prefix
	// NetnsDir holds the bind-mounted sandbox namespaces, one file per
	// sandbox ID ("/run/nook/netns").
	NetnsDir string
	// HostNetns is the namespace the manager treats as the host: where host
	// interfaces, the nftables table, forwarding and exposed ports live.
	// Zero means the namespace the daemon runs in. Tests pass a namespace
	// they made, so the real host is never touched. The manager keeps its
	// own duplicate; the caller may close theirs.
	HostNetns netns.NsHandle
	// LogGroup is the NFLOG group denied packets are logged to (100).
	LogGroup uint16
	// LogRate caps kernel log messages per second, per sandbox and deny
	// reason, with a burst of twice as many (10): one sandbox's flood of
	// denials cannot crowd out another's. OnDenied is further limited per
	// sandbox (EventRate).
	LogRate uint64
	// OnDenied, if set, is called for denied packets, at most EventRate per
	// second and sandbox. It must not block for long.
	OnDenied func(id string, ev Event)
	// EventRate is the per-sandbox cap on OnDenied calls per second (10).
	EventRate int
	// TapOwner and TapGroup own VM tap devices, so a QEMU running as that
	// user can open the tap by name (0: root).
	TapOwner, TapGroup uint32
	// ConntrackLimit caps the connections one sandbox may have tracked
	// at once (4096), TCP in states before TIME_WAIT, UDP and ICMP flows
	// until they time out, its resolver's included: a new connection over
	// the limit is refused (ReasonConntrack), so no sandbox fills the
	// host's conntrack table (nf_conntrack_max) for everyone.
	ConntrackLimit int
	// LearnedLimit caps the DNS-learned set elements of one sandbox
	// (4096), and so the kernel's and the manager's memory for them: an
	// address learned for every port is one element, one learned for some
	// ports two per port (TCP and UDP). When a new one does not fit, the
	// least recently learned addresses are evicted.
	LearnedLimit int
	// ExposeAddr is the host address exposed ports listen on (127.0.0.1).
	ExposeAddr netip.Addr
	// Log receives the manager's logs (slog.Default()).
	Log *slog.Logger
}

func (c *Config) setDefaults() {
	if !c.Pool.IsValid() {
		c.Pool = DefaultPool
	}
	if c.NetnsDir == "" {
		c.NetnsDir = "/run/nook/netns"
	}
	if c.LogGroup == 0 {
		c.LogGroup = 100
	}
	if c.LogRate == 0 {
		c.LogRate = 10
	}
	if c.ConntrackLimit <= 0 {
		c.ConntrackLimit = 4096
	}
	if c.LearnedLimit <= 0 {
		c.LearnedLimit = 4096
	}
	if c.EventRate == 0 {
		c.EventRate = 10
	}
	if !c.ExposeAddr.IsValid() {
		c.ExposeAddr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

// Attachment describes a sandbox's network attachment as found in the
// kernel.
type Attachment struct {
	ID     string
	Kind   Kind
	Iface  string       // host-side interface
	Subnet netip.Prefix // invalid if the interface has no nook address
	// Netns is the bind-mounted namespace path of a container, "" for a VM.
	Netns string
}

// Manager is the network dataplane of one host: it attaches sandboxes,
// keeps their nftables rules and logs what they are denied. Kernel state
// outlives the Manager (sandboxes keep their network across a daemon
// restart); a new Manager adopts it when the daemon calls Setup* again for
// each live sandbox and Reconcile for the rest.
//
// Lifecycle of one sandbox: Allocate (Pool) → SetupContainer or SetupTap
// (deny-all) → SetPolicy, AllowLearned, Expose as needed → Teardown.
type Manager struct {
	cfg  Config
	pool *Pool
	lay  *layout
	host netns.NsHandle
	// ownNetns: host is the process's own network namespace.
	ownNetns bool
	nl       *netlink.Handle
	// conns holds idle lasting nftables connections (lasting).
	conns chan *nftables.Conn
	// addrSock reads one link's addresses (linkAddrs); addrMu serializes
	// its requests.
	addrSock *nl.NetlinkSocket
	addrMu   sync.Mutex
	log      *slog.Logger
	cancel   context.CancelFunc
	done     chan struct{}

	mu        sync.Mutex
	locks     keylock.Map // serializes operations per sandbox ID
	sandboxes map[string]*sandbox
	byIndex   map[int]string
	// tearing holds the subnets of sandboxes being torn down until their
	// link, rules and flows are gone: Subnets counts them as taken.
	tearing map[string]netip.Prefix
	// stale holds, by interface, the set elements an earlier run left
	// (read once at start): adopting the sandbox replaces them, and
	// Reconcile removes those of interfaces no sandbox keeps.
	stale map[string]map[string][]nftables.SetElement
}

type sandbox struct {
	id, iface string
	kind      Kind
	subnet    netip.Prefix
	netns     string
	ifindex   int
	policy    compiled
	// mayHaveFlows is false for a fresh, deny-all sandbox: the first
	// SetPolicy has no connections to judge.
	mayHaveFlows bool
	learned      map[netip.Addr]learnedEntry
	// learnedLRU orders learned by when they were last learned, most
	// recent first; learnedElems counts their kernel set elements.
	learnedLRU   *list.List
	learnedElems int
	learnedFull  bool // the learned-address limit was reached (logged once)
	exposes      map[uint16]*forwarder
	events       eventLimit
}

// New starts a Manager: it installs the nftables table (keeping the
// per-sandbox state of an earlier run), enables IPv4 forwarding in the
// host namespace and starts reading denied-packet logs.
//
// Forwarding note: nook's chains are independent of other nftables tables,
// but a packet must be accepted by every base chain on its hook. A host
// where Docker or a firewall set an iptables FORWARD policy of DROP drops
// sandbox traffic unless that firewall accepts it too; New logs a warning
// when it sees such a chain in the iptables-nft "ip filter" table.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	cfg.setDefaults()
	pool, err := NewPool(cfg.Pool)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:       cfg,
		pool:      pool,
		lay:       newLayout(pool.Prefix(), cfg.LogGroup, cfg.LogRate, uint32(cfg.ConntrackLimit)),
		log:       cfg.Log,
		sandboxes: map[string]*sandbox{},
		byIndex:   map[int]string{},
		tearing:   map[string]netip.Prefix{},
		stale:     map[string]map[string][]nftables.SetElement{},
		conns:     make(chan *nftables.Conn, lastingConns),
	}
	if cfg.HostNetns > 0 {
		fd, err := unix.Dup(int(cfg.HostNetns))
		if err != nil {
			return nil, fmt.Errorf("dup host netns: %w", err)
		}
		m.host = netns.NsHandle(fd)
	} else {
		m.host, err = netns.GetFromPath("/proc/self/ns/net")
		if err != nil {
			return nil, fmt.Errorf("open host netns: %w", err)
		}
	}
	if own, err := netns.GetFromPath("/proc/self/ns/net"); err == nil {
		m.ownNetns = own.Equal(m.host)
		own.Close()
	}
	ok := false
	defer func() {
		if !ok {
			m.closeHandles()
		}
	}()
	m.nl, err = netlink.NewHandleAt(m.host, unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	if m.addrSock, err = newAddrSocket(m.host); err != nil {
		return nil, err
	}
	if err := inNetns(m.host, func() error { return writeSysctl("net/ipv4/ip_forward", "1") }); err != nil {
		return nil, err
	}
	c := m.nft()
	existing, err := c.GetSets(m.lay.table)
	if err != nil {
		existing = nil // no table yet
	}
	var chains []*nftables.Chain
	if existing != nil {
		if chains, err = c.ListChainsOfTableFamily(nftables.TableFamilyINet); err != nil {
			return nil, fmt.Errorf("list nftables chains: %w", err)
		}
	}
	if err := m.lay.installBase(c, existing, chains); err != nil {
		return nil, err
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("install nftables table inet %s: %w", tableName, err)
	}
	if m.stale, err = m.readElements(); err != nil {
		return nil, err
	}
	if m.lay.updatesTimeout, err = m.lay.probeTimeoutUpdate(m.nft); err != nil {
		return nil, err
	}
	m.warnForwardDrop()
	if err := os.MkdirAll(cfg.NetnsDir, 0o755); err != nil {
		return nil, fmt.Errorf("create netns dir: %w", err)
	}
	if err := m.startLog(ctx); err != nil {
		return nil, err
	}
	ok = true
	return m, nil
}

// Close stops the log reader and closes every exposed port. Sandbox
// namespaces, interfaces and rules stay: a restarted daemon adopts them.
func (m *Manager) Close() error {
	if m.cancel != nil {
		m.cancel()
		<-m.done
	}
	var fs []*forwarder
	m.mu.Lock()
	for _, sb := range m.sandboxes {
		for _, f := range sb.exposes {
			fs = append(fs, f)
		}
		sb.exposes = map[uint16]*forwarder{}
	}
	m.mu.Unlock()
	for _, f := range fs {
		f.close()
	}
	m.closeHandles()
	return nil
}

func (m *Manager) closeHandles() {
	if m.nl != nil {
		m.nl.Close()
		m.nl = nil
	}
	if m.addrSock != nil {
		m.addrSock.Close()
		m.addrSock = nil
	}
	for len(m.conns) > 0 {
		(<-m.conns).CloseLasting()
	}
	if m.host > 0 {
		m.host.Close()
		m.host = -1
	}
}

// Uninstall removes nook's nftables table. It is for tests and for
// uninstalling nook; sandboxes lose all connectivity.
func (m *Manager) Uninstall(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c := m.nft()
	c.AddTable(m.lay.table)
	c.DelTable(m.lay.table)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("delete table inet %s: %w", tableName, err)
	}
	return nil
}

// Pool returns the manager's address pool.
func (m *Manager) Pool() *Pool { return m.pool }

// nft returns a fresh nftables connection in the host namespace: one per
// batch, so concurrent operations never mix their messages.
func (m *Manager) nft() *nftables.Conn {
	c, _ := nftables.New(nftables.WithNetNSFd(int(m.host)), nftables.WithSockOptions(bigReceiveBuffer))
	return c
}

// nftBuffer is the send and receive buffer of nftables connections. A
// batch is one sendmsg, refused (EMSGSIZE) when larger than the send
// buffer; and the kernel answers every message of a batch after the
// commit, each answer its own buffer (hundreds of bytes of accounting),
// and answers the receive buffer cannot hold are lost (ENOBUFS) although
// the batch committed.
const nftBuffer = 16 << 20

// bigReceiveBuffer gives a netlink connection nftBuffer both ways, past
// the host's rmem_max and wmem_max (SO_RCVBUFFORCE and SO_SNDBUFFORCE:
// the daemon runs as root), and has the kernel answer without repeating
// each request (NETLINK_CAP_ACK).
func bigReceiveBuffer(c *mdnetlink.Conn) error {
	if err := c.SetOption(mdnetlink.CapAcknowledge, true); err != nil {
		return fmt.Errorf("netlink answers without their requests: %w", err)
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, nftBuffer)
		if serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, nftBuffer)
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		// Not root (tests without privileges): the host's maximum.
		c.SetWriteBuffer(nftBuffer)
		return c.SetReadBuffer(nftBuffer)
	}
	return nil
}

// lastingConns is how many idle lasting connections a Manager keeps.
const lastingConns = 8

// lasting returns a lasting nftables connection in the host namespace
// for one batch, and put, which hands it back with the batch's error:
// kept for the next batch, or closed when the batch failed (its socket
// may hold answers nobody read). Closing a netlink socket costs the
// kernel an RCU grace period (milliseconds), so a connection per batch
// made every create, policy change and learned address wait for one.
func (m *Manager) lasting() (*nftables.Conn, func(error)) {
	var c *nftables.Conn
	select {
	case c = <-m.conns:
	default:
		var err error
		if c, err = nftables.New(nftables.AsLasting(), nftables.WithNetNSFd(int(m.host)), nftables.WithSockOptions(bigReceiveBuffer)); err != nil {
			// Flush reports the same error.
			return m.nft(), func(error) {}
		}
	}
	return c, func(err error) {
		if err == nil {
			select {
			case m.conns <- c:
				return
			default:
			}
		}
		c.CloseLasting()
	}
}

// commit queues steps, in order, in one batch on a lasting connection
// and commits it. The connection goes back for the next batch unless a
// step or the commit failed.
func (m *Manager) commit(steps ...func(c *nftables.Conn) error) error {
	c, put := m.lasting()
	for _, step := range steps {
		if err := step(c); err != nil {
			put(err)
			return err
		}
	}
	err := c.Flush()
	put(err)
	return err
}

// ifacePrefix starts every sandbox interface's name.
const ifacePrefix = "nk"

// IfaceName returns the host-side interface name of a sandbox: "nk" and 12
// hex digits of the SHA-256 of its ID (14 characters, within IFNAMSIZ).
func IfaceName(id string) string {
	sum := sha256.Sum256([]byte(id))
	return ifacePrefix + hex.EncodeToString(sum[:6])
}

func validateID(id string) error {
	if id == "" || len(id) > 128 || id[0] == '.' {
		return errdefs.Invalid("sandbox id %q: want 1-128 characters of [A-Za-z0-9._-], not starting with a dot", id)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return errdefs.Invalid("sandbox id %q: want 1-128 characters of [A-Za-z0-9._-], not starting with a dot", id)
		}
	}
	return nil
}

// lock serializes operations on one sandbox ID.
func (m *Manager) lock(id string) func() { return m.locks.Lock(id) }

func (m *Manager) checkArgs(ctx context.Context, id string, subnet netip.Prefix) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validateID(id); err != nil {
		return err
	}
	if err := checkSubnet(subnet); err != nil {
		return err
	}
	if !m.pool.Contains(subnet) {
		return errdefs.Invalid("sandbox subnet %v is outside the pool %v", subnet, m.pool.Prefix())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sb := range m.sandboxes {
		if sb.subnet == subnet && sb.id != id {
			return errdefs.Exists("sandbox subnet %v is in use by another sandbox", subnet)
		}
	}
	return nil
}

// SetupContainer attaches a container sandbox: it creates a network
// namespace bind-mounted at NetnsDir/<id> (the path for the OCI spec's
// network namespace), a veth pair whose host end (IfaceName) holds the
// gateway address and whose peer is eth0 inside with the sandbox address,
// loopback up, a default route via the gateway and IPv6 disabled. The
// sandbox starts deny-all: only its resolver (gateway port 53) answers
// until SetPolicy. Calling it again for a live sandbox (after a daemon
// restart) adopts the existing namespace and interfaces and resets the
// rules to deny-all.
func (m *Manager) SetupContainer(ctx context.Context, id string, subnet netip.Prefix) (string, error) {
	if err := m.checkArgs(ctx, id, subnet); err != nil {
		return "", err
	}
	unlock := m.lock(id)
	defer unlock()
	iface := IfaceName(id)
	path := filepath.Join(m.cfg.NetnsDir, id)
	gw, addr := Gateway(subnet), SandboxAddr(subnet)

	if link, err := m.nl.LinkByName(iface); err == nil {
		if link.Type() == "veth" && link.Attrs().Alias == aliasPrefix+id && isNetnsMount(path) && m.hasAddr(link, gw) {
			if err := m.adoptContainer(link, path, subnet); err != nil {
				return "", err
			}
			return path, m.finishSetup(id, iface, KindVeth, subnet, path, link.Attrs().Index, true)
		}
		if err := m.teardown(ctx, id); err != nil {
			return "", err
		}
	} else if err := removeNetns(path); err != nil {
		return "", err
	}

	ns, err := createNetns(path)
	if err != nil {
		return "", err
	}
	defer ns.Close()
	fail := func(err error) (string, error) {
		m.nl.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: iface}})
		removeNetns(path)
		return "", err
	}
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: iface, Flags: net.FlagUp},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(ns),
	}
	if err := m.nl.LinkAdd(veth); err != nil {
		return fail(fmt.Errorf("create veth %s: %w", iface, err))
	}
	// The kernel ignores an alias in the create request.
	if err := m.nl.LinkSetAlias(veth, aliasPrefix+id); err != nil {
		return fail(fmt.Errorf("alias %s: %w", iface, err))
	}
	if err := m.nl.AddrAdd(veth, &netlink.Addr{IPNet: ipNet(gw, subnet)}); err != nil {
		return fail(fmt.Errorf("address %s: %w", iface, err))
	}
	if err := configureInside(ns, addr, gw, subnet, false); err != nil {
		return fail(err)
	}
	if err := m.finishSetup(id, iface, KindVeth, subnet, path, veth.Attrs().Index, false); err != nil {
		return fail(err)
	}
	if err := m.waitOperUp(ctx, ns, veth.Attrs().Index); err != nil {
		m.log.WarnContext(ctx, "network: sandbox link not up yet", "sandbox", id, "err", err)
	}
	return path, nil
}

// waitOperUp waits until both ends of a new veth pair are operationally
// up. The kernel activates a device's queueing discipline asynchronously
// after its carrier comes up, and until then drops what is sent: a sandbox
// that starts talking at once would lose its first packets.
func (m *Manager) waitOperUp(ctx context.Context, ns netns.NsHandle, hostIndex int) error {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer h.Close()
	deadline := time.Now().Add(2 * time.Second)
	for delay := 20 * time.Microsecond; ; delay = min(2*delay, 5*time.Millisecond) {
		inside, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		host, err := m.nl.LinkByIndex(hostIndex)
		if err != nil {
			return err
		}
		if inside.Attrs().OperState == netlink.OperUp && host.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("link state: host end %v, eth0 %v", host.Attrs().OperState, inside.Attrs().OperState)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// configureInside sets loopback up, eth0's address and the default route
// inside a sandbox namespace; replace makes it idempotent for adoption.
func configureInside(ns netns.NsHandle, addr, gw netip.Addr, subnet netip.Prefix, replace bool) error {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink handle in sandbox netns: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("sandbox lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("sandbox lo up: %w", err)
	}
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return fmt.Errorf("sandbox eth0: %w", err)
	}
	a := &netlink.Addr{IPNet: ipNet(addr, subnet)}
	if replace {
		err = h.AddrReplace(eth, a)
	} else {
		err = h.AddrAdd(eth, a)
	}
	if err != nil {
		return fmt.Errorf("sandbox eth0 address: %w", err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("sandbox eth0 up: %w", err)
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(gw.AsSlice())}
	if replace {
		err = h.RouteReplace(route)
	} else {
		err = h.RouteAdd(route)
	}
	if err != nil {
		return fmt.Errorf("sandbox default route: %w", err)
	}
	return nil
}

func (m *Manager) adoptContainer(link netlink.Link, path string, subnet netip.Prefix) error {
	if err := m.nl.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", link.Attrs().Name, err)
	}
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open sandbox netns: %w", err)
	}
	defer ns.Close()
	return configureInside(ns, SandboxAddr(subnet), Gateway(subnet), subnet, true)
}

// SetupTap attaches a VM sandbox: a persistent tap device named IfaceName
// in the host namespace, owned by Config.TapOwner/TapGroup, with the
// gateway address; the vm backend attaches to it by name (TUNSETIFF, as
// -netdev tap,ifname= would) and passes QEMU the descriptor, and the guest
// configures the sandbox address (.2) and the default route itself. The
// same rules as for containers apply, keyed on the interface.
func (m *Manager) SetupTap(ctx context.Context, id string, subnet netip.Prefix) (string, error) {
	if err := m.checkArgs(ctx, id, subnet); err != nil {
		return "", err
	}
	unlock := m.lock(id)
	defer unlock()
	iface := IfaceName(id)
	gw := Gateway(subnet)
	if link, err := m.nl.LinkByName(iface); err == nil {
		if link.Type() == "tuntap" && link.Attrs().Alias == aliasPrefix+id && m.hasAddr(link, gw) {
			if err := m.nl.LinkSetUp(link); err != nil {
				return "", fmt.Errorf("set %s up: %w", iface, err)
			}
			return iface, m.finishSetup(id, iface, KindTap, subnet, "", link.Attrs().Index, true)
		}
		if err := m.teardown(ctx, id); err != nil {
			return "", err
		}
	}
	tap := &netlink.Tuntap{
		LinkAttrs: netlink.LinkAttrs{Name: iface},
		Mode:      netlink.TUNTAP_MODE_TAP,
		Flags:     netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR,
		Owner:     m.cfg.TapOwner,
		Group:     m.cfg.TapGroup,
	}
	// The tun ioctls act in the calling thread's namespace.
	if err := inNetns(m.host, func() error { return m.nl.LinkAdd(tap) }); err != nil {
		return "", fmt.Errorf("create tap %s: %w", iface, err)
	}
	fail := func(err error) (string, error) {
		m.nl.LinkDel(tap)
		return "", err
	}
	if err := m.nl.LinkSetAlias(tap, aliasPrefix+id); err != nil {
		return fail(fmt.Errorf("alias %s: %w", iface, err))
	}
	if err := m.nl.AddrAdd(tap, &netlink.Addr{IPNet: ipNet(gw, subnet)}); err != nil {
		return fail(fmt.Errorf("address %s: %w", iface, err))
	}
	if err := m.nl.LinkSetUp(tap); err != nil {
		return fail(fmt.Errorf("set %s up: %w", iface, err))
	}
	if err := m.finishSetup(id, iface, KindTap, subnet, "", tap.Attrs().Index, false); err != nil {
		return fail(err)
	}
	return iface, nil
}

// finishSetup installs the sandbox's rules (deny-all) and records it.
// adopted says the sandbox existed before, so it may have connections.
func (m *Manager) finishSetup(id, iface string, kind Kind, subnet netip.Prefix, path string, ifindex int, adopted bool) error {
	if err := m.prepareSetup(iface); err != nil {
		return err
	}
	if err := m.commit(func(c *nftables.Conn) error { return m.queueSetup(c, id, iface, subnet) }); err != nil {
		return fmt.Errorf("install rules for %s: %w", iface, err)
	}
	m.recordSetup(id, iface, kind, subnet, path, ifindex, adopted)
	return nil
}

// prepareSetup sets strict reverse-path filtering on a sandbox's
// interface: a packet whose source would not route back through it (a
// spoofed address) is dropped before any rule, established flows
// included.
func (m *Manager) prepareSetup(iface string) error {
	if err := inNetns(m.host, func() error { return writeSysctl("net/ipv4/conf/"+iface+"/rp_filter", "1") }); err != nil {
		return fmt.Errorf("rp_filter on %s: %w", iface, err)
	}
	return nil
}

// queueSetup queues a sandbox's elements, deny-all: what an earlier run
// or attachment left goes.
func (m *Manager) queueSetup(c *nftables.Conn, id, iface string, subnet netip.Prefix) error {
	stale, base := m.setupElements(id, iface, subnet)
	if err := m.lay.removeAll(c, stale); err != nil {
		return err
	}
	return m.lay.addAll(c, base)
}

// setupElements returns what an earlier run or attachment left of a
// sandbox's elements, and its elements deny-all.
func (m *Manager) setupElements(id, iface string, subnet netip.Prefix) (stale, base map[string][]nftables.SetElement) {
	m.mu.Lock()
	defer m.mu.Unlock()
	stale = m.stale[iface]
	if old := m.sandboxes[id]; old != nil {
		stale = mergeElements(stale, m.installed(old))
	}
	return stale, baseElements(iface, subnet)
}

// recordSetup records a sandbox whose elements are in. adopted says the
// sandbox existed before, so it may have connections.
func (m *Manager) recordSetup(id, iface string, kind Kind, subnet netip.Prefix, path string, ifindex int, adopted bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.stale, iface)
	old := m.sandboxes[id]
	sb := &sandbox{
		id: id, iface: iface, kind: kind, subnet: subnet, netns: path, ifindex: ifindex,
		mayHaveFlows: adopted,
		learned:      map[netip.Addr]learnedEntry{},
		learnedLRU:   list.New(),
		exposes:      map[uint16]*forwarder{},
		events:       newEventLimit(m.cfg.EventRate),
	}
	if old != nil {
		sb.exposes = old.exposes
		delete(m.byIndex, old.ifindex)
	}
	m.sandboxes[id] = sb
	m.byIndex[ifindex] = id
}

func (m *Manager) hasAddr(link netlink.Link, gw netip.Addr) bool {
	addrs, err := m.linkAddrs(link.Attrs().Index)
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if a.Addr() == gw {
			return true
		}
	}
	return false
}

// newAddrSocket opens a route netlink socket in ns with strict checking,
// so that the kernel filters an address dump by link: reading one link's
// addresses does not read every sandbox's (vishvananda/netlink's AddrList
// dumps them all and filters them itself).
func newAddrSocket(ns netns.NsHandle) (*nl.NetlinkSocket, error) {
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.SetsockoptInt(s.GetFd(), unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1); err != nil {
		s.Close()
		return nil, fmt.Errorf("netlink strict checking: %w", err)
	}
	return s, nil
}

// linkAddrs returns the IPv4 addresses of the link with index index.
func (m *Manager) linkAddrs(index int) ([]netip.Prefix, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETADDR, unix.NLM_F_DUMP)
	msg := nl.NewIfAddrmsg(unix.AF_INET)
	msg.Index = uint32(index)
	req.AddData(msg)
	m.addrMu.Lock()
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: m.addrSock}}
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWADDR)
	m.addrMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	var out []netip.Prefix
	for _, b := range msgs {
		ifa := nl.DeserializeIfAddrmsg(b)
		if int(ifa.Index) != index || ifa.Family != unix.AF_INET {
			continue // a kernel without strict checking dumps them all
		}
		attrs, err := nl.ParseRouteAttr(b[unix.SizeofIfAddrmsg:])
		if err != nil {
			return nil, fmt.Errorf("list addresses: %w", err)
		}
		for _, a := range attrs {
			if a.Attr.Type != unix.IFA_LOCAL && a.Attr.Type != unix.IFA_ADDRESS {
				continue
			}
			if ip, ok := netip.AddrFromSlice(a.Value); ok {
				out = append(out, netip.PrefixFrom(ip.Unmap(), int(ifa.Prefixlen)))
				break
			}
		}
	}
	return out, nil
}

func ipNet(a netip.Addr, subnet netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(subnet.Bits(), 32)}
}

// Teardown removes everything a sandbox has on the host: its exposed
// ports, namespace mount, interfaces, nftables chain, sets and shared-set
// entries, and its conntrack entries. It is idempotent and works from
// kernel state alone, so it also cleans up after a crash.
func (m *Manager) Teardown(ctx context.Context, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validateID(id); err != nil {
		return err
	}
	unlock := m.lock(id)
	defer unlock()
	return m.teardown(ctx, id)
}

func (m *Manager) teardown(ctx context.Context, id string) error {
	iface := IfaceName(id)
	var subnet netip.Prefix
	m.mu.Lock()
	sb := m.sandboxes[id]
	elems := m.stale[iface]
	if sb != nil {
		elems = mergeElements(elems, m.installed(sb))
		subnet = sb.subnet
		delete(m.byIndex, sb.ifindex)
		delete(m.sandboxes, id)
		m.tearing[id] = subnet
		defer func() {
			m.mu.Lock()
			delete(m.tearing, id)
			m.mu.Unlock()
		}()
	}
	m.mu.Unlock()
	if sb != nil {
		for _, f := range sb.exposes {
			f.close()
		}
	}

	var errs []error
	if link, err := m.nl.LinkByName(iface); err == nil {
		if !subnet.IsValid() {
			subnet = m.linkSubnet(link)
		}
		// A veth goes by itself when its namespace does: gone is deleted.
		if err := m.nl.LinkDel(link); err != nil && !errors.Is(err, syscall.ENODEV) {
			errs = append(errs, fmt.Errorf("delete %s: %w", iface, err))
		}
	} else if !errors.As(err, new(netlink.LinkNotFoundError)) {
		errs = append(errs, fmt.Errorf("look up %s: %w", iface, err))
	}
	if err := removeNetns(filepath.Join(m.cfg.NetnsDir, id)); err != nil {
		errs = append(errs, err)
	}
	if subnet.IsValid() {
		elems = mergeElements(elems, baseElements(iface, subnet))
	}
	if err := m.removeRules(iface, elems); err != nil {
		errs = append(errs, err)
	}
	if subnet.IsValid() {
		m.flushConntrack(ctx, func(f *netlink.ConntrackFlow) bool {
			return prefixHas(subnet, f.Forward.SrcIP) || prefixHas(subnet, f.Forward.DstIP)
		})
	}
	return errors.Join(errs...)
}

// removeRules deletes a sandbox's set elements, whichever of them exist.
func (m *Manager) removeRules(iface string, elems map[string][]nftables.SetElement) error {
	if err := m.commit(func(c *nftables.Conn) error { return m.lay.removeAll(c, elems) }); err != nil {
		return fmt.Errorf("remove rules of %s: %w", iface, err)
	}
	m.mu.Lock()
	delete(m.stale, iface)
	m.mu.Unlock()
	return nil
}

// installed returns what the manager put in the sets for sb beyond its
// base elements: its policy's and its learned addresses'. The caller
// holds m.mu.
func (m *Manager) installed(sb *sandbox) map[string][]nftables.SetElement {
	return mergeElements(policyElements(sb.iface, &sb.policy), m.lay.learnedElements(sb.iface, sb.learned))
}

// mergeElements returns the union of element lists by set, each element
// once (a batch that deletes one twice fails).
func mergeElements(ms ...map[string][]nftables.SetElement) map[string][]nftables.SetElement {
	out := map[string][]nftables.SetElement{}
	seen := map[string]bool{}
	for _, m := range ms {
		for k, v := range m {
			for _, e := range v {
				id := k + "\x00" + string(e.Key) + "\x00" + string(e.KeyEnd)
				if !seen[id] {
					seen[id] = true
					out[k] = append(out[k], e)
				}
			}
		}
	}
	return out
}

// readElements lists the elements of every set keyed by a sandbox's
// interface, by interface. It reads the whole table: New calls it once.
func (m *Manager) readElements() (map[string]map[string][]nftables.SetElement, error) {
	out := map[string]map[string][]nftables.SetElement{}
	c := m.nft()
	for _, name := range policySets {
		elems, err := c.GetSetElements(m.lay.sharedSets[name])
		if err != nil {
			return nil, fmt.Errorf("list set %s: %w", name, err)
		}
		for _, e := range elems {
			if len(e.Key) < 16 || e.IntervalEnd {
				continue
			}
			iface := string(bytes.TrimRight(e.Key[:16], "\x00"))
			if out[iface] == nil {
				out[iface] = map[string][]nftables.SetElement{}
			}
			out[iface][name] = append(out[iface][name], nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd})
		}
	}
	return out, nil
}

func (m *Manager) linkSubnet(link netlink.Link) netip.Prefix {
	addrs, err := m.linkAddrs(link.Attrs().Index)
	if err != nil {
		return netip.Prefix{}
	}
	for _, a := range addrs {
		if p := a.Masked(); m.pool.Contains(p) {
			return p
		}
	}
	return netip.Prefix{}
}

// List returns the sandbox attachments found in the kernel: nook's
// interfaces (by their alias) and namespace mounts without one.
func (m *Manager) List(ctx context.Context) ([]Attachment, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	links, err := m.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []Attachment
	seen := map[string]bool{}
	for _, l := range links {
		id, ok := strings.CutPrefix(l.Attrs().Alias, aliasPrefix)
		if !ok || validateID(id) != nil || l.Attrs().Name != IfaceName(id) {
			continue
		}
		a := Attachment{ID: id, Iface: l.Attrs().Name, Kind: KindTap, Subnet: m.linkSubnet(l)}
		if l.Type() == "veth" {
			a.Kind = KindVeth
			a.Netns = filepath.Join(m.cfg.NetnsDir, id)
		}
		seen[id] = true
		out = append(out, a)
	}
	ents, err := os.ReadDir(m.cfg.NetnsDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("list %s: %w", m.cfg.NetnsDir, err)
	}
	for _, e := range ents {
		if id := e.Name(); !seen[id] && validateID(id) == nil {
			out = append(out, Attachment{ID: id, Kind: KindVeth, Netns: filepath.Join(m.cfg.NetnsDir, id)})
		}
	}
	return out, nil
}

// Reconcile removes every attachment, and every nftables chain of a
// sandbox interface, that does not belong to a sandbox in keep. The daemon
// calls it after a restart, once it has set up the sandboxes it knows.
func (m *Manager) Reconcile(ctx context.Context, keep []string) (removed []string, err error) {
	atts, err := m.List(ctx)
	if err != nil {
		return nil, err
	}
	kept := map[string]bool{}
	for _, id := range keep {
		kept[IfaceName(id)] = true
	}
	var errs []error
	for _, a := range atts {
		if kept[IfaceName(a.ID)] {
			continue
		}
		if err := m.Teardown(ctx, a.ID); err != nil {
			errs = append(errs, err)
		}
		removed = append(removed, a.ID)
	}
	// Elements of interfaces whose link is gone (a sandbox's namespace
	// ended while no daemon ran).
	m.mu.Lock()
	var orphans []string
	for iface := range m.stale {
		if !kept[iface] {
			orphans = append(orphans, iface)
		}
	}
	m.mu.Unlock()
	for _, iface := range orphans {
		m.mu.Lock()
		elems := m.stale[iface]
		m.mu.Unlock()
		if err := m.removeRules(iface, elems); err != nil {
			errs = append(errs, err)
		}
		removed = append(removed, iface)
	}
	return removed, errors.Join(errs...)
}

func (m *Manager) get(id string) (*sandbox, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sb := m.sandboxes[id]
	if sb == nil {
		return nil, errdefs.NotFound("sandbox %q has no network attachment", id)
	}
	return sb, nil
}

// SetPolicy replaces a sandbox's static policy in one nftables
// transaction: new connections see the new policy at once, and existing
// connections the new policy no longer allows are cut (their conntrack
// entries are removed, so their next packet is judged again and refused).
// DNS-learned addresses stay unless p.ResetLearned. Invalid rules fail
// before anything changes.
func (m *Manager) SetPolicy(ctx context.Context, id string, p Policy) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	comp, err := compilePolicy(p, m.pool.Prefix())
	if err != nil {
		return err
	}
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.get(id)
	if err != nil {
		return err
	}
	m.mu.Lock()
	old := sb.policy
	var learnedElems map[string][]nftables.SetElement
	if p.ResetLearned {
		learnedElems = m.lay.learnedElements(sb.iface, sb.learned)
	}
	m.mu.Unlock()
	if err := m.commit(
		func(c *nftables.Conn) error { return m.lay.applyPolicy(c, sb.iface, &old, &comp) },
		func(c *nftables.Conn) error { return m.lay.removeAll(c, learnedElems) },
	); err != nil {
		return fmt.Errorf("apply policy of %s: %w", id, err)
	}
	m.mu.Lock()
	sb.policy = comp
	cut := sb.mayHaveFlows && !p.KeepFlows
	sb.mayHaveFlows = true
	if p.ResetLearned {
		sb.learned = map[netip.Addr]learnedEntry{}
		sb.learnedLRU = list.New()
		sb.learnedElems = 0
	}
	learned := make(map[netip.Addr]learnedEntry, len(sb.learned))
	for k, v := range sb.learned {
		learned[k] = v
	}
	m.mu.Unlock()
	if !cut {
		return nil
	}
	j := flowJudge{subnet: sb.subnet, policy: comp, learned: learned, now: time.Now(), pool: m.pool.Prefix()}
	src := SandboxAddr(sb.subnet)
	m.flushConntrack(ctx, func(f *netlink.ConntrackFlow) bool {
		s, _ := netip.AddrFromSlice(f.Forward.SrcIP)
		return s.Unmap() == src && j.refuses(f)
	})
	return nil
}

// flowJudge judges a sandbox's connections by its policy.
type flowJudge struct {
	subnet  netip.Prefix
	policy  compiled
	learned map[netip.Addr]learnedEntry
	now     time.Time
	pool    netip.Prefix
}

// refuses reports whether the policy refuses flow f, which the sandbox
// opened.
func (j *flowJudge) refuses(f *netlink.ConntrackFlow) bool {
	d, _ := netip.AddrFromSlice(f.Forward.DstIP)
	if !d.IsValid() {
		return false
	}
	d = d.Unmap()
	if d == Gateway(j.subnet) {
		return false // the resolver, judged by the input chain
	}
	return verdict(&j.policy, j.pool, j.learned, j.now, d, f.Forward.Protocol, f.Forward.DstPort) != reasonAccepted
}

// CutFlows cuts the connections of every sandbox that its policy no
// longer allows, reading the conntrack table once: the daemon calls it
// after restoring every sandbox's policy with Policy.KeepFlows.
func (m *Manager) CutFlows(ctx context.Context) {
	now := time.Now()
	m.mu.Lock()
	bySrc := make(map[netip.Addr]*flowJudge, len(m.sandboxes))
	for _, sb := range m.sandboxes {
		learned := make(map[netip.Addr]learnedEntry, len(sb.learned))
		for k, v := range sb.learned {
			learned[k] = v
		}
		bySrc[SandboxAddr(sb.subnet)] = &flowJudge{subnet: sb.subnet, policy: sb.policy, learned: learned, now: now, pool: m.pool.Prefix()}
	}
	m.mu.Unlock()
	m.flushConntrack(ctx, func(f *netlink.ConntrackFlow) bool {
		s, _ := netip.AddrFromSlice(f.Forward.SrcIP)
		j := bySrc[s.Unmap()]
		return j != nil && j.refuses(f)
	})
}

// learnSlack is how much earlier than its new TTL a learned address may
// expire when AllowLearned skips refreshing one it refreshed just before.
const learnSlack = time.Second

// maxLearnedPorts caps how many single ports one AllowLearned call may
// expand its port ranges into.
const maxLearnedPorts = 1024

// AllowLearned lets a sandbox reach addr, on ports (all protocols when
// empty; TCP and UDP otherwise), for ttl: the DNS resolver calls it for
// every address it returns, before returning it. Calling it again for the
// same address and ports resets the timeout. When the timeout passes, new
// connections are refused; established ones continue. A learned address
// never opens a private range (only an allow rule can), the always-blocked
// ranges or the pool: DNS rebinding cannot reach them. IPv6 addresses are
// refused with an invalid-argument error (sandboxes have no IPv6).
//
// A sandbox holds at most Config.LearnedLimit learned set elements: when
// addr does not fit, the least recently learned addresses are evicted in
// the same transaction (new connections to them are refused until they
// are learned again). An address that alone needs more than the limit is
// refused (errdefs.ErrResourceExhausted).
func (m *Manager) AllowLearned(ctx context.Context, id string, addr netip.Addr, ports []PortRange, ttl time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	addr = addr.Unmap()
	if !addr.Is4() {
		return errdefs.Invalid("learned address %v: sandboxes are IPv4 only", addr)
	}
	if ttl < time.Millisecond {
		return errdefs.Invalid("learned address %v: ttl %v too short", addr, ttl)
	}
	for _, pr := range ports {
		if pr.First == 0 || pr.Last < pr.First {
			return errdefs.Invalid("learned address %v: bad port range %v", addr, pr)
		}
	}
	ports = mergePorts(ports)
	if n := countPorts(ports); n > maxLearnedPorts {
		return errdefs.Invalid("learned address %v: %d ports, at most %d", addr, n, maxLearnedPorts)
	}
	// One at a time per sandbox, so that the count below stays true
	// between the choice of what to evict and the commit.
	unlock := m.lock(id)
	defer unlock()
	sb, err := m.get(id)
	if err != nil {
		return err
	}
	tmo := ttl.Truncate(time.Millisecond)
	now := time.Now()
	m.mu.Lock()
	old, had := sb.learned[addr]
	// A new address is only added. One the kernel may already hold gets
	// its new timeout by delete and add, which costs the commit an RCU
	// grace period (milliseconds), so not again within learnSlack: a
	// sandbox resolving one name in a burst pays it once.
	if had && slices.Equal(old.ports, ports) && !old.expires.Before(now.Add(tmo-learnSlack)) {
		sb.learnedLRU.MoveToFront(old.lru)
		m.mu.Unlock()
		return nil
	}
	e := learnedEntry{ports: ports, expires: now.Add(tmo), kall: len(ports) == 0}
	if !e.kall {
		e.kports = ports
	}
	if had && now.Before(old.expires) {
		// The kernel holds both entries; remember their union.
		if len(old.ports) == 0 || len(ports) == 0 {
			e.ports = nil
		} else {
			e.ports = mergePorts(append(slices.Clone(old.ports), ports...))
		}
		e.kall = e.kall || old.kall
		e.kports = mergePorts(append(slices.Clone(old.kports), e.kports...))
		if old.expires.After(e.expires) {
			e.expires = old.expires
		}
	}
	victims, err := m.evictions(sb, addr, e, now)
	m.mu.Unlock()
	if err != nil {
		return err
	}
	// The evicted addresses' elements go in one list per set (a message
	// each per set, not per address: every message gets an answer, and
	// too many overflow the socket).
	gone := map[netip.Addr]learnedEntry{}
	for _, v := range victims {
		if now.Before(v.entry.expires) { // else the kernel has let it expire
			gone[v.addr] = v.entry
		}
	}
	if err := m.commit(
		func(c *nftables.Conn) error { return m.lay.removeAll(c, m.lay.learnedElements(sb.iface, gone)) },
		func(c *nftables.Conn) error { return m.lay.learn(c, sb.iface, addr, ports, tmo, had) },
	); err != nil {
		return fmt.Errorf("learn %v for %s: %w", addr, id, err)
	}
	m.mu.Lock()
	for _, v := range victims {
		sb.learnedLRU.Remove(v.entry.lru)
		sb.learnedElems -= v.entry.elems()
		delete(sb.learned, v.addr)
	}
	if old, ok := sb.learned[addr]; ok {
		sb.learnedElems -= old.elems()
		e.lru = old.lru
		sb.learnedLRU.MoveToFront(e.lru)
	} else {
		e.lru = sb.learnedLRU.PushFront(addr)
	}
	sb.learnedElems += e.elems()
	sb.learned[addr] = e
	warn := len(victims) > 0 && !sb.learnedFull
	sb.learnedFull = sb.learnedFull || len(victims) > 0
	m.mu.Unlock()
	if warn {
		m.log.WarnContext(ctx, "network: sandbox reached its limit of learned addresses; evicting the least recently learned",
			"sandbox", id, "limit", m.cfg.LearnedLimit)
	}
	return nil
}

type learnedVictim struct {
	addr  netip.Addr
	entry learnedEntry
}

// evictions returns the least recently learned addresses that must go
// for e, what addr will hold, to fit in Config.LearnedLimit elements.
// The caller holds m.mu and the sandbox's lock.
func (m *Manager) evictions(sb *sandbox, addr netip.Addr, e learnedEntry, now time.Time) ([]learnedVictim, error) {
	limit := m.cfg.LearnedLimit
	need := e.elems()
	if need > limit {
		return nil, errdefs.Exhausted("learned address %v on %d ports needs %d set elements, more than the sandbox's limit of %d: allow fewer ports for the name",
			addr, countPorts(e.kports), need, limit)
	}
	used := sb.learnedElems
	if old, ok := sb.learned[addr]; ok {
		used -= old.elems()
	}
	var out []learnedVictim
	for el := sb.learnedLRU.Back(); el != nil && used+need > limit; el = el.Prev() {
		a := el.Value.(netip.Addr)
		if a == addr {
			continue
		}
		v := learnedVictim{a, sb.learned[a]}
		out = append(out, v)
		used -= v.entry.elems()
	}
	return out, nil
}

// flushConntrack deletes the conntrack entries match selects. Errors are
// logged: a leftover entry only lets an old flow live on.
func (m *Manager) flushConntrack(ctx context.Context, match func(*netlink.ConntrackFlow) bool) {
	n, err := m.nl.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, flowFilter(match))
	if err != nil {
		m.log.WarnContext(ctx, "network: delete conntrack entries", "err", err)
		return
	}
	if n > 0 {
		m.log.DebugContext(ctx, "network: deleted conntrack entries", "count", n)
	}
}

type flowFilter func(*netlink.ConntrackFlow) bool

func (f flowFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool { return f(flow) }

func prefixHas(p netip.Prefix, ip net.IP) bool {
	a, ok := netip.AddrFromSlice(ip)
	return ok && p.Contains(a.Unmap())
}

// warnForwardDrop logs when an iptables-nft FORWARD chain drops by default.
func (m *Manager) warnForwardDrop() {
	chains, err := m.nft().ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return
	}
	for _, ch := range chains {
		if ch.Table.Name == "filter" && ch.Name == "FORWARD" && ch.Policy != nil && *ch.Policy == nftables.ChainPolicyDrop {
			m.log.Warn("network: iptables FORWARD policy is DROP (Docker?); sandbox traffic is dropped unless that firewall accepts the pool",
				"pool", m.pool.Prefix().String())
		}
	}
}
