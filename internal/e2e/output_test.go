package e2e

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// lines is out's non-empty lines, sorted.
func lines(out string) []string {
	var l []string
	for _, s := range strings.Split(out, "\n") {
		if s != "" {
			l = append(l, s)
		}
	}
	slices.Sort(l)
	return l
}

// Lists filter (in the daemon), -q, --format and --json on the commands
// that print, and shell completion of sandbox names, through the CLI.
func TestListFilterFormatCompletion(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "out-a1", "--label", "team=a", "--label", "tier=web", "--memory", "256M")
	d.must("create", "--name", "out-a2", "--label", "team=a", "--memory", "256M")
	d.must("create", "--name", "out-b", "--label", "team=b", "--memory", "256M")

	// pause --json prints the sandboxes it paused, paused.
	var paused []api.Sandbox
	if err := json.Unmarshal([]byte(d.must("pause", "--json", "out-a2")), &paused); err != nil || len(paused) != 1 || paused[0].Name != "out-a2" || paused[0].State != api.StatePaused {
		t.Fatalf("pause --json: %+v, %v", paused, err)
	}

	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"ls", "-q"}, []string{"out-a1", "out-a2", "out-b"}},
		{[]string{"ls", "-q", "--filter", "label=team=a"}, []string{"out-a1", "out-a2"}},
		{[]string{"ls", "-q", "--filter", "state=paused"}, []string{"out-a2"}},
		{[]string{"ls", "-q", "--filter", "label=team=a,state=running"}, []string{"out-a1"}},
		{[]string{"ls", "-q", "--filter", "label=tier"}, []string{"out-a1"}},
		{[]string{"ls", "-q", "--filter", "name=out-a*", "--filter", "label=team=b"}, nil},
		{[]string{"ls", "-q", "--filter", "state=running", "--filter", "isolation=container", "--filter", "template=base"}, []string{"out-a1", "out-b"}},
		{[]string{"ls", "--format", `{{.Name}}:{{index .Labels "team"}}`}, []string{"out-a1:a", "out-a2:a", "out-b:b"}},
		{[]string{"ls", "--format", "{{.Name}} {{.State}}", "--filter", "label=team=a"}, []string{"out-a1 running", "out-a2 paused"}},
		{[]string{"inspect", "out-b", "--format", "{{.Name}} {{.Isolation}} {{json .Labels}}"}, []string{`out-b container {"team":"b"}`}},
		// Completion (cobra's hidden __complete) lists the sandboxes; its
		// last line is the directive.
		{[]string{"__complete", "inspect", ""}, []string{":4", "out-a1", "out-a2", "out-b"}},
		{[]string{"__complete", "pause", "out-a1", "out-"}, []string{":4", "out-a1", "out-a2", "out-b"}},
		{[]string{"__complete", "rollback", "out-a"}, []string{":4", "out-a1", "out-a2"}},
	} {
		if got := lines(d.must(tc.args...)); !slices.Equal(got, tc.want) {
			t.Errorf("nook %s: %q; want %q", strings.Join(tc.args, " "), got, tc.want)
		}
	}
	// The JSON list holds exactly what -q named.
	var sbs []api.Sandbox
	if err := json.Unmarshal([]byte(d.must("ls", "--json", "--filter", "label=team=a")), &sbs); err != nil || len(sbs) != 2 {
		t.Errorf("ls --json --filter label=team=a: %+v, %v", sbs, err)
	}

	// fork --json: the forks; snapshot --format; rollback --json.
	var forks []api.Sandbox
	if err := json.Unmarshal([]byte(d.must("fork", "out-b", "--count", "2", "--name", "out-f", "--json")), &forks); err != nil || len(forks) != 2 || forks[0].Labels["team"] != "b" {
		t.Fatalf("fork --json: %+v, %v", forks, err)
	}
	if got := strings.TrimSpace(d.must("snapshot", "out-a1", "--name", "s1", "--format", "{{.Name}}")); got != "s1" {
		t.Errorf("snapshot --format: %q", got)
	}
	if got := lines(d.must("__complete", "rollback", "out-a1", "")); !slices.Equal(got, []string{":4", "s1"}) {
		t.Errorf("completing a snapshot: %q", got)
	}
	var rolled api.Sandbox
	if err := json.Unmarshal([]byte(d.must("rollback", "--json", "out-a1", "s1")), &rolled); err != nil || rolled.Name != "out-a1" || rolled.State != api.StateRunning {
		t.Errorf("rollback --json: %+v, %v", rolled, err)
	}
	if got := strings.TrimSpace(d.must("ttl", "out-b", "2h", "--format", "{{.Name}} {{.OnExpire}}")); got != "out-b destroy" {
		t.Errorf("ttl --format: %q", got)
	}
	var started api.StartedProcess
	if err := json.Unmarshal([]byte(d.must("exec", "-d", "--json", "out-b", "--", "sleep", "30")), &started); err != nil || started.PID == 0 {
		t.Errorf("exec -d --json: %+v, %v", started, err)
	}

	// token create --json carries the secret; token ls -q its ID; rm --json.
	var tok api.Token
	if err := json.Unmarshal([]byte(d.must("token", "create", "--name", "out-tok", "--scope", "read-only", "--json")), &tok); err != nil || tok.Secret == "" || tok.ID == "" || tok.Scope != "read-only" {
		t.Fatalf("token create --json: %+v, %v", tok, err)
	}
	if got := lines(d.must("token", "ls", "-q", "--filter", "name=out-")); !slices.Equal(got, []string{tok.ID}) {
		t.Errorf("token ls -q --filter name=out-: %q; want %s", got, tok.ID)
	}
	if got := strings.TrimSpace(d.must("token", "rm", tok.ID, "--format", "{{.ID}}")); got != tok.ID {
		t.Errorf("token rm --format: %q", got)
	}

	d.expectCLI(t, []cliCase{
		{[]string{"ls", "--filter", "color=red"}, 2, `--filter: unknown filter "color": the filters are label, state, template, isolation, name`},
		{[]string{"ls", "--filter", "state=sleeping"}, 2, "the states are running, paused"},
		{[]string{"ls", "--format", "{{.Colour}}"}, 2, "can't evaluate field Colour in type api.Sandbox"},
		{[]string{"inspect", "out-b", "--format", "{{.Name"}, 2, "--format: template"},
		{[]string{"ls", "-q", "--json"}, 2, "give only one of --json, --format and -q"},
		{[]string{"exec", "--json", "out-b", "--", "true"}, 2, "give -d"},
		{[]string{"snapshots", "out-a1", "--filter", "state=running"}, 2, "the filters are name"},
	})
	// The daemon filters for the SDK too, and refuses an unknown filter
	// itself (400), as every client sees it.
	cl, err := sdk.New("unix://"+d.socket(), "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cl.ListSandboxes(t.Context(), "label=team=a", "name=out-a1"); err != nil || len(got) != 1 || got[0].Name != "out-a1" {
		t.Errorf("SDK list label=team=a name=out-a1: %+v, %v", got, err)
	}
	var apiErr *sdk.Error
	if _, err := cl.ListSandboxes(t.Context(), "colour=red"); !errors.As(err, &apiErr) || apiErr.Status != 400 || !strings.Contains(err.Error(), "the filters are label") {
		t.Errorf("SDK list colour=red: %v", err)
	}
	// Without a daemon, completion offers nothing and no error.
	r, err := d.nookEnv([]string{"NOOK_HOST=unix://" + t.TempDir() + "/none.sock"}, "__complete", "inspect", "")
	if err != nil || r.code != 0 || strings.Contains(r.stdout, "out-") {
		t.Errorf("completion without a daemon: exit %d, %q, %v", r.code, r.stdout, err)
	}
	if out := d.must("completion", "bash"); !strings.Contains(out, "__start_nook") {
		t.Errorf("completion bash prints no script: %.200q", out)
	}
}
