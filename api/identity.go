package api

import "time"

// IdentityTokenFile is where a sandbox created with an identity audience
// finds its token, kept fresh by its agent.
const IdentityTokenFile = "/run/nook/identity/token"

// IdentityTokenRequest is the body of POST
// /v1/sandboxes/{name}/identity/token.
type IdentityTokenRequest struct {
	// Audience is the token's one `aud`: the relying party's identifier
	// (e.g. sts.amazonaws.com). Required.
	Audience string `json:"audience"`
	// TTL is the token's lifetime, e.g. "10m" (default 10m, at most the
	// daemon's --identity-max-ttl, never past the sandbox's expiry).
	TTL string `json:"ttl,omitempty"`
}

// IdentityToken is a sandbox's signed identity token (a JWT, ES256) and
// what it says.
type IdentityToken struct {
	Token     string    `json:"token"`
	Issuer    string    `json:"issuer"`
	Subject   string    `json:"subject"`
	Audience  string    `json:"audience"`
	ID        string    `json:"jti"`
	ExpiresAt time.Time `json:"expires_at"`
}

// IdentityLogEntry is one token issued to a sandbox.
type IdentityLogEntry struct {
	Time      time.Time `json:"time"`
	Audience  string    `json:"audience"`
	ID        string    `json:"jti"`
	ExpiresAt time.Time `json:"expires_at"`
	// Via is who asked: "metadata" (the sandbox, at its metadata
	// endpoint) or "api:NAME" (a caller of the API, by token name; "api:host"
	// over the Unix socket without a token).
	Via string `json:"via"`
}

// IdentityLog is the body of GET /v1/sandboxes/{name}/identity/log: the
// newest tokens issued to the sandbox (up to 1000), oldest first.
type IdentityLog struct {
	Entries []IdentityLogEntry `json:"entries"`
}
