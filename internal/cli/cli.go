// Package cli is the nook command line. Every command but serve goes
// through the Go SDK: the CLI has no private path to the daemon. Strings
// a sandbox controls (file names, command lines, DNS names, errors that
// quote them) are escaped for the terminal (termsafe) in human output;
// --json and --format output (output.go), file contents and exec output
// are printed as they are.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/cli/termsafe"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/identity"
	"github.com/nookhq/nook/internal/listfilter"
	"github.com/nookhq/nook/internal/runcbin"
	"github.com/nookhq/nook/internal/server"
	"github.com/nookhq/nook/sdk"
)

// exitError carries a process exit code (a command's own, from exec).
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError marks a mistake in how the command was called (exit status 2).
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }

// Main runs the CLI and returns the process exit code: 0, the command's own
// code for exec, 1 for an error, 2 for a usage error.
func Main(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var ue *usageError
	if errors.As(err, &ue) || isCobraUsage(err) {
		fmt.Fprintf(stderr, "nook: %s\n", usageText(err))
		fmt.Fprintln(stderr, "Run 'nook --help' for usage.")
		return 2
	}
	fmt.Fprintf(stderr, "nook: %s\n", errorText(err))
	return 1
}

// usageText is a usage error's message for the terminal: its lines and
// tabs (cobra's "Did you mean this?") are kept, anything else escaped.
func usageText(err error) string {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		fields := strings.Split(l, "\t")
		for j, f := range fields {
			fields[j] = termsafe.String(f)
		}
		lines[i] = strings.Join(fields, "\t")
	}
	return strings.Join(lines, "\n")
}

// errorText is an error's message for the terminal: it may quote what a
// sandbox sent (a file name, an agent's message), so control characters,
// newlines included, are escaped; the errors of an errors.Join each get
// their own line.
func errorText(err error) string {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var lines []string
		for _, e := range j.Unwrap() {
			lines = append(lines, errorText(e))
		}
		return strings.Join(lines, "\n")
	}
	return termsafe.String(err.Error())
}

func isCobraUsage(err error) bool {
	var apiErr *sdk.Error
	var unreachable *sdk.UnreachableError
	if errors.As(err, &apiErr) || errors.As(err, &unreachable) {
		return false // the daemon's answer, not a mistake in the command line
	}
	s := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand", "flag needs an argument", "accepts ", "requires at least", "requires exactly"} {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "nook",
		Short: "nook gives every AI agent a machine of its own",
		Long: `nook gives every AI agent a machine of its own.

Commands other than serve talk to a daemon, which the environment names:
  NOOK_HOST             unix:///run/nook/nook.sock (the default), or
                        https://HOST:PORT for a daemon started with --listen
  NOOK_TOKEN            a token from ` + "`nook token create`" + `, needed over TCP
  NOOK_TLS_FINGERPRINT  sha256:... pins an https daemon's certificate, as
                        ` + "`nook info`" + ` shows it on the host
  NOOK_TLS_CA           FILE: PEM CA certificates to verify an https daemon
                        with (instead of the system's)

nook serve reads its flags from ` + DefaultServeConfig + ` too (or --config FILE).`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &usageError{err} })
	root.Version = daemon.Version // --version, without a daemon
	root.AddCommand(serveCmd(), createCmd(), snapshotCmd(), snapshotsCmd(), rollbackCmd(), forkCmd(), netCmd(), exposeCmd(true), exposeCmd(false), lsCmd(), inspectCmd(), execCmd(), psCmd(), killCmd(), attachCmd(), shellCmd(), mcpCmd(), pauseCmd(true), pauseCmd(false), stopCmd(true), stopCmd(false), ttlCmd(), rmCmd(), templateCmd(), volumeCmd(), infoCmd(), versionCmd(), tokenCmd(), fsCmd(), cpCmd(), identityCmd(), oidcCmd(), secretCmd(), sshCmd(), sshKeyCmd(), sshConfigCmd(), sshKnownHostsCmd())
	root.AddCommand(eventsCmd(), logsCmd())
	root.AddCommand(statsCmd())
	registerCompletions(root) // after every AddCommand
	return root
}

// withClient makes a command's RunE that first gets the SDK client for the
// daemon (NOOK_HOST, NOOK_TOKEN).
func withClient(run func(cmd *cobra.Command, cl *sdk.Client, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		cl, err := client()
		if err != nil {
			return err
		}
		return run(cmd, cl, args)
	}
}

func client() (*sdk.Client, error) {
	c, err := sdk.FromEnv()
	if err != nil {
		return nil, &usageError{err}
	}
	return c, nil
}

