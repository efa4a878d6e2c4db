package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/backend/vm"
	"github.com/nookhq/nook/sdk"
	"golang.org/x/sys/unix"
)

// The density benchmark (nook-bench -density N): what every per-sandbox
// operation costs with 10 sandboxes alive and with N, on one daemon with
// sandbox networking in a simulated host.

// DensityResult is what RunDensity measured; the e2e regression test
// checks its ratios.
type DensityResult struct {
	N int
	// At10, AtN and After are the probes with 10 sandboxes alive, with N,
	// and with 10 again after the N were removed.
	At10, AtN, After Probe
	// Growth: each create's latency while the N were made, in order, and
	// whether it came from the warm pool.
	Growth []Create
	// IdleCPU is the daemon's CPU use while the N sit idle (1 = a core);
	// IdleRSS its resident memory then; HostMemPer the host memory each
	// sandbox takes.
	IdleCPU float64
	IdleRSS int64
	// HostIdleCPU is the whole host's CPU use in the same window (1 =
	// all its cores): the N sandboxes' own processes and the kernel's
	// work for them, which every operation at N runs beside.
	HostIdleCPU float64
	HostMemPer  int64
	// Readopt is from the start of a daemon after kill -9 until it
	// answers with all N running; ReadoptExec until the last answers an
	// exec too.
	Readopt, ReadoptExec time.Duration
	// ReadoptLog is the restarted daemon's log line of its reconcile.
	ReadoptLog string
	// Teardown is each rm of the N-10 while they go, in bursts of 10.
	Teardown []time.Duration
	// VMs is how many vms were held through the run (one running, the
	// rest paused); VMSkipped says why none were when the vm backend is
	// not available.
	VMs       int
	VMSkipped string
}

// Create is one create's latency and where it came from.
type Create struct {
	D    time.Duration
	Warm bool
}

// Probe is one round of every per-sandbox operation.
type Probe struct {
	Cold, Warm                            []time.Duration // bursts of 10 parallel creates
	Exec, Pause, Resume, Snapshot, Policy []time.Duration
	Remove                                []time.Duration
	// The same for a vm (one at a time; empty without vms).
	VMCreate, VMExec, VMPause, VMResume, VMRemove []time.Duration
	// What the host had yet to write back when the probe began (Dirty
	// and Writeback), and how long the sync that wrote it took.
	Dirty int64
	Flush time.Duration
}

// flushWriteback writes back what the host's page cache holds dirty (the
// sandboxes' mkfs and first writes: 14-131 MiB before a probe in the
// runs recorded) and returns how much there was and how long it took, so that
// each probe starts with no writeback of the growth under way beside its
// fsyncs.
func flushWriteback() (int64, time.Duration) {
	dirty := meminfo("Dirty") + meminfo("Writeback")
	t := time.Now()
	unix.Sync()
	return dirty, time.Since(t)
}

