package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/backend/container"
	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/runcbin"
	"github.com/nookhq/nook/sdk"
)

// runCheckpoint measures container pauses to disk (CRIU) through the API:
// pause, and resume -> first exec output, of a sandbox running a
// background process; beside bare `runc checkpoint` and `runc restore`
// of a plain container of the same rootfs, measured in the same run.
func runCheckpoint(ctx context.Context, cfg Config, root, rootfs string) (err error) {
	out := cfg.Out
	if _, ok, why, err := container.CRIUVersion(ctx, container.DefaultCRIU); err != nil || !ok {
		fmt.Fprintf(out, "\ncontainer checkpoints skipped: no usable CRIU at %s (scripts/criu.sh builds it): %s%v\n", container.DefaultCRIU, why, err)
		return nil
	}
	rounds := max(cfg.SnapshotRounds/2, 10)
	fmt.Fprintf(out, "\ncontainer pause to disk (CRIU): bare runc checkpoint/restore %d times (baseline); nook pause, resume -> first exec output %d times...\n", rounds, rounds)
	bareCk, bareRe, err := bareCheckpoint(ctx, root, rootfs, rounds)
	if err != nil {
		return fmt.Errorf("bare runc checkpoint baseline: %w", err)
	}
	c := cfg
	c.containerPause = "checkpoint"
	cl, stop, err := serve(ctx, c, filepath.Join(root, "ckpt"), -1)
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, destroyAll(cl))
		stop()
	}()
	const name = "ckpt"
	if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: name}); err != nil {
		return err
	}
	if _, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"sh", "-c", "sleep 100000 &"}}, io.Discard, io.Discard); err != nil {
		return err
	}
	sb, err := cl.GetSandbox(ctx, name)
	if err != nil {
		return err
	}
	var pause, resume []time.Duration
	var cgroupLeft bool
	var imageBytes int64
	for i := 0; i < rounds; i++ {
		t0 := time.Now()
		if _, err := cl.PauseSandbox(ctx, name); err != nil {
			return err
		}
		pause = append(pause, time.Since(t0))
		if len(cgroups.Dirs("nook-bench", sb.ID)) > 0 {
			cgroupLeft = true
		}
		imageBytes = dirBytes(filepath.Join(root, "ckpt", "data", "sandboxes", sb.ID, "checkpoint"))
		t1 := time.Now()
		if _, err := cl.ResumeSandbox(ctx, name); err != nil {
			return err
		}
		d, err := firstOutput(ctx, cl, name, t1)
		if err != nil {
			return err
		}
		resume = append(resume, d)
	}
	held := "none: no process, no cgroup"
	if cgroupLeft {
		held = "its memory cgroup was still there"
	}
	mem, err := memorySnapshots(ctx, cl, name, rounds)
	if err != nil {
		return fmt.Errorf("memory snapshots: %w", err)
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "metric\tp50\tp99\tbaseline\tbaseline p50\tbaseline p99\tratio p50")
	fmt.Fprintf(tw, "pause to disk (container, CRIU)\t%s\t%s\tbare runc checkpoint\t%s\t%s\t%.2fx\n", ms(pct(pause, .5)), ms(pct(pause, .99)), ms(pct(bareCk, .5)), ms(pct(bareCk, .99)), float64(pct(pause, .5))/float64(pct(bareCk, .5)))
	fmt.Fprintf(tw, "resume from disk -> first exec output\t%s\t%s\tbare runc restore\t%s\t%s\t%.2fx\n", ms(pct(resume, .5)), ms(pct(resume, .99)), ms(pct(bareRe, .5)), ms(pct(bareRe, .99)), float64(pct(resume, .5))/float64(pct(bareRe, .5)))
	fmt.Fprintf(tw, "while paused: RAM held\t%s\t\timages on disk\t%d KiB\t\t\n", held, imageBytes>>10)
	fmt.Fprintf(tw, "snapshot with memory of a running sandbox: call\t%s\t%s\tbare runc checkpoint\t%s\t%s\t%.2fx\n", ms(pct(mem.snaps, .5)), ms(pct(mem.snaps, .99)), ms(pct(bareCk, .5)), ms(pct(bareCk, .99)), float64(pct(mem.snaps, .5))/float64(pct(bareCk, .5)))
	fmt.Fprintf(tw, "  longest stop a clock inside the sandbox saw\t%s\t-\t-\t-\t-\t-\n", ms(mem.stopped))
	fmt.Fprintf(tw, "rollback to it (processes restored) -> first exec output\t%s\t%s\tbare runc restore\t%s\t%s\t%.2fx\n", ms(pct(mem.rollbacks, .5)), ms(pct(mem.rollbacks, .99)), ms(pct(bareRe, .5)), ms(pct(bareRe, .99)), float64(pct(mem.rollbacks, .5))/float64(pct(bareRe, .5)))
	fmt.Fprintf(tw, "fork of it (processes restored) -> first exec output in the fork\t%s\t%s\tbare runc restore\t%s\t%s\t%.2fx\n", ms(pct(mem.forks, .5)), ms(pct(mem.forks, .99)), ms(pct(bareRe, .5)), ms(pct(bareRe, .99)), float64(pct(mem.forks, .5))/float64(pct(bareRe, .5)))
	return tw.Flush()
}

