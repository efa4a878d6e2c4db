package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
)

// scopeServer is a Server whose routes answer 200 "reached" once past
// authentication and the access check, with fake tokens:
// admin, ro (read-only), box (sandbox:box), stale (sandbox:box, but made
// for an earlier sandbox of that name), expired.
func scopeServer(t *testing.T) *Server {
	t.Helper()
	s := &Server{log: slog.New(slog.DiscardHandler)}
	s.authenticate = func(_ context.Context, secret string) (*daemon.TokenInfo, error) {
		switch secret {
		case "admin":
			return &daemon.TokenInfo{ID: "t-admin", Scope: daemon.AdminScope}, nil
		case "ro":
			return &daemon.TokenInfo{ID: "t-ro", Scope: daemon.Scope{Kind: api.ScopeReadOnly}}, nil
		case "box":
			return &daemon.TokenInfo{ID: "t-box", Scope: daemon.Scope{Kind: daemon.ScopeSandbox, Sandbox: "box", SandboxID: "id-box"}}, nil
		case "stale":
			return &daemon.TokenInfo{ID: "t-stale", Scope: daemon.Scope{Kind: daemon.ScopeSandbox, Sandbox: "box", SandboxID: "id-box-before"}}, nil
		case "expired":
			return nil, &daemon.TokenExpiredError{At: time.Now().Add(-time.Minute)}
		}
		return nil, errdefs.NotFound("token not found")
	}
	s.sandboxID = func(_ context.Context, name string) (string, error) {
		return "id-" + name, nil
	}
	routes := s.routes()
	for i := range routes {
		routes[i].handler = func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "reached") }
	}
	s.mux = s.newMux(routes)
	return s
}

// path fills a route pattern's wildcards; sandbox routes get sandbox.
func path(pattern, sandbox string) (method, p string) {
	method, p, _ = strings.Cut(pattern, " ")
	if strings.HasPrefix(p, "/v1/sandboxes/") {
		p = strings.Replace(p, "{name}", sandbox, 1)
	}
	r := strings.NewReplacer("{name}", "base", "{snapshot}", "s1", "{port}", "8000", "{pid}", "7", "{id}", "t1")
	return method, r.Replace(p)
}

