package cli

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// sshHostKeyAlias is the name ssh checks the daemon's host key under, in
// the blocks nook ssh-config prints and the known hosts nook ssh writes:
// one name however the endpoint is reached.
const sshHostKeyAlias = "nook-ssh"

// readKeyArg reads an SSH public key from a file, or stdin for "-".
func readKeyArg(cmd *cobra.Command, path string) (string, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), 64<<10))
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// sandboxAndArg reads [NAME] ARG: a sandbox ("" without) and the argument.
func sandboxAndArg(args []string) (name, arg string) {
	if len(args) == 2 {
		return args[0], args[1]
	}
	return "", args[0]
}

func sshKeyCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "ssh-key",
		Short: "Manage the SSH public keys that log in to sandboxes (nook serve --ssh-listen)",
		Long: `SSH public keys that log in to sandboxes through the daemon's SSH endpoint
(ssh -p PORT NAME@HOST, or NAME+USER@HOST as another user of the sandbox).

A key added for a sandbox logs in to that sandbox; a key added without one logs
in to every sandbox your token may run commands in (an admin token's: all of
them), for as long as that token is valid. Keys of a sandbox go with it.`,
	}
	var addOut output
	add := &cobra.Command{
		Use:   "add [NAME] FILE",
		Short: "Add a public key (FILE, e.g. ~/.ssh/id_ed25519.pub, or - for stdin) for sandbox NAME, or for every sandbox your token reaches",
		Args:  cobra.RangeArgs(1, 2),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			name, file := sandboxAndArg(args)
			key, err := readKeyArg(cmd, file)
			if err != nil {
				return &usageError{err}
			}
			k, err := cl.AddSSHKey(cmd.Context(), name, key)
			if err != nil {
				return err
			}
			return addOut.print(cmd.OutOrStdout(), k, func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "%s %s\n", k.ID, k.Fingerprint)
				return err
			})
		}),
	}
	addOutput[api.SSHKey](add, &addOut, "the key", false)
	var out output
	ls := &cobra.Command{
		Use:   "ls [NAME]",
		Short: "List sandbox NAME's keys, or your token's own",
		Args:  cobra.MaximumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			keys, err := cl.SSHKeys(cmd.Context(), name)
			if err != nil {
				return err
			}
			if out.machine() || out.quiet {
				return printList(cmd.OutOrStdout(), &out, keys, keys, func(k api.SSHKey) string { return k.ID }, nil)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tFINGERPRINT\tCOMMENT\tOWNER\tADDED")
			for _, k := range keys {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Fingerprint, tsafe(k.Comment), tsafe(k.Owner), k.CreatedAt.Local().Format("2006-01-02 15:04"))
			}
			return tw.Flush()
		}),
	}
	addOutput[api.SSHKey](ls, &out, "the list", true)
	rm := &cobra.Command{
		Use:   "rm [NAME] ID",
		Short: "Remove a key of sandbox NAME, or one of your token's own",
		Args:  cobra.RangeArgs(1, 2),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			name, id := sandboxAndArg(args)
			return cl.RemoveSSHKey(cmd.Context(), name, id)
		}),
	}
	c.AddCommand(add, ls, rm)
	return c
}

// sshEndpoint is where this client reaches the daemon's SSH endpoint: the
// host of NOOK_HOST for a daemon reached over TCP, else this host; the
// port it listens on.
func sshEndpoint(info *api.Info) (host, port string, err error) {
	if info.SSH == nil || info.SSH.Address == "" {
		return "", "", errors.New("the daemon runs no SSH endpoint: start it with nook serve --ssh-listen ADDR (e.g. :2222)")
	}
	h, port, err := net.SplitHostPort(info.SSH.Address)
	if err != nil {
		return "", "", fmt.Errorf("the daemon's SSH address %q: %w", info.SSH.Address, err)
	}
	host = h
	if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	if u, err := url.Parse(os.Getenv("NOOK_HOST")); err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Hostname() != "" {
		if ip := net.ParseIP(h); h == "" || (ip != nil && ip.IsUnspecified()) {
			host = u.Hostname()
		}
	}
	return host, port, nil
}

