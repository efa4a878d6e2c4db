// Package bench measures nook's performance targets side by side with a
// baseline taken in the same run, and prints them as a table.
package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/backend/vm"
	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/runcbin"
	"github.com/nookhq/nook/internal/server"
	"github.com/nookhq/nook/internal/template"
	"github.com/nookhq/nook/sdk"
)

// Config says how much to measure.
type Config struct {
	Creates      int    // sandboxes created (at least 20)
	Execs        int    // exec round trips
	AgentBinary  string // nook-agent to put in sandboxes
	TemplatesDir string
	VMCacheDir   string // guest kernel, vm template images and snapshots
	VM           bool   // also measure the vm backend
	OnlyVM       bool   // measure only the vm backend
	OnlyVMShape  bool   // measure only vms at the default shape and systemd vms
	OnlyNet      bool   // measure only sandbox networking
	OnlyRemote   bool   // measure only the SSH endpoint and preview URLs
	OnlyImage    bool   // measure only templates from images
	OnlyVolume   bool   // measure only volumes
	DensityN     int    // sandboxes alive in the density figures (0: none)
	DensityVMs   int    // vms held through the density figures (0: none)
	// CgroupParent is the cgroup parent of the daemons the network and
	// density figures run as processes (default nook-bench-net).
	CgroupParent string
	Out          io.Writer
	coldVM       bool // vm sandboxes boot instead of restoring the template snapshot
	// e2bListen is the daemon's --e2b-listen ("": none).
	e2bListen string
	// OnlyE2B measures only E2B's SDK against nook's.
	OnlyE2B bool
	// containerPause is the daemon's --container-pause ("freeze" unless a
	// benchmark asks for checkpoints).
	containerPause string
	// logs receives the in-process daemon's log (nil: discarded).
	logs slog.Handler
	// The vm snapshot benchmarks (snapshots.go).
	OnlySnapshots  bool // measure only pause, resume, snapshots and forks of vms
	SnapshotRounds int  // pause/resume rounds (forks: half as many); default 20
	PausedVMs      int  // paused vms to look at; default 100
	SnapshotChain  int  // snapshots in the chain whose disk is measured; default 20
}

type row struct {
	name          string
	p50, p99      time.Duration
	base          string
	baseP50       time.Duration
	baseP99       time.Duration
	target, ratio string
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p)
	return s[i]
}

