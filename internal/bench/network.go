package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/network/nettest"
	"github.com/nookhq/nook/sdk"
)

// The network benchmarks run the daemon in a simulated host whose only
// uplink leads into a simulated world, both namespaces made here: no
// packet leaves the machine.
const (
	benchWeb  = "203.0.113.10"
	benchWeb2 = "203.0.113.20" // spliced.test: reached by name, through the egress proxy
	benchDNS  = "203.0.113.53"
	benchSink = benchWeb + ":5001"
)

type simNet struct {
	host, world netns.NsHandle
}

func (s *simNet) close() {
	s.host.Close()
	s.world.Close()
}

// newSimNetDNS is newSimNet with the world's DNS served; closeNet ends both.
func newSimNetDNS() (s *simNet, closeNet func(), err error) {
	if s, err = newSimNet(); err != nil {
		return nil, nil, fmt.Errorf("simulated network: %w", err)
	}
	stopDNS, err := s.serveDNS()
	if err != nil {
		s.close()
		return nil, nil, err
	}
	return s, func() { stopDNS(); s.close() }, nil
}

// newSimNet makes the simulated host and world: a veth between them
// (192.0.2.1 and .2), a default route into the world, and the world's
// server addresses.
func newSimNet() (*simNet, error) {
	host, err := nettest.NewNetns()
	if err != nil {
		return nil, err
	}
	world, err := nettest.NewNetns()
	if err != nil {
		host.Close()
		return nil, err
	}
	s := &simNet{host: host, world: world}
	if err := s.wire(); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *simNet) wire() error {
	hh, err := netlink.NewHandleAt(s.host, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer hh.Close()
	wh, err := netlink.NewHandleAt(s.world, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer wh.Close()
	addr := func(a string, bits int) *netlink.Addr {
		return &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(a).To4(), Mask: net.CIDRMask(bits, 32)}}
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "uplink"}, PeerName: "down", PeerNamespace: netlink.NsFd(s.world)}
	if err := hh.LinkAdd(veth); err != nil {
		return err
	}
	if err := hh.AddrAdd(veth, addr("192.0.2.1", 24)); err != nil {
		return err
	}
	if err := hh.LinkSetUp(veth); err != nil {
		return err
	}
	for _, h := range []*netlink.Handle{hh, wh} {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(lo); err != nil {
			return err
		}
	}
	down, err := wh.LinkByName("down")
	if err != nil {
		return err
	}
	if err := wh.AddrAdd(down, addr("192.0.2.2", 24)); err != nil {
		return err
	}
	if err := wh.LinkSetUp(down); err != nil {
		return err
	}
	wlo, _ := wh.LinkByName("lo")
	for _, a := range []string{benchWeb, benchWeb2, benchDNS, benchSecret} {
		if err := wh.AddrAdd(wlo, addr(a, 32)); err != nil {
			return err
		}
	}
	return hh.RouteAdd(&netlink.Route{LinkIndex: veth.Attrs().Index, Gw: net.ParseIP("192.0.2.2").To4()})
}

// serveDNS answers allowed.test with benchWeb in the world.
func (s *simNet) serveDNS() (func(), error) {
	h := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		zone := map[string]string{"allowed.test.": benchWeb, "spliced.test.": benchWeb2, "secret.test.": benchSecret}
		if len(r.Question) == 1 && zone[strings.ToLower(r.Question[0].Name)] != "" && r.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: r.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300},
				A: net.ParseIP(zone[strings.ToLower(r.Question[0].Name)])})
		} else {
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})
	var pc net.PacketConn
	if err := nettest.Do(s.world, func() (err error) { pc, err = net.ListenPacket("udp4", benchDNS+":53"); return err }); err != nil {
		return nil, err
	}
	srv := &dns.Server{PacketConn: pc, Handler: h}
	go srv.ActivateAndServe()
	return func() { srv.Shutdown() }, nil
}

// serveHTTP answers any GET in the world, on port 80 of its addresses.
func (s *simNet) serveHTTP() (func(), error) {
	var ln net.Listener
	if err := nettest.Do(s.world, func() (err error) { ln, err = net.Listen("tcp4", "0.0.0.0:80"); return err }); err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return func() { srv.Close() }, nil
}

