package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/sdk"
)

// versionTimeout bounds how long `nook version` waits for the daemon.
const versionTimeout = 3 * time.Second

// versions is what `nook version --json` prints.
type versions struct {
	Client string `json:"client"`
	Server string `json:"server,omitempty"`
	// Unreachable says why the daemon's version is missing.
	Unreachable string `json:"unreachable,omitempty"`
}

func versionCmd() *cobra.Command {
	var out output
	c := &cobra.Command{
		Use:   "version",
		Short: "Print the client's version, and the daemon's when it answers",
		Long: `Print this client's version and, when the daemon (NOOK_HOST) answers
within 3s, the daemon's. Without a daemon it prints the client's and why
the daemon's is missing, and succeeds: it needs no daemon (nook --version
prints the client's alone).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := versions{Client: daemon.Version}
			if cl, err := sdk.FromEnv(); err != nil {
				v.Unreachable = err.Error()
			} else {
				ctx, cancel := context.WithTimeout(cmd.Context(), versionTimeout)
				info, err := cl.Info(ctx)
				cancel()
				if err != nil {
					v.Unreachable = err.Error()
				} else {
					v.Server = info.Version
				}
			}
			if out.machine() {
				return out.print(cmd.OutOrStdout(), v, nil)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "client: %s\n", v.Client)
			if v.Server != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "server: %s\n", tsafe(v.Server))
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "server: not reachable (%s)\n", tsafe(v.Unreachable))
			}
			return nil
		},
	}
	addOutput[versions](c, &out, "the versions", false)
	return c
}
