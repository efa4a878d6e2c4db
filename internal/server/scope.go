package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/mcpserver"
	"github.com/nookhq/nook/sdk"
)

// access is which callers may use a route. Every route has one; a route
// without (accessUndecided) makes New panic, and TestEscapeTokenScope
// holds the expected answer for every route and scope.
type access int

const (
	accessUndecided access = iota
	// accessAnyToken: any valid token (the spec, host info, templates).
	accessAnyToken
	// accessList: any valid token; a sandbox token sees only its sandbox.
	accessList
	// accessSandboxRead: look at one sandbox (inspect, files, output,
	// watch): admin, read-only, and that sandbox's token.
	accessSandboxRead
	// accessSandboxWrite: run in or change one sandbox (exec, attach,
	// file writes, pause, snapshots, rollback, destroy): admin and that
	// sandbox's token.
	accessSandboxWrite
	// accessAdmin: what reaches beyond one sandbox or widens what it may
	// do (create, fork, templates, network policy, exposed ports, TTL):
	// admin tokens only.
	accessAdmin
	// accessHost: token management, on the unix socket without a token
	// only, so a leaked token cannot mint one that outlives its revocation.
	accessHost
	// accessPublic: anyone, without a token (the identity issuer's
	// discovery document and keys); auth lets publicPath through.
	accessPublic
)

// caller is who made a request.
type caller struct {
	// host: the unix socket without a token (root on the host).
	host  bool
	scope daemon.Scope
	// token is the bearer token's ID and secret ("" for the host).
	tokenID, secret string
}

type callerKey struct{}

func callerFrom(ctx context.Context) caller {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c
}

// Handler returns the API handler. With requireToken (the TCP listener)
// every request must carry a valid bearer token; on the unix socket, which
// only root can open, a request without one is the host (admin, and the
// only caller that may manage tokens) and a request with one gets its scope.
func (s *Server) Handler(requireToken bool) http.Handler {
	return s.logRequests(s.auth(requireToken, s.mux))
}

