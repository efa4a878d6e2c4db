package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/backend/vm"
	"github.com/nookhq/nook/internal/procfs"
	"github.com/nookhq/nook/internal/template"
	"github.com/nookhq/nook/sdk"
)

// The vm shape the snapshot benchmarks create: small, so that 100 fit.
const (
	snapCPUs   = 1
	snapMemory = "512M"
)

// runSnapshots measures pause, resume, snapshots and forks of vm
// sandboxes (issue 5's figures), beside a cold boot of the same shape,
// all through the SDK against an in-process daemon. Everything it
// creates is destroyed, and it checks that no QEMU of its data dir is
// left.
func runSnapshots(ctx context.Context, cfg Config, root string) (err error) {
	out := cfg.Out
	rounds, paused, chain := cfg.SnapshotRounds, cfg.PausedVMs, cfg.SnapshotChain
	if rounds <= 0 {
		rounds = 20
	}
	if paused <= 0 {
		paused = 100
	}
	if chain <= 0 {
		chain = 20
	}
	root = filepath.Join(root, "snapshots")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	probe := vm.New(vm.Config{StateDir: filepath.Join(root, "probe"), CacheDir: cfg.VMCacheDir, AgentBinary: cfg.AgentBinary,
		CgroupParent: "nook-bench", Log: slog.New(slog.DiscardHandler),
		TemplateRootfs: template.NewStore(cfg.TemplatesDir, slog.New(slog.DiscardHandler)).Rootfs})
	if ok, why, _ := probe.Available(ctx); !ok {
		fmt.Fprintf(out, "\nvm backend not available, snapshot benchmarks skipped: %s\n", why)
		return nil
	}
	accel, _ := probe.Accelerator()
	// Whatever happens, no QEMU of this run may outlive it.
	defer func() {
		if left := qemuProcs(root); len(left) > 0 {
			for _, p := range left {
				syscall.Kill(p, syscall.SIGKILL)
			}
			err = errors.Join(err, fmt.Errorf("%d QEMU processes of the snapshot benchmarks were left running (killed: %v)", len(left), left))
		}
	}()

	fmt.Fprintf(out, "\nsnapshots (vm backend, %s, %d vCPU, %s)\n", accel, snapCPUs, snapMemory)
	fmt.Fprintln(out, "baseline: cold boot of the template to first exec output, 3 times (daemon with snapshots off)...")
	cold, err := snapColdBoots(ctx, cfg, filepath.Join(root, "cold"), 3)
	if err != nil {
		return fmt.Errorf("cold boots: %w", err)
	}

	dir := filepath.Join(root, "d")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cl, stop, err := serveVM(ctx, cfg, dir, -1, false)
	if err != nil {
		return err
	}
	defer func() {
		// Destroy everything the daemon has, then stop it (vms outlive a
		// daemon that stops).
		err = errors.Join(err, destroyAll(cl))
		stop()
	}()
	// The first create of this shape builds its template snapshot if the
	// cache has none.
	if _, err := snapCreate(ctx, cl, "snap-first"); err != nil {
		return err
	}
	if err := cl.DeleteSandbox(ctx, "snap-first"); err != nil {
		return err
	}

	fmt.Fprintf(out, "nook: pause, then resume -> first exec output, %d times; pause, then exec (wakes it) -> first output, %d times...\n", rounds, rounds)
	pr, err := snapPauseResume(ctx, cl, rounds)
	if err != nil {
		return fmt.Errorf("pause/resume: %w", err)
	}
	forks := max(rounds/2, 5)
	fmt.Fprintf(out, "nook: fork of a running sandbox -> first exec output in the fork, %d times; fork --count 10...\n", forks)
	fk, err := snapForks(ctx, cl, forks)
	if err != nil {
		return fmt.Errorf("forks: %w", err)
	}
	fmt.Fprintln(out, "nook: stop, then start -> first exec output, 3 times; a guest reboot (sysrq b) -> first exec output in the new boot, 3 times...")
	ss, err := snapStopStart(ctx, cl, 3)
	if err != nil {
		return fmt.Errorf("stop/start and reboots: %w", err)
	}
	fmt.Fprintf(out, "nook: %d paused vms: QEMU processes, their CPU over 10 s and RSS...\n", paused)
	pv, err := snapPausedVMs(ctx, cl, dir, paused)
	if err != nil {
		return fmt.Errorf("paused vms: %w", err)
	}
	fmt.Fprintf(out, "nook: a chain of %d snapshots, 10 MB of random data written (and synced) before each...\n", chain)
	ch, err := snapChain(ctx, cl, dir, chain)
	if err != nil {
		return fmt.Errorf("snapshot chain: %w", err)
	}

	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	coldRow := fmt.Sprintf("cold boot -> first exec output\t%s", ms(pct(cold, .5)))
	fmt.Fprintln(tw, "vm snapshots ("+accel+", "+snapMemory+")\tp50\tp99\tbaseline\tbaseline p50\ttarget")
	fmt.Fprintf(tw, "pause (saved to disk, QEMU exits)\t%s\t%s\t%s\tp50 <= 100ms\n", ms(pct(pr.pause, .5)), ms(pct(pr.pause, .99)), coldRow)
	fmt.Fprintf(tw, "resume -> first exec output\t%s\t%s\t%s\tp50 <= 100ms\n", ms(pct(pr.resumeExec, .5)), ms(pct(pr.resumeExec, .99)), coldRow)
	fmt.Fprintf(tw, "  of which the resume call\t%s\t%s\t-\t-\t-\n", ms(pct(pr.resume, .5)), ms(pct(pr.resume, .99)))
	fmt.Fprintf(tw, "exec on a paused vm (wakes it) -> first output\t%s\t%s\t%s\t-\n", ms(pct(pr.wake, .5)), ms(pct(pr.wake, .99)), coldRow)
	fmt.Fprintf(tw, "fork of a running sandbox -> first exec output in the fork\t%s\t%s\t%s\tp50 <= 300ms\n", ms(pct(fk.one, .5)), ms(pct(fk.one, .99)), coldRow)
	fmt.Fprintf(tw, "  of which the fork call\t%s\t%s\t-\t-\t-\n", ms(pct(fk.oneCall, .5)), ms(pct(fk.oneCall, .99)))
	fmt.Fprintf(tw, "stop (QEMU quits, memory freed)\t%s\t%s\t-\t-\t-\n", ms(pct(ss.stop, .5)), ms(pct(ss.stop, .99)))
	fmt.Fprintf(tw, "start of a stopped vm (cold boot of its disk) -> first exec output\t%s\t%s\t%s\t-\n", ms(pct(ss.start, .5)), ms(pct(ss.start, .99)), coldRow)
	fmt.Fprintf(tw, "guest reboot -> first exec output in the new boot\t%s\t%s\t%s\t-\n", ms(pct(ss.reboot, .5)), ms(pct(ss.reboot, .99)), coldRow)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "fork --count 10 of a running sandbox\ttotal\tper fork\tbaseline\tbaseline p50")
	fmt.Fprintf(tw, "-> first exec output in all 10\t%s\t%s\t%s\n", ms(fk.ten), ms(fk.ten/10), coldRow)
	fmt.Fprintf(tw, "  of which the fork call\t%s\t%s\t-\t-\n", ms(fk.tenCall), ms(fk.tenCall/10))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "paused vms\tQEMU processes\ttheir CPU over 10 s\ttheir RSS\tsaved state on disk\tdaemon+bench process CPU over the 10 s\ttarget")
	fmt.Fprintf(tw, "%d\t%d\t%s\t%d MiB\t%d MiB (%d MiB each)\t%s\t0 CPU, no QEMU processes\n", pv.count, pv.procs, ms(pv.cpu), pv.rss>>20, pv.disk>>20, pv.disk/int64(max(pv.count, 1))>>20, ms(pv.selfCPU))
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "snapshot chain\tdisk layers\tmemory states\ttotal\texpected (disk)\t%d full copies of the disk\n", ch.count)
	fmt.Fprintf(tw, "%d snapshots, 10 MB changed between each\t%d MiB\t%d MiB (%d MiB each)\t%d MiB\tabout %d MB plus metadata\t%d MiB\n",
		ch.count, ch.disk>>20, ch.mem>>20, ch.mem/int64(max(ch.count, 1))>>20, (ch.disk+ch.mem)>>20, 10*ch.count, int64(ch.count)*ch.fullDisk>>20)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "\ncontainer pause / resume: the \"pause (container, freezer)\" and \"resume (container, freezer)\" rows of the first table.")
	if n := len(qemuProcs(root)); n > 0 {
		return fmt.Errorf("%d QEMU processes of the snapshot benchmarks still run after destroying every sandbox", n)
	}
	return nil
}

