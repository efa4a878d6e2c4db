package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/nookhq/nook/internal/testutil"
)

// inspector runs the MCP Inspector's CLI (installed by make deps) and
// returns its JSON answer.
func inspector(t *testing.T, args ...string) (map[string]any, string) {
	t.Helper()
	out, err := inspectorRun(t, args...)
	var res map[string]any
	if jerr := json.Unmarshal(out, &res); jerr != nil {
		t.Fatalf("inspector %s: %v %v\n%s", strings.Join(args, " "), err, jerr, out)
	}
	return res, string(out)
}

// inspectorRun runs the Inspector's CLI and returns its standard output
// (or, when it fails, everything it printed).
func inspectorRun(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	bin := filepath.Join(testutil.ModuleRoot(t), ".cache", "mcp-inspector", "node_modules", ".bin", "mcp-inspector")
	if _, err := os.Stat(bin); err != nil {
		if _, err := exec.LookPath("npm"); err != nil {
			testutil.Missing(t, "npm is not installed, so the MCP Inspector cannot be (make deps installs it)")
		}
		t.Fatalf("the MCP Inspector is not installed at %s: run make deps", bin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--cli"}, args...)...)
	cmd.Env = append(os.Environ(), "MCP_CATALOG_PATH="+filepath.Join(t.TempDir(), "mcp.json"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return append(out, stderr.String()...), err
	}
	return out, nil
}

// A real MCP client nobody here wrote lists nook's tools and drives a
// sandbox through them: over stdio (`nook mcp`) and over the daemon's
// streamable HTTP endpoint with a token.
func TestMCPInspector(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	d := newDaemon(t, "--listen", addr)
	stdio := []string{"-e", "NOOK_HOST=unix://" + d.socket(), d.bin, "mcp"}

	res, raw := inspector(t, append(stdio, "--method", "tools/list")...)
	names := map[string]bool{}
	for _, tool := range res["tools"].([]any) {
		tm := tool.(map[string]any)
		names[tm["name"].(string)] = true
		if len(tm["description"].(string)) < 40 {
			t.Errorf("tool %s has a thin description", tm["name"])
		}
	}
	for _, want := range []string{"sandbox_create", "sandbox_list", "sandbox_inspect", "sandbox_pause", "sandbox_resume", "sandbox_stop", "sandbox_start", "sandbox_destroy", "exec", "process_start", "process_output", "process_list", "process_kill", "read_file", "write_file", "list_files", "search_files",
		"sandbox_snapshot", "sandbox_snapshots", "sandbox_rollback", "sandbox_fork", "volume_create", "volume_list", "volume_destroy"} {
		if !names[want] {
			t.Errorf("tools/list lacks %s:\n%s", want, raw)
		}
	}

	call := func(transport []string, tool string, args ...string) map[string]any {
		a := append(append([]string{}, transport...), "--method", "tools/call", "--tool-name", tool)
		for _, kv := range args {
			a = append(a, "--tool-arg", kv)
		}
		res, raw := inspector(t, a...)
		sc, ok := res["structuredContent"].(map[string]any)
		if !ok || res["isError"] == true {
			t.Fatalf("%s: %s", tool, raw)
		}
		return sc
	}
	sb := call(stdio, "sandbox_create", "name=mcp-box")
	if sb["state"] != "running" {
		t.Fatalf("sandbox_create: %+v", sb)
	}
	ex := call(stdio, "exec", "sandbox=mcp-box", "command=echo hi; echo oops >&2; exit 3")
	if ex["stdout"] != "hi\n" || ex["stderr"] != "oops\n" || ex["exit_code"] != float64(3) {
		t.Fatalf("exec: %+v", ex)
	}
	call(stdio, "write_file", "sandbox=mcp-box", "path=/root/dir/notes.txt", "content=written by an agent")
	rd := call(stdio, "read_file", "sandbox=mcp-box", "path=/root/dir/notes.txt")
	if rd["content"] != "written by an agent" || rd["size"] != float64(19) {
		t.Fatalf("read_file: %+v", rd)
	}

	// The same tools over HTTP need the daemon's token: without one the
	// daemon answers 401, which the Inspector reports as auth_required.
	// The listener serves TLS with the daemon's self-signed certificate:
	// the Inspector (Node) trusts it as an extra CA.
	t.Setenv("NODE_EXTRA_CA_CERTS", filepath.Join(d.data, "tls", "cert.pem"))
	if out, err := inspectorRun(t, "--transport", "http", "--server-url", "https://"+addr+"/mcp", "--method", "tools/list"); err == nil || !(strings.Contains(string(out), "401") || strings.Contains(string(out), "auth_required")) {
		t.Fatalf("/mcp over TCP without a token answered (%v): %s", err, out)
	}
	token := strings.TrimSpace(d.must("token", "create"))
	http := []string{"--transport", "http", "--server-url", "https://" + addr + "/mcp", "--header", "Authorization: Bearer " + token}
	ex = call(http, "exec", "sandbox=mcp-box", "command=cat /root/dir/notes.txt")
	if ex["stdout"] != "written by an agent" {
		t.Fatalf("exec over HTTP: %+v", ex)
	}
	call(http, "sandbox_destroy", "sandbox=mcp-box")
}

// Driven by the official Go SDK's client: errors come back as tool
// errors a model can read, huge output is cut with a note, and background
// processes can be read incrementally.
func TestMCPTools(t *testing.T) {
	d := newDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.Command(d.bin, "mcp")
	cmd.Env = append(os.Environ(), "NOOK_HOST=unix://"+d.socket())
	cl := mcp.NewClient(&mcp.Implementation{Name: "nook-test", Version: "1"}, nil)
	cs, err := cl.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call := func(tool string, args map[string]any) (*mcp.CallToolResult, map[string]any) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		var sc map[string]any
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			json.Unmarshal(b, &sc)
		}
		return res, sc
	}
	if res, _ := call("sandbox_create", map[string]any{"name": "Bad Name"}); !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "not valid") {
		t.Fatalf("bad name: %+v", res)
	}
	if res, _ := call("sandbox_create", map[string]any{"name": "mcp-idle", "idle_pause": "5s"}); !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "out of range") {
		t.Fatalf("idle_pause 5s: %+v", res)
	}
	if _, sc := call("sandbox_create", map[string]any{"name": "mcp-tools", "idle_pause": "2h", "on_expire": "pause"}); sc["idle_pause"] != "2h" || sc["on_expire"] != "pause" {
		t.Fatalf("sandbox_create with idle_pause and on_expire: %+v", sc)
	}
	if res, _ := call("exec", map[string]any{"sandbox": "ghost", "command": "true"}); !res.IsError {
		t.Fatal("exec in a missing sandbox is not a tool error")
	}
	_, sc := call("exec", map[string]any{"sandbox": "mcp-tools", "command": "head -c 3000000 /dev/zero | tr '\\0' x"})
	out := sc["stdout"].(string)
	if len(out) > 70000 || !strings.Contains(out, "bytes omitted") {
		t.Fatalf("3 MB of output came back as %d bytes", len(out))
	}
	_, sc = call("process_start", map[string]any{"sandbox": "mcp-tools", "command": "echo start; sleep 0.5; echo end"})
	pid := sc["pid"].(float64)
	_, sc = call("process_output", map[string]any{"sandbox": "mcp-tools", "pid": pid, "wait_seconds": 0.2})
	if sc["output"] != "start\n" || sc["running"] != true {
		t.Fatalf("first read: %+v", sc)
	}
	_, sc = call("process_output", map[string]any{"sandbox": "mcp-tools", "pid": pid, "offset": sc["next_offset"], "wait_seconds": 5})
	if sc["output"] != "end\n" || sc["running"] != false || sc["exit_code"] != float64(0) {
		t.Fatalf("second read: %+v", sc)
	}
	// Paused, the sandbox still answers: the next call wakes it.
	if _, sc := call("sandbox_pause", map[string]any{"sandbox": "mcp-tools"}); sc["state"] != "paused" {
		t.Fatalf("sandbox_pause: %+v", sc)
	}
	if _, sc := call("exec", map[string]any{"sandbox": "mcp-tools", "command": "echo woke"}); sc["stdout"] != "woke\n" {
		t.Fatalf("exec on a paused sandbox: %+v", sc)
	}
	if res, _ := call("sandbox_resume", map[string]any{"sandbox": "mcp-tools"}); !res.IsError {
		t.Fatal("resuming a running sandbox is not a tool error")
	}
	// Stopped, calls fail and say how to start it; started, it runs on its files.
	if _, sc := call("sandbox_stop", map[string]any{"sandbox": "mcp-tools"}); sc["state"] != "stopped" {
		t.Fatalf("sandbox_stop: %+v", sc)
	}
	if res, _ := call("exec", map[string]any{"sandbox": "mcp-tools", "command": "true"}); !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "start") {
		t.Fatalf("exec on a stopped sandbox: %+v", res)
	}
	if _, sc := call("sandbox_start", map[string]any{"sandbox": "mcp-tools"}); sc["state"] != "running" {
		t.Fatalf("sandbox_start: %+v", sc)
	}
	if res, _ := call("read_file", map[string]any{"sandbox": "mcp-tools", "path": "/root"}); !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "not a file") {
		t.Fatalf("read_file of a directory: %+v", res)
	}
	if res, _ := call("read_file", map[string]any{"sandbox": "mcp-tools", "path": "relative.txt"}); !res.IsError {
		t.Fatal("relative path accepted")
	}
	// A path with shell metacharacters is a path, not a command.
	call("write_file", map[string]any{"sandbox": "mcp-tools", "path": "/tmp/x;touch /tmp/pwned", "content": "y"})
	_, sc = call("exec", map[string]any{"sandbox": "mcp-tools", "command": "test -e /tmp/pwned && echo pwned || echo safe"})
	if sc["stdout"] != "safe\n" {
		t.Fatal("write_file ran part of its path as a command")
	}
	_, sc = call("search_files", map[string]any{"sandbox": "mcp-tools", "path": "/tmp", "pattern": "^y$"})
	if m := sc["matches"].([]any); len(m) != 1 {
		t.Fatalf("search_files: %+v", sc)
	}
	// A container sandbox's snapshots hold its files, and its processes
	// where the daemon has CRIU (its default pause is then a checkpoint).
	call("exec", map[string]any{"sandbox": "mcp-tools", "command": "echo before > /root/state"})
	if _, sc := call("sandbox_snapshot", map[string]any{"sandbox": "mcp-tools", "name": "before"}); sc["name"] != "before" || sc["memory"] != haveCRIU() {
		t.Fatalf("sandbox_snapshot of a container: %+v", sc)
	}
	call("exec", map[string]any{"sandbox": "mcp-tools", "command": "echo after > /root/state"})
	if res, _ := call("sandbox_rollback", map[string]any{"sandbox": "mcp-tools", "snapshot": "before"}); res.IsError {
		t.Fatalf("sandbox_rollback of a container: %+v", res)
	}
	if _, sc := call("exec", map[string]any{"sandbox": "mcp-tools", "command": "cat /root/state"}); sc["stdout"] != "before\n" {
		t.Fatalf("after sandbox_rollback: %+v", sc)
	}
	if _, sc := call("sandbox_fork", map[string]any{"sandbox": "mcp-tools", "snapshot": "before", "count": 2, "name": "mcp-try"}); len(sc["sandboxes"].([]any)) != 2 {
		t.Fatalf("sandbox_fork of a container: %+v", sc)
	}
	if _, sc := call("exec", map[string]any{"sandbox": "mcp-try-2", "command": "cat /root/state; hostname"}); sc["stdout"] != "before\nmcp-try-2\n" {
		t.Fatalf("exec in a fork: %+v", sc)
	}
	if _, sc := call("sandbox_snapshots", map[string]any{"sandbox": "mcp-tools"}); len(sc["snapshots"].([]any)) != 1 {
		t.Fatalf("sandbox_snapshots of a container sandbox: %+v", sc)
	}
	if res, _ := call("sandbox_snapshots", map[string]any{"sandbox": "ghost"}); !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "sandbox_list") {
		t.Fatalf("sandbox_snapshots of a missing sandbox: %+v", res)
	}
	if _, sc := call("sandbox_list", nil); len(sc["sandboxes"].([]any)) != 3 {
		t.Fatalf("sandbox_list after two forks: %+v", sc)
	}
	// An agent builds a template from a Dockerfile's text, and starts from it.
	tpl := testutil.RandomName("mcp")
	t.Cleanup(func() { d.nook("rm", "mcp-made"); d.nook("template", "rm", tpl) })
	if _, sc := call("template_build", map[string]any{"name": tpl, "dockerfile": "FROM base\nARG WHO\nRUN echo \"made by $WHO\" > /made\n", "build_args": map[string]any{"WHO": "mcp"}}); sc["source"] != "dockerfile" {
		t.Fatalf("template_build from a Dockerfile: %+v", sc)
	}
	if _, sc := call("template_list", nil); !strings.Contains(fmt.Sprint(sc["templates"]), tpl) {
		t.Fatalf("template_list: %+v", sc)
	}
	call("sandbox_create", map[string]any{"name": "mcp-made", "template": tpl})
	if _, sc := call("exec", map[string]any{"sandbox": "mcp-made", "command": "cat /made"}); sc["stdout"] != "made by mcp\n" {
		t.Fatalf("exec in a sandbox of the built template: %+v", sc)
	}
	if res, _ := call("template_build", map[string]any{"name": tpl + "-x", "dockerfile": "FROM base\nRUN exit 3\n"}); !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "exited with code 3") {
		t.Fatalf("a failing build is a tool error: %+v", res)
	}
	// An agent keeps results in a volume, past its sandbox.
	if _, sc := call("volume_create", map[string]any{"name": "mcp-results", "size": "64M"}); sc["name"] != "mcp-results" {
		t.Fatalf("volume_create: %+v", sc)
	}
	call("sandbox_create", map[string]any{"name": "mcp-vol", "volumes": []any{"mcp-results:/results"}})
	call("exec", map[string]any{"sandbox": "mcp-vol", "command": "echo 42 > /results/answer"})
	if res, _ := call("volume_destroy", map[string]any{"name": "mcp-results"}); !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "mcp-vol") {
		t.Fatalf("volume_destroy of a mounted volume: %+v", res)
	}
	call("sandbox_destroy", map[string]any{"sandbox": "mcp-vol"})
	call("sandbox_create", map[string]any{"name": "mcp-vol2", "volumes": []any{"mcp-results:/r:ro"}})
	if _, sc := call("exec", map[string]any{"sandbox": "mcp-vol2", "command": "cat /r/answer"}); sc["stdout"] != "42\n" {
		t.Fatalf("the volume's file in the next sandbox: %+v", sc)
	}
	call("sandbox_destroy", map[string]any{"sandbox": "mcp-vol2"})
	if _, sc := call("volume_list", nil); !strings.Contains(fmt.Sprint(sc["volumes"]), "mcp-results") {
		t.Fatalf("volume_list: %+v", sc)
	}
	call("volume_destroy", map[string]any{"name": "mcp-results"})
}

