package cli

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

func eventsCmd() *cobra.Command {
	var o sdk.EventsOptions
	var format output
	c := &cobra.Command{
		Use:   "events [--sandbox NAME] [--type TYPE]... [--since 10m] [--json | --format TEMPLATE]",
		Short: "Print sandboxes' lifecycle events as they happen, until interrupted",
		Long: `Print sandboxes' lifecycle events as they happen, one a line, until interrupted:
` + strings.Join(api.EventTypes, ", ") + `.

  2026-11-27T21:30:00Z created demo (container, base) by host

--since replays the daemon's recent events first (it keeps the last 1024,
in memory: none from before it started). A reader that falls far behind
gets a last "lagged" event and the stream ends. A sandbox token sees its
own sandbox's events only. With --json, one object per line (NDJSON).`,
		Args: cobra.NoArgs,
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, _ []string) error {
			ctx := cmd.Context()
			s, err := cl.Events(ctx, o)
			if err != nil {
				return err
			}
			defer s.Close()
			return printStream(ctx, cmd.OutOrStdout(), &format, s.Next, printEvent, func(ev *api.Event) error {
				if ev.Type == api.EventLagged {
					return fmt.Errorf("the event stream fell behind and ended: run nook events --since again")
				}
				return nil
			})
		}),
	}
	c.Flags().StringVar(&o.Sandbox, "sandbox", "", "only this sandbox's events")
	c.Flags().StringArrayVar(&o.Types, "type", nil, "only events of this type (repeatable): "+strings.Join(api.EventTypes, ", "))
	c.Flags().StringVar(&o.Since, "since", "", "first replay the recent events since a duration ago (10m) or a time (RFC 3339)")
	addOutput[api.Event](c, &format, "one object per event, a line each,", false)
	return c
}

// printEvent prints an event for a human: TIME TYPE NAME (ISOLATION,
// TEMPLATE): REASON by ACTOR.
func printEvent(w io.Writer, ev *api.Event) error {
	var b strings.Builder
	b.WriteString(ev.Time.UTC().Format(time.RFC3339))
	b.WriteString(" " + tsafe(ev.Type))
	if ev.Sandbox != "" {
		b.WriteString(" " + tsafe(ev.Sandbox))
	}
	if ev.Isolation != "" || ev.Template != "" {
		b.WriteString(" (" + tsafe(ev.Isolation) + ", " + tsafe(ev.Template) + ")")
	}
	if ev.Reason != "" {
		b.WriteString(": " + tsafe(ev.Reason))
	}
	if ev.Actor != "" {
		b.WriteString(" by " + tsafe(ev.Actor))
	}
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}
