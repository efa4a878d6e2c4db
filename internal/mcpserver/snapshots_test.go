package mcpserver

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// fakeAPI answers the snapshot routes the way the daemon does, for a vm
// sandbox "box" and a container sandbox "ctr", and records each request.
type fakeAPI struct {
	mu   sync.Mutex
	reqs []string // "METHOD PATH BODY"
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.reqs = append(f.reqs, r.Method+" "+r.URL.Path+" "+strings.TrimSpace(string(body)))
	f.mu.Unlock()
	reply := func(code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(v)
	}
	fail := func(code int, c, msg string) { reply(code, api.ErrorBody{Error: api.Error{Code: c, Message: msg}}) }
	at := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	switch {
	case strings.HasPrefix(r.URL.Path, "/v1/sandboxes/ctr/"):
		fail(409, api.CodeFailedPrecondition, "the container backend cannot take snapshots yet: create the sandbox with --isolation vm")
	case r.URL.Path == "/v1/sandboxes/box/snapshots" && r.Method == "POST":
		var req api.CreateSnapshotRequest
		json.Unmarshal(body, &req)
		if req.Name == "taken" {
			fail(409, api.CodeAlreadyExists, "sandbox box already has a snapshot named taken: choose another --name")
			return
		}
		reply(200, api.Snapshot{ID: "snap-1", Name: req.Name, Sandbox: "box", CreatedAt: at, SizeBytes: 1 << 20, Memory: true})
	case r.URL.Path == "/v1/sandboxes/box/snapshots" && r.Method == "GET":
		reply(200, []api.Snapshot{
			{ID: "snap-1", Name: "one", Sandbox: "box", CreatedAt: at, Memory: true},
			{ID: "snap-2", Name: "two", Sandbox: "box", Parent: "snap-1", CreatedAt: at, Memory: true},
		})
	case r.URL.Path == "/v1/sandboxes/empty/snapshots":
		reply(200, []api.Snapshot{})
	case r.URL.Path == "/v1/sandboxes/box/rollback":
		var req api.RollbackRequest
		json.Unmarshal(body, &req)
		if req.Snapshot != "one" {
			fail(404, api.CodeNotFound, `no snapshot "`+req.Snapshot+"\": `nook snapshots NAME` lists them")
			return
		}
		reply(200, api.Sandbox{Name: "box", State: "running", Isolation: api.IsolationVM})
	case r.URL.Path == "/v1/sandboxes/box/fork":
		var req api.ForkRequest
		json.Unmarshal(body, &req)
		var out api.ForkResponse
		for i := 1; i <= max(req.Count, 1); i++ {
			out.Sandboxes = append(out.Sandboxes, api.Sandbox{Name: req.Name + "-" + string(rune('0'+i)), State: "running", Isolation: api.IsolationVM})
		}
		reply(200, out)
	default:
		fail(404, api.CodeNotFound, `no sandbox named "`+strings.Split(r.URL.Path, "/")[3]+"\": see `nook ls`")
	}
}