// latencyScript times HTTP GETs on new connections from inside a
// sandbox: to benchWeb (a CIDR rule: straight out) and to spliced.test (a
// domain rule: through the egress proxy), alternating, in milliseconds.
const latencyScript = `
import json, socket, sys, time
n = int(sys.argv[1])
def get(addr, host):
    t = time.perf_counter()
    s = socket.create_connection((addr, 80), timeout=10)
    s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % host).encode())
    b = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        b += d
    s.close()
    if not b.startswith(b"HTTP/1.1 200"):
        sys.exit("GET %s: %r" % (host, b[:100]))
    return (time.perf_counter() - t) * 1000
spliced = socket.gethostbyname("spliced.test")
get(sys.argv[2], sys.argv[2]); get(spliced, "spliced.test")
direct, proxied = [], []
for _ in range(n):
    direct.append(get(sys.argv[2], sys.argv[2]))
    proxied.append(get(spliced, "spliced.test"))
print(json.dumps({"direct": direct, "proxied": proxied}))
`

// connectLatency measures n HTTP GETs on new connections each way.
func connectLatency(ctx context.Context, cl *sdk.Client, name string, n int) (direct, proxied []time.Duration, err error) {
	var out, errb strings.Builder
	st, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"python3", "-c", latencyScript, fmt.Sprint(n), benchWeb}}, &out, &errb)
	if err != nil {
		return nil, nil, err
	}
	if st.ExitCode != 0 {
		return nil, nil, fmt.Errorf("exit %d: %s", st.ExitCode, errb.String())
	}
	var res struct{ Direct, Proxied []float64 }
	if err := json.Unmarshal([]byte(out.String()), &res); err != nil {
		return nil, nil, fmt.Errorf("%w: %q", err, out.String())
	}
	return millis(res.Direct), millis(res.Proxied), nil
}

// sink accepts connections in the world and reports, for each, how many
// bytes it read and how fast.
func (s *simNet) sink() (<-chan float64, func(), error) {
	var ln net.Listener
	// On port 5001 of every world address (benchWeb and benchWeb2).
	if err := nettest.Do(s.world, func() (err error) { ln, err = net.Listen("tcp4", "0.0.0.0:5001"); return err }); err != nil {
		return nil, nil, err
	}
	rates := make(chan float64, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				start := time.Now()
				n, _ := io.Copy(io.Discard, c)
				if n > 0 {
					rates <- float64(n) / time.Since(start).Seconds() / 1e6
				}
			}()
		}
	}()
	return rates, func() { ln.Close() }, nil
}

