package sdk

import (
	"context"
	"encoding/json"

	"github.com/nookhq/nook/api"
)

// IdentityToken issues a sandbox's identity token (a JWT) for one
// audience; ttl "" is the daemon's default (10m).
func (c *Client) IdentityToken(ctx context.Context, name, audience, ttl string) (*api.IdentityToken, error) {
	var out api.IdentityToken
	return &out, c.call(ctx, "POST", "/v1/sandboxes/"+esc(name)+"/identity/token", api.IdentityTokenRequest{Audience: audience, TTL: ttl}, &out)
}

// IdentityLog lists the identity tokens issued to a sandbox.
func (c *Client) IdentityLog(ctx context.Context, name string) (*api.IdentityLog, error) {
	var out api.IdentityLog
	return &out, c.call(ctx, "GET", "/v1/sandboxes/"+esc(name)+"/identity/log", nil, &out)
}

// RotateIdentityKeys retires the identity signing key now (the Unix
// socket without a token only).
func (c *Client) RotateIdentityKeys(ctx context.Context) error {
	return c.call(ctx, "POST", "/v1/identity/rotate", nil, nil)
}

// IdentityDocuments returns the identity issuer's OpenID Provider
// configuration and its key set (JWKS), as served.
func (c *Client) IdentityDocuments(ctx context.Context) (discovery, jwks json.RawMessage, err error) {
	if err := c.call(ctx, "GET", "/.well-known/openid-configuration", nil, &discovery); err != nil {
		return nil, nil, err
	}
	if err := c.call(ctx, "GET", "/.well-known/jwks.json", nil, &jwks); err != nil {
		return nil, nil, err
	}
	return discovery, jwks, nil
}