// The snapshot tools on a vm sandbox, kept short: snapshot, break,
// roll back, fork once.
func TestMCPSnapshotTools(t *testing.T) {
	requireVM(t)
	d := newDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.Command(d.bin, "mcp")
	cmd.Env = append(os.Environ(), "NOOK_HOST=unix://"+d.socket())
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "nook-test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call := func(tool string, args map[string]any) map[string]any {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		if res.IsError {
			t.Fatalf("%s: %s", tool, res.Content[0].(*mcp.TextContent).Text)
		}
		var sc map[string]any
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &sc)
		return sc
	}
	if sc := call("sandbox_create", map[string]any{"name": "mcp-vm", "isolation": "vm", "cpus": 1, "memory": "512M"}); sc["isolation"] != "vm" {
		t.Fatalf("sandbox_create with isolation vm: %+v", sc)
	}
	call("exec", map[string]any{"sandbox": "mcp-vm", "command": "echo approach-0 > /root/state"})
	if sc := call("sandbox_snapshot", map[string]any{"sandbox": "mcp-vm", "name": "start"}); sc["name"] != "start" || sc["memory"] != true {
		t.Fatalf("sandbox_snapshot: %+v", sc)
	}
	call("exec", map[string]any{"sandbox": "mcp-vm", "command": "echo approach-1 > /root/state"})
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_snapshot", Arguments: map[string]any{"sandbox": "mcp-vm", "name": "start"}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "already has a snapshot named start") {
		t.Fatalf("a taken snapshot name: %v %+v", err, res)
	}
	if sc := call("sandbox_snapshots", map[string]any{"sandbox": "mcp-vm"}); len(sc["snapshots"].([]any)) != 1 {
		t.Fatalf("sandbox_snapshots: %+v", sc)
	}
	call("sandbox_rollback", map[string]any{"sandbox": "mcp-vm", "snapshot": "start"})
	if sc := call("exec", map[string]any{"sandbox": "mcp-vm", "command": "cat /root/state"}); sc["stdout"] != "approach-0\n" {
		t.Fatalf("after sandbox_rollback: %+v", sc)
	}
	sc := call("sandbox_fork", map[string]any{"sandbox": "mcp-vm", "snapshot": "start", "name": "mcp-vm-2"})
	if l := sc["sandboxes"].([]any); len(l) != 1 || l[0].(map[string]any)["name"] != "mcp-vm-2" {
		t.Fatalf("sandbox_fork: %+v", sc)
	}
	call("exec", map[string]any{"sandbox": "mcp-vm-2", "command": "echo approach-2 > /root/state"})
	if sc := call("exec", map[string]any{"sandbox": "mcp-vm", "command": "cat /root/state"}); sc["stdout"] != "approach-0\n" {
		t.Fatalf("the fork's write reached its source: %+v", sc)
	}
	call("sandbox_destroy", map[string]any{"sandbox": "mcp-vm-2"})
	call("sandbox_destroy", map[string]any{"sandbox": "mcp-vm"})
}

