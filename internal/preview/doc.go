// Package preview serves preview URLs for nook sandboxes: `nook serve
// --preview-listen ADDR` answers http://PORT-NAME.DOMAIN[:ADDR's port]/
// with what the app listening on TCP port PORT inside sandbox NAME
// answers (HTTP, WebSockets, server-sent events and other streams).
// DOMAIN is --preview-domain, "localhost" by default, under which
// browsers resolve every name to the loopback with no DNS set up:
// `nook expose task 8000` then prints http://8000-task.localhost:8080/.
//
// # Routing
//
// The Host header alone picks the sandbox (Route): its first label is
// PORT-NAME, PORT the digits before the first '-' (1-65535, no leading
// zero), NAME a sandbox name (lowercase letters, digits and '-', so it
// may hold '-' itself), and the rest must be DOMAIN (ASCII
// case-insensitive; a trailing dot and the listener's port are
// ignored). Anything else, another domain, an IP address, a malformed
// label, gets a 404 "no preview here" page and reaches no sandbox: a
// page on another site cannot rebind its own name to this host and so
// read previews (DNS rebinding). CheckDomain validates --preview-domain.
//
// # Access
//
// Only ports exposed with `nook expose NAME PORT` are served. A sandbox
// that does not exist and a port that is not exposed get the same 404
// page, so strangers learn no names. A port exposed with --auth none is
// public; any other needs a token:
//
//   - in the query parameter nook_token: the URL `nook expose` prints.
//     A GET (not a WebSocket upgrade) with a valid one is answered 303 to
//     the same URL without it, setting nook's host-only cookie (HttpOnly,
//     SameSite=Lax, Path=/, expiring with the token), so the token leaves
//     the address bar and history; other requests (a POST, a WebSocket)
//     just use it;
//   - in that cookie: a browser's later requests;
//   - in the header Nook-Preview-Token: programs.
//
// The cookie is __Host-nook_preview (Secure) over TLS, and nook_preview
// over plain HTTP, where browsers refuse the __Host- prefix; each
// connection takes only its own name. Browsers let only the host itself
// set a __Host- cookie, so over TLS a sibling preview can neither plant
// one nor crowd ours out.
//
// A token (Server.Token) is base64url of its expiry (Unix seconds, 8
// bytes) and the first 20 bytes of HMAC-SHA256 under the daemon's key
// of "nook-preview", the sandbox's ID, the exposure's nonce, the port
// and the expiry (NUL separated; an ID or nonce holding a NUL never
// verifies), compared in constant time. It is bound to the sandbox's
// ID, not its name: a sandbox made again under the same name has another
// ID, and the old tokens fail; to the port; and to the exposure: the
// daemon draws a random nonce (PortInfo.Nonce) when it exposes a port
// and drops it when it unexposes it, so `nook unexpose NAME PORT`
// revokes every token minted for the port, even unexpired ones
// (exposing it again prints a new URL). A port that needs a token and
// has no nonce opens to none. A missing, wrong or expired token gets a 401 page telling how to
// get one (`nook expose NAME PORT` prints the URL with its token); a
// stale cookie is deleted, unless the request carried more cookies of
// the name than are checked (8 tokens in all): a sibling preview could
// set a pile of bad ones for the whole domain to make nook delete a
// valid one it did not get to.
//
// # Other sites' pages
//
// Cookies are per host name, so per sandbox and port. But under a
// --preview-domain that is not a public suffix (localhost, a top-level
// name, counts as one; so does any name on the Public Suffix List),
// every preview is the same site as its siblings, other sandboxes'
// apps: SameSite=Lax does not keep the cookie off the requests their
// pages make, and hosts under the domain
// can set cookies for all of it (over plain HTTP, that is why every
// nook_preview cookie a request carries is tried). So a request that
// only the cookie authorizes (no valid token in the query or the
// header, which a foreign page cannot know) is refused with a 403 page
// when:
//
//   - it is a WebSocket upgrade (or another upgrade) whose Origin header
//     is missing or is not the request's own origin, scheme://Host as
//     the browser sent it (https when the listener has TLS; behind a
//     proxy that ends TLS, a browser's WebSocket needs the header token);
//   - its Sec-Fetch-Site is same-site or cross-site (or anything no
//     browser sends) and it is not a top-level navigation: Sec-Fetch-Mode
//     navigate, a GET or HEAD, and Sec-Fetch-Dest document when sent.
//     Links from elsewhere keep working; a sibling's fetches, scripts,
//     images, frames and form POSTs do not;
//   - it has no Sec-Fetch-Site (curl, older browsers), and an Origin
//     header naming another origin on a method other than GET or HEAD.
//
// Requests from the preview's own pages (Sec-Fetch-Site same-origin)
// and typed addresses (none) pass. This guards nook's cookie only: the
// apps' own cookies and requests are theirs to guard, and apps in
// different sandboxes should not trust each other's cookies unless
// DOMAIN is a public suffix.
//
// # Service workers
//
// A service worker outlives its sandbox: registered on PORT-NAME.DOMAIN
// it would serve the next sandbox made under that name, and see its
// token URL. So every request carrying a Service-Worker header (browsers
// send "Service-Worker: script" when fetching a worker's script) gets a
// 403 page, on any routed host, before the sandbox is looked up: no
// preview can register one. And the 303 that turns a token into a
// cookie carries Clear-Site-Data: "cache", "storage", which drops what
// an earlier sandbox of the name may have left (workers, storage,
// cache; browsers heed it on https and on localhost). The app's own
// storage is cleared with it on each visit by token URL.
//
// # What the sandbox sees
//
// The request goes to 127.0.0.1:PORT through the sandbox's agent
// (Sandboxes.DialPort) with the public Host header (the app sees
// PORT-NAME.DOMAIN:LISTEN, as the browser does), X-Forwarded-For,
// -Host and -Proto set by the proxy (any the client sent are dropped),
// and none of nook's credentials: the nook_preview and
// __Host-nook_preview cookies are cut from the Cookie header (the app's
// own cookies stay), Nook-Preview-Token is removed and so is nook_token
// from the query (the other parameters stay as they were). Answers pass
// unbuffered (FlushInterval -1), uncompressed and uncached by the proxy.
//
// The Set-Cookie headers of the app's answers (the final one, a 101, and
// 1xx ones such as 103 Early Hints) lose their Domain attributes, so the
// app sets cookies for its own host only, not for sibling previews or
// the parent domain; a cookie under one of nook's names (ignoring case,
// and a nameless one whose value would read as one) is dropped. The
// rest of each header passes as the app sent it. (Scripts can still set
// domain-wide cookies with document.cookie: hence the rules above.)
//
// # Sandbox states
//
// A running sandbox is proxied. A paused one is woken by the dial when
// Config.Wake is set (the request waits for it), else the request gets a
// 503 page saying so (`nook resume NAME`); the daemon's DialPort may
// still wake a sandbox that paused between the check and the dial. Other
// states get a 503 page naming the state. When nothing listens on the
// port, the page is a 502 "nothing listens on port PORT in sandbox
// NAME". Every page is small HTML (no script, CSP'd, not cached), or
// {"error": msg, "code": status} for a client that accepts
// application/json. Each proxied request calls Sandboxes.Used, and so
// do the bytes of long connections (at most once a second), so an open
// WebSocket in use keeps its sandbox from pausing for idleness.
//
// # Limits and performance
//
// Connections are kept alive: one http.Transport per (sandbox ID, port),
// at most 16 idle connections each, closed after 30s idle; the
// transports are cached up to 1024, least recently used evicted. So a
// request on a warm port costs a map lookup and an HMAC over a direct
// TCP forward, not a dial through the agent. Idle connections are
// dropped when a request finds the sandbox not running (they may be
// dead or frozen), and after 30 s idle; Server.Forget drops a sandbox's
// at once (the daemon leaves them to those two), and the daemon calls
// Server.Close on shutdown.
//
// The request's header size is bounded by the daemon's http.Server
// (MaxHeaderBytes: 431 past it); a request presents at most 8 tokens
// (more are ignored). The headers of the sandbox's answers are untrusted
// and bounded to 256 KiB (a 502 past it). Bodies, in both directions,
// are streamed unbounded: the app decides. The daemon's http.Server
// should have a ReadHeaderTimeout but no WriteTimeout, which would cut
// streams and WebSockets.
package preview
