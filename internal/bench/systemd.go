package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// The default vm shape: what create gives without --cpus and --memory.
const (
	defaultCPUs   = 2
	defaultMemory = "2G"
)

// runSystemd measures, at the default shape, create to first exec output
// of a dev vm that boots systemd (from its template snapshot) beside a
// base vm with the agent as init, and what each costs idle: host memory
// (QEMU's RSS and PSS), the guest's own use, and the CPU its QEMU burns.
func runSystemd(ctx context.Context, cfg Config, root string) error {
	out := cfg.Out
	fmt.Fprintln(out, "\npreparing the dev template (built on first use)...")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	cl, stop, err := serveVM(ctx, cfg, root, -1, false)
	if err != nil {
		return err
	}
	defer stop()
	kinds := []struct{ template, init string }{{"base", api.InitAgent}, {"dev", api.InitSystemd}}
	req := func(i int, name string) api.CreateSandboxRequest {
		return api.CreateSandboxRequest{Name: name, Isolation: api.IsolationVM, Template: kinds[i].template, Init: kinds[i].init,
			CPUs: defaultCPUs, Memory: defaultMemory}
	}
	// First creates build each template snapshot at this shape.
	for i := range kinds {
		if _, err := vmCreateReq(ctx, cl, req(i, "sd-first")); err != nil {
			return fmt.Errorf("%s vm: %w", kinds[i].template, err)
		}
		cl.DeleteSandbox(ctx, "sd-first")
	}
	const n = 7
	fmt.Fprintf(out, "nook: create -> first exec output at %d vCPUs / %s, %d each of base (agent init) and dev (systemd), alternating...\n", defaultCPUs, defaultMemory, n)
	times := make([][]time.Duration, len(kinds))
	for r := 0; r < n; r++ {
		for i := range kinds {
			name := fmt.Sprintf("sd-%d-%d", i, r)
			d, err := vmCreateReq(ctx, cl, req(i, name))
			if err != nil {
				return err
			}
			times[i] = append(times[i], d)
			if err := cl.DeleteSandbox(ctx, name); err != nil {
				return err
			}
		}
	}
	fmt.Fprintln(out, "nook: a dev vm: stop, then start -> first exec output, 3 times; systemctl reboot -> first exec output in the new boot, 3 times; baseline: 2 cold boots of dev (snapshots off)...")
	if _, err := vmCreateReq(ctx, cl, req(1, "sd-stop")); err != nil {
		return err
	}
	ss, err := stopStart(ctx, cl, "sd-stop", "systemctl reboot", 3)
	cl.DeleteSandbox(ctx, "sd-stop")
	if err != nil {
		return err
	}
	cold, err := coldBoots(ctx, cfg, filepath.Join(root, "cold"), 2, func(name string) api.CreateSandboxRequest { return req(1, name) })
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "nook: 3 idle vms of each, memory and CPU after 20 s...")
	idle := make([]idleFigures, len(kinds))
	for i := range kinds {
		if idle[i], err = idleVMs(ctx, cl, root, func(j int) api.CreateSandboxRequest { return req(i, fmt.Sprintf("sd-idle-%d-%d", i, j)) }); err != nil {
			return err
		}
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "systemd vm (%d vCPUs, %s)\tp50\tp99\tbaseline\tbaseline p50\tratio p50\ttarget\n", defaultCPUs, defaultMemory)
	fmt.Fprintf(tw, "create dev (systemd) -> first exec output\t%s\t%s\tcreate base (agent init)\t%s\t%.2fx\t<= 1.2x\n",
		ms(pct(times[1], .5)), ms(pct(times[1], .99)), ms(pct(times[0], .5)), float64(pct(times[1], .5))/float64(pct(times[0], .5)))
	coldRow := fmt.Sprintf("cold boot of dev -> first exec output\t%s", ms(pct(cold, .5)))
	fmt.Fprintf(tw, "stop of a dev vm (systemd powers off)\t%s\t%s\t-\t-\t-\t-\n", ms(pct(ss.stop, .5)), ms(pct(ss.stop, .99)))
	fmt.Fprintf(tw, "start of a stopped dev vm -> first exec output\t%s\t%s\t%s\t%.2fx\t-\n", ms(pct(ss.start, .5)), ms(pct(ss.start, .99)), coldRow, float64(pct(ss.start, .5))/float64(pct(cold, .5)))
	fmt.Fprintf(tw, "systemctl reboot -> first exec output in the new boot\t%s\t%s\t%s\t%.2fx\t-\n", ms(pct(ss.reboot, .5)), ms(pct(ss.reboot, .99)), coldRow, float64(pct(ss.reboot, .5))/float64(pct(cold, .5)))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "idle vm, mean of 3\tQEMU RSS\tQEMU PSS\tguest used\tQEMU CPU (share of a core)")
	for i, k := range kinds {
		f := idle[i]
		fmt.Fprintf(tw, "%s (%s init)\t%d MiB\t%d MiB\t%d MiB\t%.1f%%\n", k.template, k.init, f.rss>>20, f.pss>>20, f.guest>>20, f.cpu*100)
	}
	return tw.Flush()
}

type idleFigures struct {
	memFigures
	cpu float64 // QEMU's CPU time over wall time, mean
}

// idleVMs creates 3 vms with req(0..2), leaves them idle for 20 s and
// measures them, then removes them.
func idleVMs(ctx context.Context, cl *sdk.Client, root string, req func(int) api.CreateSandboxRequest) (idleFigures, error) {
	const k = 3
	var f idleFigures
	defer func() {
		for j := 0; j < k; j++ {
			cl.DeleteSandbox(context.Background(), req(j).Name)
		}
	}()
	dirs := make([]string, k)
	for j := 0; j < k; j++ {
		if _, err := vmCreateReq(ctx, cl, req(j)); err != nil {
			return f, err
		}
		sb, err := cl.GetSandbox(ctx, req(j).Name)
		if err != nil {
			return f, err
		}
		dirs[j] = filepath.Join(root, "data", "vms", sb.ID)
	}
	const window = 20 * time.Second
	before := make([]time.Duration, k)
	for j, d := range dirs {
		before[j] = qemuCPU(d)
	}
	time.Sleep(window)
	for j, d := range dirs {
		f.cpu += float64(qemuCPU(d)-before[j]) / float64(window) / k
		rss, pss := qemuMemory(d)
		f.rss += rss / k
		f.pss += pss / k
		f.guest += guestUsed(ctx, cl, req(j).Name) / k
	}
	return f, nil
}

// qemuCPU is the CPU time (user and system) the QEMU serving a vm
// directory has used.
func qemuCPU(dir string) time.Duration {
	for _, p := range qemuProcDirs(dir) {
		stat, _ := os.ReadFile(filepath.Join(p, "stat"))
		// Fields after the command's closing parenthesis: utime and stime
		// are the 12th and 13th.
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 {
			f := strings.Fields(string(stat[i+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				s, _ := strconv.ParseInt(f[12], 10, 64)
				return time.Duration(u+s) * time.Second / 100 // USER_HZ
			}
		}
	}
	return 0
}
