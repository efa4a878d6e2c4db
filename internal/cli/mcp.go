package cli

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/mcpserver"
	"github.com/nookhq/nook/sdk"
)

func mcpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve nook's tools to an agent over MCP (stdio); the daemon also serves them at /mcp",
		Long: "Runs an MCP server on stdin/stdout whose tools create, use and destroy sandboxes through the daemon " +
			"(NOOK_HOST, NOOK_TOKEN). Add it to an agent's MCP configuration as the command `nook mcp`.",
		Args: cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error {
			return mcpserver.New(cl, daemon.Version).Run(cmd.Context(), &mcp.StdioTransport{})
		}),
	}
}
