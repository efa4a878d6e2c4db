package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/backend/vm"
	"github.com/nookhq/nook/internal/template"
	"github.com/nookhq/nook/sdk"
)

// The vm shape the benchmarks create: one vCPU, 1 GiB.
const (
	vmCPUs   = 1
	vmMemory = "1G"
	vmMemMiB = 1024
)

// runVM measures the vm backend: create to first exec output from the
// template snapshot (with and without a warm pool) beside a cold boot of
// the same template and a bare QEMU boot of the same kernel; host memory
// per idle vm; and how many idle vms the host holds before create latency
// doubles.
func runVM(ctx context.Context, cfg Config, root string) error {
	out := cfg.Out
	backend := vm.New(vm.Config{StateDir: filepath.Join(root, "vm-cold"), CacheDir: cfg.VMCacheDir, AgentBinary: cfg.AgentBinary,
		CgroupParent: "nook-bench", ColdBoot: true, Log: slog.New(slog.DiscardHandler),
		TemplateRootfs: template.NewStore(cfg.TemplatesDir, slog.New(slog.DiscardHandler)).Rootfs})
	if ok, why, _ := backend.Available(ctx); !ok {
		fmt.Fprintf(out, "\nvm backend not available, skipped: %s\n", why)
		return nil
	}
	accel, why := backend.Accelerator()
	fmt.Fprintf(out, "\nvm backend: accelerator %s (%s)\n", accel, why)

	fmt.Fprintln(out, "baseline: bare QEMU boot of the guest kernel to its init, 5 times...")
	var bare []time.Duration
	for i := 0; i < 5; i++ {
		d, err := backend.BareBoot(ctx, vmCPUs, vmMemMiB)
		if err != nil {
			return fmt.Errorf("bare boot: %w", err)
		}
		bare = append(bare, d)
	}

	fmt.Fprintln(out, "nook: cold boot of the template to first exec output, 3 times (through a daemon with snapshots off)...")
	cold, err := vmCreates(ctx, cfg, filepath.Join(root, "vm-coldd"), -1, 3, true)
	if err != nil {
		return err
	}
	n := max(cfg.Creates/2, 10)
	fmt.Fprintf(out, "nook: create from the template snapshot to first exec output, %d vms, no warm pool...\n", n)
	restore, err := vmCreates(ctx, cfg, filepath.Join(root, "vm-restore"), -1, n, false)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "nook: the same with a warm pool of 2, %d vms...\n", n)
	warm, err := vmCreates(ctx, cfg, filepath.Join(root, "vm-warm"), 2, n, false)
	if err != nil {
		return err
	}

	fmt.Fprintln(out, "nook: memory of 5 idle vms...")
	mem, err := idleMemory(ctx, cfg, filepath.Join(root, "vm-mem"))
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "nook: idle vms until create latency doubles...")
	dens, err := vmDensity(ctx, cfg, filepath.Join(root, "vm-density"))
	if err != nil {
		return err
	}

	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "vm metric ("+accel+")\tp50\tp99\tbaseline\tbaseline p50\tratio p50\ttarget")
	ratio := func(a, b []time.Duration) string {
		return fmt.Sprintf("%.2fx", float64(pct(a, .5))/float64(pct(b, .5)))
	}
	fmt.Fprintf(tw, "create (snapshot, warm pool) -> first exec output\t%s\t%s\tbare QEMU boot to init\t%s\t%s\tp50 <= 150ms\n", ms(pct(warm, .5)), ms(pct(warm, .99)), ms(pct(bare, .5)), ratio(warm, bare))
	fmt.Fprintf(tw, "create (snapshot, no pool) -> first exec output\t%s\t%s\tbare QEMU boot to init\t%s\t%s\t-\n", ms(pct(restore, .5)), ms(pct(restore, .99)), ms(pct(bare, .5)), ratio(restore, bare))
	fmt.Fprintf(tw, "create (cold boot) -> first exec output\t%s\t%s\tbare QEMU boot to init\t%s\t%s\t-\n", ms(pct(cold, .5)), ms(pct(cold, .99)), ms(pct(bare, .5)), ratio(cold, bare))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "idle vm ("+vmMemory+" guest)\tQEMU RSS\tQEMU PSS\tguest touched\toverhead (RSS - guest)\ttarget")
	fmt.Fprintf(tw, "mean of 5\t%d MiB\t%d MiB\t%d MiB\t%d MiB\t<= 64 MiB\n", mem.rss>>20, mem.pss>>20, mem.guest>>20, (mem.rss-mem.guest)>>20)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "\nidle vms held before create latency doubled: %d (first creates p50 %s, last %s; stopped because %s; host MemAvailable left %d MiB)\n",
		dens.count, ms(dens.first), ms(dens.last), dens.why, dens.memLeft>>20)
	return nil
}

// vmCreates times creates of vm sandboxes to the first byte of `echo hi`.
func vmCreates(ctx context.Context, cfg Config, root string, pool, n int, cold bool) ([]time.Duration, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	cl, stop, err := serveVM(ctx, cfg, root, pool, cold)
	if err != nil {
		return nil, err
	}
	defer stop()
	// One create first: it builds the template snapshot for this shape if
	// there is none, and (with a pool) starts the pool.
	if _, err := vmCreate(ctx, cl, "vm-first"); err != nil {
		return nil, err
	}
	cl.DeleteSandbox(ctx, "vm-first")
	if pool > 0 {
		time.Sleep(8 * time.Second)
	}
	var ds []time.Duration
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("vm-%d", i)
		d, err := vmCreate(ctx, cl, name)
		if err != nil {
			return nil, err
		}
		ds = append(ds, d)
		if err := cl.DeleteSandbox(ctx, name); err != nil {
			return nil, err
		}
		if pool > 0 {
			time.Sleep(time.Second) // a refill is a restore: let it finish, as between real creates
		}
	}
	return ds, nil
}

