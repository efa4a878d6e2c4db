package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/listfilter"
	"github.com/nookhq/nook/sdk"
)

func secretCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "secret",
		Short: "Secrets that never enter a sandbox: set, list, remove",
		Long: `A secret is stored encrypted by the daemon and never returned. A sandbox
binds it to the hosts it may go to:

  nook secret set GH_TOKEN < token.txt
  nook create --secret GH_TOKEN@api.github.com,github.com --allow github.com --allow api.github.com

The sandbox's $GH_TOKEN holds a placeholder. nook terminates TLS to the bound
hosts with a CA the sandbox trusts and puts the value in place of the
placeholder in the Authorization header (Basic credentials too; another
header with :header=NAME, the query or body only with :query or :body).
The placeholder going anywhere else gets a 403 naming the rule, and is logged
in nook net log; answers from the bound hosts are scrubbed of the value.`,
	}
	var file string
	set := &cobra.Command{
		Use:   "set NAME [--file FILE]",
		Short: "Set a secret's value, read from stdin or a file (never a flag); one trailing newline is dropped",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			var v []byte
			var err error
			if file != "" {
				v, err = os.ReadFile(file)
			} else {
				if f, ok := cmd.InOrStdin().(*os.File); ok && isTerminal(f) {
					fmt.Fprintf(cmd.ErrOrStderr(), "value of %s (then Enter, Ctrl-D): ", args[0])
				}
				v, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), 64<<10+2))
			}
			if err != nil {
				return err
			}
			v = bytes.TrimSuffix(bytes.TrimSuffix(v, []byte("\n")), []byte("\r"))
			if len(v) == 0 {
				return &usageError{fmt.Errorf("secret %s: the value is empty (give it on stdin or with --file)", args[0])}
			}
			return cl.SetSecret(cmd.Context(), args[0], v)
		}),
	}
	set.Flags().StringVar(&file, "file", "", "read the value from this file")

	var out output
	var filters []string
	ls := &cobra.Command{
		Use:   "ls [--filter name=GLOB] [-q | --json | --format TEMPLATE]",
		Short: "List the secrets (names and owners, never values)",
		Args:  cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			filter, _, err := parseFilter(filters, listfilter.NameKeys)
			if err != nil {
				return err
			}
			list, err := cl.ListSecrets(cmd.Context())
			if err != nil {
				return err
			}
			list = slices.DeleteFunc(list, func(s api.Secret) bool { return !filter.Name(s.Name) })
			return printList(cmd.OutOrStdout(), &out, list, list, func(s api.Secret) string { return s.Name }, func(w io.Writer) error {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tOWNER\tUPDATED")
				for _, s := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\n", tsafe(s.Name), tsafe(s.Owner), s.UpdatedAt.Local().Format(time.DateTime))
				}
				return tw.Flush()
			})
		}),
	}
	addFilter(ls, &filters, listfilter.NameKeys)
	addOutput[api.Secret](ls, &out, "the list", true)
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove secrets (requests that would carry them are refused from then on)",
		Args:  cobra.MinimumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			for _, n := range args {
				if err := cl.DeleteSecret(cmd.Context(), n); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	c.AddCommand(set, ls, rm)
	return c
}