// tsafe escapes a string a sandbox (or its agent) may control before it
// is printed for a human (termsafe.String). --json output is printed as
// it is: JSON escapes control characters itself.
func tsafe(s string) string { return termsafe.String(s) }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func serveCmd() *cobra.Command {
	var cfg server.Config
	var debug bool
	var netFlags serveNetFlags
	var idlePause, maxMemory, logFormat string
	var conf serveConfig
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run the nook daemon",
		Long: `Run the nook daemon.

Every flag can also be set in a TOML file, ` + DefaultServeConfig + ` unless
--config names another, by its name: data-dir = "/srv/nook",
max-sandboxes = 1000, idle-pause = "30m", debug = true, and a list for a
repeatable flag, allow-host-mounts = ["/srv/shared"]. A flag given on the
command line wins over the file; a missing ` + DefaultServeConfig + ` is fine.
The file must belong to root, and no other user may write it.
packaging/config.toml in nook's source lists every flag with its help.
--print-config prints the configuration in effect and exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := conf.load(cmd.Flags()); err != nil {
				return err
			}
			minIdle := cfg.Daemon.MinIdlePause
			if minIdle <= 0 {
				minIdle = core.MinIdlePause
			}
			d, err := core.ParseIdlePause(idlePause, minIdle)
			if err != nil {
				return &usageError{fmt.Errorf("--idle-pause: %w", err)}
			}
			cfg.Daemon.IdlePause = d
			if cfg.Daemon.MaxSandboxes < 0 {
				return &usageError{fmt.Errorf("--max-sandboxes %d is not valid: give a count, or 0 for no limit", cfg.Daemon.MaxSandboxes)}
			}
			if maxMemory != "off" {
				if cfg.Daemon.MaxMemory, err = core.ParseSize(maxMemory); err != nil {
					return &usageError{fmt.Errorf("--max-memory: %w", err)}
				}
			}
			level := slog.LevelInfo
			if debug {
				level = slog.LevelDebug
			}
			hopt := &slog.HandlerOptions{Level: level}
			switch logFormat {
			case "text":
				cfg.Daemon.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), hopt))
			case "json":
				cfg.Daemon.Log = slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), hopt))
			default:
				return &usageError{fmt.Errorf("--log-format %q: give text or json", logFormat)}
			}
			if err := netFlags.apply(&cfg.Daemon.Net); err != nil {
				return &usageError{err}
			}
			if conf.print {
				return conf.write(cmd.OutOrStdout(), cmd.Flags())
			}
			return server.Serve(cmd.Context(), cfg)
		},
	}
	c.Flags().StringVar(&cfg.Daemon.DataDir, "data-dir", "/var/lib/nook", "where the database, templates and sandboxes live")
	c.Flags().StringVar(&cfg.Daemon.RunDir, "run-dir", "/run/nook", "runtime state (sockets, runc state)")
	c.Flags().StringVar(&cfg.Socket, "socket", "", "unix socket to serve the API on (default RUN-DIR/nook.sock)")
	c.Flags().StringVar(&cfg.Listen, "listen", "", "also serve the API on this TCP `ADDR` (e.g. 127.0.0.1:7070), over HTTPS; requires tokens (nook token create)")
	c.Flags().StringVar(&cfg.TLSCert, "tls-cert", "", "the TCP listener's TLS certificate, a PEM `FILE` (default: a self-signed one made on first start in DATA-DIR/tls; its fingerprint is logged and shown by nook info, and clients pin it with NOOK_TLS_FINGERPRINT)")
	c.Flags().StringVar(&cfg.TLSKey, "tls-key", "", "the private key of --tls-cert, a PEM `FILE`")
	c.Flags().StringVar(&cfg.E2BListen, "e2b-listen", "", "also serve E2B's API and its sandboxes' envd API on this TCP `ADDR` (e.g. 127.0.0.1:3000), plain HTTP, for programs written for E2B's SDKs: set E2B_API_URL and E2B_SANDBOX_URL to http://ADDR and E2B_API_KEY to a token (nook token create --e2b). Off by default")
	c.Flags().StringVar(&cfg.E2BDomain, "e2b-domain", "", "the `DOMAIN` E2B sandboxes' host names end in: the SDKs' getHost(port) gives PORT-ID.DOMAIN, which --e2b-listen routes to that port in the sandbox (default localhost:PORT of --e2b-listen, which curl and browsers resolve to this host)")
	c.Flags().StringVar(&cfg.SSHListen, "ssh-listen", "", "also serve SSH to every sandbox on this TCP `ADDR` (e.g. :2222): ssh -p PORT NAME@host logs in to sandbox NAME (NAME+USER as another user), with keys added by nook ssh-key add or certificates minted by nook ssh; shells, commands, scp, sftp and -L forwards. Off by default")
	c.Flags().StringVar(&cfg.PreviewListen, "preview-listen", "", "also serve preview URLs on this TCP `ADDR` (e.g. :8080): http://PORT-NAME.DOMAIN:PORT/ reaches port PORT of sandbox NAME once exposed (nook expose, which prints the URL with its token). Off by default")
	c.Flags().StringVar(&cfg.PreviewDomain, "preview-domain", "localhost", "the `DOMAIN` preview host names end in: PORT-NAME.DOMAIN (localhost: browsers and curl resolve *.localhost to this host with no DNS; another domain needs a wildcard DNS record)")
	c.Flags().StringVar(&cfg.PreviewCert, "preview-cert", "", "serve preview URLs over HTTPS with this certificate, a PEM `FILE` (a wildcard for *.DOMAIN)")
	c.Flags().StringVar(&cfg.PreviewKey, "preview-key", "", "the private key of --preview-cert, a PEM `FILE`")
	c.Flags().BoolVar(&cfg.PreviewWake, "preview-wake", true, "a preview request its token (or --auth none) admits wakes a paused sandbox; false: it answers a page saying the sandbox is paused")
	c.Flags().StringSliceVar(&cfg.SSHAcceptEnv, "ssh-accept-env", []string{"LANG", "LC_*"}, "environment variables SSH clients may pass into sandboxes (names, or prefixes ending in *), as sshd's AcceptEnv")
	c.Flags().StringVar(&cfg.Daemon.Identity.Issuer, "issuer", "", "the `URL` of sandboxes' identity tokens (their iss), where relying parties read /.well-known/openid-configuration and the keys: this daemon serves both without a token, and nook oidc export writes them for hosting elsewhere (default "+identity.DefaultIssuer+", which names no host: set it before relying parties trust tokens)")
	c.Flags().StringVar(&cfg.Daemon.Identity.TrustDomain, "identity-trust-domain", "", "the trust `DOMAIN` of identity tokens' subjects, spiffe://DOMAIN/sandbox/ID (default the --issuer's host)")
	c.Flags().DurationVar(&cfg.Daemon.Identity.RotateEvery, "identity-rotate", identity.DefaultRotateEvery, "how long an identity signing key signs before the next (published a whole period ahead) takes over")
	c.Flags().DurationVar(&cfg.Daemon.Identity.MaxTTL, "identity-max-ttl", identity.DefaultMaxTTL, "the longest lifetime of an identity token; retired keys stay published this long")
	c.Flags().BoolVar(&cfg.InsecureHTTP, "insecure-http", false, "serve plain HTTP on --listen instead of HTTPS: tokens cross the network readable. Only behind a TLS-terminating proxy on the same host")
	c.Flags().IntVar(&cfg.MaxConns, "max-conns", server.DefaultMaxConns, "most connections the TCP listener holds open at once; more wait until one closes")
	c.Flags().DurationVar(&cfg.IdleTimeout, "idle-timeout", server.DefaultIdleTimeout, "close API connections idle this long between requests (streams in progress are not idle)")
	c.Flags().StringVar(&cfg.Daemon.AgentBinary, "agent", "", "nook-agent binary (default: beside nook)")
	c.Flags().StringVar(&cfg.Daemon.TemplatesDir, "templates-dir", "", "template store (default DATA-DIR/templates)")
	c.Flags().StringVar(&cfg.Daemon.CgroupParent, "cgroup-parent", "nook", "parent cgroup of sandboxes")
	c.Flags().DurationVar(&cfg.Daemon.ReapInterval, "reap-interval", 5*time.Second, "how often expired sandboxes are looked for")
	c.Flags().IntVar(&cfg.Daemon.WarmPool, "warm-pool", 2, "started sandboxes kept ready per template (and vm shape) in use, at least (negative: none)")
	c.Flags().IntVar(&cfg.Daemon.WarmPoolMax, "warm-pool-max", 16, "how many warm containers a template's pool grows to after bursts of creates (its target: the most creates seen within 2 s in the last minute, at least --warm-pool); vm pools keep --warm-pool, each warm vm holding its RAM")
	c.Flags().StringVar(&cfg.Daemon.Accel, "accel", "", "vm accelerator: kvm or tcg (default: kvm where a stock guest kernel runs under it, else tcg)")
	c.Flags().StringVar(&cfg.Daemon.ContainerPause, "container-pause", "", "what pausing a container does: checkpoint (to disk with CRIU, no RAM held) or freeze (in RAM) (default: checkpoint where CRIU >= 4 is installed)")
	c.Flags().StringVar(&cfg.Daemon.Runc, "runc", "", "runc binary for container sandboxes (default: "+runcbin.DefaultPath+", which make deps builds, else runc in PATH)")
	c.Flags().StringVar(&cfg.Daemon.CRIU, "criu", "", "CRIU >= 4 binary for container checkpoints (default: "+daemon.DefaultCRIU+", else criu in PATH)")
	c.Flags().StringVar(&cfg.Daemon.KernelRoot, "kernel", "", "an unpacked Debian linux-image package for vm guests (default: fetched with apt on first use)")
	c.Flags().StringVar(&cfg.Daemon.VMCacheDir, "vm-cache-dir", "", "guest kernels, vm template images and snapshots (default DATA-DIR/vm)")
	c.Flags().StringArrayVar(&cfg.Daemon.AllowHostMounts, "allow-host-mounts", nil, "a directory of this host under which creates may mount directories (nook create --mount); repeatable; none: no host mounts. A sandbox's root is root there: allow only directories on a nosuid file system, or that no other user of this host can reach")
	c.Flags().IntVar(&cfg.Daemon.MaxSandboxes, "max-sandboxes", 0, "most sandboxes that may exist at once, in any state; creates and forks beyond are refused (HTTP 429) (0: no limit)")
	c.Flags().StringVar(&maxMemory, "max-memory", "0", "most memory the sandboxes holding RAM (running, or paused in RAM) may commit between them, e.g. 64G; a create, fork, start or resume from disk beyond is refused (HTTP 429) (0 or off: no limit)")
	c.Flags().StringVar(&idlePause, "idle-pause", "off", "pause sandboxes created without --idle-pause after this long idle, e.g. 30m (off: never)")
	c.Flags().DurationVar(&cfg.Daemon.MinIdlePause, "min-idle-pause", 0, "the shortest idle pause accepted (tests)")
	c.Flags().MarkHidden("min-idle-pause")
	c.Flags().BoolVar(&debug, "debug", false, "log every API request (with its request id, which every answer carries in X-Request-Id)")
	c.Flags().StringVar(&logFormat, "log-format", "text", "the log's format: text (key=value lines) or json (one object per line)")
	c.Flags().StringVar(&cfg.MetricsListen, "metrics-listen", "", "also serve Prometheus metrics at http://ADDR/metrics on this TCP `ADDR` (e.g. 127.0.0.1:9090): sandboxes by state, operation latencies and errors, warm pools, each sandbox's CPU, memory, disk and network, refused connections and DNS queries. Plain HTTP with no token and nothing else served: it holds no secrets but names every sandbox, so bind it to loopback or a private network. Off by default")
	c.Flags().StringVar(&cfg.DebugSocket, "debug-socket", "", "serve the daemon's Go runtime profiles (net/http/pprof) on this unix socket `PATH`, root only, e.g. curl --unix-socket PATH http://nook/debug/pprof/profile > cpu.pprof")
	netFlags.add(c)
	conf.add(c)
	return c
}

func createCmd() *cobra.Command {
	var req api.CreateSandboxRequest
	var env, labels, sshKeys []string
	var out output
	c := &cobra.Command{
		Use:   "create [--name NAME] [--template T] [--isolation container|vm] [--cpus N] [--memory 2G] [--disk 10G] [--ttl 1h] [--idle-pause 10m] [--on-expire destroy|pause|stop] [--init systemd|agent] [--env K=V]... [--label K=V]... [--net allowlist|none] [--allow RULE]... [--deny RULE]...",
		Short: "Create a sandbox and print its name",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if len(labels) > 0 {
				req.Labels = map[string]string{}
				for _, kv := range labels {
					k, v, ok := strings.Cut(kv, "=")
					if !ok {
						return fmt.Errorf("--label %q: write it as KEY=VALUE", kv)
					}
					req.Labels[k] = v
				}
			}
			if req.Env, err = core.ParseEnvList(env); err != nil {
				return &usageError{err}
			}
			for _, f := range sshKeys {
				key, err := readKeyArg(cmd, f)
				if err != nil {
					return &usageError{fmt.Errorf("--ssh-key: %w", err)}
				}
				req.SSHKeys = append(req.SSHKeys, key)
			}
			cl, err := client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			// Build a missing base template first, with its progress on stderr.
			tpl := req.Template
			if tpl == "" {
				tpl = "base"
			}
			if tl, err := cl.ListTemplates(ctx); err == nil && !hasTemplate(tl, tpl) && canBuild(tl, tpl) {
				fmt.Fprintf(cmd.ErrOrStderr(), "template %s is not built yet; building it now\n", tpl)
				if _, err := cl.BuildTemplate(ctx, tpl, cmd.ErrOrStderr()); err != nil {
					return err
				}
			}
			var sb *api.Sandbox
			if req.Repo != "" {
				// The clone's progress as it comes, on stderr.
				sb, err = cl.CreateSandboxProgress(ctx, req, func(line string) { fmt.Fprintln(cmd.ErrOrStderr(), tsafe(line)) })
			} else {
				sb, err = cl.CreateSandbox(ctx, req)
			}
			if err != nil {
				return err
			}
			if out.machine() {
				return out.print(cmd.OutOrStdout(), sb, nil)
			}
			fmt.Fprintln(cmd.OutOrStdout(), tsafe(sb.Name))
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&req.Name, "name", "", "sandbox name (a DNS label; generated if empty)")
	f.StringVar(&req.Template, "template", "", "template to start from (default base)")
	f.StringVar(&req.Isolation, "isolation", "container", "container or vm")
	f.Float64Var(&req.CPUs, "cpus", 0, "CPU limit, in cores (default 2, at most the host's)")
	f.StringVar(&req.Memory, "memory", "", "memory limit, e.g. 512M or 2G (default 2G)")
	f.StringVar(&req.Disk, "disk", "", "writable disk size, e.g. 20G, beside the template's files (container: at least 64M, default 10G; vm: at least and by default 8G)")
	f.StringArrayVar(&req.Volumes, "volume", nil, "mount a volume, NAME:/path or NAME:/path:ro (nook volume create NAME makes one)")
	f.StringArrayVar(&req.Mounts, "mount", nil, "mount a directory of the daemon's host, /host/dir:/path or /host/dir:/path:ro, under one nook serve --allow-host-mounts allows")
	f.StringVar(&req.TTL, "ttl", "", "time to live, e.g. 90m, 2h, 3d (default 1h; extend with nook ttl)")
	f.StringVar(&req.IdlePause, "idle-pause", "", "pause it after this long without use, e.g. 10m, or off (default: the daemon's --idle-pause); any call wakes it")
	f.StringVar(&req.OnExpire, "on-expire", "", "what the TTL does when it runs out: destroy (default), pause or stop (kept until a new TTL is set)")
	f.StringVar(&req.Init, "init", "", "PID 1: systemd (vm sandboxes whose template has it, e.g. dev: services, timers, journald) or agent (fastest start); default: systemd where the template has it")
	f.StringArrayVar(&env, "env", nil, "environment variable K=V for every process (repeatable)")
	f.StringArrayVar(&req.Secrets, "secret", nil, "bind a secret (nook secret set) to hosts: NAME@HOST[,HOST...][:header=H][:format='Bearer {}'][:path=/p][:methods=GET,POST][:query][:body][:inherit]; the sandbox's $NAME is a placeholder nook replaces only in requests to those hosts (repeatable)")
	f.StringVar(&req.Repo, "repo", "", "clone this https git repository into the sandbox at create (a secret bound to its host is the credential)")
	f.StringVar(&req.Branch, "branch", "", "the branch --repo clones (default: the remote's HEAD)")
	f.StringVar(&req.RepoPath, "path", "", "where --repo clones to (default /workspace)")
	c.Flags().StringArrayVar(&sshKeys, "ssh-key", nil, "an SSH public key `FILE` (e.g. ~/.ssh/id_ed25519.pub, - for stdin) that may log in to the sandbox through nook serve --ssh-listen (repeatable)")
	f.StringVar(&req.IdentityAudience, "identity-audience", "", "keep an identity token for this audience fresh in /run/nook/identity/token (path in NOOK_IDENTITY_TOKEN_FILE), e.g. sts.amazonaws.com for AWS_WEB_IDENTITY_TOKEN_FILE")
	f.StringArrayVar(&labels, "label", nil, "a label K=V kept with the sandbox, shown by inspect, listed by ls --filter label=K=V (repeatable)")
	f.StringVar(&req.Net, "net", "", "network mode: allowlist (default: only what --allow names) or none (nothing leaves the sandbox)")
	f.StringArrayVar(&req.Allow, "allow", nil, "allow egress to a domain, *.wildcard, CIDR or @preset, optionally :PORTS, e.g. github.com:443, @registries; a domain's TCP must be TLS or HTTP naming it, unless the rule ends in /tcp (github.com:22/tcp) (repeatable)")
	f.StringArrayVar(&req.Deny, "deny", nil, "deny egress to a domain, *.wildcard or CIDR, even if allowed (repeatable)")
	addOutput[api.Sandbox](c, &out, "the sandbox", false)
	return c
}

func hasTemplate(tl *api.TemplateList, name string) bool {
	for _, t := range tl.Templates {
		if t.Name == name {
			return true
		}
	}
	return false
}

func canBuild(tl *api.TemplateList, name string) bool {
	for _, r := range tl.Buildable {
		if r.Name == name {
			return true
		}
	}
	return false
}

func until(t time.Time) string {
	d := time.Until(t).Round(time.Second)
	if d <= 0 {
		return "expired"
	}
	if d > 48*time.Hour {
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
	return d.String()
}

func lsCmd() *cobra.Command {
	var out output
	var filters []string
	c := &cobra.Command{
		Use:   "ls [--filter KEY=VALUE]... [-q | --json | --format TEMPLATE]",
		Short: "List sandboxes",
		Long: `List sandboxes, all or those that match every --filter (the daemon filters):
label=K=V (label K is V), label=K (has label K), state=running|paused|stopped|
creating|failed|destroying, template=NAME, isolation=container|vm, name=GLOB
(a value without * ? [ is a prefix). A key given twice matches either value,
except label, which must match each time. Filters can be joined by commas:
--filter label=team=a,state=paused.`,
		Args: cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error {
			_, pairs, err := parseFilter(filters, listfilter.SandboxKeys)
			if err != nil {
				return err
			}
			sbs, err := cl.ListSandboxes(cmd.Context(), pairs...)
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), &out, sbs, sbs, func(sb api.Sandbox) string { return sb.Name }, func(w io.Writer) error {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSTATE\tISOLATION\tTEMPLATE\tCPUS\tMEMORY\tEXPIRES IN")
				for _, sb := range sbs {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%g\t%s\t%s\n", tsafe(sb.Name), tsafe(sb.State), tsafe(sb.Isolation), tsafe(sb.Template), sb.CPUs, core.FormatBytes(sb.MemoryBytes), until(sb.ExpiresAt))
				}
				return tw.Flush()
			})
		}),
	}
	addFilter(c, &filters, listfilter.SandboxKeys)
	addOutput[api.Sandbox](c, &out, "the list", true)
	return c
}

func inspectCmd() *cobra.Command {
	var out output
	c := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			sb, err := cl.GetSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if out.machine() {
				return out.print(cmd.OutOrStdout(), sb, nil)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "name:\t%s\nid:\t%s\nstate:\t%s\n", tsafe(sb.Name), tsafe(sb.ID), tsafe(sb.State))
			if sb.Reason != "" {
				fmt.Fprintf(tw, "reason:\t%s\n", tsafe(sb.Reason))
			}
			if sb.PauseKind != "" {
				fmt.Fprintf(tw, "paused:\t%s\n", tsafe(sb.PauseKind))
			}
			if sb.RebootedAt != nil {
				fmt.Fprintf(tw, "rebooted at:\t%s\n", sb.RebootedAt.Local().Format(time.RFC3339))
			}
			fmt.Fprintf(tw, "isolation:\t%s\ntemplate:\t%s\ncpus:\t%g\nmemory:\t%s\npids limit:\t%d\n", tsafe(sb.Isolation), tsafe(sb.Template), sb.CPUs, core.FormatBytes(sb.MemoryBytes), sb.PidsLimit)
			if sb.DiskBytes > 0 {
				fmt.Fprintf(tw, "disk:\t%s\n", core.FormatBytes(sb.DiskBytes))
			}
			if sb.SnapshotsBytes > 0 {
				fmt.Fprintf(tw, "snapshots:\t%s on disk (nook snapshots %s)\n", core.FormatBytes(sb.SnapshotsBytes), tsafe(sb.Name))
			}
			for _, v := range sb.Volumes {
				ro := ""
				if v.ReadOnly {
					ro = " (read-only)"
				}
				if v.HostPath != "" {
					fmt.Fprintf(tw, "host mount:\t%s at %s%s\n", tsafe(v.HostPath), tsafe(v.Path), ro)
					continue
				}
				fmt.Fprintf(tw, "volume:\t%s at %s%s\n", tsafe(v.Name), tsafe(v.Path), ro)
			}
			if sb.Init != "" {
				fmt.Fprintf(tw, "init:\t%s\n", tsafe(sb.Init))
			}
			if sb.Accelerator != "" {
				kernel := tsafe(sb.GuestKernel)
				if sb.GuestKernelFrom == "template" {
					kernel += " (the template's own)"
				}
				fmt.Fprintf(tw, "accelerator:\t%s\nguest kernel:\t%s\nstarted by:\t%s\n", tsafe(sb.Accelerator), kernel, tsafe(sb.Boot))
			}
			fmt.Fprintf(tw, "created:\t%s\n", sb.CreatedAt.Local().Format(time.RFC3339))
			if sb.Expired {
				fmt.Fprintf(tw, "expired:\t%s (kept, not destroyed: on expire %s; set a new TTL with nook ttl)\n", sb.ExpiresAt.Local().Format(time.RFC3339), tsafe(sb.OnExpire))
			} else {
				fmt.Fprintf(tw, "expires:\t%s (in %s)\n", sb.ExpiresAt.Local().Format(time.RFC3339), until(sb.ExpiresAt))
			}
			idle := sb.IdlePause
			if idle == "" {
				idle = "off"
			}
			fmt.Fprintf(tw, "idle pause:\t%s\non expire:\t%s\n", tsafe(idle), tsafe(sb.OnExpire))
			keys := make([]string, 0, len(sb.Env))
			for k := range sb.Env {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				fmt.Fprintf(tw, "env:\t%s=%s\n", tsafe(k), tsafe(sb.Env[k]))
			}
			return tw.Flush()
		}),
	}
	addOutput[api.Sandbox](c, &out, "the sandbox", false)
	return c
}

func execCmd() *cobra.Command {
	var req api.ExecRequest
	var env []string
	var out output
	c := &cobra.Command{
		Use:   "exec [-d] [-i] [-t] [--env K=V]... [--cwd DIR] [--user U] [--timeout D] NAME -- CMD [ARG...]",
		Short: "Run a command in a sandbox, streaming its output; exits with its code",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 || (len(args) == 2 && args[1] == "--") {
				return &usageError{errors.New("exec needs a sandbox name and a command: nook exec NAME -- CMD [ARG...]")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if req.Env, err = core.ParseEnvList(env); err != nil {
				return &usageError{err}
			}
			if out.machine() && !req.Background {
				return &usageError{errors.New("--json and --format print the process exec -d starts: give -d")}
			}
			// Flags stop at NAME, so "--" (if given) is still in args.
			req.Cmd = args[1:]
			if req.Cmd[0] == "--" {
				req.Cmd = req.Cmd[1:]
			}
			cl, err := client()
			if err != nil {
				return err
			}
			if req.Background {
				pid, err := cl.Start(cmd.Context(), args[0], req)
				if err != nil {
					return err
				}
				return out.print(cmd.OutOrStdout(), api.StartedProcess{PID: pid}, func(w io.Writer) error {
					_, err := fmt.Fprintln(w, pid)
					return err
				})
			}
			if req.Stdin || req.TTY {
				return runInteractive(cmd, cl, args[0], req)
			}
			st, err := cl.Exec(cmd.Context(), args[0], req, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return exitFor(cmd, st, req.Timeout)
		},
	}
	c.Flags().SetInterspersed(false)
	c.Flags().StringArrayVarP(&env, "env", "e", nil, "environment variable K=V (repeatable)")
	c.Flags().StringVarP(&req.Cwd, "cwd", "w", "", "working directory (default: the user's home)")
	c.Flags().StringVarP(&req.User, "user", "u", "", "user (name or uid[:gid]; default root)")
	c.Flags().StringVar(&req.Timeout, "timeout", "", "kill the command after this long, e.g. 30s")
	c.Flags().BoolVarP(&req.Background, "detach", "d", false, "run in the background and print its PID (see nook ps, attach, kill)")
	addOutput[api.StartedProcess](c, &out, "the started process (with -d)", false)
	c.Flags().BoolVarP(&req.Stdin, "interactive", "i", false, "pass standard input to the command")
	c.Flags().BoolVarP(&req.TTY, "tty", "t", false, "run the command on a terminal")
	return c
}

// exitFor turns a command's exit status into the CLI's exit code.
func exitFor(cmd *cobra.Command, st *api.ExitStatus, timeout string) error {
	switch {
	case st.TimedOut:
		fmt.Fprintf(cmd.ErrOrStderr(), "nook: command timed out after %s and was killed\n", timeout)
		return &exitError{124}
	case st.Signal != "":
		fmt.Fprintf(cmd.ErrOrStderr(), "nook: command killed by signal %s\n", tsafe(st.Signal))
		return &exitError{128 + signalNumber(st.Signal)}
	case st.ExitCode != 0:
		return &exitError{st.ExitCode}
	}
	return nil
}

func signalNumber(name string) int {
	if n := unix.SignalNum("SIG" + name); n != 0 {
		return int(n)
	}
	n, _ := strconv.Atoi(name)
	return n
}

func ttlCmd() *cobra.Command {
	var out output
	c := &cobra.Command{
		Use:   "ttl NAME DURATION",
		Short: "Set a sandbox's remaining time to live (e.g. 2h, 3d)",
		Args:  cobra.ExactArgs(2),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			sb, err := cl.SetTTL(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			return out.print(cmd.OutOrStdout(), sb, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "%s expires at %s (in %s)\n", tsafe(sb.Name), sb.ExpiresAt.Local().Format(time.RFC3339), until(sb.ExpiresAt))
				return err
			})
		}),
	}
	addOutput[api.Sandbox](c, &out, "the sandbox", false)
	return c
}

func rmCmd() *cobra.Command {
	var out output
	c := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"destroy"},
		Short:   "Destroy sandboxes and everything they had on the host",
		Args:    cobra.MinimumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			var errs []error
			var done []removed
			for _, name := range args {
				if err := cl.DeleteSandbox(cmd.Context(), name); err != nil {
					errs = append(errs, err)
					continue
				}
				done = append(done, removed{Name: name})
			}
			return errors.Join(append(errs, printList(cmd.OutOrStdout(), &out, done, done, nil, func(w io.Writer) error {
				for _, r := range done {
					fmt.Fprintln(w, tsafe(r.Name))
				}
				return nil
			}))...)
		}),
	}
	addOutput[removed](c, &out, `what it removed (a list of {"name": NAME})`, false)
	return c
}

func templateCmd() *cobra.Command {
	c := &cobra.Command{Use: "template", Short: "Build, list, inspect and remove templates"}
	var req api.BuildTemplateRequest
	var dreq api.DockerfileBuild
	var buildArgs, secretSpecs []string
	var buildOut output
	build := &cobra.Command{
		Use:   "build NAME [--from IMAGE [--pull] | [-f Dockerfile] CONTEXT [--build-arg K=V]... [--target STAGE] [--secret id=ID,src=FILE]... [--allow RULE]...] [--start CMD|none] [--ready port:N|file:PATH|cmd:CMD]",
		Short: "Build (or rebuild) a template: one of nook's (base, dev), or from an image",
		Long: `Build (or rebuild) a template: one of nook's recipes (base, dev), or with
--from an image: a registry reference (python:3.12-slim,
ghcr.io/org/img@sha256:..., with ~/.docker/config.json credentials),
oci:DIR[:TAG] (an OCI layout) or docker-archive:FILE[:REPO:TAG] (docker
save output). A tag resolves to a digest the template records; a rebuild
from the same reference keeps that digest unless --pull. The image's ENV,
WORKDIR and USER are the defaults of every exec in its sandboxes, and its
ENTRYPOINT and CMD (or --start) the service each of them starts when it
comes up (nook ps shows it); with --ready a create returns once the
service is ready. A vm has it running already in its template's
snapshot (started before the sandbox existed: with the image's ENV,
not the sandbox's --env). With CONTEXT (a directory) it builds from a Dockerfile (-f, default
CONTEXT/Dockerfile): FROM an image, a nook template or a stage; RUN in
nook's own sandboxes under the build's network policy (--allow, default
@registries); COPY and ADD from the context (less .dockerignore) or
another stage; RUN --mount=type=cache (kept between builds, with its owners; uid, gid, mode, ro) and
type=secret (--secret; in no layer); ENV, ARG, WORKDIR, USER, SHELL,
ENTRYPOINT, CMD, EXPOSE, LABEL. Each step that makes a layer is cached by content: a rebuild
reruns from the first step that changed.
Progress goes to stderr (on a terminal with a bar for each layer being
pulled); the template's build ID (or with --json the template) to stdout.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			req.Name = args[0]
			if len(args) == 2 || dreq.Dockerfile != "" {
				if req.From != "" || req.Pull {
					return &usageError{errors.New("--from and --pull build from an image; a CONTEXT builds from a Dockerfile: not both")}
				}
				if len(args) < 2 {
					return &usageError{errors.New("-f needs the build CONTEXT directory: nook template build NAME -f Dockerfile DIR")}
				}
				dreq.Start, dreq.Ready = req.Start, req.Ready
				for _, kv := range buildArgs {
					k, v, ok := strings.Cut(kv, "=")
					if !ok || k == "" {
						if v, ok = os.LookupEnv(kv); !ok {
							return &usageError{fmt.Errorf("--build-arg %q is not NAME=VALUE (nor a variable of this environment)", kv)}
						}
						k = kv
					}
					if dreq.BuildArgs == nil {
						dreq.BuildArgs = map[string]string{}
					}
					dreq.BuildArgs[k] = v
				}
				secrets := map[string]string{}
				for _, spec := range secretSpecs {
					id, src := "", ""
					for _, f := range strings.Split(spec, ",") {
						k, v, _ := strings.Cut(f, "=")
						switch k {
						case "id":
							id = v
						case "src", "source":
							src = v
						default:
							return &usageError{fmt.Errorf("--secret %q: use id=ID,src=FILE", spec)}
						}
					}
					if id == "" || src == "" {
						return &usageError{fmt.Errorf("--secret %q: use id=ID,src=FILE", spec)}
					}
					secrets[id] = src
				}
				tarStream, dockerfile, err := contextTar(args[1], dreq.Dockerfile, secrets)
				if err != nil {
					return err
				}
				defer tarStream.Close()
				dreq.Dockerfile = dockerfile
				view := newBuildView(cmd.ErrOrStderr())
				t, err := cl.BuildTemplateDockerfile(cmd.Context(), req.Name, dreq, tarStream, view.event)
				view.finish()
				return printBuilt(cmd, t, err, &buildOut)
			}
			if len(buildArgs) > 0 || dreq.Target != "" || len(dreq.Allow) > 0 || len(secretSpecs) > 0 {
				return &usageError{errors.New("--build-arg, --target, --secret and --allow are for Dockerfile builds: give the build CONTEXT")}
			}
			if (req.Pull || req.Start != "" || req.Ready != "") && req.From == "" {
				return &usageError{errors.New("--pull, --start and --ready need --from IMAGE")}
			}
			view := newBuildView(cmd.ErrOrStderr())
			t, err := cl.BuildTemplateFrom(cmd.Context(), req, view.event)
			view.finish()
			return printBuilt(cmd, t, err, &buildOut)
		}),
	}
	build.Flags().StringVar(&req.From, "from", "", "build from this image (registry reference, oci:DIR[:TAG] or docker-archive:FILE[:REPO:TAG])")
	build.Flags().BoolVar(&req.Pull, "pull", false, "resolve the image's tag again instead of the digest the template recorded")
	build.Flags().StringVar(&req.Start, "start", "", "the service every sandbox of the template starts, a shell command run as the image's user (default the image's ENTRYPOINT and CMD; none: nothing)")
	build.Flags().StringVar(&req.Ready, "ready", "", "what a create waits for once the service started: port:N, file:PATH or cmd:COMMAND (at most 2m)")
	addOutput[api.Template](build, &buildOut, "the template", false)
	build.Flags().StringVarP(&dreq.Dockerfile, "file", "f", "", "the Dockerfile (default CONTEXT/Dockerfile)")
	build.Flags().StringArrayVar(&buildArgs, "build-arg", nil, "an ARG's value, NAME=VALUE (or NAME: its value here)")
	build.Flags().StringVar(&dreq.Target, "target", "", "the stage to build (default the last)")
	build.Flags().StringArrayVar(&secretSpecs, "secret", nil, "a secret RUN --mount=type=secret,id=ID reads: id=ID,src=FILE (kept in no layer)")
	build.Flags().StringArrayVar(&dreq.Allow, "allow", nil, "what RUN steps may reach on the network, as nook create --allow (default @registries)")
	var lsOut, inspectOut, rmOut output
	var lsFilters []string
	ls := &cobra.Command{
		Use:   "ls [--filter name=GLOB] [-q | --json | --format TEMPLATE]",
		Short: "List templates (--format and -q: the built ones)",
		Args:  cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error {
			filter, _, err := parseFilter(lsFilters, listfilter.NameKeys)
			if err != nil {
				return err
			}
			tl, err := cl.ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			tl.Templates = slices.DeleteFunc(tl.Templates, func(t api.Template) bool { return !filter.Name(t.Name) })
			tl.Buildable = slices.DeleteFunc(tl.Buildable, func(r api.TemplateRecipe) bool { return !filter.Name(r.Name) })
			return printList(cmd.OutOrStdout(), &lsOut, tl, tl.Templates, func(t api.Template) string { return t.Name }, func(w io.Writer) error { return printTemplates(w, tl) })
		}),
	}
	addFilter(ls, &lsFilters, listfilter.NameKeys)
	addOutput[api.Template](ls, &lsOut, "the list", true)
	inspect := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a template: its source, digest, layers and image config",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			tl, err := cl.ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			for _, t := range tl.Templates {
				if t.Name != args[0] {
					continue
				}
				return inspectOut.print(cmd.OutOrStdout(), t, func(w io.Writer) error { return printTemplate(w, t) })
			}
			return fmt.Errorf("template %s not found: nook template ls lists them", tsafe(args[0]))
		}),
	}
	addOutput[api.Template](inspect, &inspectOut, "the template", false)
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a template no sandbox uses (its image layers go once no other template uses them)",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			if err := cl.DeleteTemplate(cmd.Context(), args[0]); err != nil {
				return err
			}
			return rmOut.print(cmd.OutOrStdout(), removed{Name: args[0]}, nil)
		}),
	}
	addOutput[removed](rm, &rmOut, `what it removed ({"name": NAME})`, false)
	c.AddCommand(build, ls, inspect, rm)
	return c
}

