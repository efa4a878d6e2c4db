package daemon

import (
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/store"
)

// FuzzParseScope: a scope string from an API client parses to a scope
// that prints back to itself, or is refused; it never panics.
func FuzzParseScope(f *testing.F) {
	for _, s := range []string{"", "admin", "read-only", "sandbox:task", "sandbox:", "sandbox:../x", "Sandbox:a", "sandbox:a:b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sc, err := ParseScope(s)
		if err != nil {
			return
		}
		switch sc.Kind {
		case "admin", "read-only":
			if sc.Sandbox != "" {
				t.Fatalf("%q: %+v", s, sc)
			}
		case ScopeSandbox:
			if sc.Sandbox == "" || sc.String() != s {
				t.Fatalf("%q: %+v prints as %q", s, sc, sc.String())
			}
		default:
			t.Fatalf("%q: kind %q", s, sc.Kind)
		}
		again, err := ParseScope(sc.String())
		if err != nil || again != sc {
			t.Fatalf("%q -> %q -> %+v, %v", s, sc.String(), again, err)
		}
	})
}

// An expired token is refused with when it expired; a live one works, and
// a sandbox scope needs the sandbox and is bound to its ID.
func TestEscapeTokenExpired(t *testing.T) {
	m, _ := newManager(t)
	ctx := context.Background()
	live, err := m.CreateToken(ctx, api.CreateTokenRequest{Name: "live", TTL: "1h", Scope: "read-only"})
	if err != nil {
		t.Fatal(err)
	}
	if live.ExpiresAt == nil || time.Until(*live.ExpiresAt) > time.Hour || time.Until(*live.ExpiresAt) < 59*time.Minute {
		t.Fatalf("expires %v", live.ExpiresAt)
	}
	ti, err := m.Authenticate(ctx, live.Secret)
	if err != nil || ti.Scope.Kind != api.ScopeReadOnly || ti.ID != live.ID {
		t.Fatalf("%+v %v", ti, err)
	}
	// Default: 30 days; never: no expiry.
	def, err := m.CreateToken(ctx, api.CreateTokenRequest{})
	if err != nil || def.ExpiresAt == nil || time.Until(*def.ExpiresAt) < DefaultTokenTTL-time.Minute || def.Scope != "admin" {
		t.Fatalf("%+v %v", def, err)
	}
	never, err := m.CreateToken(ctx, api.CreateTokenRequest{TTL: "never"})
	if err != nil || never.ExpiresAt != nil {
		t.Fatalf("%+v %v", never, err)
	}
	// A token whose time has passed (stored as it would be by then).
	secret := "nook_expired-for-test"
	sum := sha256.Sum256([]byte(secret))
	at := time.Now().Add(-time.Second)
	if err := m.store.InsertToken(ctx, store.Token{ID: "exp", Hash: sum[:], CreatedAt: at.Add(-time.Hour), Scope: "admin", ExpiresAt: at}); err != nil {
		t.Fatal(err)
	}
	_, err = m.Authenticate(ctx, secret)
	var expired *TokenExpiredError
	if !errors.As(err, &expired) || !strings.Contains(err.Error(), "expired at") || !strings.Contains(err.Error(), "nook token create") {
		t.Fatalf("expired token: %v", err)
	}
	for _, bad := range []api.CreateTokenRequest{{TTL: "-1h"}, {TTL: "0s"}, {TTL: "soon"}, {Scope: "root"}, {Scope: "sandbox:Bad Name"}} {
		if _, err := m.CreateToken(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if _, err := m.CreateToken(ctx, api.CreateTokenRequest{Scope: "sandbox:nosuch"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("scope of a missing sandbox: %v", err)
	}
}
