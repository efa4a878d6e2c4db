package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// runContainerSnapshots measures container snapshots (disk only: the daemon
// runs with --container-pause freeze; memory snapshots are in ckpt.go; see
// internal/backend/container/snapshots.go), rollbacks and forks through
// the SDK against an in-process daemon, beside bare `runc run` and a
// plain create measured in the same run. rootfs is the template's, for
// what a full copy of the disk would take.
func runContainerSnapshots(ctx context.Context, cfg Config, root, rootfs string, bare []time.Duration) (err error) {
	out := cfg.Out
	chain := cfg.SnapshotChain
	if chain <= 0 {
		chain = 20
	}
	rounds := max(cfg.SnapshotRounds/2, 10)
	cl, stop, err := serve(ctx, cfg, filepath.Join(root, "ctrsnap"), -1)
	if err != nil {
		return err
	}
	defer func() {
		err = errors.Join(err, destroyAll(cl))
		stop()
	}()
	fmt.Fprintf(out, "\ncontainer snapshots: create -> first exec output %d times (baseline); a chain of %d snapshots, 10 MB written before each; %d rollbacks, %d forks -> first exec output; fork --count 10...\n", rounds, chain, rounds, rounds)
	var creates []time.Duration
	for i := 0; i < rounds; i++ {
		name := fmt.Sprintf("ctr-create-%d", i)
		t0 := time.Now()
		if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: name}); err != nil {
			return err
		}
		d, err := firstOutput(ctx, cl, name, t0)
		if err != nil {
			return err
		}
		creates = append(creates, d)
		if err := cl.DeleteSandbox(ctx, name); err != nil {
			return err
		}
	}

	const src = "ctr-snap"
	if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: src}); err != nil {
		return err
	}
	// A clock inside the sandbox, on its tmpfs (so not in any snapshot):
	// its longest gap is how long a snapshot stopped the sandbox.
	clock, err := cl.Start(ctx, src, api.ExecRequest{Cmd: []string{"sh", "-c", clockLoop}})
	if err != nil {
		return err
	}
	var snaps []time.Duration
	for i := 1; i <= chain; i++ {
		var stderr strings.Builder
		st, err := cl.Exec(ctx, src, api.ExecRequest{Cmd: []string{"sh", "-c", fmt.Sprintf("head -c 10000000 /dev/urandom > /root/blob-%d", i)}}, io.Discard, &stderr)
		if err != nil || st.ExitCode != 0 {
			return fmt.Errorf("write 10 MB: %v %v %s", err, st, stderr.String())
		}
		t0 := time.Now()
		if _, err := cl.CreateSnapshot(ctx, src, fmt.Sprintf("chain-%d", i)); err != nil {
			return err
		}
		snaps = append(snaps, time.Since(t0))
	}
	list, err := cl.ListSnapshots(ctx, src)
	if err != nil {
		return err
	}
	var chainDisk int64
	for _, sn := range list {
		chainDisk += sn.SizeBytes
	}

	// A big change made a while before a snapshot: the running copy takes
	// it, and the freeze only checks it.
	if st, err := cl.Exec(ctx, src, api.ExecRequest{Cmd: []string{"sh", "-c", "head -c 300000000 /dev/urandom > /root/bulk && sleep 0.2"}}, io.Discard, io.Discard); err != nil || st.ExitCode != 0 {
		return fmt.Errorf("write 300 MB: %v %v", err, st)
	}
	bulkStart := time.Now()
	if _, err := cl.CreateSnapshot(ctx, src, "bulk"); err != nil {
		return err
	}
	bulkEnd := time.Now()
	var ticks strings.Builder
	if err := cl.Signal(ctx, src, clock, "KILL"); err != nil {
		return err
	}
	if _, err := cl.Exec(ctx, src, api.ExecRequest{Cmd: []string{"cat", "/dev/shm/ticks"}}, &ticks, io.Discard); err != nil {
		return err
	}
	stopped := longestGap(ticks.String(), time.Time{}, bulkStart)
	bulkStopped := longestGap(ticks.String(), bulkStart, bulkEnd)
	var rollbacks, forks, forkCalls []time.Duration
	for i := 0; i < rounds; i++ {
		t0 := time.Now()
		if _, err := cl.Rollback(ctx, src, fmt.Sprintf("chain-%d", chain-i%chain)); err != nil {
			return err
		}
		d, err := firstOutput(ctx, cl, src, t0)
		if err != nil {
			return err
		}
		rollbacks = append(rollbacks, d)
	}
	for i := 0; i < rounds; i++ {
		name := fmt.Sprintf("ctr-fork-%d", i)
		t0 := time.Now()
		if _, err := cl.Fork(ctx, src, api.ForkRequest{Name: name}); err != nil {
			return err
		}
		forkCalls = append(forkCalls, time.Since(t0))
		d, err := firstOutput(ctx, cl, name, t0)
		if err != nil {
			return err
		}
		forks = append(forks, d)
		if err := cl.DeleteSandbox(ctx, name); err != nil {
			return err
		}
	}
	t0 := time.Now()
	sbs, err := cl.Fork(ctx, src, api.ForkRequest{Snapshot: "chain-1", Count: 10, Name: "ctr-ten"})
	if err != nil {
		return err
	}
	if err := allAnswer(ctx, cl, sbs, t0); err != nil {
		return err
	}
	ten := time.Since(t0)

	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	base := fmt.Sprintf("bare runc run -> first output\t%s", ms(pct(bare, .5)))
	fmt.Fprintln(tw, "container snapshots (disk only)\tp50\tp99\tbaseline\tbaseline p50")
	fmt.Fprintf(tw, "create (no pool) -> first exec output\t%s\t%s\t%s\n", ms(pct(creates, .5)), ms(pct(creates, .99)), base)
	fmt.Fprintf(tw, "snapshot of a running sandbox, 10 MB changed\t%s\t%s\t%s\n", ms(pct(snaps, .5)), ms(pct(snaps, .99)), base)
	fmt.Fprintf(tw, "  longest stop a clock inside the sandbox saw over the %d snapshots\t%s\t-\t-\t-\n", chain, ms(stopped))
	fmt.Fprintf(tw, "snapshot, 300 MB written 200 ms before: call\t%s\t-\t-\t-\n", ms(bulkEnd.Sub(bulkStart)))
	fmt.Fprintf(tw, "  longest stop a clock inside the sandbox saw\t%s\t-\t-\t-\n", ms(bulkStopped))
	fmt.Fprintf(tw, "rollback -> first exec output\t%s\t%s\t%s\n", ms(pct(rollbacks, .5)), ms(pct(rollbacks, .99)), base)
	fmt.Fprintf(tw, "fork of a running sandbox -> first exec output in the fork\t%s\t%s\t%s\n", ms(pct(forks, .5)), ms(pct(forks, .99)), base)
	fmt.Fprintf(tw, "  of which the fork call\t%s\t%s\t-\t-\n", ms(pct(forkCalls, .5)), ms(pct(forkCalls, .99)))
	fmt.Fprintf(tw, "fork --count 10 -> first exec output in all 10 (total)\t%s\t-\t%s\n", ms(ten), base)
	if err := tw.Flush(); err != nil {
		return err
	}
	full := treeBlocks(rootfs)
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "container snapshot chain\tlayers on disk\texpected\t%d full copies of the disk\n", len(list))
	fmt.Fprintf(tw, "%d snapshots, 10 MB changed between each\t%d MiB\tabout %d MB plus metadata\t%d MiB\n", len(list), chainDisk>>20, 10*len(list), int64(len(list))*full>>20)
	return tw.Flush()
}