// printTemplates is template ls's table.
func printTemplates(w io.Writer, tl *api.TemplateList) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tBUILD\tSOURCE\tSIZE\tCREATED\tIN USE BY")
	for _, t := range tl.Templates {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", tsafe(t.Name), tsafe(t.ID), tsafe(templateSource(t)), core.FormatBytes(t.SizeBytes), t.CreatedAt.Local().Format(time.RFC3339), t.InUseBy)
	}
	for _, r := range tl.Buildable {
		if !hasTemplate(tl, r.Name) {
			fmt.Fprintf(tw, "%s\t(not built: nook template build %s)\t\t\t\t\n", tsafe(r.Name), tsafe(r.Name))
		}
	}
	return tw.Flush()
}

// printBuilt prints a built template's build ID (or the template, --json or --format).
func printBuilt(cmd *cobra.Command, t *api.Template, err error, out *output) error {
	if err != nil {
		return err
	}
	return out.print(cmd.OutOrStdout(), t, func(w io.Writer) error {
		_, err := fmt.Fprintln(w, t.ID)
		return err
	})
}

// templateSource says in a few words what a template was built from.
func templateSource(t api.Template) string {
	switch t.Source {
	case "image":
	case "dockerfile":
		return "Dockerfile (" + t.Image + ")"
	default:
		return "recipe"
	}
	d := strings.TrimPrefix(t.Digest, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return t.Image + " (" + d + ")"
}

func printTemplate(w io.Writer, t api.Template) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\nbuild:\t%s\nsource:\t%s\nsize:\t%s\ncreated:\t%s\nin use by:\t%d\n", tsafe(t.Name), tsafe(t.ID), tsafe(t.Source),
		core.FormatBytes(t.SizeBytes), t.CreatedAt.Local().Format(time.RFC3339), t.InUseBy)
	if t.Source == "image" {
		fmt.Fprintf(tw, "image:\t%s\ndigest:\t%s\ncanonical:\t%s\nplatform:\t%s\n", tsafe(t.Image), tsafe(t.Digest), tsafe(t.Canonical), tsafe(t.Platform))
		for i, l := range t.Layers {
			fmt.Fprintf(tw, "layer %d:\t%s (%s)\n", i+1, tsafe(l.Digest), core.FormatBytes(l.Size))
		}
	}
	if c := t.Config; c != nil {
		for _, e := range c.Env {
			fmt.Fprintf(tw, "env:\t%s\n", tsafe(e))
		}
		show := func(k string, v []string) {
			if len(v) > 0 {
				fmt.Fprintf(tw, "%s:\t%s\n", k, tsafe(strings.Join(v, " ")))
			}
		}
		if c.WorkingDir != "" {
			fmt.Fprintf(tw, "workdir:\t%s\n", tsafe(c.WorkingDir))
		}
		if c.User != "" {
			fmt.Fprintf(tw, "user:\t%s\n", tsafe(c.User))
		}
		show("entrypoint", c.Entrypoint)
		show("cmd", c.Cmd)
		show("exposed", c.ExposedPorts)
		keys := make([]string, 0, len(c.Labels))
		for k := range c.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(tw, "label:\t%s=%s\n", tsafe(k), tsafe(c.Labels[k]))
		}
	}
	if svc := t.Service; svc != nil {
		fmt.Fprintf(tw, "service:\t%s\n", tsafe(strings.Join(svc.Cmd, " ")))
		if svc.Ready != "" {
			fmt.Fprintf(tw, "ready:\t%s\n", tsafe(svc.Ready))
		}
	}
	if len(t.Packages) > 0 {
		fmt.Fprintf(tw, "packages:\t%s\n", tsafe(strings.Join(t.Packages, " ")))
	}
	return tw.Flush()
}