// snapCreate creates a vm sandbox of the benchmarks' shape and times it
// to the first byte of `echo hi`.
func snapCreate(ctx context.Context, cl *sdk.Client, name string) (time.Duration, error) {
	start := time.Now()
	if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: name, Isolation: api.IsolationVM, CPUs: snapCPUs, Memory: snapMemory}); err != nil {
		return 0, err
	}
	return firstOutput(ctx, cl, name, start)
}

// firstOutput runs `echo hi` and returns when its first byte came, since start.
func firstOutput(ctx context.Context, cl *sdk.Client, name string, start time.Time) (time.Duration, error) {
	fw := &firstWrite{start: start}
	st, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"echo", "hi"}}, fw, io.Discard)
	if err != nil {
		return 0, fmt.Errorf("exec in %s: %w", name, err)
	}
	if st.ExitCode != 0 || fw.at == 0 {
		return 0, fmt.Errorf("exec in %s: exit %d, no output", name, st.ExitCode)
	}
	return fw.at, nil
}

type stopFigures struct{ stop, start, reboot []time.Duration }

// snapStopStart times stops, starts (to the first exec output) and guest
// reboots (from the reboot to the first exec output of the new boot).
func snapStopStart(ctx context.Context, cl *sdk.Client, n int) (stopFigures, error) {
	const name = "snap-stop"
	if _, err := snapCreate(ctx, cl, name); err != nil {
		return stopFigures{}, err
	}
	defer cl.DeleteSandbox(context.Background(), name)
	return stopStart(ctx, cl, name, "echo b > /proc/sysrq-trigger", n)
}