// Run runs the benchmarks.
func Run(ctx context.Context, cfg Config) error {
	tpls := template.NewStore(cfg.TemplatesDir, slog.New(slog.DiscardHandler))
	fmt.Fprintln(cfg.Out, "preparing the base template (built on first use)...")
	tpl, err := tpls.EnsureBuilt(ctx, "base", os.Stderr)
	if err != nil {
		return err
	}
	rootfs, err := tpls.Rootfs(tpl.ID)
	if err != nil {
		return err
	}
	root, err := os.MkdirTemp("", "nookbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	// Searchable by others: a container sandbox's root, an unprivileged
	// uid on the host, passes it on the way to its rootfs.
	if err := os.Chmod(root, 0o711); err != nil {
		return err
	}
	if cfg.OnlyVM {
		return runVMAll(ctx, cfg, root)
	}
	if cfg.OnlyVMShape {
		return runVMShapes(ctx, cfg, root)
	}
	if cfg.OnlyNet {
		return runNetwork(ctx, cfg, root)
	}
	if cfg.OnlyRemote {
		return runOnlyRemote(ctx, cfg, root)
	}
	if cfg.OnlyImage {
		return runImage(ctx, cfg, root)
	}
	if cfg.OnlyVolume {
		return runVolume(ctx, cfg, root)
	}
	if cfg.OnlyE2B {
		return runE2B(ctx, cfg, root)
	}
	if cfg.OnlySnapshots {
		fmt.Fprintln(cfg.Out, "baseline: bare runc run of the same rootfs, 10 times...")
		bare, err := bareRunc(ctx, root, rootfs, 10)
		if err != nil {
			return fmt.Errorf("bare runc baseline: %w", err)
		}
		if err := runContainerSnapshots(ctx, cfg, root, rootfs, bare); err != nil {
			return fmt.Errorf("container snapshots: %w", err)
		}
		if err := runCheckpoint(ctx, cfg, root, rootfs); err != nil {
			return fmt.Errorf("container checkpoints: %w", err)
		}
		if !cfg.VM {
			return nil
		}
		return runSnapshots(ctx, cfg, root)
	}

	fmt.Fprintf(cfg.Out, "baseline: bare runc run of the same rootfs, %d times...\n", cfg.Creates)
	bare, err := bareRunc(ctx, root, rootfs, cfg.Creates)
	if err != nil {
		return fmt.Errorf("bare runc baseline: %w", err)
	}

	fmt.Fprintf(cfg.Out, "nook: create to first exec output, %d sandboxes, warm pool of 2; exec round trips...\n", cfg.Creates)
	warm, err := measure(ctx, cfg, filepath.Join(root, "warm"), 2, true)
	if err != nil {
		return err
	}
	create, rt := warm.create, warm.rt
	fmt.Fprintf(cfg.Out, "nook: create to first exec output, %d sandboxes, no warm pool...\n", cfg.Creates)
	coldRes, err := measure(ctx, Config{Creates: cfg.Creates, AgentBinary: cfg.AgentBinary, TemplatesDir: cfg.TemplatesDir, VMCacheDir: cfg.VMCacheDir}, filepath.Join(root, "cold"), -1, false)
	if err != nil {
		return err
	}
	cold := coldRes.create

	rows := []row{
		{name: "create (cold, no pool) -> first exec output", p50: pct(cold, .5), p99: pct(cold, .99), base: "bare runc run -> first output", baseP50: pct(bare, .5), target: "-",
			ratio: fmt.Sprintf("%.2fx", float64(pct(cold, .5))/float64(pct(bare, .5)))},
		{name: "create (warm pool) -> first exec output", p50: pct(create, .5), p99: pct(create, .99), base: "bare runc run -> first output", baseP50: pct(bare, .5), target: "<= 1.5x baseline",
			ratio: fmt.Sprintf("%.2fx", float64(pct(create, .5))/float64(pct(bare, .5)))},
		{name: "exec round trip (true)", p50: pct(rt, .5), p99: pct(rt, .99), base: "-", target: "p50 <= 3ms", ratio: "-"},
		{name: "exec first byte of output (echo)", p50: pct(warm.firstByte, .5), p99: pct(warm.firstByte, .99), base: "-", target: "p50 <= 5ms", ratio: "-"},
		{name: "pause (container, freezer)", p50: pct(warm.pause, .5), p99: pct(warm.pause, .99), base: "bare runc pause", baseP50: pct(warm.runcPause, .5), baseP99: pct(warm.runcPause, .99), target: "p50 <= 30ms",
			ratio: fmt.Sprintf("%.2fx", float64(pct(warm.pause, .5))/float64(pct(warm.runcPause, .5)))},
		{name: "resume (container, freezer)", p50: pct(warm.resume, .5), p99: pct(warm.resume, .99), base: "bare runc resume", baseP50: pct(warm.runcResume, .5), baseP99: pct(warm.runcResume, .99), target: "p50 <= 30ms",
			ratio: fmt.Sprintf("%.2fx", float64(pct(warm.resume, .5))/float64(pct(warm.runcResume, .5)))},
	}
	fmt.Fprintln(cfg.Out)
	tw := tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "metric\tp50\tp99\tbaseline\tbaseline p50\tbaseline p99\tratio p50\ttarget")
	for _, r := range rows {
		bp50, bp99 := "-", "-"
		if r.baseP50 > 0 {
			if r.baseP99 == 0 {
				r.baseP99 = pct(bare, .99)
			}
			bp50, bp99 = ms(r.baseP50), ms(r.baseP99)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.name, ms(r.p50), ms(r.p99), r.base, bp50, bp99, r.ratio, r.target)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(cfg.Out)
	tw = tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "stream (1 GiB)\tthroughput\tbaseline\tbaseline throughput\ttarget")
	fmt.Fprintf(tw, "cat in sandbox -> client (exec stream)\t%.0f MB/s\tcat on the host -> pipe\t%.0f MB/s\t>= 300 MB/s\n", warm.catMBs, warm.hostCatMBs)
	fmt.Fprintf(tw, "client -> stdin of cat > file (WebSocket)\t%.0f MB/s\t-\t-\t>= 300 MB/s\n", warm.uploadMBs)
	fmt.Fprintf(tw, "file download (GET .../files/content)\t%.0f MB/s\tcat on the host -> pipe\t%.0f MB/s\t>= 300 MB/s\n", warm.fileDownMBs, warm.hostCatMBs)
	fmt.Fprintf(tw, "file upload (PUT .../files/content)\t%.0f MB/s\t-\t-\t>= 300 MB/s\n", warm.fileUpMBs)
	fmt.Fprintf(tw, "peak RSS while streaming: agent\t%d MiB\tdaemon+client process\t%d MiB\tbounded\n", warm.agentRSS>>20, warm.selfRSS>>20)
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := runContainerSnapshots(ctx, cfg, root, rootfs, bare); err != nil {
		return fmt.Errorf("container snapshots: %w", err)
	}
	if err := runCheckpoint(ctx, cfg, root, rootfs); err != nil {
		return fmt.Errorf("container checkpoints: %w", err)
	}
	fmt.Fprintln(cfg.Out)
	if err := runNetwork(ctx, cfg, root); err != nil {
		return fmt.Errorf("network benchmarks: %w", err)
	}
	fmt.Fprintln(cfg.Out)
	if err := runImage(ctx, cfg, root); err != nil {
		return fmt.Errorf("image template benchmarks: %w", err)
	}
	fmt.Fprintln(cfg.Out)
	if err := runVolume(ctx, cfg, root); err != nil {
		return fmt.Errorf("volume benchmarks: %w", err)
	}
	fmt.Fprintln(cfg.Out)
	if err := runE2B(ctx, cfg, root); err != nil {
		return fmt.Errorf("E2B SDK benchmarks: %w", err)
	}
	if cfg.DensityN > 0 {
		fmt.Fprintln(cfg.Out)
		if _, err := RunDensity(ctx, cfg, cfg.DensityN); err != nil {
			return fmt.Errorf("density: %w", err)
		}
	}
	if cfg.VM {
		if err := runVMAll(ctx, cfg, root); err != nil {
			return err
		}
		return runSnapshots(ctx, cfg, root)
	}
	return nil
}