func infoCmd() *cobra.Command {
	var out output
	c := &cobra.Command{
		Use:   "info",
		Short: "Show host capabilities: backends, accelerator, versions",
		Args:  cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error {
			info, err := cl.Info(cmd.Context())
			if err != nil {
				return err
			}
			if out.machine() {
				return out.print(cmd.OutOrStdout(), info, nil)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "nook %s (client %s) at %s\nkernel: %s\ncpus: %d  memory: %s\naccelerator: %s\ncontainer pause: %s\ncgroups: %s\ndata dir: %s\nsandboxes: %s\ncommitted memory: %s\nsnapshots: %s on disk\nbackends:\n",
				tsafe(info.Version), daemon.Version, cl.Host(), tsafe(info.Kernel), info.CPUs, core.FormatBytes(info.MemoryBytes), tsafe(info.Accelerator), tsafe(info.ContainerPause), tsafe(info.CgroupMode), tsafe(info.DataDir),
				ofLimit(strconv.Itoa(info.Sandboxes), info.MaxSandboxes > 0, strconv.Itoa(info.MaxSandboxes), "--max-sandboxes"),
				ofLimit(core.FormatBytes(info.CommittedMemoryBytes), info.MaxMemoryBytes > 0, core.FormatBytes(info.MaxMemoryBytes), "--max-memory"),
				core.FormatBytes(info.SnapshotsBytes))
			for _, b := range info.Backends {
				state := "available"
				if !b.Available {
					state = "not available: " + b.Reason
				}
				var vs []string
				for k, v := range b.Versions {
					vs = append(vs, k+" "+v)
				}
				sort.Strings(vs)
				fmt.Fprintf(w, "  %-10s %s\n", tsafe(b.Isolation), tsafe(strings.TrimSpace(state+" "+strings.Join(vs, ", "))))
			}
			if info.TLSFingerprint != "" {
				fmt.Fprintf(w, "tls fingerprint: %s (clients: NOOK_TLS_FINGERPRINT=%s)\n", tsafe(info.TLSFingerprint), tsafe(info.TLSFingerprint))
			}
			if info.SSH != nil {
				fmt.Fprintf(w, "ssh:             %s, host key %s\n                 %s\n", tsafe(info.SSH.Address), tsafe(info.SSH.Fingerprint), tsafe(info.SSH.HostKey))
			}
			if info.Preview != nil {
				fmt.Fprintf(w, "preview urls:    %s\n", tsafe(info.Preview.URL))
			}
			if info.Runc != nil {
				printRunc(w, info.Runc)
			}
			printWarmPools(w, info.WarmPools)
			return nil
		}),
	}
	addOutput[api.Info](c, &out, "the host's information", false)
	return c
}

