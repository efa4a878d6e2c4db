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

func volumeCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "volume",
		Short: "Volumes: data that outlives sandboxes, mounted by several at once",
		Long: `A volume is its own filesystem of a fixed size (writes past it fail with
ENOSPC; the host's free space is untouched) that sandboxes, containers
and vms alike, mount at create (nook create --volume NAME:/path[:ro]),
several at once.
It is in no snapshot: a rollback does not rewind it, a fork mounts the
same. It outlives every sandbox until nook volume rm.

In a vm a volume is a FUSE file system the vm's agent serves through the
daemon: every file operation is a round trip to the host, so small-file
work is much slower there than in a container, and a change another
sandbox makes to a file the vm looked at in the last second shows within
that second (a new file, at once). Owners are ids 0 to 65535 in both.`,
	}
	var size string
	var createOut, lsOut, inspectOut output
	var lsFilters []string
	create := &cobra.Command{
		Use:   "create NAME [--size 10G]",
		Short: "Create a volume",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			v, err := cl.CreateVolume(cmd.Context(), args[0], size)
			if err != nil {
				return err
			}
			return createOut.print(cmd.OutOrStdout(), v, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, tsafe(v.Name))
				return err
			})
		}),
	}
	create.Flags().StringVar(&size, "size", "", "its size, e.g. 10G (default 10G, at least 64M)")
	addOutput[api.Volume](create, &createOut, "the volume", false)
	ls := &cobra.Command{
		Use:   "ls [--filter name=GLOB] [-q | --json | --format TEMPLATE]",
		Short: "List volumes",
		Args:  cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error {
			filter, _, err := parseFilter(lsFilters, listfilter.NameKeys)
			if err != nil {
				return err
			}
			vols, err := cl.ListVolumes(cmd.Context())
			if err != nil {
				return err
			}
			vols = slices.DeleteFunc(vols, func(v api.Volume) bool { return !filter.Name(v.Name) })
			return printList(cmd.OutOrStdout(), &lsOut, api.VolumeList{Volumes: vols}, vols, func(v api.Volume) string { return v.Name }, func(w io.Writer) error {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSIZE\tUSED\tCREATED\tMOUNTED BY")
				for _, v := range vols {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", tsafe(v.Name), core.FormatBytes(v.SizeBytes), core.FormatBytes(v.UsedBytes),
						v.CreatedAt.Local().Format(time.RFC3339), tsafe(strings.Join(v.MountedBy, ",")))
				}
				return tw.Flush()
			})
		}),
	}
	addFilter(ls, &lsFilters, listfilter.NameKeys)
	addOutput[api.Volume](ls, &lsOut, "the list", true)
	inspect := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a volume and the sandboxes that mount it",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			v, err := cl.GetVolume(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if inspectOut.machine() {
				return inspectOut.print(cmd.OutOrStdout(), v, nil)
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
	addOutput[api.Volume](inspect, &inspectOut, "the volume", false)
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
	rm.Flags().BoolVar(&force, "force", false, "remove it even while sandboxes mount it (a container keeps what it sees until it is removed, and cannot start again once stopped; a vm keeps it until it is paused, stopped, rolled back or the daemon restarts, and then gets EIO from it)")
	c.AddCommand(create, ls, inspect, rm, volumeCpCmd(), volumeFsCmd())
	return c
}

// volumeCpCmd copies files between this machine and a volume, as nook cp
// does with a sandbox, without any sandbox.
func volumeCpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files between this machine and a volume (one side VOLUME:/path), without a sandbox",
		Long: `Copy files and directory trees between this machine and a volume, as nook cp
does with a sandbox (the same rules for directories, "dir/." and "-"). The
daemon reads and writes the volume itself: paths resolve inside the volume,
and a symlink that leads out of it is refused. Files copied in belong to
root (the root of a sandbox that mounts the volume).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, srcRemote := splitRemote(args[0])
			dst, dstRemote := splitRemote(args[1])
			if srcRemote == dstRemote {
				return &usageError{errors.New("volume cp copies between a volume and this machine: one of SRC and DST is VOLUME:/path, the other a local path")}
			}
			for i, remote := range []bool{srcRemote, dstRemote} {
				if remote {
					if _, err := parseRemote(args[i]); err != nil {
						return err
					}
				}
			}
			cl, err := client()
			if err != nil {
				return err
			}
			if dstRemote {
				return copyIn(cmd, cl.Volume(dst.name), args[0], dst)
			}
			return copyOut(cmd, cl.Volume(src.name), src, args[1])
		},
	}
}

func volumeFsCmd() *cobra.Command {
	c := &cobra.Command{Use: "fs", Short: "Files of a volume, without a sandbox: ls, cat"}
	var recursive bool
	var out output
	var maxEntries int
	ls := &cobra.Command{
		Use:   "ls [-r] [--max N] [-q | --json | --format TEMPLATE] VOLUME:/path",
		Short: "List a directory of a volume (-r: the whole tree)",
		Args:  cobra.ExactArgs(1),
		RunE: withRemote(func(cmd *cobra.Command, cl *sdk.Client, rp remotePath) error {
			l, err := cl.Volume(rp.name).ListFiles(cmd.Context(), rp.path, sdk.ListOptions{Recursive: recursive, MaxEntries: maxEntries})
			if err != nil {
				return err
			}
			return printListing(cmd, l, recursive, &out)
		}),
	}
	ls.Flags().BoolVarP(&recursive, "recursive", "r", false, "list the whole tree")
	ls.Flags().IntVar(&maxEntries, "max", 0, "list at most this many entries (default 100000)")
	addOutput[api.FileInfo](ls, &out, "the listing", true)
	cat := &cobra.Command{
		Use:   "cat VOLUME:/path",
		Short: "Print a file of a volume",
		Args:  cobra.ExactArgs(1),
		RunE: withRemote(func(cmd *cobra.Command, cl *sdk.Client, rp remotePath) error {
			rc, err := cl.Volume(rp.name).ReadFile(cmd.Context(), rp.path)
			if err != nil {
				return err
			}
			defer rc.Close()
			_, err = io.Copy(cmd.OutOrStdout(), rc)
			return err
		}),
	}
	c.AddCommand(ls, cat)
	return c
}
