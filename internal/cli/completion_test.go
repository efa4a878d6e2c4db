package cli

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// Each command completions names is one nook has, and got its function.
func TestCompletionPaths(t *testing.T) {
	root := newRoot(io.Discard, io.Discard)
	for path := range completions {
		c, rest, err := root.Find(strings.Fields(path))
		if err != nil || len(rest) > 0 || c.CommandPath() != "nook "+path {
			t.Errorf("completions names %q, not a command (found %q, %v)", path, c.CommandPath(), err)
			continue
		}
		if c.ValidArgsFunction == nil {
			t.Errorf("nook %s has no completion function", path)
		}
	}
	if c, _, err := root.Find([]string{"completion"}); err != nil || c.Name() != "completion" || !strings.Contains(c.Long, "source <(nook completion bash)") {
		t.Errorf("no completion command with its help: %v", err)
	}
}

// Without a daemon, completion offers nothing, quickly, and succeeds.
func TestCompletionNoDaemon(t *testing.T) {
	t.Setenv("NOOK_HOST", "unix://"+t.TempDir()+"/none.sock")
	for _, args := range [][]string{{"__complete", "inspect", ""}, {"__complete", "create", "--template", ""}, {"__complete", "fork", "x:"}} {
		var out, errb bytes.Buffer
		if code := Main(args, &out, &errb); code != 0 || strings.TrimSpace(out.String()) != ":4" {
			t.Errorf("nook %q: exit %d, %q (stderr %q); want only the directive :4", args, code, out.String(), errb.String())
		}
	}
}

// --filter completes its keys, and state's values, without a daemon.
func TestCompletionFilter(t *testing.T) {
	t.Setenv("NOOK_HOST", "unix://"+t.TempDir()+"/none.sock")
	var out, errb bytes.Buffer
	if code := Main([]string{"__complete", "ls", "--filter", "state=p"}, &out, &errb); code != 0 || out.String() != "state=paused\n:6\n" {
		t.Errorf("ls --filter state=p: exit %d, %q", code, out.String())
	}
	out.Reset()
	if code := Main([]string{"__complete", "volume", "ls", "--filter", ""}, &out, &errb); code != 0 || out.String() != "name=\n:6\n" {
		t.Errorf("volume ls --filter: exit %d, %q", code, out.String())
	}
}