func vmCreate(ctx context.Context, cl *sdk.Client, name string) (time.Duration, error) {
	return vmCreateReq(ctx, cl, api.CreateSandboxRequest{Name: name, Isolation: api.IsolationVM, CPUs: vmCPUs, Memory: vmMemory})
}

// vmCreateReq times a create to the first byte of `echo hi`.
func vmCreateReq(ctx context.Context, cl *sdk.Client, req api.CreateSandboxRequest) (time.Duration, error) {
	name := req.Name
	start := time.Now()
	if _, err := cl.CreateSandbox(ctx, req); err != nil {
		return 0, err
	}
	fw := &firstWrite{start: start}
	if _, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"echo", "hi"}}, fw, io.Discard); err != nil {
		return 0, err
	}
	return fw.at, nil
}

// serveVM is serve with the vm backend's options.
func serveVM(ctx context.Context, cfg Config, root string, pool int, cold bool) (*sdk.Client, func(), error) {
	c := cfg
	c.coldVM = cold
	return serve(ctx, c, root, pool)
}

type memFigures struct{ rss, pss, guest int64 }

func idleMemory(ctx context.Context, cfg Config, root string) (memFigures, error) {
	var m memFigures
	os.MkdirAll(root, 0o700)
	cl, stop, err := serveVM(ctx, cfg, root, -1, false)
	if err != nil {
		return m, err
	}
	defer stop()
	const k = 5
	for i := 0; i < k; i++ {
		if _, err := vmCreate(ctx, cl, fmt.Sprintf("idle-%d", i)); err != nil {
			return m, err
		}
	}
	time.Sleep(5 * time.Second)
	for i := 0; i < k; i++ {
		name := fmt.Sprintf("idle-%d", i)
		sb, err := cl.GetSandbox(ctx, name)
		if err != nil {
			return m, err
		}
		rss, pss := qemuMemory(filepath.Join(root, "data", "vms", sb.ID))
		m.rss += rss / k
		m.pss += pss / k
		m.guest += guestUsed(ctx, cl, name) / k
	}
	for i := 0; i < k; i++ {
		cl.DeleteSandbox(ctx, fmt.Sprintf("idle-%d", i))
	}
	return m, nil
}

// guestUsed is the memory a vm's guest uses (MemTotal - MemFree).
func guestUsed(ctx context.Context, cl *sdk.Client, name string) int64 {
	var b strings.Builder
	cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"sh", "-c", "grep -E '^(MemTotal|MemFree):' /proc/meminfo"}}, &b, io.Discard)
	var total, free int64
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.HasPrefix(l, "MemTotal:") {
			total = parseKB(l)
		} else if strings.HasPrefix(l, "MemFree:") {
			free = parseKB(l)
		}
	}
	return total - free
}

// qemuMemory reads the RSS and PSS of the QEMU serving a vm directory.
func qemuMemory(dir string) (rss, pss int64) {
	for _, p := range qemuProcDirs(dir) {
		sm, _ := os.ReadFile(filepath.Join(p, "smaps_rollup"))
		for _, l := range strings.Split(string(sm), "\n") {
			if strings.HasPrefix(l, "Rss:") {
				rss = parseKB(l)
			} else if strings.HasPrefix(l, "Pss:") {
				pss = parseKB(l)
			}
		}
	}
	return rss, pss
}

// qemuProcDirs are the /proc directories of the QEMU serving a vm
// directory (one, or none).
func qemuProcDirs(dir string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), dir+"/disk.qcow2") {
			out = append(out, filepath.Dir(p))
		}
	}
	return out
}

type density struct {
	count       int
	first, last time.Duration
	why         string
	memLeft     int64
}

// vmDensity creates idle vms (no pool) until the median of the last three
// creates is twice that of the first three, the host runs low on memory,
// or 100 are running.
func vmDensity(ctx context.Context, cfg Config, root string) (density, error) {
	var d density
	os.MkdirAll(root, 0o700)
	cl, stop, err := serveVM(ctx, cfg, root, -1, false)
	if err != nil {
		return d, err
	}
	defer stop()
	defer func() {
		for i := 0; i < d.count+1; i++ {
			cl.DeleteSandbox(context.Background(), fmt.Sprintf("dense-%d", i))
		}
	}()
	var ds []time.Duration
	for {
		if d.count >= 100 {
			d.why = "100 vms were running"
			break
		}
		if d.memLeft = memAvailable(); d.memLeft < 2<<30 {
			d.why = "host MemAvailable fell below 2 GiB"
			break
		}
		t, err := vmCreate(ctx, cl, fmt.Sprintf("dense-%d", d.count))
		if err != nil {
			d.why = "create failed: " + err.Error()
			break
		}
		d.count++
		ds = append(ds, t)
		if len(ds) >= 6 {
			d.first, d.last = pct(ds[:3], .5), pct(ds[len(ds)-3:], .5)
			if d.last > 2*d.first {
				d.why = "create latency doubled"
				break
			}
		}
	}
	d.memLeft = memAvailable()
	return d, nil
}

func memAvailable() int64 { return meminfo("MemAvailable") }

// meminfo returns a /proc/meminfo field, in bytes (0 if it is missing).
func meminfo(field string) int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, field+":") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}