func connect(t *testing.T, h http.Handler) *mcp.ClientSession {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := sdk.New(srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := New(c, "test").Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func callTool(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (res *mcp.CallToolResult, sc map[string]any, text string) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if b, err := json.Marshal(res.StructuredContent); err == nil {
		json.Unmarshal(b, &sc)
	}
	if len(res.Content) > 0 {
		if tc, ok := res.Content[0].(*mcp.TextContent); ok {
			text = tc.Text
		}
	}
	return res, sc, text
}

// The snapshot tools are listed with descriptions a model can act on and
// input schemas whose only required argument is what the tool cannot do
// without; sandbox_create offers the isolation they need.
func TestSnapshotToolsListed(t *testing.T) {
	cs := connect(t, &fakeAPI{})
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"sandbox_snapshot":  {"sandbox"},
		"sandbox_snapshots": {"sandbox"},
		"sandbox_rollback":  {"sandbox", "snapshot"},
		"sandbox_fork":      {"sandbox"},
	}
	props := map[string][]string{
		"sandbox_snapshot": {"sandbox", "name"},
		"sandbox_rollback": {"sandbox", "snapshot"},
		"sandbox_fork":     {"sandbox", "snapshot", "count", "name"},
		"sandbox_create":   {"isolation"},
	}
	seen := map[string]bool{}
	for _, tool := range res.Tools {
		seen[tool.Name] = true
		b, _ := json.Marshal(tool.InputSchema)
		var schema struct {
			Required   []string                  `json:"required"`
			Properties map[string]map[string]any `json:"properties"`
		}
		if err := json.Unmarshal(b, &schema); err != nil {
			t.Fatal(err)
		}
		if req, ok := want[tool.Name]; ok {
			slices.Sort(schema.Required)
			if !slices.Equal(schema.Required, req) {
				t.Errorf("%s requires %v, want %v", tool.Name, schema.Required, req)
			}
			if !strings.Contains(tool.Description, "snapshot") || len(tool.Description) < 200 {
				t.Errorf("%s has a thin description: %q", tool.Name, tool.Description)
			}
		}
		for _, p := range props[tool.Name] {
			if d, _ := schema.Properties[p]["description"].(string); d == "" {
				t.Errorf("%s: argument %s is missing or undescribed: %s", tool.Name, p, b)
			}
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("tools/list lacks %s", name)
		}
	}
	for _, tool := range res.Tools {
		if tool.Name == "sandbox_snapshot" && !strings.Contains(tool.Description, `isolation "vm"`) {
			t.Errorf("sandbox_snapshot does not say which sandboxes can take snapshots: %q", tool.Description)
		}
		if tool.Name == "sandbox_rollback" && !strings.Contains(tool.Description, "lost") {
			t.Errorf("sandbox_rollback does not say what is lost: %q", tool.Description)
		}
	}
}

// The tools pass their arguments to the API and return its answers; the
// API's errors come back as tool errors, with its CLI hints said in the
// tools' terms.
func TestSnapshotTools(t *testing.T) {
	f := &fakeAPI{}
	cs := connect(t, f)
	last := func() string {
		f.mu.Lock()
		defer f.mu.Unlock()
		if len(f.reqs) == 0 {
			return ""
		}
		return f.reqs[len(f.reqs)-1]
	}

	_, sc, _ := callTool(t, cs, "sandbox_snapshot", map[string]any{"sandbox": "box", "name": "before"})
	if sc["id"] != "snap-1" || sc["name"] != "before" || sc["memory"] != true {
		t.Fatalf("sandbox_snapshot: %+v", sc)
	}
	if l := last(); l != `POST /v1/sandboxes/box/snapshots {"name":"before"}` {
		t.Fatalf("sandbox_snapshot sent %s", l)
	}
	callTool(t, cs, "sandbox_snapshot", map[string]any{"sandbox": "box"})
	if l := last(); l != `POST /v1/sandboxes/box/snapshots {}` {
		t.Fatalf("sandbox_snapshot without a name sent %s", l)
	}

	_, sc, _ = callTool(t, cs, "sandbox_snapshots", map[string]any{"sandbox": "box"})
	l, _ := sc["snapshots"].([]any)
	if len(l) != 2 || l[1].(map[string]any)["parent"] != "snap-1" {
		t.Fatalf("sandbox_snapshots: %+v", sc)
	}
	// No snapshots is an empty list, not null.
	if _, sc, _ = callTool(t, cs, "sandbox_snapshots", map[string]any{"sandbox": "empty"}); sc["snapshots"] == nil {
		t.Fatalf("sandbox_snapshots of a sandbox without any: %+v", sc)
	}

	_, sc, _ = callTool(t, cs, "sandbox_rollback", map[string]any{"sandbox": "box", "snapshot": "one"})
	if sc["name"] != "box" || sc["state"] != "running" {
		t.Fatalf("sandbox_rollback: %+v", sc)
	}
	if l := last(); l != `POST /v1/sandboxes/box/rollback {"snapshot":"one"}` {
		t.Fatalf("sandbox_rollback sent %s", l)
	}

	_, sc, _ = callTool(t, cs, "sandbox_fork", map[string]any{"sandbox": "box", "snapshot": "one", "count": 3, "name": "try"})
	if fl, _ := sc["sandboxes"].([]any); len(fl) != 3 || fl[2].(map[string]any)["name"] != "try-3" {
		t.Fatalf("sandbox_fork: %+v", sc)
	}
	if l := last(); l != `POST /v1/sandboxes/box/fork {"snapshot":"one","count":3,"name":"try"}` {
		t.Fatalf("sandbox_fork sent %s", l)
	}

	// Errors a model can act on.
	for _, c := range []struct {
		tool string
		args map[string]any
		want []string
	}{
		{"sandbox_snapshot", map[string]any{"sandbox": "ctr"}, []string{"cannot take snapshots yet: create the sandbox with --isolation vm", `sandbox_create with isolation "vm"`}},
		{"sandbox_snapshots", map[string]any{"sandbox": "ctr"}, []string{"--isolation vm"}},
		{"sandbox_rollback", map[string]any{"sandbox": "ctr", "snapshot": "one"}, []string{"--isolation vm"}},
		{"sandbox_fork", map[string]any{"sandbox": "ctr"}, []string{"cannot take snapshots yet", `isolation "vm"`}},
		{"sandbox_snapshot", map[string]any{"sandbox": "box", "name": "taken"}, []string{"already has a snapshot named taken", "pass another name"}},
		{"sandbox_rollback", map[string]any{"sandbox": "box", "snapshot": "nope"}, []string{`no snapshot "nope"`, "sandbox_snapshots lists them"}},
		{"sandbox_fork", map[string]any{"sandbox": "ghost"}, []string{`no sandbox named "ghost"`, "sandbox_list"}},
		{"sandbox_rollback", map[string]any{"sandbox": "box"}, []string{"snapshot"}}, // the SDK's schema check
		{"sandbox_rollback", map[string]any{"sandbox": "box", "snapshot": ""}, []string{"snapshot is empty", "sandbox_snapshots"}},
	} {
		res, _, text := callTool(t, cs, c.tool, c.args)
		if !res.IsError {
			t.Errorf("%s %v: not a tool error: %+v", c.tool, c.args, res)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s %v: error %q lacks %q", c.tool, c.args, text, w)
			}
		}
	}
	// An empty snapshot never reached the API.
	if l := last(); strings.Contains(l, "rollback {}") || strings.Contains(l, `"snapshot":""`) {
		t.Fatalf("rollback without a snapshot was sent: %s", l)
	}
}

// No tool hands a model an identity token (or anything of the identity
// API): a token is a credential for the sandbox's own code, not for the
// model driving it.
func TestNoIdentityTools(t *testing.T) {
	cs := connect(t, &fakeAPI{})
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tools) == 0 {
		t.Fatal("no tools listed")
	}
	for _, tool := range res.Tools {
		text := strings.ToLower(tool.Name + " " + tool.Description)
		if strings.Contains(text, "identity") || strings.Contains(text, "jwt") || strings.Contains(text, "oidc") {
			t.Errorf("tool %s reaches identity tokens: %s", tool.Name, tool.Description)
		}
	}
}
