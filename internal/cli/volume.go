package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/sdk"
)

func volumeCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "volume",
		Short: "Volumes: data that outlives sandboxes, mounted by several at once",
		Long: `A volume is its own filesystem of a fixed size (writes past it fail with
ENOSPC; the host's free space is untouched) that container sandboxes
mount at create (nook create --volume NAME:/path[:ro]), several at once.
It is in no snapshot: a rollback does not rewind it, a fork mounts the
same. It outlives every sandbox until nook volume rm.`,
	}
	var size string
	var createJSON bool
	create := &cobra.Command{
		Use:   "create NAME [--size 10G]",
		Short: "Create a volume",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			v, err := cl.CreateVolume(cmd.Context(), args[0], size)
			if err != nil {
				return err
			}
			if createJSON {
				return printJSON(cmd.OutOrStdout(), v)
			}
			fmt.Fprintln(cmd.OutOrStdout(), tsafe(v.Name))
			return nil
		}),
	}
	create.Flags().StringVar(&size, "size", "", "its size, e.g. 10G (default 10G, at least 64M)")
	create.Flags().BoolVar(&createJSON, "json", false, "print the volume as JSON")
	var lsJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List volumes",
		Args:  cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error {
			vols, err := cl.ListVolumes(cmd.Context())
			if err != nil {
				return err
			}
			if lsJSON {
				return printJSON(cmd.OutOrStdout(), api.VolumeList{Volumes: vols})
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSIZE\tUSED\tCREATED\tMOUNTED BY")
			for _, v := range vols {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", tsafe(v.Name), core.FormatBytes(v.SizeBytes), core.FormatBytes(v.UsedBytes),
					v.CreatedAt.Local().Format(time.RFC3339), tsafe(strings.Join(v.MountedBy, ",")))
			}
			return tw.Flush()
		}),
	}
	ls.Flags().BoolVar(&lsJSON, "json", false, "print the list as JSON")
	var inspectJSON bool
	inspect := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a volume and the sandboxes that mount it",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			v, err := cl.GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if inspectJSON {
				return printJSON(cmd.OutOrStdout(), v)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "name:\t%s\nsize:\t%s\nused:\t%s\ncreated:\t%s\n", tsafe(v.Name), core.FormatBytes(v.SizeBytes),
				core.FormatBytes(v.UsedBytes), v.CreatedAt.Local().Format(time.RFC3339))
			for _, sb := range v.MountedBy {
				fmt.Fprintf(tw, "mounted by:\t%s\n", tsafe(sb))
			}
			return tw.Flush()
		}),
	}
	inspect.Flags().BoolVar(&inspectJSON, "json", false, "print the volume as JSON")
	var force bool
	rm := &cobra.Command{
		Use:   "rm NAME... [--force]",
		Short: "Remove volumes and their files (refused while a sandbox mounts one, unless --force)",
		Args:  cobra.MinimumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			for _, name := range args {
				if err := cl.DeleteVolume(cmd.Context(), name, force); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	rm.Flags().BoolVar(&force, "force", false, "remove it even while sandboxes mount it (they keep what they see until they are removed, and cannot start again once stopped)")
	c.AddCommand(create, ls, inspect, rm)
	return c
}