// printWarmPools prints what each warm pool holds and how creates fared.
func printWarmPools(w io.Writer, pools []api.WarmPool) {
	if len(pools) == 0 {
		return
	}
	fmt.Fprintln(w, "warm pools:")
	for _, p := range pools {
		stopping := ""
		if p.Stopping > 0 {
			stopping = fmt.Sprintf(", %d stopping", p.Stopping)
		}
		fmt.Fprintf(w, "  %-10s %s  ready %d of %d (%d starting%s, min %d, max %d), creates: %d warm, %d cold\n",
			tsafe(p.Isolation), tsafe(p.Key), p.Ready, p.Target, p.Starting, stopping, p.Min, p.Max, p.Hits, p.Misses)
	}
}

// ofLimit shows a use beside its limit: "3 of 10 (--max-sandboxes)", or
// "3 (no --max-sandboxes)".
func ofLimit(use string, limited bool, limit, flag string) string {
	if !limited {
		return use + " (no " + flag + ")"
	}
	return use + " of " + limit + " (" + flag + ")"
}

// printRunc prints the runc in use and the advisories it lacks the fixes for.
func printRunc(w io.Writer, r *api.RuncInfo) {
	fmt.Fprintf(w, "runc: %s", r.Path)
	if r.Version != "" {
		var parts []string
		for _, kv := range [][2]string{{"commit", r.Commit}, {"spec", r.Spec}, {"libseccomp", r.Libseccomp}} {
			if kv[1] != "" {
				parts = append(parts, kv[0]+" "+kv[1])
			}
		}
		fmt.Fprintf(w, " %s (%s)", r.Version, strings.Join(parts, ", "))
	}
	fmt.Fprintln(w)
	if r.Error != "" {
		fmt.Fprintf(w, "  error: %s\n", r.Error)
	}
	open := 0
	for _, a := range r.Advisories {
		if a.Status == api.AdvisoryFixed {
			continue
		}
		open++
		fmt.Fprintf(w, "  %s %s (%s, %s): %s; %s\n", strings.ToUpper(a.Status), a.ID, a.Severity, a.GHSA, a.Summary, a.Why)
	}
	switch {
	case open > 0:
		fmt.Fprintf(w, "  make deps builds a fixed runc into %s (scripts/runc.sh)\n", runcbin.DefaultPath)
	case len(r.Advisories) > 0:
		fmt.Fprintf(w, "  known advisories: none open (%d checked)\n", len(r.Advisories))
	}
}

