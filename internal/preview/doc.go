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
//     the same URL without it, setting the host-only cookie
//     nook_preview (HttpOnly, SameSite=Lax, Path=/, Secure over TLS,
//     expiring with the token), so the token leaves the address bar and
//     history; other requests (a POST, a WebSocket) just use it;
//   - in that cookie: a browser's later requests;
//   - in the header Nook-Preview-Token: programs.
//
// A token (Server.Token) is base64url of its expiry (Unix seconds, 8
// bytes) and the first 20 bytes of HMAC-SHA256 under the daemon's key
// of "nook-preview", the sandbox's ID, the port and the expiry (NUL
// separated), compared in constant time. It is bound to the sandbox's
// ID, not its name: a sandbox made again under the same name has another
// ID, and the old tokens fail; and to the port. A missing, wrong or
// expired token gets a 401 page telling how to get one (`nook expose
// NAME PORT` prints the URL with its token); a stale cookie is deleted.
// Cookies are per host name, so per sandbox and port; but hosts under
// one DOMAIN can set cookies for all of it, so every nook_preview cookie
// a request carries is tried, and apps in different sandboxes should not
// trust each other's cookies unless DOMAIN is a public suffix.
//
// # What the sandbox sees
//
// The request goes to 127.0.0.1:PORT through the sandbox's agent
// (Sandboxes.DialPort) with the public Host header (the app sees
// PORT-NAME.DOMAIN:LISTEN, as the browser does), X-Forwarded-For,
// -Host and -Proto set by the proxy (any the client sent are dropped),
// and none of nook's credentials: the nook_preview cookie is cut from
// the Cookie header (the app's own cookies stay), Nook-Preview-Token is
// removed and so is nook_token from the query (the other parameters stay
// as they were). Answers pass unbuffered (FlushInterval -1), uncompressed
// and uncached by the proxy.
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
// dead or frozen); the daemon may call Server.Forget when it pauses or
// removes a sandbox, and Server.Close on shutdown.
//
// The request's header size is bounded by the daemon's http.Server
// (MaxHeaderBytes: 431 past it); a request presents at most 8 tokens
// (more are ignored). The headers of the sandbox's answers are untrusted
// and bounded to 256 KiB (a 502 past it). Bodies, in both directions,
// are streamed unbounded: the app decides. The daemon's http.Server
// should have a ReadHeaderTimeout but no WriteTimeout, which would cut
// streams and WebSockets.
package preview
