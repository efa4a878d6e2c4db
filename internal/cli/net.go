package cli

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/sdk"
)

// serveNetFlags are serve's networking flags; --net-pool is a hidden
// test switch.
type serveNetFlags struct {
	enabled        bool
	pool           string
	upstreams      []string
	conntrackLimit int
	learnedLimit   int
}

func (f *serveNetFlags) add(c *cobra.Command) {
	c.Flags().BoolVar(&f.enabled, "network", true, "give every sandbox its own network with an egress policy (false: loopback only)")
	c.Flags().StringVar(&f.pool, "net-pool", "", "IPv4 prefix sandbox subnets come from (default 10.89.0.0/16)")
	c.Flags().StringArrayVar(&f.upstreams, "dns-upstream", nil, "resolver ADDR:PORT sandboxes' allowed DNS queries go to, repeatable (default: the nameservers of /etc/resolv.conf); the egress name check trusts what it answers")
	c.Flags().IntVar(&f.conntrackLimit, "net-conntrack-limit", 4096, "connections one sandbox may have open (tracked) at once; more are refused")
	c.Flags().IntVar(&f.learnedLimit, "net-learned-limit", 4096, "addresses one sandbox may have learned through DNS at once (an address for some ports counts 2 per port); the least recently learned make room")
	c.Flags().MarkHidden("net-pool")
}

func (f *serveNetFlags) apply(cfg *daemon.NetConfig) error {
	cfg.Enabled = f.enabled
	if f.conntrackLimit < 1 {
		return fmt.Errorf("--net-conntrack-limit %d: want at least 1", f.conntrackLimit)
	}
	if f.learnedLimit < 1 {
		return fmt.Errorf("--net-learned-limit %d: want at least 1", f.learnedLimit)
	}
	cfg.ConntrackLimit, cfg.LearnedLimit = f.conntrackLimit, f.learnedLimit
	if f.pool != "" {
		p, err := netip.ParsePrefix(f.pool)
		if err != nil || !p.Addr().Is4() {
			return fmt.Errorf("--net-pool %q is not an IPv4 prefix such as 10.89.0.0/16", f.pool)
		}
		cfg.Pool = p
	}
	for _, u := range f.upstreams {
		a, err := netip.ParseAddrPort(u)
		if err != nil {
			return fmt.Errorf("--dns-upstream %q is not ADDR:PORT", u)
		}
		cfg.DNSUpstreams = append(cfg.DNSUpstreams, a)
	}
	return nil
}

func netCmd() *cobra.Command {
	var req api.SetNetworkRequest
	var out output
	c := &cobra.Command{
		Use:   "net NAME [--net allowlist|none] [--allow RULE]... [--deny RULE]...",
		Short: "Show a sandbox's network, or replace its egress policy",
		Long: `Show a sandbox's network (address, mode, rules, exposed ports), or, with
--net, --allow or --deny, replace its whole egress policy. The new policy
takes effect at once and is exactly what the flags say: rules not given
again are removed (see the current ones with nook net NAME first).

Rules: a domain (github.com), a wildcard for its subdomains
(*.pythonhosted.org), an IPv4 address or CIDR (192.0.2.0/24), each with
optional ports (example.com:443, 10.0.0.0/8:80,8000-8100), or a preset
(@registries, @internet). Deny rules win over allow rules. The host, other
sandboxes and link-local/metadata addresses are never reachable.

The host checks the name behind every TCP connection to a domain's
addresses (CDNs serve thousands of sites from one address): TLS must name
(SNI), and plain HTTP ask for (Host), an allowed name that resolved to that
address through the sandbox's resolver. TCP that is neither needs a rule
ending in /tcp (db.example.com:5432/tcp, github.com:22/tcp). QUIC to them
is refused, so that clients fall back to TCP. Refusals are in nook net log.`,
		Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			var n *api.Network
			var err error
			f := cmd.Flags()
			if f.Changed("net") || f.Changed("allow") || f.Changed("deny") {
				n, err = cl.SetNetwork(cmd.Context(), args[0], req)
			} else {
				n, err = cl.Network(cmd.Context(), args[0])
			}
			if err != nil {
				return err
			}
			if out.machine() {
				return out.print(cmd.OutOrStdout(), n, nil)
			}
			printNetwork(cmd, n)
			return nil
		}),
	}
	f := c.Flags()
	f.StringVar(&req.Net, "net", "", "network mode: allowlist or none")
	f.StringArrayVar(&req.Allow, "allow", nil, "allow rule (repeatable; replaces every allow rule)")
	f.StringArrayVar(&req.Deny, "deny", nil, "deny rule (repeatable; replaces every deny rule)")
	addOutput[api.Network](c, &out, "the network", false)
	c.AddCommand(netLogCmd())
	return c
}