// median is the middle of fs (the mean of the middle two when even).
func median(fs []float64) float64 {
	s := slices.Clone(fs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// netDaemon runs `nook serve` in the simulated host, with or without
// sandbox networking and no warm pool.
func netDaemon(ctx context.Context, cfg Config, s *simNet, root string, network bool, env ...string) (*sdk.Client, func(), error) {
	d := &procDaemon{cfg: cfg, s: s, root: root, args: []string{"--warm-pool", "-1", fmt.Sprintf("--network=%v", network)}, log: &logBuf{}, env: env}
	if err := d.start(ctx); err != nil {
		return nil, nil, err
	}
	cl, err := sdk.New("unix://"+d.socket(), "")
	if err != nil {
		d.stop()
		return nil, nil, err
	}
	d.cl = cl
	return d.cl, d.stop, nil
}

// procDaemon is `nook serve` run as its own process in the simulated
// host, so that it can be killed.
type procDaemon struct {
	cfg  Config
	s    *simNet
	root string
	args []string
	env  []string // added to its environment
	cl   *sdk.Client
	log  *logBuf
	cmd  *exec.Cmd
	// logFile has a copy of the log (NOOK_BENCH_DEBUG_LOG).
	logFile *os.File
}

func startProcDaemon(ctx context.Context, cfg Config, s *simNet, root string, args ...string) (*procDaemon, error) {
	d := &procDaemon{cfg: cfg, s: s, root: root, args: args, log: &logBuf{}}
	if err := d.start(ctx); err != nil {
		return nil, err
	}
	cl, err := sdk.New("unix://"+d.socket(), "")
	if err != nil {
		d.stop()
		return nil, err
	}
	d.cl = cl
	return d, nil
}

func (d *procDaemon) socket() string { return filepath.Join(d.root, "nook.sock") }

func (d *procDaemon) cgroup() string { return cmp.Or(d.cfg.CgroupParent, "nook-bench-net") }

func (d *procDaemon) pid() int { return d.cmd.Process.Pid }

// start runs the daemon (nsenter execs it: the process is the daemon) and
// waits until it answers.
func (d *procDaemon) start(ctx context.Context) error {
	bin := filepath.Join(filepath.Dir(d.cfg.AgentBinary), "nook")
	args := append([]string{fmt.Sprintf("--net=/proc/%d/fd/%d", os.Getpid(), int(d.s.host)), bin, "serve",
		"--data-dir", filepath.Join(d.root, "data"), "--run-dir", filepath.Join(d.root, "run"), "--socket", d.socket(),
		"--templates-dir", d.cfg.TemplatesDir, "--agent", d.cfg.AgentBinary, "--cgroup-parent", d.cgroup(),
		"--dns-upstream", benchDNS + ":53"}, d.args...)
	if d.cfg.VMCacheDir != "" {
		args = append(args, "--vm-cache-dir", d.cfg.VMCacheDir) // the template's vm image and snapshot, made once
	}
	if sock := os.Getenv("NOOK_BENCH_DEBUG_SOCKET"); sock != "" {
		args = append(args, "--debug-socket", sock) // profiles of the daemon under test
	}
	if os.Getenv("NOOK_BENCH_DEBUG_LOG") != "" {
		args = append(args, "--debug") // each step's duration in the daemon's log (NOOK_BENCH_DEBUG_LOG names the file)
	}
	d.cmd = exec.CommandContext(ctx, "nsenter", args...)
	if len(d.env) > 0 {
		d.cmd.Env = append(os.Environ(), d.env...)
	}
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if path := os.Getenv("NOOK_BENCH_DEBUG_LOG"); path != "" {
		if d.logFile == nil { // one file for every start; stop closes it
			f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
			if err != nil {
				return err
			}
			d.logFile = f
		}
		d.cmd.Stdout = io.MultiWriter(d.log, d.logFile)
		d.cmd.Stderr = d.cmd.Stdout
	}
	if err := d.cmd.Start(); err != nil {
		return err
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("unix", d.socket()); err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			d.cmd.Process.Kill()
			d.cmd.Wait()
			return fmt.Errorf("daemon in the simulated host did not start:\n%s", d.log.String())
		}
	}
}

// stop removes every sandbox left (a run cut short) and stops the daemon.
func (d *procDaemon) stop() {
	if d.cl != nil {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		if sbs, err := d.cl.ListSandboxes(dctx); err == nil {
			names := make([]string, len(sbs))
			for i, sb := range sbs {
				names[i] = sb.Name
			}
			for len(names) > 0 {
				k := min(10, len(names))
				parallel(names[:k], func(name string) error { return d.cl.DeleteSandbox(dctx, name) })
				names = names[k:]
			}
		}
		cancel()
	}
	d.cmd.Process.Signal(unix.SIGTERM)
	d.cmd.Wait()
	if d.logFile != nil {
		d.logFile.Close()
	}
	removeCgroups(d.cgroup())
}

// burst creates names in parallel (128M each, disk of the given size or
// the default) and returns each create's latency.
func (d *procDaemon) burst(ctx context.Context, names []string, disk string) ([]time.Duration, error) {
	return parallel(names, func(name string) error {
		_, err := d.cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: name, Memory: "128M", Disk: disk})
		return err
	})
}

// settle waits until every warm pool holds its target, nothing starting.
func (d *procDaemon) settle(ctx context.Context) error { return d.settleTo(ctx, false) }

