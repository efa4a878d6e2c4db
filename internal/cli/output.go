package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/template"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/internal/listfilter"
)

// output is how a command prints what it got: --json, --format TEMPLATE,
// -q (lists only: names, one a line) or, with none of them, its own text
// for people. Every command that prints something goes through it.
type output struct {
	json   bool
	format string
	quiet  bool
	list   bool
	tmpl   *template.Template
}

// formatHelp is what the help of --format says; the data is exactly what
// --json prints, with the Go field names of package api.
const formatHelp = `print with a Go template (text/template) instead: its data is what --json prints, its fields named as in Go (.Name for "name", .CreatedAt for "created_at", .Labels, .Network.Address...), one line per item of a list; functions json, join, lower, upper (e.g. '{{.Name}} {{.State}}', '{{json .Labels}}')`

// addOutput puts --json and --format (and, for a list, -q) on c for a
// value of type T (a list's item type), and checks them before c runs:
// a template that does not parse or names a field T lacks is a usage
// error before the command does anything.
func addOutput[T any](c *cobra.Command, o *output, what string, list bool) {
	o.list = list
	f := c.Flags()
	f.BoolVar(&o.json, "json", false, "print "+what+" as JSON")
	f.StringVar(&o.format, "format", "", formatHelp)
	if list {
		f.BoolVarP(&o.quiet, "quiet", "q", false, "print only the names (IDs for tokens, keys and processes), one a line")
	}
	pre := c.PreRunE
	c.PreRunE = func(cmd *cobra.Command, args []string) error {
		var zero T
		if err := o.check(zero); err != nil {
			return err
		}
		if pre != nil {
			return pre(cmd, args)
		}
		return nil
	}
}

// check refuses flags that exclude each other and parses the template,
// trying it on zero (a value of the printed type) to catch a field
// that does not exist.
func (o *output) check(zero any) error {
	n := 0
	for _, set := range []bool{o.json, o.format != "", o.quiet} {
		if set {
			n++
		}
	}
	if n > 1 {
		return &usageError{errors.New("give only one of --json, --format and -q")}
	}
	if o.format == "" {
		return nil
	}
	t, err := template.New("format").Option("missingkey=error").Funcs(template.FuncMap{
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
		"join":  strings.Join,
		"lower": strings.ToLower,
		"upper": strings.ToUpper,
	}).Parse(o.format)
	if err != nil {
		return &usageError{fmt.Errorf("--format: %w", err)}
	}
	o.tmpl = t
	// A field the type lacks fails on any value; other errors on the
	// zero value (a nil pointer, a missing map key) may not on a real one.
	if err := t.Execute(io.Discard, zero); err != nil && strings.Contains(err.Error(), "can't evaluate field") {
		return &usageError{fmt.Errorf("--format: %w", err)}
	}
	return nil
}

// print writes v: as JSON, through the template, or with human (which
// may be nil: then nothing is printed for people).
func (o *output) print(w io.Writer, v any, human func(io.Writer) error) error {
	switch {
	case o.json:
		return printJSON(w, v)
	case o.tmpl != nil:
		return o.execute(w, []any{v})
	case human != nil:
		return human(w)
	}
	return nil
}

// printList writes a list: asJSON as JSON (the list itself, or what
// holds it), each item through the template, the items' names (-q), or
// with human.
func printList[T any](w io.Writer, o *output, asJSON any, items []T, name func(T) string, human func(io.Writer) error) error {
	switch {
	case o.json:
		return printJSON(w, asJSON)
	case o.tmpl != nil:
		vs := make([]any, len(items))
		for i, it := range items {
			vs[i] = it
		}
		return o.execute(w, vs)
	case o.quiet:
		var b strings.Builder
		for _, it := range items {
			b.WriteString(tsafe(name(it)) + "\n")
		}
		_, err := io.WriteString(w, b.String())
		return err
	case human != nil:
		return human(w)
	}
	return nil
}

// execute runs the template on each value, a line each; nothing is
// written unless all succeed. Its errors are usage errors. The values
// hold text a sandbox chose (file names, command lines), so on a
// terminal what the template wrote goes through termsafe, all but its
// newlines and tabs; to a pipe or file it is written exact.
func (o *output) execute(w io.Writer, vs []any) error {
	var buf bytes.Buffer
	for _, v := range vs {
		if err := o.tmpl.Execute(&buf, v); err != nil {
			return &usageError{fmt.Errorf("--format: %w", err)}
		}
		buf.WriteByte('\n')
	}
	out := buf.Bytes()
	if f, ok := w.(*os.File); ok && isTerminal(f) {
		out = []byte(tsafeLayout(buf.String()))
	}
	_, err := w.Write(out)
	return err
}

// tsafeLayout is tsafe keeping s's newlines and tabs: a template's
// layout, on a terminal.
func tsafeLayout(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		cols := strings.Split(l, "\t")
		for j, c := range cols {
			cols[j] = tsafe(c)
		}
		lines[i] = strings.Join(cols, "\t")
	}
	return strings.Join(lines, "\n")
}

// addFilter puts --filter on a list that takes the keys given (package
// listfilter), its help naming them.
func addFilter(c *cobra.Command, pairs *[]string, keys []string) {
	c.Flags().StringArrayVar(pairs, "filter", nil, "list only what matches KEY=VALUE (repeatable, or joined by commas); keys: "+strings.Join(keys, ", "))
	// The shell completes the keys, and state's values.
	c.RegisterFlagCompletionFunc("filter", func(_ *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		var all []string
		for _, k := range keys {
			all = append(all, k+"=")
			if k == "state" {
				for _, st := range listfilter.States {
					all = append(all, "state="+st)
				}
			}
		}
		return filterPrefix(all, toComplete, ""), cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	})
}

// parseFilter reads --filter's pairs; a bad one is a usage error.
func parseFilter(pairs []string, keys []string) (*listfilter.Filter, []string, error) {
	split, err := listfilter.Pairs(pairs, keys)
	if err != nil {
		return nil, nil, &usageError{fmt.Errorf("--filter: %w", err)}
	}
	f, _ := listfilter.Parse(split, keys)
	return f, split, nil
}

// machine reports whether v is to be printed for a program (--json or
// --format): a command with long human output checks this first and
// calls print, leaving its own text as it is.
func (o *output) machine() bool { return o.json || o.tmpl != nil }

// printStream prints each item next gives, a line each (JSON, the
// template, or human's line), until next fails: the end of a stream the
// caller interrupted (ctx) is no error. stop, if not nil, may end the
// stream after an item with its error.
func printStream[T any](ctx context.Context, w io.Writer, o *output, next func() (T, error), human func(io.Writer, T) error, stop func(T) error) error {
	for {
		v, err := next()
		if err != nil {
			if ctx.Err() != nil {
				return nil // interrupted
			}
			return err
		}
		switch {
		case o.json:
			err = printJSONLine(w, v)
		case o.tmpl != nil:
			err = o.execute(w, []any{v})
		default:
			err = human(w, v)
		}
		if err == nil && stop != nil {
			err = stop(v)
		}
		if err != nil {
			return err
		}
	}
}

// removed is what a command that removes things prints with --json or
// --format: the name (or ID) of each it removed.
type removed struct {
	Name string `json:"name,omitempty"`
	ID   string `json:"id,omitempty"`
}