func sshCmd() *cobra.Command {
	var user, ttl string
	c := &cobra.Command{
		Use:   "ssh NAME [-- SSH-ARGS...]",
		Short: "Log in to a sandbox with the ssh client, over the daemon's SSH endpoint, with a certificate made for this login",
		Long: `Log in to a sandbox with OpenSSH's ssh, through the daemon's SSH endpoint
(nook serve --ssh-listen). nook makes a key for this login, has the daemon's SSH
CA certify it for this sandbox only (valid --ttl), pins the daemon's host key,
and runs ssh; what follows -- goes to ssh (a command to run, -L forwards, ...).

  nook ssh task                        a shell
  nook ssh task -- uname -a            a command
  nook ssh task -- -L 8000:localhost:8000 -N
  nook ssh --user dev task             as the sandbox's user dev`,
		Args: cobra.MinimumNArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			name, extra := args[0], args[1:]
			info, err := cl.Info(cmd.Context())
			if err != nil {
				return err
			}
			host, port, err := sshEndpoint(info)
			if err != nil {
				return err
			}
			dir, err := os.MkdirTemp("", "nook-ssh-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			pub, priv, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				return err
			}
			spub, err := ssh.NewPublicKey(pub)
			if err != nil {
				return err
			}
			cert, err := cl.SSHCert(cmd.Context(), name, api.SSHCertRequest{PublicKey: string(ssh.MarshalAuthorizedKey(spub)), User: user, TTL: ttl})
			if err != nil {
				return err
			}
			block, err := ssh.MarshalPrivateKey(priv, "nook ssh "+name)
			if err != nil {
				return err
			}
			keyFile, certFile, known := filepath.Join(dir, "id"), filepath.Join(dir, "id-cert.pub"), filepath.Join(dir, "known_hosts")
			if err := os.WriteFile(keyFile, pem.EncodeToMemory(block), 0o600); err != nil {
				return err
			}
			if err := os.WriteFile(certFile, []byte(cert.Certificate+"\n"), 0o600); err != nil {
				return err
			}
			if err := os.WriteFile(known, []byte(sshHostKeyAlias+" "+cert.SSH.HostKey+"\n"), 0o600); err != nil {
				return err
			}
			sshArgs := []string{
				"-i", keyFile, "-o", "CertificateFile=" + certFile, "-o", "IdentitiesOnly=yes",
				"-o", "UserKnownHostsFile=" + known, "-o", "GlobalKnownHostsFile=/dev/null",
				"-o", "HostKeyAlias=" + sshHostKeyAlias, "-o", "StrictHostKeyChecking=yes",
				"-o", "UpdateHostKeys=no", "-p", port, cert.Login + "@" + host,
			}
			ssh := exec.CommandContext(cmd.Context(), "ssh", append(sshArgs, extra...)...)
			ssh.Stdin, ssh.Stdout, ssh.Stderr = cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr()
			if err := ssh.Run(); err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					return &exitError{code: ee.ExitCode()}
				}
				if errors.Is(err, exec.ErrNotFound) {
					return errors.New("nook ssh runs OpenSSH's ssh, which is not installed (apt-get install openssh-client)")
				}
				return err
			}
			return nil
		}),
	}
	c.Flags().StringVar(&user, "user", "", "log in as this user of the sandbox (default: its default user)")
	c.Flags().StringVar(&ttl, "ttl", "", "how long the login's certificate is valid (default 10m; a session outlives it)")
	return c
}

func sshConfigCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "ssh-config [NAME...]",
		Short: "Print ~/.ssh/config blocks for sandboxes (all of them without NAME), for ssh, scp, VS Code and JetBrains",
		Long: `Print a ~/.ssh/config block per sandbox: Host nook-NAME reaches sandbox NAME
through the daemon's SSH endpoint with your own keys (add them with nook ssh-key
add). The daemon's host key is checked by KnownHostsCommand, which runs this
nook: it must reach the daemon as you (NOOK_HOST, NOOK_TOKEN) when ssh runs.

  nook ssh-config >> ~/.ssh/config && ssh nook-task`,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			info, err := cl.Info(cmd.Context())
			if err != nil {
				return err
			}
			host, port, err := sshEndpoint(info)
			if err != nil {
				return err
			}
			names := args
			if len(names) == 0 {
				sbs, err := cl.ListSandboxes(cmd.Context())
				if err != nil {
					return err
				}
				for _, sb := range sbs {
					names = append(names, sb.Name)
				}
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, name := range names {
				fmt.Fprintf(w, "Host nook-%s\n  HostName %s\n  Port %s\n  User %s\n  HostKeyAlias %s\n  KnownHostsCommand %s ssh-known-hosts\n  StrictHostKeyChecking yes\n  UpdateHostKeys no\n\n",
					tsafe(name), host, port, tsafe(name), sshHostKeyAlias, self)
			}
			return nil
		}),
	}
}

func sshKnownHostsCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "ssh-known-hosts",
		Short:  "Print the daemon's SSH host key as a known_hosts line (ssh's KnownHostsCommand, from nook ssh-config)",
		Hidden: true,
		Args:   cobra.ArbitraryArgs, // ssh may pass its tokens
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error {
			info, err := cl.Info(cmd.Context())
			if err != nil {
				return err
			}
			if info.SSH == nil {
				return errors.New("the daemon runs no SSH endpoint")
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", sshHostKeyAlias, strings.TrimSpace(info.SSH.HostKey))
			return nil
		}),
	}
}
