package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nookhq/nook/api"
)

// runDefaultShape measures vm snapshots, pause and fork at the default
// shape (2 vCPUs, 2 GiB): the snapshot call of a running vm, its first and
// later ones, with how long the guest stood still (the vm backend logs it:
// under TCG a clock inside the guest stops with it, so it cannot see the
// stop) and until the snapshot is durable; pause; fork to the first exec
// output in the fork. Baseline: a create of the same shape from its
// template snapshot, in the same run.
func runDefaultShape(ctx context.Context, cfg Config, root string) error {
	out := cfg.Out
	root = filepath.Join(root, "shape")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return err
	}
	stops := &stopLog{}
	c := cfg
	c.logs = stops
	cl, stop, err := serveVM(ctx, c, root, -1, false)
	if err != nil {
		return err
	}
	defer stop()
	req := func(name string) api.CreateSandboxRequest {
		return api.CreateSandboxRequest{Name: name, Isolation: api.IsolationVM, CPUs: defaultCPUs, Memory: defaultMemory}
	}
	if _, err := vmCreateReq(ctx, cl, req("shape-first")); err != nil {
		return err
	}
	cl.DeleteSandbox(ctx, "shape-first")
	const n = 5
	fmt.Fprintf(out, "\nvm at the default shape (%d vCPUs, %s)\n", defaultCPUs, defaultMemory)
	fmt.Fprintf(out, "nook: create -> first exec output, then its first snapshot, %d vms; 10 later snapshots of one vm, 10 MB written before each...\n", n)
	var creates, first, firstStop, later, laterStop []time.Duration
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("shape-%d", i)
		d, err := vmCreateReq(ctx, cl, req(name))
		if err != nil {
			return err
		}
		creates = append(creates, d)
		t0 := time.Now()
		if _, err := cl.CreateSnapshot(ctx, name, "first"); err != nil {
			return err
		}
		first, firstStop = append(first, time.Since(t0)), append(firstStop, stops.last())
		if i < n-1 {
			if err := cl.DeleteSandbox(ctx, name); err != nil {
				return err
			}
		}
	}
	src := fmt.Sprintf("shape-%d", n-1)
	for i := 0; i < 10; i++ {
		if st, err := cl.Exec(ctx, src, api.ExecRequest{Cmd: []string{"sh", "-c", "head -c 10000000 /dev/urandom > /root/blob-$RANDOM"}}, io.Discard, io.Discard); err != nil || st.ExitCode != 0 {
			return fmt.Errorf("write 10 MB: %v %v", err, st)
		}
		t0 := time.Now()
		if _, err := cl.CreateSnapshot(ctx, src, fmt.Sprintf("later-%d", i)); err != nil {
			return err
		}
		later, laterStop = append(later, time.Since(t0)), append(laterStop, stops.last())
	}
	fmt.Fprintf(out, "nook: pause (saved to disk), then resume, %d times; fork -> first exec output in the fork, %d times...\n", n, n)
	var pauses []time.Duration
	for i := 0; i < n; i++ {
		t0 := time.Now()
		if _, err := cl.PauseSandbox(ctx, src); err != nil {
			return err
		}
		pauses = append(pauses, time.Since(t0))
		if _, err := cl.ResumeSandbox(ctx, src); err != nil {
			return err
		}
	}
	forks, _, err := forkOnes(ctx, cl, src, "shape-fork", n)
	if err != nil {
		return err
	}
	if err := cl.DeleteSandbox(ctx, src); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	base := fmt.Sprintf("create -> first exec output\t%s", ms(pct(creates, .5)))
	fmt.Fprintf(tw, "vm, %d vCPUs, %s\tp50\tp99\tbaseline\tbaseline p50\ttarget\n", defaultCPUs, defaultMemory)
	fmt.Fprintf(tw, "first snapshot of a running vm (call; durable when it returns)\t%s\t%s\t%s\tp50 <= 50ms, p99 <= 150ms\n", ms(pct(first, .5)), ms(pct(first, .99)), base)
	fmt.Fprintf(tw, "  guest stopped (longest %s)\t%s\t%s\t-\t-\t-\n", ms(slicesMax(firstStop)), ms(pct(firstStop, .5)), ms(pct(firstStop, .99)))
	fmt.Fprintf(tw, "later snapshots (call; durable when it returns)\t%s\t%s\t%s\tp50 <= 50ms, p99 <= 150ms\n", ms(pct(later, .5)), ms(pct(later, .99)), base)
	fmt.Fprintf(tw, "  guest stopped (longest %s)\t%s\t%s\t-\t-\t-\n", ms(slicesMax(laterStop)), ms(pct(laterStop, .5)), ms(pct(laterStop, .99)))
	fmt.Fprintf(tw, "pause (saved to disk, QEMU exits)\t%s\t%s\t%s\tp50 <= 150ms\n", ms(pct(pauses, .5)), ms(pct(pauses, .99)), base)
	fmt.Fprintf(tw, "fork of a running vm -> first exec output in the fork\t%s\t%s\t%s\tp50 <= 300ms\n", ms(pct(forks, .5)), ms(pct(forks, .99)), base)
	return tw.Flush()
}

func slicesMax(ds []time.Duration) time.Duration {
	var m time.Duration
	for _, d := range ds {
		m = max(m, d)
	}
	return m
}

// stopLog is a slog.Handler that keeps the guest_stopped figures the vm
// backend logs for each live snapshot.
type stopLog struct {
	mu    sync.Mutex
	stops []time.Duration
}

func (l *stopLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *stopLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *stopLog) WithGroup(string) slog.Handler            { return l }
func (l *stopLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "guest_stopped" {
			l.mu.Lock()
			l.stops = append(l.stops, a.Value.Duration())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

// last is the latest guest stop logged (0: none).
func (l *stopLog) last() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.stops) == 0 {
		return 0
	}
	return l.stops[len(l.stops)-1]
}
