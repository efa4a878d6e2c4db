package daemon

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/store"
)

// DefaultTokenTTL is how long a token works unless its creator says
// otherwise ("never" for no expiry).
const DefaultTokenTTL = 30 * 24 * time.Hour

// Scope is what a token may do.
type Scope struct {
	// Kind is api.ScopeAdmin, api.ScopeReadOnly or "sandbox".
	Kind string
	// Sandbox and SandboxID name the one sandbox of a "sandbox" scope.
	Sandbox   string
	SandboxID string
}

// ScopeSandbox is the Kind of a one-sandbox scope.
const ScopeSandbox = "sandbox"

// AdminScope is the unix socket's scope, and an admin token's.
var AdminScope = Scope{Kind: api.ScopeAdmin}

func (s Scope) String() string {
	if s.Kind == ScopeSandbox {
		return api.ScopeSandboxPrefix + s.Sandbox
	}
	return s.Kind
}

// ParseScope parses "admin", "read-only" or "sandbox:NAME" (the sandbox's
// ID is not filled in).
func ParseScope(s string) (Scope, error) {
	switch s {
	case "", api.ScopeAdmin:
		return AdminScope, nil
	case api.ScopeReadOnly:
		return Scope{Kind: api.ScopeReadOnly}, nil
	}
	name, ok := strings.CutPrefix(s, api.ScopeSandboxPrefix)
	if !ok {
		return Scope{}, errdefs.Invalid("token scope %q is not valid: use admin, read-only or sandbox:NAME", clipScope(s))
	}
	if err := core.ValidateName(name); err != nil {
		return Scope{}, errdefs.Invalid("token scope %q: %v", clipScope(s), err)
	}
	return Scope{Kind: ScopeSandbox, Sandbox: name}, nil
}