// TestEscapeTokenScope asks every route the server has, as every kind of
// caller, and checks who gets through. A route missing from want (a new
// one) fails the test: its access must be decided here too.
func TestEscapeTokenScope(t *testing.T) {
	// Who gets through, by class.
	const (
		anyToken = "host admin ro box stale"
		read     = "host admin ro box"
		write    = "host admin box"
		admin    = "host admin"
		host     = "host"
		public   = "host admin ro box stale public" // no token needed
	)
	want := map[string]string{
		"GET /v1/openapi.yaml":                             anyToken,
		"GET /v1/info":                                     anyToken,
		"GET /v1/events":                                   anyToken, // filtered for sandbox tokens
		"GET /v1/sandboxes/{name}/logs":                    read,
		"GET /v1/templates":                                anyToken,
		"GET /v1/sandboxes":                                anyToken, // filtered for sandbox tokens
		"POST /v1/sandboxes":                               admin,
		"GET /v1/sandboxes/{name}":                         read,
		"DELETE /v1/sandboxes/{name}":                      write,
		"PUT /v1/sandboxes/{name}/ttl":                     admin,
		"POST /v1/sandboxes/{name}/pause":                  write,
		"POST /v1/sandboxes/{name}/resume":                 write,
		"POST /v1/sandboxes/{name}/stop":                   write,
		"POST /v1/sandboxes/{name}/start":                  write,
		"POST /v1/sandboxes/{name}/snapshots":              write,
		"GET /v1/sandboxes/{name}/snapshots":               read,
		"DELETE /v1/sandboxes/{name}/snapshots/{snapshot}": write,
		"POST /v1/sandboxes/{name}/rollback":               write,
		"POST /v1/sandboxes/{name}/fork":                   admin,
		"GET /v1/sandboxes/{name}/stats":                   read,
		"GET /v1/stats":                                    anyToken, // filtered for sandbox tokens
		"GET /v1/sandboxes/{name}/network":                 read,
		"PUT /v1/sandboxes/{name}/network":                 admin,
		"GET /v1/sandboxes/{name}/network/log":             read,
		"POST /v1/sandboxes/{name}/identity/token":         write,
		"GET /v1/sandboxes/{name}/identity/log":            read,
		"POST /v1/identity/rotate":                         host,
		"GET /v1/secrets":                                  admin,
		"PUT /v1/secrets/{secret}":                         admin,
		"DELETE /v1/secrets/{secret}":                      admin,
		"GET /.well-known/openid-configuration":            public,
		"GET /.well-known/jwks.json":                       public,
		"POST /v1/sandboxes/{name}/expose":                 admin,
		"DELETE /v1/sandboxes/{name}/expose/{port}":        admin,
		"GET /v1/ssh-keys":                                 anyToken, // a token sees its own
		"POST /v1/ssh-keys":                                anyToken, // but the handler refuses read-only (TestTokenScopeReadOnlySSHKey)
		"DELETE /v1/ssh-keys/{id}":                         anyToken, // a token removes its own
		"GET /v1/sandboxes/{name}/ssh-keys":                read,
		"POST /v1/sandboxes/{name}/ssh-keys":               write,
		"DELETE /v1/sandboxes/{name}/ssh-keys/{id}":        write,
		"POST /v1/sandboxes/{name}/ssh-cert":               write,
		"POST /v1/sandboxes/{name}/exec":                   write,
		"GET /v1/sandboxes/{name}/exec/ws":                 write,
		"GET /v1/sandboxes/{name}/processes":               read,
		"GET /v1/sandboxes/{name}/processes/{pid}/output":  read,
		"GET /v1/sandboxes/{name}/processes/{pid}/attach":  write,
		"POST /v1/sandboxes/{name}/processes/{pid}/signal": write,
		"GET /v1/sandboxes/{name}/files/stat":              read,
		"GET /v1/sandboxes/{name}/files/list":              read,
		"GET /v1/sandboxes/{name}/files/content":           read,
		"PUT /v1/sandboxes/{name}/files/content":           write,
		"POST /v1/sandboxes/{name}/files/mkdir":            write,
		"DELETE /v1/sandboxes/{name}/files":                write,
		"POST /v1/sandboxes/{name}/files/move":             write,
		"POST /v1/sandboxes/{name}/files/chmod":            write,
		"GET /v1/sandboxes/{name}/files/archive":           read,
		"PUT /v1/sandboxes/{name}/files/archive":           write,
		"GET /v1/sandboxes/{name}/files/watch":             read,
		"POST /v1/templates":                               admin,
		"POST /v1/templates/{name}/build":                  admin,
		"POST /v1/templates/{name}/dockerfile":             admin,
		"DELETE /v1/templates/{name}":                      admin,
		"GET /v1/volumes":                                  admin,
		"POST /v1/volumes":                                 admin,
		"GET /v1/volumes/{name}":                           admin,
		"DELETE /v1/volumes/{name}":                        admin,
		"GET /v1/volumes/{name}/files/stat":                admin,
		"GET /v1/volumes/{name}/files/list":                admin,
		"GET /v1/volumes/{name}/files/content":             admin,
		"PUT /v1/volumes/{name}/files/content":             admin,
		"GET /v1/volumes/{name}/files/archive":             admin,
		"PUT /v1/volumes/{name}/files/archive":             admin,
		"POST /v1/tokens":                                  host,
		"GET /v1/tokens":                                   host,
		"DELETE /v1/tokens/{id}":                           host,
	}
	s := scopeServer(t)
	unix, tcp := s.Handler(false), s.Handler(true)
	do := func(h http.Handler, method, p, token string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, p, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	seen := map[string]bool{}
	for _, r := range s.routes() {
		seen[r.pattern] = true
		allowed, ok := want[r.pattern]
		if !ok {
			t.Errorf("route %s has no expected access in TestEscapeTokenScope: decide who may call it", r.pattern)
			continue
		}
		method, p := path(r.pattern, "box")
		for _, who := range []string{"host", "admin", "ro", "box", "stale"} {
			h, token := tcp, who
			if who == "host" {
				h, token = unix, ""
			}
			rec := do(h, method, p, token)
			through := rec.Code == http.StatusOK && rec.Body.String() == "reached"
			if wantThrough := strings.Contains(" "+allowed+" ", " "+who+" "); through != wantThrough {
				t.Errorf("%s as %s: status %d %q; want through=%v", r.pattern, who, rec.Code, rec.Body, wantThrough)
			} else if !through && (rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), api.CodePermissionDenied)) {
				t.Errorf("%s as %s: status %d %q; want 403 permission_denied", r.pattern, who, rec.Code, rec.Body)
			}
		}
		// A sandbox token reaches no other sandbox's routes.
		if strings.Contains(r.pattern, "/v1/sandboxes/{name}") {
			method, p := path(r.pattern, "other")
			if rec := do(tcp, method, p, "box"); rec.Code != http.StatusForbidden || allowed != admin && !strings.Contains(rec.Body.String(), "for sandbox box only") {
				t.Errorf("%s as box on sandbox other: %d %q", r.pattern, rec.Code, rec.Body)
			}
		}
		// Over TCP: no token, a wrong one and an expired one are 401,
		// the last saying it expired.
		for _, tc := range []struct{ token, msg string }{{"", "needs a token"}, {"nook_wrong", "not valid"}, {"expired", "expired at"}} {
			if allowed == public {
				if rec := do(tcp, method, p, tc.token); rec.Code != http.StatusOK {
					t.Errorf("%s (public) with token %q: %d %q", r.pattern, tc.token, rec.Code, rec.Body)
				}
				continue
			}
			if rec := do(tcp, method, p, tc.token); rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), tc.msg) {
				t.Errorf("%s with token %q: %d %q", r.pattern, tc.token, rec.Code, rec.Body)
			}
		}
		// A token on the unix socket has its scope there too.
		if allowed == host || allowed == admin {
			if rec := do(unix, method, p, "ro"); rec.Code != http.StatusForbidden {
				t.Errorf("%s with a read-only token on the unix socket: %d %q", r.pattern, rec.Code, rec.Body)
			}
		}
	}
	for p := range want {
		if !seen[p] {
			t.Errorf("TestEscapeTokenScope expects route %s, which the server does not have", p)
		}
	}
	// The read-only refusal says what to do.
	method, p := path("POST /v1/sandboxes/{name}/exec", "box")
	if rec := do(tcp, method, p, "ro"); !strings.Contains(rec.Body.String(), "read-only") {
		t.Errorf("read-only exec: %q", rec.Body)
	}
	method, p = path("POST /v1/sandboxes/{name}/exec", "box")
	if rec := do(tcp, method, p, "stale"); !strings.Contains(rec.Body.String(), "earlier sandbox") {
		t.Errorf("stale sandbox token: %q", rec.Body)
	}
}