// runVMAll runs the vm figures: the small shape's creates, memory and
// density, then the default shape's snapshots, pause and fork, and
// systemd against the agent as init.
func runVMAll(ctx context.Context, cfg Config, root string) error {
	if err := runVM(ctx, cfg, root); err != nil {
		return err
	}
	return runVMShapes(ctx, cfg, root)
}

// runVMShapes runs the default shape's figures and systemd's.
func runVMShapes(ctx context.Context, cfg Config, root string) error {
	probe := vm.New(vm.Config{StateDir: filepath.Join(root, "probe-shape"), CacheDir: cfg.VMCacheDir, AgentBinary: cfg.AgentBinary,
		CgroupParent: "nook-bench", Log: slog.New(slog.DiscardHandler), TemplateRootfs: template.NewStore(cfg.TemplatesDir, slog.New(slog.DiscardHandler)).Rootfs})
	if ok, why, _ := probe.Available(ctx); !ok {
		fmt.Fprintf(cfg.Out, "\nvm backend not available, default-shape and systemd figures skipped: %s\n", why)
		return nil
	}
	if err := runDefaultShape(ctx, cfg, root); err != nil {
		return fmt.Errorf("vm at the default shape: %w", err)
	}
	if err := runSystemd(ctx, cfg, filepath.Join(root, "systemd")); err != nil {
		return fmt.Errorf("systemd vms: %w", err)
	}
	return nil
}