// bearer adds a token to every request of an MCP client.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// TestEscapeMCPScope: over /mcp (the official Go SDK's client, HTTPS with
// the certificate pinned as a CA), a token's scope holds for every tool: a
// read-only token lists and reads but cannot exec or write; a sandbox
// token sees and uses only its sandbox and cannot create others; and a
// session cannot be used with another token.
func TestEscapeMCPScope(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	d := newDaemon(t, "--listen", addr)
	d.must("create", "--name", "box")
	d.must("create", "--name", "other")
	d.must("exec", "box", "--", "sh", "-c", "echo secret-notes > /root/notes")
	ro := strings.TrimSpace(d.must("token", "create", "--scope", "read-only"))
	box := strings.TrimSpace(d.must("token", "create", "--scope", "sandbox:box"))
	pem, err := os.ReadFile(filepath.Join(d.data, "tls", "cert.pem"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	connect := func(token string) (*mcp.ClientSession, *http.Client) {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
		hc := &http.Client{Transport: bearer{token, tr}}
		cl := mcp.NewClient(&mcp.Implementation{Name: "nook-scope-test", Version: "1"}, nil)
		cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "https://" + addr + "/mcp", HTTPClient: hc}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs, hc
	}
	call := func(cs *mcp.ClientSession, tool string, args map[string]any) (string, bool) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		b, _ := json.Marshal(res.StructuredContent)
		if res.IsError {
			b, _ = json.Marshal(res.Content)
		}
		return string(b), res.IsError
	}

	rs, _ := connect(ro)
	if out, isErr := call(rs, "sandbox_list", nil); isErr || !strings.Contains(out, `"box"`) || !strings.Contains(out, `"other"`) {
		t.Fatalf("read-only sandbox_list: %s", out)
	}
	if out, isErr := call(rs, "read_file", map[string]any{"sandbox": "box", "path": "/root/notes"}); isErr || !strings.Contains(out, "secret-notes") {
		t.Fatalf("read-only read_file: %s", out)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{"exec", map[string]any{"sandbox": "box", "command": "true"}},
		{"write_file", map[string]any{"sandbox": "box", "path": "/root/x", "content": "x"}},
		{"process_start", map[string]any{"sandbox": "box", "command": "sleep 100"}},
		{"sandbox_destroy", map[string]any{"sandbox": "other"}},
		{"sandbox_create", map[string]any{"name": "made-by-ro"}},
	} {
		if out, isErr := call(rs, tc.tool, tc.args); !isErr || !(strings.Contains(out, "read-only") || strings.Contains(out, "admin token")) {
			t.Errorf("read-only %s: error=%v %s", tc.tool, isErr, out)
		}
	}

	bs, bhc := connect(box)
	if out, isErr := call(bs, "sandbox_list", nil); isErr || !strings.Contains(out, `"box"`) || strings.Contains(out, `"other"`) {
		t.Fatalf("sandbox:box sandbox_list: %s", out)
	}
	if out, isErr := call(bs, "exec", map[string]any{"sandbox": "box", "command": "cat /root/notes"}); isErr || !strings.Contains(out, "secret-notes") {
		t.Fatalf("sandbox:box exec in box: %s", out)
	}
	if out, isErr := call(bs, "exec", map[string]any{"sandbox": "other", "command": "true"}); !isErr || !strings.Contains(out, "for sandbox box only") {
		t.Fatalf("sandbox:box exec in other: %s", out)
	}
	if out, isErr := call(bs, "sandbox_create", map[string]any{"name": "made-by-box"}); !isErr || !strings.Contains(out, "admin token") {
		t.Fatalf("sandbox:box sandbox_create: %s", out)
	}

	// The read-only token cannot ride the box token's session.
	sid := bs.ID()
	if sid == "" {
		t.Fatal("no session id")
	}
	body := `{"jsonrpc":"2.0","id":99,"method":"tools/call","params":{"name":"exec","arguments":{"sandbox":"box","command":"true"}}}`
	req, _ := http.NewRequestWithContext(ctx, "POST", "https://"+addr+"/mcp", strings.NewReader(body))
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	hijack := &http.Client{Transport: bearer{ro, bhc.Transport.(bearer).next}}
	resp, err := hijack.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("another token on box's session: %s", resp.Status)
	}
	if _, err := os.Stat(filepath.Join(d.data, "sandboxes")); err != nil {
		t.Fatal(err)
	}
	if out := d.must("ls"); strings.Contains(out, "made-by") {
		t.Fatalf("a scoped token created a sandbox:\n%s", out)
	}
}