// A read-only token passes the access check of POST /v1/ssh-keys (any
// token manages its own keys), but the handler refuses it with 403: it
// may run commands nowhere, so its keys would log in nowhere.
func TestTokenScopeReadOnlySSHKey(t *testing.T) {
	s := scopeServer(t)
	s.mux = s.newMux([]route{{"POST /v1/ssh-keys", accessAnyToken, s.addSSHKey}})
	for _, h := range []http.Handler{s.Handler(true), s.Handler(false)} {
		req := httptest.NewRequest("POST", "/v1/ssh-keys", strings.NewReader(`{"public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGXF1LmvB7yX2m1mWzJf0L8c1xZ5p3VYbHc8m0s6dQ2k me@laptop"}`))
		req.Header.Set("Authorization", "Bearer ro")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), api.CodePermissionDenied) || !strings.Contains(rec.Body.String(), "read-only") {
			t.Errorf("read-only token adding an SSH key: %d %q; want 403 permission_denied saying read-only", rec.Code, rec.Body)
		}
	}
}

// New refuses a route without an access decision.
func TestRouteWithoutAccessPanics(t *testing.T) {
	s := scopeServer(t)
	defer func() {
		if recover() == nil {
			t.Fatal("a route without access was served")
		}
	}()
	s.newMux([]route{{pattern: "GET /v1/new", handler: func(http.ResponseWriter, *http.Request) {}}})
}

// Every route a scope can refuse documents its 403.
func TestOpenAPIScopeDenied(t *testing.T) {
	doc := loadOpenAPI(t)
	for _, r := range (&Server{}).routes() {
		if r.access == accessAnyToken || r.access == accessList || r.access == accessPublic {
			continue
		}
		method, p, _ := strings.Cut(r.pattern, " ")
		item := doc.Paths.Find(p)
		if item == nil || item.GetOperation(method) == nil {
			t.Errorf("%s: not in the spec", r.pattern)
			continue
		}
		if item.GetOperation(method).Responses.Value("403") == nil {
			t.Errorf("%s: a token's scope can refuse it, but the spec has no 403", r.pattern)
		}
	}
}