// measure runs a daemon on its own data dir and socket, driven through the
// SDK like any client: creates to first exec output, then exec round trips.
type results struct {
	create, rt, firstByte         []time.Duration
	pause, resume                 []time.Duration // through the API
	runcPause, runcResume         []time.Duration // bare runc on the same container
	catMBs, hostCatMBs, uploadMBs float64
	fileDownMBs, fileUpMBs        float64
	agentRSS, selfRSS             int64 // peak, bytes
}

// serve runs a daemon on its own data dir and socket under root, and
// returns a client of it and a function that stops it.
func serve(ctx context.Context, cfg Config, root string, pool int) (*sdk.Client, func(), error) {
	log := slog.New(slog.DiscardHandler)
	if cfg.logs != nil {
		log = slog.New(cfg.logs)
	}
	sock := filepath.Join(root, "nook.sock")
	ready := make(chan struct{})
	sctx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		errc <- server.Serve(sctx, server.Config{
			Socket: sock, Ready: func() { close(ready) }, E2BListen: cfg.e2bListen,
			Daemon: daemon.Config{DataDir: filepath.Join(root, "data"), RunDir: filepath.Join(root, "run"), TemplatesDir: cfg.TemplatesDir,
				VMCacheDir: cfg.VMCacheDir, AgentBinary: cfg.AgentBinary, CgroupParent: "nook-bench", WarmPool: pool, Log: log,
				VMColdBoot: cfg.coldVM, ContainerPause: cmp.Or(cfg.containerPause, "freeze")},
		})
	}()
	select {
	case <-ready:
	case err := <-errc:
		stop()
		return nil, nil, err
	}
	cl, err := sdk.New("unix://"+sock, "")
	done := func() {
		// What a measurement cut short (an error, a signal) left is
		// destroyed: the daemon itself leaves sandboxes running.
		if cl != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			if sbs, err := cl.ListSandboxes(dctx); err == nil {
				for _, sb := range sbs {
					cl.DeleteSandbox(dctx, sb.Name)
				}
			}
			// Volumes are mounted under the bench's directory: removed
			// here, never walked by its RemoveAll.
			if vols, err := cl.ListVolumes(dctx); err == nil {
				for _, v := range vols {
					cl.DeleteVolume(dctx, v.Name, true)
				}
			}
			cancel()
		}
		stop()
		<-errc
		removeCgroups("nook-bench")
	}
	if err != nil {
		done()
		return nil, nil, err
	}
	return cl, done, nil
}

func measure(ctx context.Context, cfg Config, root string, pool int, streams bool) (res results, err error) {
	cl, stop, err := serve(ctx, cfg, root, pool)
	if err != nil {
		return res, err
	}
	defer stop()
	if pool > 0 {
		time.Sleep(2 * time.Second) // let the pool fill, as on a daemon that has been up a while
	}
	for i := 0; i < cfg.Creates; i++ {
		name := fmt.Sprintf("bench-%d", i)
		start := time.Now()
		if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: name}); err != nil {
			return res, err
		}
		fw := &firstWrite{start: start}
		if _, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"echo", "hi"}}, fw, io.Discard); err != nil {
			return res, err
		}
		res.create = append(res.create, fw.at)
		if i > 0 { // keep the first for the exec benchmarks
			if err := cl.DeleteSandbox(ctx, name); err != nil {
				return res, err
			}
		}
	}
	for i := 0; i < cfg.Execs; i++ {
		start := time.Now()
		st, err := cl.Exec(ctx, "bench-0", api.ExecRequest{Cmd: []string{"true"}}, io.Discard, io.Discard)
		if err != nil || st.ExitCode != 0 {
			return res, fmt.Errorf("exec true: %v %+v", err, st)
		}
		res.rt = append(res.rt, time.Since(start))
		fw := &firstWrite{start: time.Now()}
		if _, err := cl.Exec(ctx, "bench-0", api.ExecRequest{Cmd: []string{"echo", "hi"}}, fw, io.Discard); err != nil {
			return res, err
		}
		res.firstByte = append(res.firstByte, fw.at)
	}
	if streams {
		if err := measurePause(ctx, cl, root, &res); err != nil {
			return res, err
		}
		if err := measureStreams(ctx, cl, root, &res); err != nil {
			return res, err
		}
	}
	return res, cl.DeleteSandbox(ctx, "bench-0")
}

