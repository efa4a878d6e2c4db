package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/sdk"
)

func statsCmd() *cobra.Command {
	var noStream bool
	var out output
	c := &cobra.Command{
		Use:   "stats [NAME...] [--no-stream] [--json | --format TEMPLATE]",
		Short: "Show what sandboxes use: CPU, memory, disk, network, processes",
		Long: `Show what sandboxes use, like docker stats: CPU (in percent of one CPU,
over the last second), memory and its limit, network bytes received and
sent, disk in use and its size, and processes. Without NAME, every
sandbox (those a sandbox token may see: its own).

On a terminal the table is redrawn every second until Ctrl-C (a sandbox
followed by name stops the command when it is destroyed). With
--no-stream, --json, --format, or when the output is not a terminal, one
sample is printed and the command exits (it takes a second: CPU is
measured over it). --json prints the sample as a JSON list (GET
/v1/stats), --format each sandbox's line.

A vm's CPU and memory are its QEMU's on the host, its disk its top disk
layer on the host, and its guest's processes are not counted (0).`,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, names []string) error {
			ctx := cmd.Context()
			w := cmd.OutOrStdout()
			f, isFile := w.(*os.File)
			stream := !noStream && !out.json && out.format == "" && isFile && isTerminal(f)
			if !stream {
				sample, err := statsOnce(ctx, cl, names)
				if err != nil {
					return err
				}
				return printList(w, &out, sample, sample, func(s api.SandboxStats) string { return s.Name }, func(w io.Writer) error {
					return printStats(w, sample)
				})
			}
			name := ""
			if len(names) == 1 {
				name = names[0]
			}
			for _, n := range names {
				if _, err := cl.GetSandbox(ctx, n); err != nil {
					return err
				}
			}
			err := cl.StreamStats(ctx, name, func(sample []api.SandboxStats) error {
				if len(names) > 1 {
					sample = slices.DeleteFunc(sample, func(s api.SandboxStats) bool { return !slices.Contains(names, s.Name) })
				}
				// Home, clear the screen, then the table.
				fmt.Fprint(w, "\x1b[H\x1b[2J")
				return printStats(w, sample)
			})
			if ctx.Err() != nil {
				return nil
			}
			if name != "" && errors.Is(err, sdk.ErrStatsEnded) {
				return fmt.Errorf("sandbox %s is gone", name)
			}
			return err
		}),
	}
	c.Flags().BoolVar(&noStream, "no-stream", false, "print one sample and exit (the default when the output is not a terminal)")
	addOutput[api.SandboxStats](c, &out, "one sample (a list), and exit", false)
	return c
}

// statsOnce reads one sample of the named sandboxes (every sandbox if
// none), in the order named.
func statsOnce(ctx context.Context, cl *sdk.Client, names []string) ([]api.SandboxStats, error) {
	if len(names) == 0 {
		return cl.AllStats(ctx)
	}
	out := make([]api.SandboxStats, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Go(func() {
			st, err := cl.SandboxStats(ctx, n)
			if err == nil {
				out[i] = *st
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func printStats(w io.Writer, sample []api.SandboxStats) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATE\tCPU %\tMEM USAGE / LIMIT\tMEM %\tNET I/O (RX / TX)\tDISK USAGE / SIZE\tPIDS")
	for _, s := range sample {
		memPct := 0.0
		if s.MemoryLimitBytes > 0 {
			memPct = 100 * float64(s.MemoryBytes) / float64(s.MemoryLimitBytes)
		}
		disk := core.FormatBytes(s.DiskBytes)
		if s.DiskLimitBytes > 0 {
			disk += " / " + core.FormatBytes(s.DiskLimitBytes)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f%%\t%s / %s\t%.2f%%\t%s / %s\t%s\t%d\n", tsafe(s.Name), tsafe(s.State), s.CPUPercent,
			core.FormatBytes(s.MemoryBytes), core.FormatBytes(s.MemoryLimitBytes), memPct,
			core.FormatBytes(s.NetRxBytes), core.FormatBytes(s.NetTxBytes), disk, s.Pids)
	}
	return tw.Flush()
}
