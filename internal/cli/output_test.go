package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/spf13/cobra"

	"github.com/nookhq/nook/api"
)

// outputCmd is a command that prints v (or, as a list, vs) through the
// output helper, as the real ones do.
func outputCmd[T any](list bool, vs []T, args ...string) (string, error) {
	var o output
	var b bytes.Buffer
	c := &cobra.Command{Use: "x", RunE: func(cmd *cobra.Command, _ []string) error {
		human := func(w io.Writer) error { _, err := io.WriteString(w, "human\n"); return err }
		if list {
			return printList(cmd.OutOrStdout(), &o, vs, vs, func(v T) string { return any(v).(api.Sandbox).Name }, human)
		}
		return o.print(cmd.OutOrStdout(), vs[0], human)
	}}
	addOutput[T](c, &o, "it", list)
	c.SetOut(&b)
	c.SetErr(io.Discard)
	c.SetArgs(args)
	c.SilenceErrors, c.SilenceUsage = true, true
	err := c.Execute()
	return b.String(), err
}

var testSandboxes = []api.Sandbox{
	{Name: "a", State: "running", Labels: map[string]string{"team": "x"}, CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
	{Name: "b", State: "paused", Network: &api.Network{Address: "10.0.0.2"}},
}

func TestOutputFormat(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "human\n"},
		{[]string{"--format", "{{.Name}} {{.State}}"}, "a running\nb paused\n"},
		{[]string{"--format", `{{.Name}}:{{index .Labels "team"}}`}, "a:x\nb:\n"},
		{[]string{"--format", "{{json .Labels}}"}, "{\"team\":\"x\"}\nnull\n"},
		{[]string{"--format", "{{upper .Name}}{{if .Network}} {{.Network.Address}}{{end}}"}, "A\nB 10.0.0.2\n"},
		{[]string{"--format", "{{.CreatedAt.Year}}"}, "2026\n1\n"},
		{[]string{"-q"}, "a\nb\n"},
	} {
		got, err := outputCmd(true, testSandboxes, tc.args...)
		if err != nil || got != tc.want {
			t.Errorf("%q: %q, %v; want %q", tc.args, got, err, tc.want)
		}
	}
	// --json is the list; --format on one value is a single line.
	got, err := outputCmd(true, testSandboxes, "--json")
	var back []api.Sandbox
	if err != nil || json.Unmarshal([]byte(got), &back) != nil || len(back) != 2 || back[1].Network.Address != "10.0.0.2" {
		t.Errorf("--json: %q, %v", got, err)
	}
	if got, err := outputCmd(false, testSandboxes[1:], "--format", "{{.Name}}"); err != nil || got != "b\n" {
		t.Errorf("one value: %q, %v", got, err)
	}
}

// A bad template, a field the type lacks, or flags that exclude each
// other are usage errors (exit status 2), and nothing is printed.
func TestOutputErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--format", "{{.Name"}, "--format: template: format:1: unclosed action"},
		{[]string{"--format", "{{.Nmae}}"}, "can't evaluate field Nmae in type api.Sandbox"},
		{[]string{"--format", "{{.Network.Nope}}"}, "can't evaluate field Nope"},
		{[]string{"--format", "{{nofunc .Name}}"}, `function "nofunc" not defined`},
		{[]string{"--json", "--format", "{{.Name}}"}, "give only one of --json, --format and -q"},
		{[]string{"-q", "--json"}, "give only one of"},
		// Found only on a real value: a is running, b has no network.
		{[]string{"--format", "{{.Name}} {{.Network.Address}}"}, "nil pointer evaluating *api.Network.Address"},
		{[]string{"--format", `{{.Labels.team}}`}, `map has no entry for key "team"`},
	} {
		out, err := outputCmd(true, testSandboxes, tc.args...)
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) || out != "" {
			t.Errorf("%q: output %q, error %v; want a usage error with %q and no output", tc.args, out, err, tc.want)
		}
	}
	// Through Main: exit status 2 and the message on stderr, before any
	// call to a daemon (there is none at NOOK_HOST).
	t.Setenv("NOOK_HOST", "unix://"+t.TempDir()+"/none.sock")
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"ls", "--format", "{{.Bogus}}"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "can't evaluate field Bogus in type api.Sandbox") {
		t.Errorf("nook ls --format '{{.Bogus}}': exit %d, stderr %q", code, stderr.String())
	}
	stderr.Reset()
	if code := Main([]string{"ls", "--filter", "color=red"}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), `--filter: unknown filter "color": the filters are label, state, template, isolation, name`) {
		t.Errorf("nook ls --filter color=red: exit %d, stderr %q", code, stderr.String())
	}
	// A filter too costly to match is refused here too, before the daemon.
	stderr.Reset()
	if code := Main([]string{"ls", "--filter", "name=*" + strings.Repeat("[b-b]", 30)}, &stdout, &stderr); code != 2 || !strings.Contains(stderr.String(), "--filter: filter name: a value of 151 bytes, more than the 126 allowed") {
		t.Errorf("nook ls --filter with a long name pattern: exit %d, stderr %q", code, stderr.String())
	}
}

// Every command with --json has --format beside it, and every list -q.
func TestOutputFlagsEverywhere(t *testing.T) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if f := c.Flags().Lookup("json"); f != nil && c.Flags().Lookup("format") == nil {
			t.Errorf("%s has --json but no --format", c.CommandPath())
		}
		if strings.Contains(c.Use, "--filter") && c.Flags().Lookup("quiet") == nil {
			t.Errorf("%s filters but has no -q", c.CommandPath())
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(newRoot(io.Discard, io.Discard))
}

// On a terminal, --format escapes what a sandbox chose (an escape
// sequence in a name) but keeps the template's newlines and tabs; to a
// pipe it prints exact.
func TestOutputFormatTerminal(t *testing.T) {
	evil := []api.Sandbox{{Name: "a\x1b]0;owned\a\x1b[2J", State: "running"}, {Name: "b", State: "paused"}}
	run := func(w io.Writer) error {
		var o output
		c := &cobra.Command{Use: "x", RunE: func(cmd *cobra.Command, _ []string) error {
			return printList(cmd.OutOrStdout(), &o, evil, evil, func(v api.Sandbox) string { return v.Name }, nil)
		}}
		addOutput[api.Sandbox](c, &o, "it", true)
		c.SetOut(w)
		c.SetErr(io.Discard)
		c.SetArgs([]string{"--format", "{{.Name}}\t{{.State}}"})
		c.SilenceErrors, c.SilenceUsage = true, true
		return c.Execute()
	}
	var b bytes.Buffer
	if err := run(&b); err != nil || b.String() != evil[0].Name+"\trunning\nb\tpaused\n" {
		t.Errorf("to a pipe: %q, %v; want the names exact", b.String(), err)
	}

	master, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	defer master.Close()
	err = run(tty)
	tty.Close()
	got, _ := io.ReadAll(master) // ends with EIO once the terminal is closed
	s := strings.ReplaceAll(string(got), "\r\n", "\n")
	if err != nil || s != `a\x1b]0;owned\a\x1b[2J`+"\trunning\nb\tpaused\n" {
		t.Errorf("to a terminal: %q, %v; want the escape sequences escaped, the tabs and newlines kept", s, err)
	}
}