func (s *Server) auth(requireToken bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if publicPath(r) {
			next.ServeHTTP(w, r) // accessPublic: no caller
			return
		}
		h := r.Header.Get("Authorization")
		if h == "" && !requireToken {
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, caller{host: true, scope: daemon.AdminScope})))
			return
		}
		secret, ok := strings.CutPrefix(h, "Bearer ")
		if !ok || secret == "" {
			writeError(w, http.StatusUnauthorized, api.CodeUnauthorized, "this API needs a token: create one on the host with `nook token create` and set NOOK_TOKEN (header Authorization: Bearer <token>)")
			return
		}
		ti, err := s.authenticate(r.Context(), secret)
		if err != nil {
			var expired *daemon.TokenExpiredError
			if errors.As(err, &expired) {
				writeError(w, http.StatusUnauthorized, api.CodeUnauthorized, expired.Error())
				return
			}
			if !errors.Is(err, errdefs.ErrNotFound) {
				s.log.Error("token check failed", "err", err)
			}
			writeError(w, http.StatusUnauthorized, api.CodeUnauthorized, "the token is not valid (revoked or mistyped): create one with `nook token create`")
			return
		}
		c := caller{scope: ti.Scope, tokenID: ti.ID, secret: secret}
		ctx := context.WithValue(r.Context(), callerKey{}, c)
		ctx = daemon.WithCreator(ctx, ti.Name)
		ctx = daemon.WithTokenID(ctx, ti.ID)
		if ti.Scope.Kind == api.ScopeReadOnly {
			ctx = daemon.LookOnly(ctx)
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// authorize lets a request through to h if its caller's scope allows
// access, else answers 403 saying why.
func (s *Server) authorize(a access, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if msg := s.denied(r, a); msg != "" {
			writeError(w, http.StatusForbidden, api.CodePermissionDenied, msg)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// denied returns why the request's caller may not use a route of access
// a, or "" if it may.
func (s *Server) denied(r *http.Request, a access) string {
	if a == accessPublic && publicPath(r) {
		return ""
	}
	c := callerFrom(r.Context())
	if c.scope.Kind == "" {
		return "the request has no caller (this is a bug in nook)"
	}
	what := r.Method + " " + r.URL.Path
	switch a {
	case accessHost:
		if !c.host {
			return "tokens are managed on the host only, over the unix socket without a token: run `nook token` there"
		}
		return ""
	case accessAnyToken, accessList:
		return ""
	case accessAdmin:
		if c.scope.Kind != api.ScopeAdmin {
			return fmt.Sprintf("%s needs an admin token; this token's scope is %s", what, c.scope)
		}
		return ""
	case accessSandboxRead, accessSandboxWrite:
		switch c.scope.Kind {
		case api.ScopeAdmin:
			return ""
		case api.ScopeReadOnly:
			if a == accessSandboxRead {
				return ""
			}
			return fmt.Sprintf("this token is read-only: it may look at sandboxes but not run commands in them or change them (%s); use a token with scope sandbox:NAME or admin", what)
		case daemon.ScopeSandbox:
			return s.sandboxDenied(r, c.scope)
		}
	}
	return fmt.Sprintf("%s is not allowed to a token of scope %s", what, c.scope)
}

// sandboxDenied checks that the route's sandbox is the scope's: the same
// name and the same sandbox (not a later one given the name).
func (s *Server) sandboxDenied(r *http.Request, sc daemon.Scope) string {
	name := r.PathValue("name")
	if name != sc.Sandbox {
		return fmt.Sprintf("this token is for sandbox %s only: it cannot reach sandbox %s", sc.Sandbox, name)
	}
	id, err := s.sandboxID(r.Context(), name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "" // the handler reports it
	}
	if err != nil { // fail closed: nothing unchecked goes through
		return fmt.Sprintf("the sandbox %s this token is for could not be checked (%v): try again", name, err)
	}
	if id != sc.SandboxID {
		return fmt.Sprintf("this token was made for an earlier sandbox named %s, which was destroyed: create a new token for this one", name)
	}
	return ""
}

// mcpServers caps the cache of per-token MCP servers; past it the cache
// starts afresh (sessions keep the server they started with).
const mcpServers = 256

// EnableMCP serves nook's MCP tools over streamable HTTP at /mcp. Each
// session's tools reach the daemon through the unix socket at socket,
// carrying the token that opened the session, so a token's scope applies
// to the tools exactly as to the API (a read-only token's exec fails with
// the same message). The SDK binds a session to its token's ID: another
// token cannot use it.
func (s *Server) EnableMCP(socket string) error {
	hostClient, err := sdk.New("unix://"+socket, "")
	if err != nil {
		return err
	}
	host := mcpserver.New(hostClient, daemon.Version)
	var mu sync.Mutex
	perToken := map[string]*mcp.Server{}
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		c := callerFrom(r.Context())
		if c.secret == "" {
			return host
		}
		mu.Lock()
		defer mu.Unlock()
		if srv := perToken[c.tokenID]; srv != nil {
			return srv
		}
		cl, err := sdk.New("unix://"+socket, c.secret)
		if err != nil {
			s.log.Error("mcp client", "err", err)
			return nil
		}
		if len(perToken) >= mcpServers {
			clear(perToken)
		}
		srv := mcpserver.New(cl, daemon.Version)
		perToken[c.tokenID] = srv
		return srv
	}, nil)
	verify := func(ctx context.Context, _ string, _ *http.Request) (*auth.TokenInfo, error) {
		c := callerFrom(ctx)
		if c.tokenID == "" {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: c.tokenID, Scopes: []string{c.scope.String()}}, nil
	}
	withToken := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(h)
	s.mux.Handle("/mcp", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if callerFrom(r.Context()).tokenID != "" {
			withToken.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	}))
	return nil
}