// measurePause times pause and resume through the API, beside bare
// `runc pause` / `runc resume` of the same container.
func measurePause(ctx context.Context, cl *sdk.Client, root string, res *results) error {
	sb, err := cl.GetSandbox(ctx, "bench-0")
	if err != nil {
		return err
	}
	runc := func(verb string) (time.Duration, error) {
		t := time.Now()
		out, err := exec.CommandContext(ctx, runcbin.Find(), "--root", filepath.Join(root, "run", "runc"), verb, sb.ID).CombinedOutput()
		if err != nil {
			return 0, fmt.Errorf("runc %s: %v: %s", verb, err, out)
		}
		return time.Since(t), nil
	}
	for i := 0; i < 50; i++ {
		t0 := time.Now()
		if _, err := cl.PauseSandbox(ctx, "bench-0"); err != nil {
			return err
		}
		t1 := time.Now()
		if _, err := cl.ResumeSandbox(ctx, "bench-0"); err != nil {
			return err
		}
		res.pause, res.resume = append(res.pause, t1.Sub(t0)), append(res.resume, time.Since(t1))
		p, err := runc("pause")
		if err != nil {
			return err
		}
		r, err := runc("resume")
		if err != nil {
			return err
		}
		res.runcPause, res.runcResume = append(res.runcPause, p), append(res.runcResume, r)
	}
	return nil
}

const streamBytes = 1 << 30

// measureStreams times `cat` of a 1 GiB file from a sandbox to the client
// and a 1 GiB upload through stdin, beside `cat` of the same file on the
// host, and records peak memory of the agent and of this process (daemon
// and client).
func measureStreams(ctx context.Context, cl *sdk.Client, root string, res *results) error {
	if _, err := cl.Exec(ctx, "bench-0", api.ExecRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/urandom > /tmp/big", streamBytes)}}, io.Discard, os.Stderr); err != nil {
		return err
	}
	var cnt countWriter
	start := time.Now()
	if _, err := cl.Exec(ctx, "bench-0", api.ExecRequest{Cmd: []string{"cat", "/tmp/big"}}, &cnt, io.Discard); err != nil {
		return err
	}
	if cnt.n != streamBytes {
		return fmt.Errorf("cat streamed %d bytes, want %d", cnt.n, streamBytes)
	}
	res.catMBs = float64(streamBytes) / 1e6 / time.Since(start).Seconds()

	// The same file, on the host: it is in the sandbox's upper layer.
	sbs, err := cl.ListSandboxes(ctx)
	if err != nil || len(sbs) == 0 {
		return fmt.Errorf("list sandboxes: %v", err)
	}
	host := filepath.Join(root, "data", "sandboxes", sbs[0].ID, "disk", "upper", "tmp", "big") // the sandbox's own disk image
	hc := exec.CommandContext(ctx, "cat", host)
	out, _ := hc.StdoutPipe()
	start = time.Now()
	if err := hc.Start(); err != nil {
		return err
	}
	n, _ := io.Copy(io.Discard, out)
	if err := hc.Wait(); err != nil || n != streamBytes {
		return fmt.Errorf("host cat: %v (%d bytes)", err, n)
	}
	res.hostCatMBs = float64(streamBytes) / 1e6 / time.Since(start).Seconds()

	s, err := cl.ExecInteractive(ctx, "bench-0", api.ExecRequest{Cmd: []string{"sh", "-c", "cat > /tmp/up"}})
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	start = time.Now()
	for sent := 0; sent < streamBytes; sent += len(buf) {
		if _, err := s.Write(buf); err != nil {
			return err
		}
	}
	s.CloseStdin()
	st, err := s.Wait(io.Discard, os.Stderr)
	if err != nil || st.ExitCode != 0 {
		return fmt.Errorf("upload: %v %+v", err, st)
	}
	res.uploadMBs = float64(streamBytes) / 1e6 / time.Since(start).Seconds()
	s.Close()

	// The file API: download the file, and upload 1 GiB to a new one.
	start = time.Now()
	rd, err := cl.ReadFile(ctx, "bench-0", "/tmp/big", nil)
	if err != nil {
		return err
	}
	n, err = io.Copy(io.Discard, rd)
	rd.Close()
	if err != nil || n != streamBytes {
		return fmt.Errorf("file download: %v (%d bytes)", err, n)
	}
	res.fileDownMBs = float64(streamBytes) / 1e6 / time.Since(start).Seconds()
	start = time.Now()
	if _, err := cl.WriteFile(ctx, "bench-0", "/tmp/up2", io.LimitReader(zeroReader{}, streamBytes), nil); err != nil {
		return fmt.Errorf("file upload: %w", err)
	}
	res.fileUpMBs = float64(streamBytes) / 1e6 / time.Since(start).Seconds()

	pidOut := &strings.Builder{}
	cl.Exec(ctx, "bench-0", api.ExecRequest{Cmd: []string{"sh", "-c", "grep VmHWM /proc/1/status; rm -f /tmp/big /tmp/up /tmp/up2"}}, pidOut, io.Discard)
	res.agentRSS = parseKB(pidOut.String())
	self, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(self), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			res.selfRSS = parseKB(line)
		}
	}
	return nil
}