// settleTo is settle; atMin also waits until each pool's target is back
// at its floor (a minute after the last burst), so that no pool shrinks
// during what is measured next.
func (d *procDaemon) settleTo(ctx context.Context, atMin bool) error {
	for deadline := time.Now().Add(2 * time.Minute); ; {
		info, err := d.cl.Info(ctx)
		if err != nil {
			return err
		}
		full := true
		for _, p := range info.WarmPools {
			full = full && p.Starting == 0 && p.Ready == p.Target && (!atMin || p.Target <= p.Min && p.Stopping == 0)
		}
		if full {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the daemon's warm pools did not refill in 2m: %+v", info.WarmPools)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readopt kills the daemon with SIGKILL, starts it again and returns how
// long until it lists all n sandboxes running, and until last answers an
// exec.
func (d *procDaemon) readopt(ctx context.Context, last string, n int) (listed, execd time.Duration, err error) {
	d.cmd.Process.Kill()
	d.cmd.Wait()
	start := time.Now()
	if err := d.start(ctx); err != nil {
		return 0, 0, err
	}
	for deadline := start.Add(5 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		sbs, err := d.cl.ListSandboxes(ctx)
		running := 0
		for _, sb := range sbs {
			if sb.State == api.StateRunning {
				running++
			}
		}
		if err == nil && running >= n {
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("after a restart, %d of %d sandboxes running in 5m (%v)", running, n, err)
		}
	}
	listed = time.Since(start)
	if st, err := d.cl.Exec(ctx, last, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard); err != nil || st.ExitCode != 0 {
		return 0, 0, fmt.Errorf("exec after restart: %v %+v", err, st)
	}
	return listed, time.Since(start), nil
}

// coldCreates times n creates to first exec output on a daemon without a
// warm pool.
func coldCreates(ctx context.Context, cl *sdk.Client, n int) ([]time.Duration, error) {
	var out []time.Duration
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("netbench-%d", i)
		start := time.Now()
		if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: name}); err != nil {
			return nil, err
		}
		fw := &firstWrite{start: start}
		if _, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"echo", "hi"}}, fw, io.Discard); err != nil {
			return nil, err
		}
		out = append(out, fw.at)
		if err := cl.DeleteSandbox(ctx, name); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// dnsLatency times n A queries for allowed.test to server from the
// simulated host, paced under the resolver's per-sandbox rate limit.
func dnsLatency(s *simNet, server string, n int) ([]time.Duration, error) {
	var out []time.Duration
	err := nettest.Do(s.host, func() error {
		c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
		conn, err := c.Dial(server)
		if err != nil {
			return err
		}
		defer conn.Close()
		for i := 0; i < n; i++ {
			m := new(dns.Msg)
			m.SetQuestion("allowed.test.", dns.TypeA)
			r, rtt, err := c.ExchangeWithConn(m, conn)
			if err != nil {
				return err
			}
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
				return fmt.Errorf("query %s: %s", server, dns.RcodeToString[r.Rcode])
			}
			out = append(out, rtt)
			time.Sleep(25 * time.Millisecond)
		}
		return nil
	})
	return out, err
}