func tokenCmd() *cobra.Command {
	c := &cobra.Command{Use: "token", Short: "Manage API tokens for the TCP listener (on the host, over the unix socket)"}
	var req api.CreateTokenRequest
	var createOut, lsOut, rmOut output
	var lsFilters []string
	create := &cobra.Command{
		Use:   "create [--name NAME] [--scope admin|read-only|sandbox:NAME] [--ttl 30d|never] [--e2b] [--max-sandboxes N] [--max-cpus N] [--max-memory SIZE] [--max-disk SIZE] [--max-snapshots N] [--max-ttl D]",
		Short: "Create a token and print it (shown only once)",
		Long: `Create a token for the TCP listener and print it (shown only once).

Scopes: admin (default) may do everything but manage tokens; read-only may
list and look (inspect, files, output, watch) but not run or change
anything; sandbox:NAME may use and destroy only that sandbox (not create,
fork, widen its network, expose ports or extend its TTL), and stops working
if the sandbox is destroyed and the name reused. Tokens expire after --ttl
(default 30d); "never" makes one that does not. --e2b makes the secret an
E2B API key (e2b_ and hex), for E2B's SDKs against nook serve --e2b-listen.

Quotas (--max-*) limit what the sandboxes the token creates or forks hold
together, in any state until they are removed: their number, CPUs, memory
and disk (a sandbox made without --disk counts its backend's default
disk), and their snapshots. Volumes (nook volume create) count against no
quota, nor do a Dockerfile build's RUN steps. A create, fork or snapshot
beyond one is refused (HTTP 429, saying what is in use and what is
allowed). --max-ttl caps the time a sandbox of the token's has left
whenever it is set (create, fork, nook ttl, E2B's timeout), whoever sets
it: a longer --ttl is refused, a create without --ttl (or a fork) gets at
most that. It caps each TTL, not the lifetime: the sandbox may be extended
again, by at most that much each time. Quotas follow the token, not its
name; token ls shows each one's use.`,
		Args: cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error {
			t, err := cl.CreateToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			return createOut.print(cmd.OutOrStdout(), t, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, t.Secret)
				return err
			})
		}),
	}
	addOutput[api.Token](create, &createOut, "the token (with its secret)", false)
	create.Flags().StringVar(&req.Name, "name", "", "a label for the token")
	create.Flags().StringVar(&req.Scope, "scope", "admin", "what the token may do: admin, read-only or sandbox:NAME")
	create.Flags().StringVar(&req.TTL, "ttl", "30d", "how long the token works, e.g. 12h, 30d, or never")
	create.Flags().BoolVar(&req.E2B, "e2b", false, "make the secret an E2B API key (e2b_ and hex digits) that E2B's SDKs accept")
	addQuotaFlags(create, &req)
	ls := &cobra.Command{
		Use:   "ls [--filter name=GLOB] [-q | --json | --format TEMPLATE]",
		Short: "List tokens (-q: their IDs)",
		Args:  cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error {
			filter, _, err := parseFilter(lsFilters, listfilter.NameKeys)
			if err != nil {
				return err
			}
			ts, err := cl.ListTokens(cmd.Context())
			if err != nil {
				return err
			}
			ts = slices.DeleteFunc(ts, func(t api.Token) bool { return !filter.Name(t.Name) })
			return printList(cmd.OutOrStdout(), &lsOut, ts, ts, func(t api.Token) string { return t.ID }, func(w io.Writer) error { return printTokens(w, ts) })
		}),
	}
	addFilter(ls, &lsFilters, listfilter.NameKeys)
	addOutput[api.Token](ls, &lsOut, "the list", true)
	rm := &cobra.Command{
		Use:   "rm ID",
		Short: "Revoke a token",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			if err := cl.DeleteToken(cmd.Context(), args[0]); err != nil {
				return err
			}
			return rmOut.print(cmd.OutOrStdout(), removed{ID: args[0]}, nil)
		}),
	}
	addOutput[removed](rm, &rmOut, `what it revoked ({"id": ID})`, false)
	c.AddCommand(create, ls, rm)
	return c
}

