package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/sdk"
)

func logsCmd() *cobra.Command {
	var follow bool
	var tail int
	var log string
	c := &cobra.Command{
		Use:   "logs NAME [-f] [--tail N] [--log agent|console]",
		Short: "Print a sandbox's log: a container's agent log, a vm's serial console; -f follows",
		Long: `Print a sandbox's log. A container's is its agent's (nook-agent is its init;
a container has no console); a vm's is its serial console, where its
guest kernel, init and agent write (its agent has no log of its own).
--log asks for one by name; a sandbox without it says why.

The log is written by the sandbox: on a terminal, control characters are
printed escaped (\x1b...); piped, the bytes are printed as they are.
Only the log's last MiB is read; a vm's console is emptied past 8 MiB.`,
		Args: cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			ctx := cmd.Context()
			o := sdk.LogsOptions{Log: log, Follow: follow}
			switch {
			case tail == 0:
				o.Tail = -1
			case tail > 0:
				o.Tail = tail
			}
			name, body, err := cl.SandboxLogs(ctx, args[0], o)
			if err != nil {
				return err
			}
			defer body.Close()
			if log == "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s's %s log%s\n", tsafe(args[0]), tsafe(name), map[string]string{
					"agent": " (a container has no console)", "console": " (its guest kernel, init and agent write here)"}[name])
			}
			out := cmd.OutOrStdout()
			f, ok := out.(*os.File)
			err = copyLog(out, body, ok && isTerminal(f))
			if ctx.Err() != nil {
				return nil // interrupted
			}
			return err
		}),
	}
	c.Flags().BoolVarP(&follow, "follow", "f", false, "go on printing what is written, until interrupted or the sandbox is gone")
	c.Flags().IntVar(&tail, "tail", -1, "print only the last N lines (default: all of the log's last MiB; 0 with -f: only what comes)")
	c.Flags().StringVar(&log, "log", "", "which log: agent or console (default: the one the sandbox's backend keeps)")
	return c
}

// copyLog copies a sandbox's log to w: raw, or, for a terminal (escape),
// a line at a time with its control characters escaped.
func copyLog(w io.Writer, r io.Reader, escape bool) error {
	if !escape {
		_, err := io.Copy(w, r)
		return err
	}
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			s := string(line)
			end := ""
			if line[len(line)-1] == '\n' {
				s, end = s[:len(s)-1], "\n"
			}
			if _, werr := io.WriteString(w, tsafe(s)+end); werr != nil {
				return werr
			}
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
		case err == io.EOF:
			return nil
		default:
			return err
		}
	}
}