func parseKB(s string) int64 {
	var kb int64
	f := strings.Fields(s)
	if len(f) >= 2 {
		kb, _ = strconv.ParseInt(f[1], 10, 64)
	}
	return kb << 10
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) { clear(p); return len(p), nil }

type countWriter struct{ n int64 }

func (c *countWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000) }

// firstWrite records when the first byte of output arrived.
type firstWrite struct {
	start time.Time
	at    time.Duration
}

func (f *firstWrite) Write(p []byte) (int, error) {
	if f.at == 0 && len(p) > 0 {
		f.at = time.Since(f.start)
	}
	return len(p), nil
}

// bareRunc times `runc run` to the first byte of `echo hi`, with runc's
// own default spec (`runc spec`) pointed at the template's rootfs,
// read-only as a lower layer is.
func bareRunc(ctx context.Context, root, rootfs string, n int) ([]time.Duration, error) {
	bundle := filepath.Join(root, "bare")
	if err := bareBundle(ctx, bundle, rootfs, "/nook-bench-bare/c", "echo", "hi"); err != nil {
		return nil, err
	}
	defer removeCgroups("nook-bench-bare")
	var out []time.Duration
	for i := 0; i < n; i++ {
		cmd := exec.CommandContext(ctx, runcbin.Find(), "--root", filepath.Join(root, "runc-bare"), "run", "--bundle", bundle, fmt.Sprintf("bare-%d", i))
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		start := time.Now()
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		r := bufio.NewReader(stdout)
		if _, err := r.ReadByte(); err != nil {
			cmd.Wait()
			return nil, fmt.Errorf("no output from runc run: %w", err)
		}
		out = append(out, time.Since(start))
		io.Copy(io.Discard, r)
		if err := cmd.Wait(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// bareBundle writes a runc bundle at dir with runc's own default spec
// (`runc spec`), pointed at rootfs read-only (as a lower layer is), in
// cgroup cgroupsPath, running args.
func bareBundle(ctx context.Context, dir, rootfs, cgroupsPath string, args ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, runcbin.Find(), "spec", "--bundle", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("runc spec: %v: %s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return err
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return err
	}
	spec.Root = &specs.Root{Path: rootfs, Readonly: true}
	spec.Process.Terminal = false
	spec.Process.Args = args
	spec.Linux.CgroupsPath = cgroupsPath
	if b, err = json.Marshal(&spec); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644)
}

// removeCgroups removes the (empty) cgroups at path, deepest first, in
// every hierarchy.
func removeCgroups(paths ...string) {
	for _, p := range paths {
		for _, d := range cgroups.Dirs(p, "") {
			os.Remove(d)
		}
	}
}