// stopStart times n stops and starts of a running vm, then n reboots
// from inside it by rebootCmd.
func stopStart(ctx context.Context, cl *sdk.Client, name, rebootCmd string, n int) (stopFigures, error) {
	var f stopFigures
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := cl.StopSandbox(ctx, name); err != nil {
			return f, err
		}
		f.stop = append(f.stop, time.Since(t0))
		t1 := time.Now()
		if _, err := cl.StartSandbox(ctx, name); err != nil {
			return f, err
		}
		d, err := firstOutput(ctx, cl, name, t1)
		if err != nil {
			return f, err
		}
		f.start = append(f.start, d)
	}
	for i := 0; i < n; i++ {
		var boot bytes.Buffer
		if _, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"cat", "/proc/sys/kernel/random/boot_id"}}, &boot, io.Discard); err != nil {
			return f, err
		}
		t0 := time.Now()
		// The exec does not come back: the machine resets under it.
		cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"sh", "-c", rebootCmd}}, io.Discard, io.Discard)
		deadline := t0.Add(2 * time.Minute)
		for {
			var now bytes.Buffer
			fw := &firstWrite{start: t0}
			st, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"cat", "/proc/sys/kernel/random/boot_id"}}, io.MultiWriter(fw, &now), io.Discard)
			if err == nil && st.ExitCode == 0 && now.Len() > 0 && now.String() != boot.String() {
				f.reboot = append(f.reboot, fw.at)
				break
			}
			if time.Now().After(deadline) {
				return f, fmt.Errorf("the vm did not come back from its reboot in 2 minutes (%v)", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return f, nil
}

func snapColdBoots(ctx context.Context, cfg Config, root string, n int) ([]time.Duration, error) {
	return coldBoots(ctx, cfg, root, n, func(name string) api.CreateSandboxRequest {
		return api.CreateSandboxRequest{Name: name, Isolation: api.IsolationVM, CPUs: snapCPUs, Memory: snapMemory}
	})
}

// coldBoots times n creates of req(name) to the first exec output through
// a daemon with template snapshots off (every vm boots).
func coldBoots(ctx context.Context, cfg Config, root string, n int, req func(name string) api.CreateSandboxRequest) ([]time.Duration, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	cl, stop, err := serveVM(ctx, cfg, root, -1, true)
	if err != nil {
		return nil, err
	}
	defer stop()
	var ds []time.Duration
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("cold-%d", i)
		d, err := vmCreateReq(ctx, cl, req(name))
		if err != nil {
			cl.DeleteSandbox(context.Background(), name)
			return nil, err
		}
		ds = append(ds, d)
		if err := cl.DeleteSandbox(ctx, name); err != nil {
			return nil, err
		}
	}
	return ds, nil
}