// allAnswer waits for the first exec output of every sandbox, in parallel.
func allAnswer(ctx context.Context, cl *sdk.Client, sbs []api.Sandbox, start time.Time) error {
	var wg sync.WaitGroup
	errs := make([]error, len(sbs))
	for i, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = firstOutput(ctx, cl, sb.Name, start)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// treeBlocks is the disk a directory tree's files take.
func treeBlocks(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// destroyAll destroys every sandbox the daemon has.
func destroyAll(cl *sdk.Client) error {
	sbs, err := cl.ListSandboxes(context.Background())
	if err != nil {
		return err
	}
	var errs []error
	for _, sb := range sbs {
		if err := cl.DeleteSandbox(context.Background(), sb.Name); err != nil {
			errs = append(errs, fmt.Errorf("destroy %s: %w", sb.Name, err))
		}
	}
	return errors.Join(errs...)
}

// clockLoop writes a nanosecond clock every 2 ms to the sandbox's tmpfs
// (so into no snapshot); longestGap reads how long the sandbox stood still.
const clockLoop = "while :; do date +%s%N; sleep 0.002; done > /dev/shm/ticks"

// longestGap is the longest time between two lines of nanosecond clock
// readings (the sandbox shares the host's clock) that ends between from
// and to (zero: unbounded).
func longestGap(ticks string, from, to time.Time) time.Duration {
	var longest time.Duration
	var last int64
	for _, l := range strings.Fields(ticks) {
		n, err := strconv.ParseInt(l, 10, 64)
		if err != nil {
			continue
		}
		if at := time.Unix(0, n); !from.IsZero() && at.Before(from) || !to.IsZero() && at.After(to) {
			last = n
			continue
		}
		if last != 0 && time.Duration(n-last) > longest {
			longest = time.Duration(n - last)
		}
		last = n
	}
	return longest
}
