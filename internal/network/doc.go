// Package network is nook's kernel network dataplane: every sandbox gets
// its own network, an address from a pool, and an egress policy enforced by
// nftables in the host kernel, not by a proxy a process could bypass.
//
// # Addresses
//
// Sandbox subnets are /30s from Config.Pool (default 10.89.0.0/16, 16384
// sandboxes): .1 is the gateway on the host end, .2 the sandbox. Pool is
// stateless and deterministic; the daemon persists each sandbox's subnet,
// marks the taken ones in a Taken (a bit a subnet, in words of 64) and
// asks AllocateFrom for the lowest free one: no list of every sandbox's
// subnet is built and searched under its allocation lock, which with
// 1,000 sandboxes held every create's network attach for milliseconds
// of allocations and garbage. An exhausted pool is
// ErrPoolExhausted (errdefs.ErrResourceExhausted).
//
// # Attachments
//
// A container gets a network namespace bind-mounted at NetnsDir/<id> (the
// path for the OCI spec), with loopback up, IPv6 disabled, and eth0 (the
// peer of a veth pair) holding .2/30 with a default route via .1. A VM gets
// a persistent tap device with the gateway address; the guest configures
// .2 itself. Either way the host-side interface is IfaceName(id) ("nk" and
// 12 hex digits), carries the alias "nook:<id>", and everything in the
// rules is keyed on its name. All netlink and nftables work happens through
// handles bound to Config.HostNetns, so tests run the whole dataplane in a
// namespace they made.
//
// # Rules
//
// One table, inet nook, owned by nook. Shared sets: pool, blocked (0/8,
// 127/8, 169.254/16, 224/4, 240/4), private (10/8, 100.64/10, 172.16/12,
// 192.168/16) and dnsports (tcp/udp 53 and 853). Every sandbox lives in
// sets keyed by its interface, shared by all sandboxes: ifaces (every
// sandbox interface), src (interface . its address), dns (interface .
// gateway . proto . port: its own resolver on 53, its metadata endpoint
// on MetadataPort and its egress proxy on EgressPort), allow and deny (interface .
// CIDR ranges), allowp and denyp (interface . CIDR ranges . proto . port
// ranges), learn and learnp (DNS-learned, with timeouts), public
// (interfaces whose policy is public) and intercept (interfaces whose
// policy intercepts: Policy.Intercept). Setting a sandbox up, changing its
// policy and removing it only add and delete elements: there is no chain
// per sandbox, so no commit makes the kernel revalidate the table (which
// a chain per sandbox, reached through a verdict map, cost: linear in the
// sandboxes alive). Dynamic sets the kernel fills itself, one element per
// sandbox interface: conn-<limit> (a connection count per sandbox) and
// log-<reason> (a log rate limiter per sandbox and reason).
//
//	chain forward (filter, policy accept)
//	  ct state established,related accept
//	  iifname @ifaces ct state invalid drop
//	  iifname @ifaces goto sandbox
//	  ip saddr @pool drop                      a sandbox link not (or no longer) registered
//	  oifname @ifaces goto deny-inbound        nothing opens a connection into a sandbox
//
//	chain sandbox (fixed; a sandbox is its elements in the sets)
//	  meta nfproto != ipv4                        goto deny-not-ipv4
//	  iifname . ip saddr != @src                  drop      no spoofing
//	  ip daddr @pool                              goto deny-sandbox
//	  ip daddr @blocked                           goto deny-blocked
//	  l4proto . th dport @dnsports                goto deny-dns
//	  iifname . ip daddr @deny                    goto deny-denied
//	  iifname . ip daddr . l4proto . th dport @denyp   goto deny-denied
//	  iifname . ip daddr @allow                   goto admit   static CIDRs, any port
//	  iifname . ip daddr . l4proto . th dport @allowp  goto admit   CIDR x port ranges
//	  ip daddr @private                           goto deny-private
//	  iifname @public                             goto admit   Policy.Public
//	  udp dport 443 iifname . ip daddr [. ...] @learn, @learnp  goto deny-quic  (QUIC hides its name)
//	  iifname . ip daddr @learn                   goto admit   DNS-learned, with timeouts (UDP: TCP was redirected)
//	  iifname . ip daddr . l4proto . th dport @learnp  goto admit
//	  goto deny-policy
//
//	chain input (filter, policy accept)
//	  ct state established,related accept      replies to what the host opened (Expose)
//	  iifname @ifaces tcp dport MetadataPort socket mark != <mark> goto deny-host
//	  iifname @ifaces tcp dport EgressPort socket mark != <mark> goto deny-host
//	                                           the gateway ports, into the daemon's marked sockets only
//	  iifname . ip daddr . l4proto . th dport @dns goto admit
//	  iifname @ifaces goto deny-host           every host address and port
//	  iifname != lo ip saddr @pool drop        a sandbox link not (or no longer) registered
//
//	chain admit (every new connection a sandbox may open)
//	  add @conn-<limit> { iifname ct count over <limit> } goto deny-conntrack-limit
//	  accept
//
//	chain prerouting (nat; a connection's first packet)
//	  iifname @ifaces ip daddr 169.254.169.254 tcp dport 80 redirect to :MetadataPort
//	      (to the incoming interface's address: the sandbox's own gateway)
//	  l4proto . th dport @dnsports accept         the forward chain refuses these,
//	  ip daddr @pool, @blocked accept             learned, intercepted or not
//	  iifname . ip daddr [. l4proto . th dport] @deny, @denyp accept
//	  iifname @intercept tcp dport 80, 443 iifname . ip daddr [. l4proto . th dport]
//	      @allow, @allowp redirect to :EgressPort
//	  ip daddr @private accept                    (the forward chain decides: learned or not)
//	  iifname @intercept tcp dport 80, 443 iifname @public redirect to :EgressPort
//	      Policy.Intercept: what a CIDR rule or @internet admits, to the sandbox's
//	      egress proxy (which terminates TLS for hosts secrets are bound to)
//	  iifname @public accept                      no name checks under @internet
//	  iifname . ip daddr [. l4proto . th dport] @allow, @allowp accept
//	                                              a CIDR rule opens it as before
//	  tcp iifname . ip daddr [. l4proto . th dport] @learn, @learnp redirect to :EgressPort
//	      a domain rule's address: to the sandbox's egress proxy (internal/egress),
//	      which checks the TLS server name or HTTP Host and splices
//
//	chain postrouting (nat)
//	  ip saddr <pool> oifname != @ifaces masquerade
//
//	chain deny-<reason>
//	  update @log-<reason> { iifname timeout 1m limit rate <LogRate>/second burst <2*LogRate> packets }
//	      log group 100 prefix "nook:<reason>" queue-threshold 1   (oifname for deny-inbound)
//	  meta l4proto tcp reject with tcp reset
//	  reject with icmpx admin-prohibited
//
// The interval sets with an interface field are concatenations the
// kernel keeps as pipapo sets, whose lookup is the same for any number of
// sandboxes' elements (bitmap ANDs). The manager knows what it put in the
// sets for each sandbox (its compiled policy, its learned addresses), so
// a policy change deletes exactly the old elements and adds the new ones
// in one transaction, and a teardown deletes what the sandbox had (each
// element added and deleted, or given a 1 ms timeout in the timeout sets,
// so the batch succeeds whether or not the kernel still holds it). At
// start a Manager reads the sets once and remembers each interface's
// elements: adopting a sandbox replaces them (deny-all until its policy),
// and Reconcile removes those of interfaces no sandbox keeps. A table an
// earlier nook made with a chain and sets per sandbox loses those at
// start; the daemon then adopts its sandboxes into the shared sets.
//
// So deny rules beat allow rules; allow CIDRs may open private ranges but
// never the always-blocked ranges or the pool; DNS-learned addresses open
// neither (DNS rebinding reaches nothing private); and DNS goes only to the
// sandbox's own gateway, where the daemon's resolver listens on
// Gateway(subnet):53 in the host namespace. Port rules cover TCP and UDP.
// The metadata address 169.254.169.254, port 80, is the one link-local
// destination a sandbox reaches, and only as its own gateway's
// MetadataPort, where the daemon serves that sandbox's metadata endpoint
// (internal/identity; ListenGateway listens there); any other port of it
// is blocked like the rest of 169.254/16. MetadataPort (169) is
// privileged, so no unprivileged host user binds it before the daemon;
// and a sandbox's connection to it is admitted only into a socket with
// the daemon's SO_MARK (which needs CAP_NET_ADMIN), so where the port is
// not privileged (ip_unprivileged_port_start lowered; the daemon warns)
// a socket someone else bound gets nothing.
//
// A policy that intercepts (Policy.Intercept) sends every new TCP
// connection to port 80 or 443 that a CIDR rule or @internet admits to
// the sandbox's egress proxy instead (a domain rule's addresses go there
// on every TCP port anyway). What the forward chain refuses is not
// redirected, and is refused as before: DNS ports, another sandbox, the
// always-blocked ranges, a deny rule, a private range no allow rule
// names, an address nothing admits. An intercepted connection never
// reaches the forward chain: the proxy, which dials from the host,
// judges it. Turning Intercept on or off cuts no connection by itself
// (the userspace verdict knows nothing of interception): existing ones
// keep going where they went.
//
// A policy lives in the sets alone: SetPolicy replaces its elements in
// one transaction without touching rules (replacing rules costs an RCU
// grace period). New connections see it at once; existing connections the
// new policy refuses are cut by deleting their conntrack entries (after a
// restart, CutFlows judges every sandbox's connections in one read of the
// conntrack table). An expired
// learned address refuses new connections; established ones continue.
//
// Refused TCP gets a reset and everything else ICMP "administratively
// prohibited", so refused connections fail at once. Refusals are logged to
// NFLOG (Config.LogGroup) and delivered to Config.OnDenied.
//
// # Per-sandbox limits on shared kernel tables
//
// No sandbox can use up what the host's sandboxes share:
//
//   - Conntrack: a sandbox may have Config.ConntrackLimit connections
//     tracked at once (4096; its resolver's count too). The count is
//     nf_conncount's (`ct count`), kept in the sandbox's element of
//     conn-<limit>, which the kernel drops when the count is 0. TCP in
//     TIME_WAIT or CLOSE is not counted (those connections have ended, and
//     the kernel's conntrack gc drops such entries first when the table is
//     nearly full). A new connection over the limit is refused like any
//     other denial, with reason "conntrack-limit". The limit is in the
//     set's name because an element keeps the limit it was made with: a
//     restart with another limit replaces the set.
//   - NFLOG: each sandbox has its own kernel log rate limit per reason
//     (Config.LogRate a second, burst twice that), so one sandbox's flood
//     cannot crowd out another's denials. The reader keeps no queue: it
//     hands each message to OnDenied at once, at most EventRate a second
//     per sandbox, and counts the rest in the next event's Suppressed
//     (what the kernel's limit dropped is not counted). A socket overflow
//     (ENOBUFS) is logged.
//   - Learned addresses: a sandbox holds at most Config.LearnedLimit
//     learned set elements (4096; an address for every port is one, one
//     for some ports two per port); a new one that does not fit evicts the
//     least recently learned (an LRU list, so O(1) per address), in the
//     same transaction. Where the kernel updates an element's timeout when
//     it is added again (Linux 6.10 and later, probed by New), an evicted
//     element gets a timeout of 1 ms, so it expires within a jiffy and the
//     kernel's gc frees it, without the RCU grace period a delete costs
//     the commit (on the development machine: 0.13 ms per evicting learn
//     against 16 ms); older kernels delete it. The
//     manager's own record of learned addresses is bounded the same way.
//
// # The host's other firewalls
//
// nook's base chains sit beside other tables: a packet must be accepted by
// every base chain on a hook. IPv4 forwarding is switched on by New. If an
// iptables FORWARD chain drops by default (Docker sets this), sandbox
// traffic is dropped there too unless that firewall accepts the pool; New
// logs a warning when it sees such a chain in iptables-nft.
//
// # Exposed ports
//
// Expose listens on the host and forwards each connection to the sandbox
// in userspace. A forwarder holds at most 256 client connections and a
// sandbox's forwarders together 1024; one past either cap is closed as
// soon as it is accepted, so a client cannot pin host sockets and
// goroutines without bound.
//
// # Restarts
//
// Kernel state outlives the daemon. After a restart the daemon creates a
// new Manager (which reinstalls the chains and keeps the sandboxes'
// elements), calls AdoptAll with every live sandbox (each interface
// checked, the elements of all reset to deny-all in one commit; Adopt
// does one), then SetPolicy with KeepFlows,
// Expose with the old host ports, CutFlows once, and Reconcile with the
// IDs it knows to remove the rest.
package network