// printTokens is token ls's table.
func printTokens(w io.Writer, ts []api.Token) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSCOPE\tCREATED\tEXPIRES\tQUOTAS (USED/ALLOWED)")
	for _, t := range ts {
		exp := "never"
		if t.ExpiresAt != nil {
			exp = t.ExpiresAt.Local().Format(time.RFC3339)
			if !time.Now().Before(*t.ExpiresAt) {
				exp += " (expired)"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", tsafe(t.ID), tsafe(t.Name), tsafe(t.Scope), t.CreatedAt.Local().Format(time.RFC3339), exp, tsafe(quotaSummary(t)))
	}
	return tw.Flush()
}

func stopCmd(stop bool) *cobra.Command {
	if stop {
		return eachCmd("stop NAME...", "Stop sandboxes: their processes end and their memory is freed, their disk is kept; nook start boots them again", (*sdk.Client).StopSandbox)
	}
	return eachCmd("start NAME...", "Start stopped sandboxes: afresh on their disk (a vm boots), with their name, address and policy", (*sdk.Client).StartSandbox)
}

func pauseCmd(pause bool) *cobra.Command {
	if pause {
		return eachCmd("pause NAME...", "Pause sandboxes: their processes stop, nothing is lost; any exec or file call resumes them", (*sdk.Client).PauseSandbox)
	}
	return eachCmd("resume NAME...", "Resume paused sandboxes", (*sdk.Client).ResumeSandbox)
}

// eachCmd is a command that calls op on each sandbox it names, printing
// the name of each it succeeded on (--json, --format: the sandboxes).
func eachCmd(use, short string, op func(*sdk.Client, context.Context, string) (*api.Sandbox, error)) *cobra.Command {
	var out output
	c := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			var errs []error
			var done []api.Sandbox
			for _, name := range args {
				sb, err := op(cl, cmd.Context(), name)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				done = append(done, *sb)
			}
			return errors.Join(append(errs, printList(cmd.OutOrStdout(), &out, done, done, nil, func(w io.Writer) error {
				for _, sb := range done {
					fmt.Fprintln(w, tsafe(sb.Name))
				}
				return nil
			}))...)
		}),
	}
	addOutput[api.Sandbox](c, &out, "the sandboxes (a list)", false)
	return c
}