func clipScope(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// TokenInfo is an authenticated token.
type TokenInfo struct {
	ID        string
	Name      string // its name, else its ID
	Scope     Scope
	ExpiresAt time.Time // zero: never
}

// TokenExpiredError says a token was valid but has expired.
type TokenExpiredError struct{ At time.Time }

func (e *TokenExpiredError) Error() string {
	return fmt.Sprintf("the token expired at %s: create a new one on the host with `nook token create --ttl DURATION`", e.At.UTC().Format(time.RFC3339))
}

// Unwrap makes an expired token a permission error.
func (e *TokenExpiredError) Unwrap() error { return errdefs.ErrPermissionDenied }

// CreateToken makes an API token; its secret is returned only now. A
// sandbox scope binds the token to the sandbox that has the name now.
func (m *Manager) CreateToken(ctx context.Context, req api.CreateTokenRequest) (api.Token, error) {
	if len(req.Name) > 100 {
		return api.Token{}, errdefs.Invalid("token name is longer than 100 characters")
	}
	if req.Name == "host" {
		// Identity tokens name the creator of a sandbox: "host" is the
		// Unix socket without a token.
		return api.Token{}, errdefs.Invalid(`token name "host" is reserved (it names the daemon's Unix socket as a sandbox's creator): pick another`)
	}
	scope, err := ParseScope(req.Scope)
	if err != nil {
		return api.Token{}, err
	}
	if scope.Kind == ScopeSandbox {
		sb, err := m.Get(ctx, scope.Sandbox)
		if err != nil {
			return api.Token{}, fmt.Errorf("token scope %s: %w", scope, err)
		}
		scope.SandboxID = sb.ID
	}
	now := time.Now()
	var expires time.Time
	switch req.TTL {
	case "never":
	case "":
		expires = now.Add(DefaultTokenTTL)
	default:
		d, err := core.ParseDuration(req.TTL)
		if err != nil {
			return api.Token{}, fmt.Errorf("token ttl: %w", err)
		}
		if d <= 0 {
			return api.Token{}, errdefs.Invalid("token ttl %q is not positive: give a duration such as 12h or 30d, or never", req.TTL)
		}
		expires = now.Add(d)
	}
	quotas, err := parseQuotas(req.Quotas)
	if err != nil {
		return api.Token{}, err
	}
	b := make([]byte, 32)
	rand.Read(b)
	secret := "nook_" + base64.RawURLEncoding.EncodeToString(b)
	if req.E2B {
		secret = "e2b_" + hex.EncodeToString(b)
	}
	sum := sha256.Sum256([]byte(secret))
	t := store.Token{ID: newID()[:12], Name: req.Name, Hash: sum[:], CreatedAt: now, Scope: scope.String(), SandboxID: scope.SandboxID, ExpiresAt: expires}
	if err := m.store.InsertToken(ctx, t); err != nil {
		return api.Token{}, err
	}
	if err := m.store.SetTokenQuotas(ctx, t.ID, quotas); err != nil {
		// Its secret was never shown: nobody can use it.
		m.store.DeleteToken(context.WithoutCancel(ctx), t.ID)
		return api.Token{}, err
	}
	out := tokenView(t)
	out.Secret = secret
	out.Quotas = quotasView(quotas)
	return out, nil
}

func tokenView(t store.Token) api.Token {
	out := api.Token{ID: t.ID, Name: t.Name, Scope: t.Scope, CreatedAt: t.CreatedAt.UTC()}
	if !t.ExpiresAt.IsZero() {
		e := t.ExpiresAt.UTC()
		out.ExpiresAt = &e
	}
	return out
}

// Tokens lists tokens (never their secrets), with their quotas and
// what counts against them.
func (m *Manager) Tokens(ctx context.Context) ([]api.Token, error) {
	ts, err := m.store.ListTokens(ctx)
	if err != nil {
		return nil, err
	}
	quotas, err := m.store.AllTokenQuotas(ctx)
	if err != nil {
		return nil, err
	}
	usage, err := m.store.AllTokenUsage(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Token, 0, len(ts))
	for _, t := range ts {
		v := tokenView(t)
		v.Quotas, v.Usage = quotasView(quotas[t.ID]), usageView(usage[t.ID])
		out = append(out, v)
	}
	return out, nil
}

// RevokeToken deletes a token.
func (m *Manager) RevokeToken(ctx context.Context, id string) error {
	return m.store.DeleteToken(ctx, id)
}

// Authenticate checks a bearer token's secret and returns what it may do.
// Secrets are 256 random bits, so an unsalted SHA-256 is enough to keep
// them unrecoverable from the database. An expired token is a
// *TokenExpiredError.
func (m *Manager) Authenticate(ctx context.Context, secret string) (*TokenInfo, error) {
	if secret == "" {
		return nil, errdefs.NotFound("no token")
	}
	sum := sha256.Sum256([]byte(secret))
	t, err := m.store.TokenByHash(ctx, sum[:])
	if err != nil {
		return nil, err
	}
	if !t.ExpiresAt.IsZero() && !time.Now().Before(t.ExpiresAt) {
		return nil, &TokenExpiredError{At: t.ExpiresAt}
	}
	scope, err := ParseScope(t.Scope)
	if err != nil {
		// A scope this nook cannot read grants nothing.
		return nil, fmt.Errorf("token %s: %w", t.ID, err)
	}
	scope.SandboxID = t.SandboxID
	name := t.Name
	if name == "" {
		name = t.ID
	}
	return &TokenInfo{ID: t.ID, Name: name, Scope: scope, ExpiresAt: t.ExpiresAt}, nil
}

type lookOnlyKey struct{}

// LookOnly marks a call made for a caller that may only look (a
// read-only token): it reads a running sandbox, but never wakes a paused
// one (that would run code an admin stopped).
func LookOnly(ctx context.Context) context.Context {
	return context.WithValue(ctx, lookOnlyKey{}, true)
}

func lookOnly(ctx context.Context) bool {
	v, _ := ctx.Value(lookOnlyKey{}).(bool)
	return v
}