type pauseFigures struct{ pause, resume, resumeExec, wake []time.Duration }

// snapPauseResume times, on one running vm that has already run commands:
// pause; resume then `echo hi` (from the resume call to the first byte);
// and pause then `echo hi` straight away (the exec wakes it).
func snapPauseResume(ctx context.Context, cl *sdk.Client, n int) (pauseFigures, error) {
	var f pauseFigures
	const name = "snap-pr"
	if _, err := snapCreate(ctx, cl, name); err != nil {
		return f, err
	}
	defer cl.DeleteSandbox(context.Background(), name)
	for i := 0; i < 3; i++ {
		if _, err := firstOutput(ctx, cl, name, time.Now()); err != nil {
			return f, err
		}
	}
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := cl.PauseSandbox(ctx, name); err != nil {
			return f, err
		}
		t1 := time.Now()
		if _, err := cl.ResumeSandbox(ctx, name); err != nil {
			return f, err
		}
		resumed := time.Since(t1)
		d, err := firstOutput(ctx, cl, name, t1)
		if err != nil {
			return f, err
		}
		f.pause, f.resume, f.resumeExec = append(f.pause, t1.Sub(t0)), append(f.resume, resumed), append(f.resumeExec, d)
	}
	for i := 0; i < n; i++ {
		if _, err := cl.PauseSandbox(ctx, name); err != nil {
			return f, err
		}
		d, err := firstOutput(ctx, cl, name, time.Now())
		if err != nil {
			return f, err
		}
		f.wake = append(f.wake, d)
	}
	return f, nil
}

// forkOnes forks src n times (prefix-0, prefix-1, ...), timing each to
// the first exec output in the fork and its fork call, and removes each.
func forkOnes(ctx context.Context, cl *sdk.Client, src, prefix string, n int) (toExec, calls []time.Duration, err error) {
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		t0 := time.Now()
		if _, err := cl.Fork(ctx, src, api.ForkRequest{Name: name}); err != nil {
			return nil, nil, err
		}
		call := time.Since(t0)
		d, err := firstOutput(ctx, cl, name, t0)
		if err != nil {
			return nil, nil, err
		}
		toExec, calls = append(toExec, d), append(calls, call)
		if err := cl.DeleteSandbox(ctx, name); err != nil {
			return nil, nil, err
		}
	}
	return toExec, calls, nil
}

type forkFigures struct {
	one, oneCall []time.Duration
	ten, tenCall time.Duration
}

// snapForks times forks of a running vm (each takes an implicit snapshot
// of it) to the first byte of `echo hi` in the fork, one at a time, then
// a fork --count 10 to the first byte in every one of them.
func snapForks(ctx context.Context, cl *sdk.Client, n int) (forkFigures, error) {
	var f forkFigures
	const src = "snap-src"
	if _, err := snapCreate(ctx, cl, src); err != nil {
		return f, err
	}
	defer cl.DeleteSandbox(context.Background(), src)
	if _, err := cl.Exec(ctx, src, api.ExecRequest{Cmd: []string{"sh", "-c", "echo state > /root/state; sync"}}, io.Discard, io.Discard); err != nil {
		return f, err
	}
	var err error
	if f.one, f.oneCall, err = forkOnes(ctx, cl, src, "snap-fork", n); err != nil {
		return f, err
	}
	t0 := time.Now()
	sbs, err := cl.Fork(ctx, src, api.ForkRequest{Count: 10, Name: "snap-ten"})
	f.tenCall = time.Since(t0)
	defer func() {
		for i := 1; i <= 10; i++ {
			cl.DeleteSandbox(context.Background(), fmt.Sprintf("snap-ten-%d", i))
		}
	}()
	if err != nil {
		return f, err
	}
	err = allAnswer(ctx, cl, sbs, t0)
	f.ten = time.Since(t0)
	if len(sbs) != 10 {
		return f, fmt.Errorf("fork --count 10 made %d sandboxes", len(sbs))
	}
	return f, err
}

