package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/identity"
	"github.com/nookhq/nook/sdk"
)

func identityCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "identity",
		Short: "Sandboxes' identity tokens: issue one, see what was issued, rotate the signing key",
		Long: `Every sandbox can prove who it is with a short-lived JWT signed by the
daemon (ES256), which relying parties verify with any OIDC library against
the issuer's published keys (nook serve --issuer; nook oidc export).

Inside a sandbox, one request gets one:

  curl -H 'Nook-Metadata: true' 'http://169.254.169.254/v1/token?audience=AUD'

and /v1/sandbox answers its own facts. Only the sandbox itself reaches its
endpoint; the subject is spiffe://TRUST-DOMAIN/sandbox/ID, new for every
fork.`,
	}
	var audience, ttl string
	var out output
	token := &cobra.Command{
		Use:   "token NAME --audience AUD",
		Short: "Issue a sandbox's identity token (printed alone, for scripts)",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			t, err := cl.IdentityToken(cmd.Context(), args[0], audience, ttl)
			if err != nil {
				return err
			}
			if out.machine() {
				return out.print(cmd.OutOrStdout(), t, nil)
			}
			fmt.Fprintln(cmd.OutOrStdout(), t.Token)
			return nil
		}),
	}
	token.Flags().StringVar(&audience, "audience", "", "the token's audience (aud): the relying party's identifier, e.g. sts.amazonaws.com (required)")
	token.Flags().StringVar(&ttl, "ttl", "", "the token's lifetime, e.g. 10m (default 10m; at most the daemon's --identity-max-ttl and the sandbox's expiry)")
	addOutput[api.IdentityToken](token, &out, "the token with its subject, audience, jti and expiry", false)
	token.MarkFlagRequired("audience")

	var logOut output
	log := &cobra.Command{
		Use:   "log NAME",
		Short: "List the identity tokens issued to a sandbox, and who asked",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			l, err := cl.IdentityLog(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if logOut.machine() {
				return logOut.print(cmd.OutOrStdout(), l, nil)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tAUDIENCE\tEXPIRES\tVIA\tJTI")
			for _, e := range l.Entries {
				// The audience is what the sandbox asked for.
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Time.Local().Format(time.RFC3339), tsafe(e.Audience),
					e.ExpiresAt.Local().Format(time.RFC3339), tsafe(e.Via), e.ID)
			}
			return tw.Flush()
		}),
	}
	addOutput[api.IdentityLog](log, &logOut, "the log", false)

	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Retire the signing key now (on the host, over the Unix socket)",
		Long: `The published next key signs from now on and a new next key is
published; tokens the old key signed keep verifying until they expire.
Keys also rotate on their own (nook serve --identity-rotate).`,
		Args: cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error {
			return cl.RotateIdentityKeys(cmd.Context())
		}),
	}
	c.AddCommand(token, log, rotate)
	return c
}

func oidcCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "oidc",
		Short: "The identity issuer's public documents",
	}
	export := &cobra.Command{
		Use:   "export DIR",
		Short: "Write the OIDC discovery document and the keys (JWKS) for static hosting at the issuer URL",
		Long: `Writes DIR/.well-known/openid-configuration and DIR/.well-known/jwks.json
(under the issuer URL's path, if it has one). Host DIR at the URL given to
nook serve --issuer (e.g. a bucket behind HTTPS): relying parties in a cloud
then verify sandboxes' tokens without reaching this host. Export again
after each key rotation (the next key is published a rotation period
before it signs, so exporting once a period is enough).`,
		Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			disc, jwks, err := cl.IdentityDocuments(cmd.Context())
			if err != nil {
				return err
			}
			files, err := identity.WriteDocuments(args[0], disc, jwks)
			if err != nil {
				return err
			}
			for _, f := range files {
				fmt.Fprintln(cmd.OutOrStdout(), f)
			}
			return nil
		}),
	}
	c.AddCommand(export)
	return c
}
