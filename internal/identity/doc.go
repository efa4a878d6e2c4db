// Package identity gives every sandbox an identity that anyone can
// verify: short-lived JWTs the daemon signs, and the OIDC documents a
// relying party verifies them with, using any standard library and
// nothing from nook.
//
// # Tokens
//
// ES256 JWTs (go-jose) with a `kid`. Claims: `iss` (Config.Issuer, `nook
// serve --issuer`), `sub` = spiffe://TRUST-DOMAIN/sandbox/ID (the trust
// domain defaults to the issuer's host; a prefix match on
// spiffe://TRUST-DOMAIN/sandbox/ admits any sandbox of this issuer, an
// exact match one sandbox), exactly one `aud` (required, the caller's
// choice, a JSON string), `iat` = `nbf`, `exp` (DefaultTTL, at most
// Config.MaxTTL, never past the sandbox's own expiry), a random `jti`;
// and the sandbox's context: sandbox_id, sandbox_name, template,
// template_build, template_digest (the image manifest digest, for a
// template built from an image), isolation, creator (the name of the
// token that created it; "host" for the daemon's Unix socket), labels,
// parent_id (the sandbox it was forked from) and lineage_id (the first
// sandbox of its line of forks). A fork has a new ID, so a new subject; a
// rollback keeps its sandbox's ID and subject.
//
// # Keys
//
// A ring of P-256 keys in Config.Dir/keys.json (the directory 0700, the
// file 0600, replaced atomically): the current key signs; the next key is
// published (in the JWKS) from its creation, a whole rotation period
// before it signs, so a relying party that caches the key set knows it
// when it starts; a retired key stays published until every token it
// signed has expired (its retirement + MaxTTL), then leaves. Rotation is
// due every Config.RotateEvery (checked whenever a token is signed or the
// key set read) and Rotate forces it. The kid is the key's RFC 7638
// thumbprint (SHA-256, first 16 bytes, base64url).
//
// # Documents
//
// Discovery is the OpenID Provider configuration (issuer, jwks_uri =
// issuer + JWKSPath, ES256); JWKS the key set. The daemon serves both
// without a token at the well-known paths; WriteDocuments writes them
// under a directory at the paths the issuer URL names, for static hosting
// (`nook oidc export DIR`), since relying parties in a cloud cannot reach
// a daemon on a private host.
//
// # The metadata endpoint
//
// Inside a sandbox, http://169.254.169.254/ (and metadata.nook.internal,
// which the sandbox's resolver answers) reaches MetadataHandler, served by
// the daemon on that sandbox's own gateway address: the network package's
// prerouting rule sends the sandbox's TCP to 169.254.169.254:80 to its own
// gateway's MetadataPort (169, privileged), and its input rule admits
// that port from the sandbox's own interface alone, and only into a socket
// carrying the daemon's mark. The caller's identity is that path, not
// anything it says: the daemon also closes unanswered any connection from
// another address than the sandbox's (a process on the host), holds at
// most 16 at once per sandbox, and the handler checks the peer again. It
// serves GET /v1/token?audience=AUD[&ttl=10m] (the token as the body,
// application/jwt), GET /v1/sandbox (the sandbox's facts as JSON) and / (a
// static index of both), and refuses what clouds' metadata servers
// learned to refuse: a request without the header
// `Nook-Metadata: true`, one carrying X-Forwarded-For, Forwarded, Via or
// X-Forwarded-Host (it came through a proxy: SSRF), a Host other than
// 169.254.169.254 or metadata.nook.internal (DNS rebinding), any method
// but GET; and more than 20 token or facts requests a second (burst 40)
// per sandbox.
// Every token issued is logged (the daemon's database, written in
// batches off the request's path, the newest 1000 per sandbox: `nook
// identity log NAME`; the daemon's log at debug level).
//
// An agent told an audience at create (`--identity-audience`) keeps a
// token in /run/nook/identity/token, fetched from the same endpoint at
// half its lifetime and at every wake; a fork's agent (same memory, a new
// sandbox ID in its configuration) removes its parent's token first.
package identity