// logBuf keeps a daemon's log and answers which creates were warm.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// warm reports, for each sandbox the log says was created, whether it
// came from the warm pool.
func (l *logBuf) warm() map[string]bool {
	out := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="sandbox created"`) {
			continue
		}
		var name string
		var warm bool
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "sandbox="); ok {
				name = v
			} else if v, ok := strings.CutPrefix(f, "warm="); ok {
				warm = v == "true"
			}
		}
		out[name] = warm
	}
	return out
}

// RunDensity measures density at n sandboxes (see Result), printing a
// table beside the same operations at 10.
func RunDensity(ctx context.Context, cfg Config, n int) (*DensityResult, error) {
	if n < 20 {
		n = 20
	}
	root, err := os.MkdirTemp("", "nookdensity")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(root)
	if err := os.Chmod(root, 0o711); err != nil {
		return nil, err
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err == nil && cfg.DensityVMs > 0 && cfg.VMCacheDir != "" {
		// The daemon below runs in a simulated host, where Debian's
		// mirror is out of reach: the guest kernel comes from here. If
		// it cannot, the daemon's first vm says why.
		if err := vm.FetchKernel(ctx, cfg.VMCacheDir); err != nil {
			fmt.Fprintf(cfg.Out, "density: the vm guest kernel could not be fetched: %v\n", err)
		}
	}
	s, closeNet, err := newSimNetDNS()
	if err != nil {
		return nil, err
	}
	defer closeNet()

	d, err := startProcDaemon(ctx, cfg, s, filepath.Join(root, "density"), "--container-pause", "freeze")
	if err != nil {
		return nil, err
	}
	defer d.stop()
	res := &DensityResult{N: n}
	out := cfg.Out
	g := &grower{d: d}
	memBefore := memAvailable()
	fmt.Fprintf(out, "density: 10 sandboxes, then every operation once...\n")
	if err := g.grow(ctx, 10); err != nil {
		return nil, err
	}
	if res.At10, err = probe(ctx, d, "p10"); err != nil {
		return nil, fmt.Errorf("probe at 10: %w", err)
	}
	heldVMs := 0 // vms among the sandboxes that run
	if cfg.DensityVMs > 0 {
		fmt.Fprintf(out, "density: %d vms held (one running, the rest paused), then a vm probed with 10 containers...\n", cfg.DensityVMs)
		if res.VMSkipped, err = holdVMs(ctx, d, cfg.DensityVMs); err != nil {
			return nil, err
		}
		if res.VMSkipped == "" {
			res.VMs, heldVMs = cfg.DensityVMs, 1
			if err := vmProbe(ctx, d, "v10", &res.At10); err != nil {
				return nil, fmt.Errorf("vm probe at 10: %w", err)
			}
		}
	}
	fmt.Fprintf(out, "density: growing to %d in bursts of 10...\n", n)
	if err := g.grow(ctx, n); err != nil {
		return nil, err
	}
	res.Growth = g.creates
	if res.AtN, err = probe(ctx, d, "pn"); err != nil {
		return nil, fmt.Errorf("probe at %d: %w", n, err)
	}
	if res.VMs > 0 {
		if err := vmProbe(ctx, d, "vn", &res.AtN); err != nil {
			return nil, fmt.Errorf("vm probe at %d: %w", n, err)
		}
	}
	// Idle: the warm pools back at their floor, nothing asked of the
	// daemon.
	fmt.Fprintf(out, "density: waiting for the warm pool to shrink back after the bursts...\n")
	if err := d.settleTo(ctx, true); err != nil {
		return nil, err
	}
	res.HostMemPer = (memBefore - memAvailable()) / int64(n)
	window := 20 * time.Second
	if n < 500 {
		window = 10 * time.Second
	}
	fmt.Fprintf(out, "density: daemon idle with %d sandboxes for %s...\n", n, window)
	host0, hostStart := hostBusy(), time.Now()
	if res.IdleCPU, err = cpuOver(ctx, d.pid(), window); err != nil {
		return nil, err
	}
	res.HostIdleCPU = float64(hostBusy()-host0) / float64(time.Since(hostStart)) / float64(runtime.NumCPU())
	res.IdleRSS = procRSS(d.pid())

	fmt.Fprintf(out, "density: kill -9 of the daemon, and its restart with %d sandboxes...\n", n)
	if res.Readopt, res.ReadoptExec, err = d.readopt(ctx, g.names[len(g.names)-1], n+heldVMs); err != nil {
		return nil, err
	}
	for _, line := range strings.Split(d.log.String(), "\n") {
		if strings.Contains(line, "reconciled the sandboxes") {
			res.ReadoptLog = line // the last restart's
		}
	}

	if res.VMs > 0 {
		if _, err := parallel(heldNames(res.VMs), func(name string) error { return d.cl.DeleteSandbox(ctx, name) }); err != nil {
			return nil, err
		}
	}
	fmt.Fprintf(out, "density: removing %d in bursts of 10...\n", n-10)
	if res.Teardown, err = g.shrink(ctx, 10); err != nil {
		return nil, err
	}
	if res.After, err = probe(ctx, d, "pa"); err != nil {
		return nil, fmt.Errorf("probe after teardown: %w", err)
	}
	if _, err := g.shrink(ctx, 0); err != nil {
		return nil, err
	}
	res.print(out)
	return res, nil
}

// grower creates and removes the bulk of the sandboxes.
type grower struct {
	d       *procDaemon
	names   []string
	creates []Create
}

// grow creates sandboxes in bursts of 10 parallel creates until n are alive.
func (g *grower) grow(ctx context.Context, n int) error {
	for len(g.names) < n {
		burst := min(10, n-len(g.names))
		names := make([]string, burst)
		for i := range names {
			names[i] = fmt.Sprintf("d%05d", len(g.names)+i)
		}
		ds, err := g.d.burst(ctx, names, "")
		if err != nil {
			return err
		}
		warm := g.d.log.warm()
		for i, name := range names {
			g.creates = append(g.creates, Create{D: ds[i], Warm: warm[name]})
		}
		g.names = append(g.names, names...)
	}
	return nil
}

// shrink removes sandboxes, 10 at a time in parallel, until n are left,
// and returns each rm's latency.
func (g *grower) shrink(ctx context.Context, n int) ([]time.Duration, error) {
	var out []time.Duration
	for len(g.names) > n {
		k := min(10, len(g.names)-n)
		batch := g.names[len(g.names)-k:]
		ds, err := parallel(batch, func(name string) error { return g.d.cl.DeleteSandbox(ctx, name) })
		if err != nil {
			return out, err
		}
		out = append(out, ds...)
		g.names = g.names[:len(g.names)-k]
	}
	return out, nil
}

// parallel runs fn for each name at once and returns each one's latency.
func parallel(names []string, fn func(string) error) ([]time.Duration, error) {
	ds := make([]time.Duration, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			errs[i] = fn(name)
			ds[i] = time.Since(t)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("%s: %w", names[i], err)
		}
	}
	return ds, nil
}

// probe times every per-sandbox operation on sandboxes it makes (a burst of
// 10 creates from the warm pool, then one of 10 cold creates) and removes
// again: 50 exec round trips, 30 pauses and resumes, 15 snapshots, 20
// policy changes and the 20 removes (enough samples that a median is not
// one moment's background work).
func probe(ctx context.Context, d *procDaemon, prefix string) (Probe, error) {
	var p Probe
	if err := d.settle(ctx); err != nil {
		return p, err
	}
	// Every probe begins with nothing left to write back: it measures an
	// operation with N sandboxes alive, not beside the writes that made
	// them (the growth's rows show those).
	p.Dirty, p.Flush = flushWriteback()
	// A burst from a full warm pool, then a burst of cold creates: a
	// disk size other than the default is never taken from the pool.
	names := make([]string, 20)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	ds, err := d.burst(ctx, names[:10], "")
	if err != nil {
		return p, err
	}
	warm := d.log.warm()
	for i, name := range names[:10] {
		if warm[name] {
			p.Warm = append(p.Warm, ds[i])
		} else {
			p.Cold = append(p.Cold, ds[i])
		}
	}
	// The cold burst with nothing else in flight: the warm burst's refill
	// (10 starts) would otherwise run beside it, and how the two interleave
	// is what it would measure.
	if err := d.settle(ctx); err != nil {
		return p, err
	}
	if ds, err = d.burst(ctx, names[10:], "9G"); err != nil {
		return p, err
	}
	p.Cold = append(p.Cold, ds...)
	cl := d.cl
	for i := 0; i < 50; i++ {
		t := time.Now()
		if st, err := cl.Exec(ctx, names[0], api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard); err != nil || st.ExitCode != 0 {
			return p, fmt.Errorf("exec true: %v %+v", err, st)
		}
		p.Exec = append(p.Exec, time.Since(t))
	}
	for i := 0; i < 30; i++ {
		t := time.Now()
		if _, err := cl.PauseSandbox(ctx, names[1]); err != nil {
			return p, err
		}
		t1 := time.Now()
		if _, err := cl.ResumeSandbox(ctx, names[1]); err != nil {
			return p, err
		}
		p.Pause, p.Resume = append(p.Pause, t1.Sub(t)), append(p.Resume, time.Since(t1))
	}
	for i := 0; i < 15; i++ {
		t := time.Now()
		if _, err := cl.CreateSnapshot(ctx, names[2], fmt.Sprintf("s%d", i)); err != nil {
			return p, err
		}
		p.Snapshot = append(p.Snapshot, time.Since(t))
	}
	for i := 0; i < 20; i++ {
		allow := []string{"allowed.test", "203.0.113.0/24"}
		if i%2 == 1 {
			allow = []string{"198.51.100.0/24:443"}
		}
		t := time.Now()
		if _, err := cl.SetNetwork(ctx, names[3], api.SetNetworkRequest{Allow: allow}); err != nil {
			return p, err
		}
		p.Policy = append(p.Policy, time.Since(t))
	}
	for _, name := range names {
		t := time.Now()
		if err := cl.DeleteSandbox(ctx, name); err != nil {
			return p, err
		}
		p.Remove = append(p.Remove, time.Since(t))
	}
	return p, nil
}

// The vms of the density run: the benchmarks' vm shape at half its
// memory, so that a few fit beside N containers. All have one shape: the
// first create makes its snapshot and the rest come from its warm pool,
// the way a host's vms of one shape are made.
const densityVMMemory = "512M"

func densityVM(name string) api.CreateSandboxRequest {
	return api.CreateSandboxRequest{Name: name, Isolation: api.IsolationVM, CPUs: vmCPUs, Memory: densityVMMemory}
}

// vmProbe times vmRounds vms' create (from a full warm pool), exec round
// trips, pauses (to disk), resumes and rm into p, one vm after another.
func vmProbe(ctx context.Context, d *procDaemon, prefix string, p *Probe) error {
	for i := 0; i < vmRounds; i++ {
		if err := vmRound(ctx, d, fmt.Sprintf("%s-%d", prefix, i), p); err != nil {
			return err
		}
	}
	return nil
}

const vmRounds = 3

func vmRound(ctx context.Context, d *procDaemon, name string, p *Probe) (err error) {
	if err := d.settle(ctx); err != nil {
		return err
	}
	cl := d.cl
	t := time.Now()
	if _, err := cl.CreateSandbox(ctx, densityVM(name)); err != nil {
		return err
	}
	p.VMCreate = append(p.VMCreate, time.Since(t))
	defer func() {
		t := time.Now()
		if rmErr := cl.DeleteSandbox(ctx, name); rmErr != nil && err == nil {
			err = rmErr
		}
		p.VMRemove = append(p.VMRemove, time.Since(t))
	}()
	for i := 0; i < 10; i++ {
		t := time.Now()
		if st, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard); err != nil || st.ExitCode != 0 {
			return fmt.Errorf("exec true in a vm: %v %+v", err, st)
		}
		p.VMExec = append(p.VMExec, time.Since(t))
	}
	for i := 0; i < 2; i++ {
		t := time.Now()
		if _, err := cl.PauseSandbox(ctx, name); err != nil {
			return err
		}
		t1 := time.Now()
		if _, err := cl.ResumeSandbox(ctx, name); err != nil {
			return err
		}
		p.VMPause, p.VMResume = append(p.VMPause, t1.Sub(t)), append(p.VMResume, time.Since(t1))
	}
	return nil
}

func heldNames(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("vheld%02d", i)
	}
	return names
}

// holdVMs creates n vms one after another and pauses all but the first,
// or returns why the vm backend is not available.
func holdVMs(ctx context.Context, d *procDaemon, n int) (skipped string, err error) {
	for i, name := range heldNames(n) {
		_, err := d.cl.CreateSandbox(ctx, densityVM(name))
		if e := (*sdk.Error)(nil); i == 0 && errors.As(err, &e) && e.Code == api.CodeUnavailable && strings.Contains(e.Message, "backend is not available") {
			return e.Message, nil
		}
		if err != nil {
			return "", fmt.Errorf("held vm: %w", err)
		}
		if i > 0 {
			if _, err := d.cl.PauseSandbox(ctx, name); err != nil {
				return "", fmt.Errorf("pause of a held vm: %w", err)
			}
		}
	}
	return "", nil
}

// cpuOver is the share of one core pid used over window.
func cpuOver(ctx context.Context, pid int, window time.Duration) (float64, error) {
	t0 := procsCPU([]int{pid})
	start := time.Now()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(window):
	}
	return float64(procsCPU([]int{pid})-t0) / float64(time.Since(start)), nil
}

// hostBusy is the CPU time all of the host's cores have spent working
// (user, system, interrupts) since it booted (/proc/stat).
func hostBusy() time.Duration {
	b, _ := os.ReadFile("/proc/stat")
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0
	}
	// user nice system idle iowait irq softirq steal guest...: guest
	// time is counted in user's already, and steal is no work of ours.
	var busy int64
	for _, i := range []int{0, 1, 2, 5, 6} {
		if i+1 < len(f) {
			n, _ := strconv.ParseInt(f[i+1], 10, 64)
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / clockTick
}

func (r *DensityResult) print(w io.Writer) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "density (containers, 128M, network on)\tp50 at 10\tp50 at %d\tratio\tp50 after teardown to 10\ttarget\n", r.N)
	line := func(name string, a, b, c []time.Duration) {
		if len(a) == 0 || len(b) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t<= 1.3x\n", name)
			return
		}
		after := "-"
		if len(c) > 0 {
			after = ms(pct(c, .5))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.2fx\t%s\t<= 1.3x\n", name, ms(pct(a, .5)), ms(pct(b, .5)), Ratio(a, b), after)
	}
	line("create, cold (bursts of 10)", r.At10.Cold, r.AtN.Cold, r.After.Cold)
	line("create, warm (bursts of 10)", r.At10.Warm, r.AtN.Warm, r.After.Warm)
	line("exec round trip (true)", r.At10.Exec, r.AtN.Exec, r.After.Exec)
	line("pause (freeze)", r.At10.Pause, r.AtN.Pause, r.After.Pause)
	line("resume", r.At10.Resume, r.AtN.Resume, r.After.Resume)
	line("snapshot (container)", r.At10.Snapshot, r.AtN.Snapshot, r.After.Snapshot)
	line("network policy change", r.At10.Policy, r.AtN.Policy, r.After.Policy)
	line("rm", r.At10.Remove, r.AtN.Remove, r.After.Remove)
	if r.VMs > 0 {
		fmt.Fprintf(tw, "vm (1 vCPU, %s, %d one after another; %d more held: 1 running, %d paused)\t\t\t\t\t\n", densityVMMemory, vmRounds, r.VMs, r.VMs-1)
		line("vm create, warm", r.At10.VMCreate, r.AtN.VMCreate, nil)
		line("vm exec round trip (true)", r.At10.VMExec, r.AtN.VMExec, nil)
		line("vm pause (to disk)", r.At10.VMPause, r.AtN.VMPause, nil)
		line("vm resume", r.At10.VMResume, r.AtN.VMResume, nil)
		line("vm rm", r.At10.VMRemove, r.AtN.VMRemove, nil)
	}
	tw.Flush()
	fmt.Fprintf(w, "written back before each probe (at 10, at %d, after): %d MiB in %s, %d MiB in %s, %d MiB in %s\n", r.N,
		r.At10.Dirty>>20, ms(r.At10.Flush), r.AtN.Dirty>>20, ms(r.AtN.Flush), r.After.Dirty>>20, ms(r.After.Flush))
	if r.VMSkipped != "" {
		fmt.Fprintf(w, "vms skipped: %s\n", r.VMSkipped)
	}

	first, last := r.growthSplit()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	k := len(first)
	fmt.Fprintf(tw, "growth to %d, bursts of 10\tfirst %d p50\tfirst %d p95\tlast %d p50\tlast %d p95\tratio p50\n", r.N, k, k, k, k)
	for _, kind := range []struct {
		name string
		warm bool
	}{{"create, cold", false}, {"create, warm", true}} {
		a, b := pick(first, kind.warm), pick(last, kind.warm)
		if len(a) == 0 || len(b) == 0 {
			fmt.Fprintf(tw, "%s (%d, %d)\t-\t-\t-\t-\t-\n", kind.name, len(a), len(b))
			continue
		}
		fmt.Fprintf(tw, "%s (%d, %d)\t%s\t%s\t%s\t%s\t%.2fx\n", kind.name, len(a), len(b), ms(pct(a, .5)), ms(pct(a, .95)), ms(pct(b, .5)), ms(pct(b, .95)), Ratio(a, b))
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "at %d\tvalue\ttarget\n", r.N)
	fmt.Fprintf(tw, "daemon CPU, idle\t%.2f%% of a core\t< 3%%\n", 100*r.IdleCPU)
	fmt.Fprintf(tw, "host CPU, idle (every process and the kernel)\t%.1f%% of %d cores\t-\n", 100*r.HostIdleCPU, runtime.NumCPU())
	fmt.Fprintf(tw, "daemon RSS, idle\t%d MiB\t-\n", r.IdleRSS>>20)
	fmt.Fprintf(tw, "host memory per sandbox (MemAvailable)\t%.1f MiB\t-\n", float64(r.HostMemPer)/(1<<20))
	fmt.Fprintf(tw, "restart after kill -9 -> all %d listed running\t%s\t< 10s\n", r.N, ms(r.Readopt))
	fmt.Fprintf(tw, "restart after kill -9 -> exec answered\t%s\t< 10s\n", ms(r.ReadoptExec))
	if len(r.Teardown) > 0 {
		fmt.Fprintf(tw, "rm during teardown, bursts of 10, p50 / p95\t%s / %s\t-\n", ms(pct(r.Teardown, .5)), ms(pct(r.Teardown, .95)))
	}
	tw.Flush()
	if r.ReadoptLog != "" {
		fmt.Fprintf(w, "the restart's reconcile: %s\n", r.ReadoptLog)
	}
}

// growthSplit returns the first and the last 100 creates of the growth
// (fewer when N is small: the first and last fifth).
func (r *DensityResult) growthSplit() (first, last []Create) {
	k := min(100, len(r.Growth)/5)
	return r.Growth[:k], r.Growth[len(r.Growth)-k:]
}

func pick(cs []Create, warm bool) []time.Duration {
	var out []time.Duration
	for _, c := range cs {
		if c.Warm == warm {
			out = append(out, c.D)
		}
	}
	return out
}

// Ratio is b's median over a's.
func Ratio(a, b []time.Duration) float64 { return RatioAt(a, b, .5) }

// RatioAt is b's q-quantile over a's (0 when either is empty).
func RatioAt(a, b []time.Duration, q float64) float64 {
	if len(a) == 0 || len(b) == 0 {
		return 0
	}
	return float64(pct(b, q)) / float64(pct(a, q))
}

// GrowthRatio is the q-quantile of the cold creates among the growth's
// last 100 over the same of its first 100 (warm ones are left out: the
// warm pool's share changes as it adapts to the bursts).
func (r *DensityResult) GrowthRatio(q float64) float64 {
	first, last := r.growthSplit()
	return RatioAt(pick(first, false), pick(last, false), q)
}