type pausedFigures struct {
	count, procs int
	cpu, selfCPU time.Duration
	rss, disk    int64
}

// snapPausedVMs creates n vms, pausing each once it answers, then looks
// at them for 10 s: the QEMU processes of this data dir (there should be
// none), their CPU time and RSS, and the saved state on disk.
func snapPausedVMs(ctx context.Context, cl *sdk.Client, dir string, n int) (pausedFigures, error) {
	var f pausedFigures
	defer func() {
		for i := 0; i < n; i++ {
			cl.DeleteSandbox(context.Background(), fmt.Sprintf("snap-paused-%d", i))
		}
	}()
	for i := 0; i < n; i++ {
		if memAvailable() < 2<<30 {
			return f, fmt.Errorf("host MemAvailable fell below 2 GiB after %d vms", i)
		}
		name := fmt.Sprintf("snap-paused-%d", i)
		if _, err := snapCreate(ctx, cl, name); err != nil {
			return f, err
		}
		if _, err := cl.PauseSandbox(ctx, name); err != nil {
			return f, err
		}
		f.count++
	}
	time.Sleep(time.Second)
	before := qemuProcs(dir)
	cpu0 := procsCPU(before)
	self0 := selfCPU()
	time.Sleep(10 * time.Second)
	after := qemuProcs(dir)
	f.procs = max(len(before), len(after))
	f.cpu = procsCPU(after) - cpu0
	f.selfCPU = selfCPU() - self0
	for _, p := range after {
		f.rss += procRSS(p)
	}
	states, _ := filepath.Glob(filepath.Join(dir, "data", "vms", "*", "paused-*.state"))
	for _, s := range states {
		f.disk += blocks(s)
	}
	return f, nil
}

type chainFigures struct {
	count     int
	disk, mem int64 // the snapshots' own disk layers and memory states
	fullDisk  int64 // what one full copy of the sandbox's disk would take
}

// snapChain writes 10 MB of random data into a vm (synced, so that it is
// on its disk) before each of n snapshots, and adds up what the
// snapshots' own files take on disk.
func snapChain(ctx context.Context, cl *sdk.Client, dir string, n int) (chainFigures, error) {
	var f chainFigures
	const name = "snap-chain"
	if _, err := snapCreate(ctx, cl, name); err != nil {
		return f, err
	}
	defer cl.DeleteSandbox(context.Background(), name)
	for i := 1; i <= n; i++ {
		var stderr strings.Builder
		st, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("head -c 10000000 /dev/urandom > /root/blob-%d && sync", i)}}, io.Discard, &stderr)
		if err != nil || st.ExitCode != 0 {
			return f, fmt.Errorf("write 10 MB: %v %v %s", err, st, stderr.String())
		}
		if _, err := cl.CreateSnapshot(ctx, name, fmt.Sprintf("chain-%d", i)); err != nil {
			return f, err
		}
	}
	sns, err := cl.ListSnapshots(ctx, name)
	if err != nil {
		return f, err
	}
	layers := filepath.Join(dir, "data", "vm-snapshots")
	for _, sn := range sns {
		f.disk += blocks(filepath.Join(layers, sn.ID, "disk.qcow2"))
		f.mem += blocks(filepath.Join(layers, sn.ID, "mem.state"))
		f.count++
	}
	// A full copy: what the guest's root filesystem holds.
	var df strings.Builder
	if _, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"sh", "-c", "df -B1 --output=used / | tail -1"}}, &df, io.Discard); err == nil {
		f.fullDisk, _ = strconv.ParseInt(strings.TrimSpace(df.String()), 10, 64)
	}
	return f, nil
}

// blocks is the disk a file really takes.
func blocks(path string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0
	}
	return st.Blocks * 512
}

// qemuProcs returns the QEMU processes whose command line names a path under dir.
func qemuProcs(dir string) []int {
	var out []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "qemu-system") || !strings.Contains(string(b), dir+"/") {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

const clockTick = 100 // USER_HZ

// procsCPU is the CPU time (user + system) the processes have used.
func procsCPU(pids []int) time.Duration {
	var ticks int64
	for _, pid := range pids {
		ticks += procfs.CPUTicks(pid)
	}
	return time.Duration(ticks) * time.Second / clockTick
}

func procRSS(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return parseKB(l)
		}
	}
	return 0
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