// runNetwork measures network setup's share of create latency, TCP
// throughput through NAT and DNS latency through the resolver.
func runNetwork(ctx context.Context, cfg Config, root string) error {
	if _, err := exec.LookPath("nsenter"); err != nil {
		fmt.Fprintln(cfg.Out, "network benchmarks skipped: nsenter is not installed")
		return nil
	}
	s, closeNet, err := newSimNetDNS()
	if err != nil {
		return err
	}
	defer closeNet()
	rates, stopSink, err := s.sink()
	if err != nil {
		return err
	}
	defer stopSink()

	fmt.Fprintf(cfg.Out, "network: cold creates with and without sandbox networking, %d each, in a simulated host...\n", cfg.Creates)
	cl, stop, err := netDaemon(ctx, cfg, s, filepath.Join(root, "net-off"), false)
	if err != nil {
		return err
	}
	without, err := coldCreates(ctx, cl, cfg.Creates)
	stop()
	if err != nil {
		return err
	}
	// The daemon trusts the world's test CA (SSL_CERT_FILE), as a real
	// one trusts the public CAs: its interception verifies secret.test.
	ca, caFile, err := benchCA(root)
	if err != nil {
		return err
	}
	stopTLS, err := s.serveTLS(ca)
	if err != nil {
		return err
	}
	defer stopTLS()
	cl, stop, err = netDaemon(ctx, cfg, s, filepath.Join(root, "net-on"), true, "SSL_CERT_FILE="+caFile)
	if err != nil {
		return err
	}
	defer stop()
	with, err := coldCreates(ctx, cl, cfg.Creates)
	if err != nil {
		return err
	}

	fmt.Fprintln(cfg.Out, "network: TCP throughput sandbox -> world server through NAT, through the egress proxy, and host -> server...")
	stopWeb, err := s.serveHTTP()
	if err != nil {
		return err
	}
	defer stopWeb()
	if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: "netbench-tcp", Allow: []string{"allowed.test", benchWeb, "spliced.test:5001/tcp", "spliced.test:80", "spliced.test:443"}}); err != nil {
		return err
	}
	const size = 1 << 30
	var sandboxMBs, hostMBs float64
	// Three transfers each way, alternating, and the median of each: one
	// transfer's rate varies by a third from run to run on a busy host.
	var nat, spliced []float64
	for i := 0; i < 3; i++ {
		st, err := cl.Exec(ctx, "netbench-tcp", api.ExecRequest{Cmd: []string{"bash", "-c", fmt.Sprintf("dd if=/dev/zero bs=1M count=%d status=none > /dev/tcp/%s/5001", size>>20, benchWeb)}}, io.Discard, io.Discard)
		if err != nil || st.ExitCode != 0 {
			return fmt.Errorf("sandbox -> server: %v %+v", err, st)
		}
		nat = append(nat, <-rates)
		st, err = cl.Exec(ctx, "netbench-tcp", api.ExecRequest{Cmd: []string{"bash", "-c", fmt.Sprintf("dd if=/dev/zero bs=1M count=%d status=none > /dev/tcp/spliced.test/5001", size>>20)}}, io.Discard, io.Discard)
		if err != nil || st.ExitCode != 0 {
			return fmt.Errorf("sandbox -> server through the egress proxy: %v %+v", err, st)
		}
		spliced = append(spliced, <-rates)
	}
	sandboxMBs, splicedMBs := median(nat), median(spliced)
	if err := nettest.Do(s.host, func() error {
		c, err := net.Dial("tcp4", benchSink)
		if err != nil {
			return err
		}
		_, err = io.CopyN(c, zeroReader{}, size)
		c.Close()
		return err
	}); err != nil {
		return fmt.Errorf("host -> server: %w", err)
	}
	hostMBs = <-rates

	fmt.Fprintln(cfg.Out, "network: DNS lookup latency through the sandbox's resolver, and straight to the upstream...")
	n, err := cl.Network(ctx, "netbench-tcp")
	if err != nil {
		return err
	}
	viaNook, err := dnsLatency(s, netip.AddrPortFrom(netip.MustParseAddr(n.Gateway), 53).String(), 100)
	if err != nil {
		return fmt.Errorf("DNS through nook: %w", err)
	}
	direct, err := dnsLatency(s, benchDNS+":53", 100)
	if err != nil {
		return fmt.Errorf("DNS to the upstream: %w", err)
	}
	fmt.Fprintln(cfg.Out, "network: HTTP requests on new connections, straight out (a CIDR rule) and through the egress proxy (a domain rule, Host checked)...")
	httpDirect, httpProxied, err := connectLatency(ctx, cl, "netbench-tcp", 50)
	if err != nil {
		return fmt.Errorf("connect latency: %w", err)
	}
	fmt.Fprintln(cfg.Out, "network: identity tokens from inside the sandbox (its metadata endpoint), beside static GETs there...")
	tokens, static, err := metadataTokens(ctx, cl, "netbench-tcp", 30)
	if err != nil {
		return fmt.Errorf("identity tokens: %w", err)
	}
	fmt.Fprintln(cfg.Out, "network: HTTPS through the name check (spliced after the ClientHello) and straight out...")
	spl, err := httpsRun(ctx, cl, "netbench-tcp", ca, 50, 1<<30, "spliced.test:443", "allowed.test:8443")
	if err != nil {
		return fmt.Errorf("spliced TLS: %w", err)
	}
	if err := cl.DeleteSandbox(ctx, "netbench-tcp"); err != nil {
		return err
	}
	fmt.Fprintln(cfg.Out, "network: HTTPS with a secret bound: through nook's interception (TLS terminated, placeholder replaced, answer scrubbed) and straight out...")
	sec, err := benchSecrets(ctx, cl, ca, 50, 1<<30)
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}

	fmt.Fprintln(cfg.Out)
	tw := tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "network\tp50\tp99\tbaseline\tbaseline p50\tbaseline p99\tdifference p50\ttarget")
	share := pct(with, .5) - pct(without, .5)
	fmt.Fprintf(tw, "create (cold) -> first exec output, with network\t%s\t%s\tthe same without network\t%s\t%s\t%s (%.0f%% of create)\tnetwork setup <= 10ms\n",
		ms(pct(with, .5)), ms(pct(with, .99)), ms(pct(without, .5)), ms(pct(without, .99)), ms(share), 100*float64(share)/float64(pct(with, .5)))
	fmt.Fprintf(tw, "DNS lookup (A, allowed name) through the sandbox's resolver\t%s\t%s\tstraight to the upstream\t%s\t%s\t%s\t-\n",
		ms(pct(viaNook, .5)), ms(pct(viaNook, .99)), ms(pct(direct, .5)), ms(pct(direct, .99)), ms(pct(viaNook, .5)-pct(direct, .5)))
	fmt.Fprintf(tw, "HTTP GET on a new connection through the egress proxy (Host checked)\t%s\t%s\tthe same straight out (a CIDR rule)\t%s\t%s\t%s\tadded <= 1ms\n",
		ms(pct(httpProxied, .5)), ms(pct(httpProxied, .99)), ms(pct(httpDirect, .5)), ms(pct(httpDirect, .99)), ms(pct(httpProxied, .5)-pct(httpDirect, .5)))
	fmt.Fprintf(tw, "identity token from inside the sandbox (GET 169.254.169.254/v1/token, keep-alive)\t%s\t%s\tstatic GET / of the same endpoint\t%s\t%s\t%s\tp50 <= 2ms\n",
		ms(pct(tokens, .5)), ms(pct(tokens, .99)), ms(pct(static, .5)), ms(pct(static, .99)), ms(pct(tokens, .5)-pct(static, .5)))
	fmt.Fprintf(tw, "HTTPS GET on a new connection through the name check (SNI read, spliced)\t%s\t%s\tthe same straight out (a CIDR rule)\t%s\t%s\t%s\tadded <= 1ms\n",
		ms(pct(spl.subject, .5)), ms(pct(spl.subject, .99)), ms(pct(spl.baseline, .5)), ms(pct(spl.baseline, .99)), ms(pct(spl.subject, .5)-pct(spl.baseline, .5)))
	fmt.Fprintf(tw, "HTTPS GET on a new connection with a secret bound (intercepted: TLS terminated, re-encrypted, verified)\t%s\t%s\tthe same straight out (a CIDR rule, port 8443)\t%s\t%s\t%s\tadded <= 3ms\n",
		ms(pct(sec.subject, .5)), ms(pct(sec.subject, .99)), ms(pct(sec.baseline, .5)), ms(pct(sec.baseline, .99)), ms(pct(sec.subject, .5)-pct(sec.baseline, .5)))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(cfg.Out)
	tw = tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TCP (1 GiB, one connection; raw TCP: median of 3)\tthroughput\tbaseline\tbaseline throughput\tratio")
	fmt.Fprintf(tw, "sandbox -> allowed world server (veth, nftables, NAT)\t%.0f MB/s\tsimulated host -> the same server\t%.0f MB/s\t%.2fx\n", sandboxMBs, hostMBs, sandboxMBs/hostMBs)
	fmt.Fprintf(tw, "sandbox -> a domain rule's server through the egress proxy (raw TCP, spliced)\t%.0f MB/s\tthe same straight out (NAT)\t%.0f MB/s\t%.2fx\n", splicedMBs, sandboxMBs, splicedMBs/sandboxMBs)
	fmt.Fprintf(tw, "HTTPS download to the sandbox through the name check (spliced; target >= 0.8x)\t%.0f MB/s\tthe same straight out (a CIDR rule)\t%.0f MB/s\t%.2fx\n", spl.subjectMBs, spl.baselineMBs, spl.subjectMBs/spl.baselineMBs)
	fmt.Fprintf(tw, "HTTPS download to the sandbox, secret bound (intercepted, scrubbed; target >= 300 MB/s)\t%.0f MB/s\tthe same straight out (port 8443)\t%.0f MB/s\t%.2fx\n", sec.subjectMBs, sec.baselineMBs, sec.subjectMBs/sec.baselineMBs)
	if err := tw.Flush(); err != nil {
		return err
	}
	stop() // one daemon at a time: the next listens for SSH and preview URLs
	fmt.Fprintln(cfg.Out)
	return runRemote(ctx, cfg, root, s)
}

// runOnlyRemote measures only SSH and preview URLs (-only-remote).
func runOnlyRemote(ctx context.Context, cfg Config, root string) error {
	s, closeNet, err := newSimNetDNS()
	if err != nil {
		return err
	}
	defer closeNet()
	return runRemote(ctx, cfg, root, s)
}
