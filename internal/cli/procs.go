package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// detachKey is Ctrl-]: typed on an attached terminal, it detaches and leaves the process running.
const detachKey = 0x1d

func parsePID(s string) (int, error) {
	pid, err := strconv.Atoi(s)
	if err != nil || pid <= 0 {
		return 0, &usageError{fmt.Errorf("process id %q is not valid: use a PID from nook ps", s)}
	}
	return pid, nil
}

func psCmd() *cobra.Command {
	var out output
	c := &cobra.Command{
		Use:   "ps NAME",
		Short: "List the commands started through nook in a sandbox",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			ps, err := cl.Processes(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if out.machine() || out.quiet {
				return printList(cmd.OutOrStdout(), &out, ps, ps, func(p api.Process) string { return strconv.Itoa(p.PID) }, nil)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PID\tSTATUS\tSTARTED\tOUTPUT\tCOMMAND")
			for _, p := range ps {
				status := "running"
				if !p.Running && p.Exit != nil {
					status = "exited " + strconv.Itoa(p.Exit.ExitCode)
					if p.Exit.Signal != "" {
						status = "killed " + tsafe(p.Exit.Signal)
					}
				}
				if p.TTY {
					status += " (tty)"
				}
				fmt.Fprintf(tw, "%d\t%s\t%s ago\t%dB\t%s\n", p.PID, status, time.Since(p.StartedAt).Round(time.Second), p.OutputTo, commandLine(p.Cmd))
			}
			return tw.Flush()
		}),
	}
	addOutput[api.Process](c, &out, "the list", true)
	return c
}

// commandLine renders a process's arguments for a human: each escaped
// (termsafe), and quoted when it is empty or holds a space.
func commandLine(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " '\"") {
			out[i] = strconv.Quote(a) // escapes what is not printable too
		} else {
			out[i] = tsafe(a)
		}
	}
	return strings.Join(out, " ")
}

func killCmd() *cobra.Command {
	var sig string
	c := &cobra.Command{
		Use:   "kill NAME PID [-s SIGNAL]",
		Short: "Send a signal (default TERM) to a command started through nook",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[1])
			if err != nil {
				return err
			}
			cl, err := client()
			if err != nil {
				return err
			}
			return cl.Signal(cmd.Context(), args[0], pid, sig)
		},
	}
	c.Flags().StringVarP(&sig, "signal", "s", "TERM", "signal name (TERM, KILL, INT, HUP...) or number")
	return c
}

func attachCmd() *cobra.Command {
	var offset int64
	var noStdin bool
	c := &cobra.Command{
		Use:   "attach NAME PID [--offset N] [--no-stdin]",
		Short: "Follow a command's output from a byte offset, with input; Ctrl-] detaches",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pid, err := parsePID(args[1])
			if err != nil {
				return err
			}
			if offset < 0 {
				return &usageError{errors.New("--offset must be 0 or more")}
			}
			cl, err := client()
			if err != nil {
				return err
			}
			if noStdin {
				st, err := cl.Output(cmd.Context(), args[0], pid, offset, cmd.OutOrStdout(), cmd.ErrOrStderr())
				if err != nil {
					return err
				}
				return exitFor(cmd, st, "")
			}
			s, err := cl.Attach(cmd.Context(), args[0], pid, offset)
			if err != nil {
				return err
			}
			return runSession(cmd, s, isTerminal(os.Stdin), args[0], pid)
		},
	}
	c.Flags().Int64Var(&offset, "offset", 0, "start from this byte of the command's output")
	c.Flags().BoolVar(&noStdin, "no-stdin", false, "only follow the output")
	return c
}

func shellCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "shell NAME",
		Short: "Open an interactive shell in a sandbox; Ctrl-] detaches, nook attach re-attaches",
		Args:  cobra.ExactArgs(1),
		RunE: withClient(func(cmd *cobra.Command, cl *sdk.Client, args []string) error {
			rows, cols := termSize()
			// A background terminal session, attached: detaching leaves it running.
			pid, err := cl.Start(cmd.Context(), args[0], api.ExecRequest{
				Cmd: []string{"sh", "-c", "if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi"},
				TTY: true, Rows: rows, Cols: cols,
			})
			if err != nil {
				return err
			}
			s, err := cl.Attach(cmd.Context(), args[0], pid, 0)
			if err != nil {
				return err
			}
			return runSession(cmd, s, true, args[0], pid)
		}),
	}
}

func isTerminal(f *os.File) bool { return term.IsTerminal(int(f.Fd())) }

func termSize() (uint16, uint16) {
	if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil && w > 0 && h > 0 {
		return uint16(h), uint16(w)
	}
	return 24, 80
}

// runInteractive runs `nook exec -i/-t`.
func runInteractive(cmd *cobra.Command, cl *sdk.Client, name string, req api.ExecRequest) error {
	if req.TTY {
		req.Rows, req.Cols = termSize()
	}
	s, err := cl.ExecInteractive(cmd.Context(), name, req)
	if err != nil {
		return err
	}
	return runSession(cmd, s, req.TTY, name, 0)
}

// runSession pumps stdin to the session and its output to stdout/stderr
// until the command exits. With a terminal, the local terminal is raw (so
// Ctrl-C goes to the sandbox), follows window size changes, and Ctrl-]
// detaches when pid is known.
func runSession(cmd *cobra.Command, s *sdk.Session, tty bool, name string, pid int) error {
	defer s.Close()
	stdin := cmd.InOrStdin()
	if tty && isTerminal(os.Stdin) {
		old, err := term.MakeRaw(int(os.Stdin.Fd()))
		if err == nil {
			defer term.Restore(int(os.Stdin.Fd()), old)
		}
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for range winch {
				s.Resize(termSize())
			}
		}()
		s.Resize(termSize())
	}
	detached := make(chan struct{})
	go func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := stdin.Read(buf)
			if n > 0 {
				chunk := buf[:n]
				if tty && pid > 0 {
					if i := indexByte(chunk, detachKey); i >= 0 {
						s.Write(chunk[:i])
						close(detached)
						s.Close()
						return
					}
				}
				if _, werr := s.Write(chunk); werr != nil {
					return
				}
			}
			if err != nil {
				if err == io.EOF {
					s.CloseStdin()
				}
				return
			}
		}
	}()
	st, err := s.Wait(cmd.OutOrStdout(), cmd.ErrOrStderr())
	select {
	case <-detached:
		fmt.Fprintf(cmd.ErrOrStderr(), "\r\ndetached from process %d; re-attach with: nook attach %s %d\r\n", pid, name, pid)
		return nil
	default:
	}
	if err != nil {
		return err
	}
	return exitFor(cmd, st, "")
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}