type memoryFigures struct {
	snaps, rollbacks, forks []time.Duration
	stopped                 time.Duration // longest gap of a clock in the sandbox during the snapshots
}

// memorySnapshots times snapshots with memory of running sandbox name (a
// daemon in checkpoint mode), rollbacks to one and forks of one, each to
// first exec output; the rollbacks and forks must bring its background
// clock back.
func memorySnapshots(ctx context.Context, cl *sdk.Client, name string, rounds int) (f memoryFigures, err error) {
	clock, err := cl.Start(ctx, name, api.ExecRequest{Cmd: []string{"sh", "-c", clockLoop}})
	if err != nil {
		return f, err
	}
	start := time.Now()
	for i := 0; i < rounds; i++ {
		t0 := time.Now()
		sn, err := cl.CreateSnapshot(ctx, name, fmt.Sprintf("mem-%d", i))
		if err != nil {
			return f, err
		}
		if !sn.Memory {
			return f, fmt.Errorf("snapshot %s has no memory", sn.Name)
		}
		f.snaps = append(f.snaps, time.Since(t0))
		time.Sleep(20 * time.Millisecond)
	}
	end := time.Now()
	var ticks strings.Builder
	if _, err := cl.Exec(ctx, name, api.ExecRequest{Cmd: []string{"cat", "/dev/shm/ticks"}}, &ticks, io.Discard); err != nil {
		return f, err
	}
	f.stopped = longestGap(ticks.String(), start, end)
	for i := 0; i < rounds; i++ {
		t0 := time.Now()
		if _, err := cl.Rollback(ctx, name, fmt.Sprintf("mem-%d", i)); err != nil {
			return f, err
		}
		d, err := firstOutput(ctx, cl, name, t0)
		if err != nil {
			return f, err
		}
		f.rollbacks = append(f.rollbacks, d)
	}
	if err := clockRuns(ctx, cl, name, clock); err != nil {
		return f, fmt.Errorf("after the rollbacks: %w", err)
	}
	for i := 0; i < rounds; i++ {
		fork := fmt.Sprintf("%s-fork-%d", name, i)
		t0 := time.Now()
		if _, err := cl.Fork(ctx, name, api.ForkRequest{Snapshot: fmt.Sprintf("mem-%d", i), Name: fork}); err != nil {
			return f, err
		}
		d, err := firstOutput(ctx, cl, fork, t0)
		if err != nil {
			return f, err
		}
		f.forks = append(f.forks, d)
		if i == 0 {
			if err := clockRuns(ctx, cl, fork, clock); err != nil {
				return f, fmt.Errorf("in a fork: %w", err)
			}
		}
		if err := cl.DeleteSandbox(ctx, fork); err != nil {
			return f, err
		}
	}
	return f, cl.Signal(ctx, name, clock, "KILL")
}

// clockRuns checks that background process pid of sandbox name runs.
func clockRuns(ctx context.Context, cl *sdk.Client, name string, pid int) error {
	ps, err := cl.Processes(ctx, name)
	if err != nil {
		return err
	}
	for _, p := range ps {
		if p.PID == pid && p.Running {
			return nil
		}
	}
	return fmt.Errorf("background process %d of %s is not running (processes: %+v)", pid, name, ps)
}

// bareCheckpoint times `runc checkpoint` and `runc restore --detach` of a
// plain container (sleep, a read-only copy of the rootfs, its own network
// namespace), n times each.
func bareCheckpoint(ctx context.Context, root, rootfs string, n int) (ck, re []time.Duration, err error) {
	bundle := filepath.Join(root, "bare-ckpt")
	if err := bareBundle(ctx, bundle, rootfs, "/nook-bench-bare/ckpt", "sleep", "100000"); err != nil {
		return nil, nil, err
	}
	runcRoot := filepath.Join(root, "runc-bare-ckpt")
	log := filepath.Join(root, "bare-ckpt.log")
	runc := func(args ...string) error {
		// No stdio: a detached container would hold a pipe open.
		cmd := exec.CommandContext(ctx, runcbin.Find(), append([]string{"--root", runcRoot, "--log", log}, args...)...)
		cmd.Env = runcbin.EnvWithCRIU(filepath.Dir(container.DefaultCRIU))
		if err := cmd.Run(); err != nil {
			msg, _ := os.ReadFile(log)
			return fmt.Errorf("runc %s: %v: %s", strings.Join(args, " "), err, msg)
		}
		return nil
	}
	const id = "bare-ckpt"
	defer func() {
		runc("delete", "--force", id)
		removeCgroups("nook-bench-bare/ckpt", "nook-bench-bare")
	}()
	if err := runc("run", "--detach", "--bundle", bundle, id); err != nil {
		return nil, nil, err
	}
	images := filepath.Join(root, "bare-images")
	for i := 0; i < n; i++ {
		os.RemoveAll(images)
		t0 := time.Now()
		if err := runc("checkpoint", "--image-path", images, "--work-path", filepath.Join(root, "bare-work"), id); err != nil {
			return nil, nil, err
		}
		t1 := time.Now()
		if err := runc("restore", "--detach", "--image-path", images, "--work-path", filepath.Join(root, "bare-work"), "--bundle", bundle, id); err != nil {
			return nil, nil, err
		}
		ck, re = append(ck, t1.Sub(t0)), append(re, time.Since(t1))
	}
	return ck, re, nil
}

// dirBytes is the disk the files of dir use.
func dirBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}
