package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/sdk"
)

func snapshotCmd() *cobra.Command {
	var name string
	var asJSON bool
	c := &cobra.Command{
		Use:   "snapshot NAME [--name LABEL]",
		Short: "Snapshot a running or paused sandbox (disk, and memory on vm): it goes on running",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			sn, err := cl.CreateSnapshot(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), sn)
			}
			fmt.Fprintln(cmd.OutOrStdout(), tsafe(sn.Name))
			return nil
		}),
	}
	c.Flags().StringVar(&name, "name", "", "the snapshot's name, unique within the sandbox (default snap-N)")
	c.Flags().BoolVar(&asJSON, "json", false, "print the snapshot as JSON")
	c.AddCommand(&cobra.Command{
		Use:   "rm NAME SNAPSHOT...",
		Short: "Remove snapshots (their files go once no later snapshot or fork uses them)",
		Args:  cobra.MinimumNArgs(2),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			for _, s := range args[1:] {
				if err := cl.DeleteSnapshot(cmd.Context(), args[0], s); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), s)
			}
			return nil
		}),
	})
	return c
}

func snapshotsCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "snapshots NAME",
		Short: "List a sandbox's snapshots as a tree: each under its parent, with its time and size",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			list, err := cl.ListSnapshots(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), list)
			}
			return printSnapshotTree(cmd.OutOrStdout(), list)
		}),
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
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
	return &cobra.Command{
		Use:   "rollback NAME SNAPSHOT",
		Short: "Put a sandbox back to one of its snapshots (files, and on vm running processes); it runs after",
		Args:  cobra.ExactArgs(2),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			if _, err := cl.Rollback(cmd.Context(), args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), args[0])
			return nil
		}),
	}
}

func forkCmd() *cobra.Command {
	var req api.ForkRequest
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
			for _, sb := range sbs {
				fmt.Fprintln(cmd.OutOrStdout(), tsafe(sb.Name))
			}
			return err
		}),
	}
	c.Flags().IntVar(&req.Count, "count", 1, "how many forks (1 to 20)")
	c.Flags().StringVar(&req.Name, "name", "", "the fork's name, or the prefix of NAME-1..N with --count")
	return c
}
