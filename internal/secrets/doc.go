// Package secrets keeps credentials out of sandboxes: a sandbox holds a
// placeholder, and the host puts the value into requests to the hosts
// the secret is bound to, and nowhere else.
//
// # Storage
//
// Values are sealed with AES-256-GCM (Box) under a key in
// DATA/secrets/key (0600, its directory 0700, written whole before it is
// used), each bound to its name as additional data; the daemon keeps
// the sealed values in its database with the name of the token that set
// each (its owner: only it, or the host's socket, binds, replaces or
// removes it, in one statement each: no check-then-write race). Each
// secret has an ID, new each time its name is made: a binding holds the
// ID, so a secret removed and made again under its name, by anyone, is
// not the bound one (its requests are refused). Values are opened on
// first use and kept in the daemon's memory only; they are never logged
// and no API returns them.
//
// # Bindings and placeholders
//
// nook create --secret NAME@HOST[,HOST...][:option...] (ParseBinding)
// binds a secret to exact names or *.suffix (not a public suffix of the
// Public Suffix List, such as *.github.io: anyone has names below it;
// a domain whose subdomains hold public suffixes, such as amazonaws.com,
// the list cannot tell: bind exact names there), in a header (Authorization
// by default, where a Basic credential's password is replaced too), with
// :format='Bearer {}' to write the whole header, :path=/prefix and
// :methods=GET,POST to narrow it, :query and :body to replace the
// placeholder there too, and :inherit to keep it in forks. Each binding
// gets a random placeholder (nook_secret_ and 40 hex digits) in the
// sandbox's variable NAME; a fork gets new ones for the bindings it
// inherits, and loses the others' variables. Its parent's placeholders,
// which its processes restored from the snapshot still hold, are kept
// retired: a request carrying one is refused with a reason that says
// so (a 403, not the remote's 401).
//
// # Interception
//
// Each sandbox with bindings gets a CA (NewCA: ECDSA P-256, its name
// constraints permitting only the bound hosts' domains, the key sealed
// in the database, a fork keeps its parent's) that its agent installs:
// /etc/nook/secrets-ca.crt, appended to the system bundle, and
// /etc/nook/ca-bundle.crt (system roots and it) named by SSL_CERT_FILE,
// REQUESTS_CA_BUNDLE, NODE_EXTRA_CA_CERTS, GIT_SSL_CAINFO, PIP_CERT and
// CURL_CA_BUNDLE. Its TCP to ports 80 and 443 goes to its egress proxy
// whatever its policy (the network package's intercept set), as domain
// rules' TCP always does (internal/egress). When a ClientHello names a
// bound host that the sandbox's resolver resolved to the destination,
// the proxy hands the connection to Sandbox.Serve, which terminates TLS
// with a certificate for that name from the sandbox's CA (HTTP/1.1 or
// HTTP/2 by ALPN) and forwards each request with Go's reverse proxy over
// TLS to the same destination, verified against the host's trust store
// (SSL_CERT_FILE when the daemon has it). Every request must name the
// connection's host; the placeholders of the bindings that apply are
// replaced, and a placeholder left anywhere (another header, a cookie,
// the path, a query without :query, a request the binding's path or
// methods exclude, a removed secret) gets a 403 with a Nook-Refused
// header naming the secret and why, and an entry in nook net log. A
// binding's path applies only to a plain path (no dot segments, no
// encoded slash, dot, backslash or percent, no backslash or semicolon),
// its methods only without a method-override header; the bound header
// given twice, or over 8 KiB, is refused; an upgrade other than
// WebSocket is refused.
// Plain HTTP carrying a placeholder is refused the same way by the proxy
// (InRequest). Answers are asked for uncompressed (Go's transport asks
// for gzip and decodes it; any other Content-Encoding is a 502) and
// scrubbed, headers (103 Early Hints' too), body and trailers, of each
// bound value raw, base64 and URL-encoded, and of the exact Basic
// credential sent: an upstream that echoes the request shows the
// placeholder. A request that carried a value is sent without Range, so
// no answer holds part of one. WebSocket upgrades pass through (their
// frames are not scrubbed). Connections to hosts no secret is bound to
// are never decrypted: they are spliced after the name check.
//
// Limits: an intercepted connection takes 16 HTTP/2 streams and 64 KiB
// of headers; a sandbox keeps one transport per bound name and address
// (at most 64), each at most 8 upstream connections (more requests
// wait), answers' headers within 5 minutes. Its client connections
// count in the egress proxy's 1024.
//
// What it does not do: a placeholder sent over TLS to a host it is not
// bound to leaves as it is (nook does not decrypt that connection): it
// is worthless there. A body's placeholder is not looked for without
// :body. A value the upstream returns transformed (hashed, split,
// base64 at another offset or unpadded, JSON-escaped, hex) is not
// recognized: bind secrets to hosts that do not echo them. The daemon
// dials upstreams itself, so the host's own firewall rules for
// forwarded traffic do not see intercepted connections (the dial
// refuses the host's addresses and the sandboxes').
package secrets
