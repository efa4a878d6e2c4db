package cli

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
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

// fork NAME:<Tab> offers that sandbox's snapshots as NAME:SNAPSHOT,
// which the shells keep (they drop candidates that do not start with
// the word): asked of a daemon on a unix socket.
func TestCompletionForkSnapshots(t *testing.T) {
	sock := t.TempDir() + "/nook.sock"
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/web/snapshots" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode([]api.Snapshot{{Name: "before"}, {Name: "base"}, {Name: "after"}})
	})}
	go srv.Serve(l)
	defer srv.Close()
	t.Setenv("NOOK_HOST", "unix://"+sock)
	for word, want := range map[string]string{
		"web:":   "web:before\nweb:base\nweb:after\n:4\n",
		"web:b":  "web:before\nweb:base\n:4\n",
		"web:ba": "web:base\n:4\n",
	} {
		var out, errb bytes.Buffer
		if code := Main([]string{"__complete", "fork", word}, &out, &errb); code != 0 || out.String() != want {
			t.Errorf("nook __complete fork %s: exit %d, %q (stderr %q); want %q", word, code, out.String(), errb.String(), want)
		}
	}
}
