package cli

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/listfilter"
	"github.com/nookhq/nook/sdk"
)

func snapshotCmd() *cobra.Command {
	var name string
	var out, rmOut output
	c := &cobra.Command{
		Use:   "snapshot NAME [--name LABEL]",
		Short: "Snapshot a running or paused sandbox (disk, and memory on vm): it goes on running",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			sn, err := cl.CreateSnapshot(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			return out.print(cmd.OutOrStdout(), sn, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, tsafe(sn.Name))
				return err
			})
		}),
	}
	c.Flags().StringVar(&name, "name", "", "the snapshot's name, unique within the sandbox (default snap-N)")
	addOutput[api.Snapshot](c, &out, "the snapshot", false)
	rm := &cobra.Command{
		Use:   "rm NAME SNAPSHOT...",
		Short: "Remove snapshots (their files go once no later snapshot or fork uses them)",
		Args:  cobra.MinimumNArgs(2),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			var done []removed
			var err error
			for _, s := range args[1:] {
				if err = cl.DeleteSnapshot(cmd.Context(), args[0], s); err != nil {
					break
				}
				done = append(done, removed{Name: s})
			}
			return errors.Join(err, printList(cmd.OutOrStdout(), &rmOut, done, done, nil, func(w io.Writer) error {
				for _, r := range done {
					fmt.Fprintln(w, tsafe(r.Name))
				}
				return nil
			}))
		}),
	}
	addOutput[removed](rm, &rmOut, `what it removed (a list of {"name": SNAPSHOT})`, false)
	c.AddCommand(rm)
	return c
}

func snapshotsCmd() *cobra.Command {
	var out output
	var filters []string
	c := &cobra.Command{
		Use:   "snapshots NAME [--filter name=GLOB] [-q | --json | --format TEMPLATE]",
		Short: "List a sandbox's snapshots as a tree: each under its parent, with its time and size",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			filter, _, err := parseFilter(filters, listfilter.NameKeys)
			if err != nil {
				return err
			}
			list, err := cl.ListSnapshots(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			list = slices.DeleteFunc(list, func(s api.Snapshot) bool { return !filter.Name(s.Name) })
			return printList(cmd.OutOrStdout(), &out, list, list, func(s api.Snapshot) string { return s.Name }, func(w io.Writer) error { return printSnapshotTree(w, list) })
		}),
	}
	addFilter(c, &filters, listfilter.NameKeys)
	addOutput[api.Snapshot](c, &out, "the list", true)
	return c
}

// printSnapshotTree prints snapshots under their parents; a snapshot
// whose parent is not in the list (another sandbox's, for a fork, or a
// removed one) is a root.
func printSnapshotTree(w io.Writer, list []api.Snapshot) error {
	if len(list) == 0 {
		fmt.Fprintln(w, "no snapshots")
		return nil
	}
	byID := map[string]bool{}
	children := map[string][]api.Snapshot{}
	for _, s := range list {
		byID[s.ID] = true
	}
	var roots []api.Snapshot
	for _, s := range list {
		if s.Parent != "" && byID[s.Parent] {
			children[s.Parent] = append(children[s.Parent], s)
		} else {
			roots = append(roots, s)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tCREATED\tSIZE\tMEMORY")
	var walk func(s api.Snapshot, depth int)
	walk = func(s api.Snapshot, depth int) {
		label := strings.Repeat("  ", depth) + tsafe(s.Name)
		if depth > 0 {
			label = strings.Repeat("  ", depth-1) + "└ " + tsafe(s.Name)
		}
		mem := "no (disk only)"
		if s.Memory {
			mem = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", label, tsafe(s.ID), s.CreatedAt.Local().Format(time.DateTime), core.FormatBytes(s.SizeBytes), mem)
		for _, c := range children[s.ID] {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	return tw.Flush()
}

func rollbackCmd() *cobra.Command {
	var out output
	c := &cobra.Command{
		Use:   "rollback NAME SNAPSHOT",
		Short: "Put a sandbox back to one of its snapshots (files, and on vm running processes); it runs after",
		Args:  cobra.ExactArgs(2),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			sb, err := cl.Rollback(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			return out.print(cmd.OutOrStdout(), sb, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, tsafe(args[0]))
				return err
			})
		}),
	}
	addOutput[api.Sandbox](c, &out, "the sandbox", false)
	return c
}

func forkCmd() *cobra.Command {
	var req api.ForkRequest
	var out output
	c := &cobra.Command{
		Use:   "fork NAME[:SNAPSHOT] [--count N] [--name PREFIX]",
		Short: "Make new independent sandboxes from a sandbox (a snapshot taken now) or one of its snapshots",
		Long: "Make new sandboxes from a sandbox: from NAME:SNAPSHOT, or from NAME as it is now (an\n" +
			"implicit snapshot is taken). Each fork has its own name, hostname, address and disk layer,\n" +
			"and inherits the limits and network policy. With --count N the forks are PREFIX-1..N\n" +
			"(default PREFIX: NAME-fork); one fork is named PREFIX.",
		Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			name, snap, _ := strings.Cut(args[0], ":")
			req.Snapshot = snap
			sbs, err := cl.Fork(cmd.Context(), name, req)
			return errors.Join(err, printList(cmd.OutOrStdout(), &out, sbs, sbs, nil, func(w io.Writer) error {
				for _, sb := range sbs {
					fmt.Fprintln(w, tsafe(sb.Name))
				}
				return nil
			}))
		}),
	}
	c.Flags().IntVar(&req.Count, "count", 1, "how many forks (1 to 20)")
	c.Flags().StringVar(&req.Name, "name", "", "the fork's name, or the prefix of NAME-1..N with --count")
	addOutput[api.Sandbox](c, &out, "the forks (a list)", false)
	return c
}
