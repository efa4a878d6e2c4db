package cli

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/nookhq/nook/sdk"
)

// completionTimeout bounds each call completion makes to the daemon: a
// shell waits on it at every Tab.
const completionTimeout = 2 * time.Second

const completionHelp = `Print a script that makes your shell complete nook's commands, flags and
the names of sandboxes, snapshots, templates, volumes and secrets (asked
of the daemon, NOOK_HOST, as you press Tab; nothing when it does not answer).

  bash: source <(nook completion bash)   (needs the bash-completion package)
  zsh:  nook completion zsh > "${fpath[1]}/_nook"
  fish: nook completion fish | source`

// names lists one kind of name from the daemon.
type names func(ctx context.Context, cl *sdk.Client, args []string) ([]string, error)

func sandboxNames(ctx context.Context, cl *sdk.Client, _ []string) ([]string, error) {
	sbs, err := cl.ListSandboxes(ctx)
	out := make([]string, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, sb.Name)
	}
	return out, err
}

// snapshotNames lists the snapshots of the sandbox args[0] names.
func snapshotNames(ctx context.Context, cl *sdk.Client, args []string) ([]string, error) {
	if len(args) == 0 {
		return nil, nil
	}
	list, err := cl.ListSnapshots(ctx, args[0])
	out := make([]string, 0, len(list))
	for _, s := range list {
		out = append(out, s.Name)
	}
	return out, err
}

func templateNames(ctx context.Context, cl *sdk.Client, _ []string) ([]string, error) {
	tl, err := cl.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range tl.Templates {
		out = append(out, t.Name)
	}
	for _, r := range tl.Buildable {
		if !hasTemplate(tl, r.Name) {
			out = append(out, r.Name)
		}
	}
	return out, nil
}

func volumeNames(ctx context.Context, cl *sdk.Client, _ []string) ([]string, error) {
	vols, err := cl.ListVolumes(ctx)
	out := make([]string, 0, len(vols))
	for _, v := range vols {
		out = append(out, v.Name)
	}
	return out, err
}

func secretNames(ctx context.Context, cl *sdk.Client, _ []string) ([]string, error) {
	list, err := cl.ListSecrets(ctx)
	out := make([]string, 0, len(list))
	for _, s := range list {
		out = append(out, s.Name)
	}
	return out, err
}

// ask calls list with a short timeout; an unreachable daemon (or any
// error) completes nothing, quietly.
func ask(cmd *cobra.Command, list names, args []string) []string {
	cl, err := sdk.FromEnv()
	if err != nil {
		return nil
	}
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	out, err := list(ctx, cl, args)
	if err != nil {
		return nil
	}
	return out
}

// complete completes the positional arguments: at[i] the i-th (the last
// for every one after it when rest), nil for none.
func complete(rest bool, at ...names) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		i := len(args)
		if i >= len(at) {
			if !rest || len(at) == 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			i = len(at) - 1
		}
		if at[i] == nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return filterPrefix(ask(cmd, at[i], args), toComplete, ""), cobra.ShellCompDirectiveNoFileComp
	}
}

// filterPrefix keeps the names that start with prefix, each with suffix.
func filterPrefix(all []string, prefix, suffix string) []string {
	var out []string
	for _, n := range all {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n+suffix)
		}
	}
	return out
}

// completeFork completes fork's NAME[:SNAPSHOT]: sandbox names, then
// after NAME: that sandbox's snapshots, each as NAME:SNAPSHOT (the shells
// keep only the candidates that start with the word being completed).
func completeFork(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	if name, _, ok := strings.Cut(toComplete, ":"); ok {
		var full []string
		for _, snap := range ask(cmd, snapshotNames, []string{name}) {
			full = append(full, name+":"+snap)
		}
		return filterPrefix(full, toComplete, ""), cobra.ShellCompDirectiveNoFileComp
	}
	return filterPrefix(ask(cmd, sandboxNames, nil), toComplete, ""), cobra.ShellCompDirectiveNoFileComp
}

// completions are the commands whose arguments complete, by path under
// nook (a test checks each path is a command).
var completions = map[string]cobra.CompletionFunc{
	"inspect":          complete(false, sandboxNames),
	"exec":             complete(false, sandboxNames),
	"ps":               complete(false, sandboxNames),
	"kill":             complete(false, sandboxNames),
	"attach":           complete(false, sandboxNames),
	"shell":            complete(false, sandboxNames),
	"ssh":              complete(false, sandboxNames),
	"ssh-config":       complete(true, sandboxNames),
	"ttl":              complete(false, sandboxNames),
	"rm":               complete(true, sandboxNames),
	"pause":            complete(true, sandboxNames),
	"resume":           complete(true, sandboxNames),
	"stop":             complete(true, sandboxNames),
	"start":            complete(true, sandboxNames),
	"net":              complete(false, sandboxNames),
	"net log":          complete(false, sandboxNames),
	"expose":           complete(false, sandboxNames),
	"unexpose":         complete(false, sandboxNames),
	"identity token":   complete(false, sandboxNames),
	"identity log":     complete(false, sandboxNames),
	"snapshot":         complete(false, sandboxNames),
	"snapshot rm":      complete(true, sandboxNames, snapshotNames),
	"snapshots":        complete(false, sandboxNames),
	"rollback":         complete(false, sandboxNames, snapshotNames),
	"fork":             completeFork,
	"template build":   complete(false, templateNames),
	"template inspect": complete(false, templateNames),
	"template rm":      complete(false, templateNames),
	"volume inspect":   complete(false, volumeNames),
	"volume rm":        complete(true, volumeNames),
	"secret rm":        complete(true, secretNames),
	"secret set":       complete(false, secretNames),
}

// registerCompletions sets the completion of arguments and of flags
// that take a name (create --template, --volume) on root's commands.
func registerCompletions(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		path := strings.TrimPrefix(c.CommandPath(), root.Name()+" ")
		if f, ok := completions[path]; ok && c.ValidArgsFunction == nil {
			c.ValidArgsFunction = f
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	if create, _, err := root.Find([]string{"create"}); err == nil && create.Name() == "create" {
		create.RegisterFlagCompletionFunc("template", func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			return filterPrefix(ask(cmd, templateNames, nil), toComplete, ""), cobra.ShellCompDirectiveNoFileComp
		})
		// --volume NAME:/path: the name, then the shell waits for the path.
		create.RegisterFlagCompletionFunc("volume", func(cmd *cobra.Command, _ []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			return filterPrefix(ask(cmd, volumeNames, nil), toComplete, ":"), cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
		})
	}
	root.InitDefaultCompletionCmd()
	if c, _, err := root.Find([]string{"completion"}); err == nil && c.Name() == "completion" {
		c.Long = completionHelp
	}
}