func printNetwork(cmd *cobra.Command, n *api.Network) {
	tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "mode:\t%s\n", tsafe(n.Mode))
	if n.Address != "" {
		fmt.Fprintf(tw, "address:\t%s\ngateway:\t%s (DNS)\n", tsafe(n.Address), tsafe(n.Gateway))
	}
	for _, r := range n.Allow {
		fmt.Fprintf(tw, "allow:\t%s\n", tsafe(r))
	}
	for _, r := range n.Deny {
		fmt.Fprintf(tw, "deny:\t%s\n", tsafe(r))
	}
	if n.Mode == api.NetAllowlist && len(n.Allow) == 0 {
		fmt.Fprintf(tw, "allow:\t(nothing)\n")
	}
	for _, e := range n.Exposed {
		fmt.Fprintf(tw, "exposed:\t%d -> %s\n", e.Port, tsafe(e.HostAddress))
	}
	tw.Flush()
}

func netLogCmd() *cobra.Command {
	var out output
	c := &cobra.Command{
		Use:   "log NAME",
		Short: "Show what a sandbox was denied: connections and DNS queries, with why",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			l, err := cl.NetLog(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if out.machine() {
				return out.print(cmd.OutOrStdout(), l, nil)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tKIND\tDESTINATION\tREASON\tDETAIL")
			for _, e := range l.Entries {
				detail := e.Detail
				if e.Suppressed > 0 {
					detail = strings.TrimSpace(fmt.Sprintf("%s (%d more not logged)", detail, e.Suppressed))
				}
				// The destination and detail hold what the sandbox sent (a DNS name).
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Time.Local().Format(time.RFC3339), tsafe(e.Kind), tsafe(e.Destination), tsafe(e.Reason), tsafe(detail))
			}
			return tw.Flush()
		}),
	}
	addOutput[api.NetLog](c, &out, "the log", false)
	return c
}

func exposeCmd(expose bool) *cobra.Command {
	use, short := "expose NAME PORT", "Make a sandbox's TCP port reachable from the host; prints the host address, and its preview URL"
	if !expose {
		use, short = "unexpose NAME PORT", "Close an exposed port"
	}
	var auth string
	var out output
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Long: short + `.

With expose, the first line is the host address (HOST:PORT) that forwards TCP
to the port; when the daemon serves preview URLs (nook serve --preview-listen),
the second is the port's URL, http(s)://PORT-NAME.DOMAIN[:PORT]/, routed by
host name to the port (HTTP, WebSocket and server-sent events). With --auth
token (the default) the URL carries a token, valid 24 hours, that the first
visit turns into a cookie; expose the port again for a new one. With --auth
none anyone who reaches the preview listener may open it.`,
		Args: cobra.ExactArgs(2),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return &usageError{errors.New("PORT must be a number, e.g. 8000")}
			}
			if !expose {
				return cl.Unexpose(cmd.Context(), args[0], port)
			}
			if auth != api.PreviewAuthToken && auth != api.PreviewAuthNone {
				return &usageError{fmt.Errorf("--auth %q: give token or none", auth)}
			}
			e, err := cl.ExposePort(cmd.Context(), args[0], api.ExposeRequest{Port: port, Auth: auth})
			if err != nil {
				return err
			}
			return out.print(cmd.OutOrStdout(), e, func(w io.Writer) error {
				fmt.Fprintln(w, tsafe(e.HostAddress))
				if e.URL != "" {
					fmt.Fprintln(w, tsafe(e.URL))
				}
				return nil
			})
		}),
	}
	if expose {
		addOutput[api.ExposedPort](c, &out, "the exposed port", false)
		c.Flags().StringVar(&auth, "auth", api.PreviewAuthToken, "who may open the preview URL: token (the URL's token, then a cookie) or none (anyone who reaches the preview listener)")
	}
	return c
}
