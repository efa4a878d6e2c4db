package preview

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
)

// The names of nook's own credentials on a request. The proxy removes
// them all before the request goes to the sandbox.
const (
	// QueryParam carries a token in the URL `nook expose` prints.
	QueryParam = "nook_token"
	// CookieName is the host-only cookie a first visit with QueryParam
	// sets over plain HTTP; over TLS it is "__Host-" + CookieName.
	CookieName = "nook_preview"
	// HeaderName carries a token for programs (curl, scripts).
	HeaderName = "Nook-Preview-Token"
)

// maxTransports bounds the cache of keep-alive pools, one per sandbox
// and port: past it the least recently used pool is closed.
const maxTransports = 1024

// Sandboxes is what the preview server needs of the daemon.
type Sandboxes interface {
	// Port describes port of sandbox name: errdefs.ErrNotFound (wrapped)
	// when there is no such sandbox.
	Port(ctx context.Context, name string, port int) (PortInfo, error)
	// DialPort connects to port inside the sandbox (waking it when
	// paused).
	DialPort(ctx context.Context, name string, port int) (net.Conn, error)
	// Used tells the daemon the sandbox was used now (its idle clock
	// restarts).
	Used(sandboxID string)
}

// PortInfo is what the daemon knows of one port of one sandbox.
type PortInfo struct {
	SandboxID string
	State     string // "running", "paused", "stopped", "failed", "creating", "destroying"
	Exposed   bool   // `nook expose NAME PORT` was done
	Public    bool   // exposed with --auth none: no token needed
	// Nonce is the daemon's random value for this exposure of the port,
	// drawn when it is exposed and dropped when it is unexposed: tokens
	// are bound to it (Server.Token), so unexposing revokes them all. A
	// port that needs a token and has no nonce opens to none.
	Nonce string
}

// Config configures a Server.
type Config struct {
	// Domain is the parent of the preview host names, PORT-NAME.Domain
	// (any port in the Host header is ignored). Empty means "localhost".
	// The daemon checks it with CheckDomain: with an invalid one nothing
	// routes.
	Domain string
	// Key signs tokens: at least 32 bytes (New panics on a shorter one).
	Key []byte
	// Wake lets an authorized request wake a paused sandbox; without it
	// the request gets a 503 page saying the sandbox is paused.
	Wake bool
	// Log receives unexpected errors only; nil discards them.
	Log *slog.Logger
}

// Server serves preview URLs: an http.Handler for the preview listener.
type Server struct {
	sb     Sandboxes
	domain string
	key    []byte
	wake   bool
	log    *slog.Logger
	proxy  *httputil.ReverseProxy
	pool   pool
}

// New returns a Server over sb.
func New(sb Sandboxes, cfg Config) *Server {
	if len(cfg.Key) < 32 {
		panic("preview: Config.Key must be at least 32 bytes")
	}
	s := &Server{
		sb:     sb,
		domain: normDomain(cfg.Domain),
		key:    append([]byte(nil), cfg.Key...),
		wake:   cfg.Wake,
		log:    cfg.Log,
	}
	if s.domain == "" {
		s.domain = "localhost"
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if err := CheckDomain(s.domain); err != nil {
		s.log.Error("preview: no host name will route", "err", err)
	}
	s.pool.init(s, maxTransports)
	s.proxy = &httputil.ReverseProxy{
		Rewrite:   s.rewrite,
		Transport: poolTransport{s},
		// Server-sent events and other streams pass as they come.
		FlushInterval:  -1,
		ModifyResponse: s.modifyResponse,
		ErrorHandler:   s.proxyError,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	return s
}

// Domain is the domain the server answers for (normalized).
func (s *Server) Domain() string { return s.domain }

// target is the sandbox port a request goes to, in its context.
type target struct {
	name string
	id   string
	port int
}

type targetKey struct{}

func targetOf(ctx context.Context) *target {
	t, _ := ctx.Value(targetKey{}).(*target)
	return t
}

// ServeHTTP routes a request by its Host header to a port in a sandbox.
//
// The size of the request's headers is bounded by the daemon's
// http.Server (MaxHeaderBytes: net/http answers 431 past it); bodies are
// streamed to the sandbox unbounded, as the app decides what it accepts.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, port, ok := Route(r.Host, s.domain)
	if !ok {
		// Another domain, an IP address, a malformed label: this never
		// reaches a sandbox (which defeats DNS rebinding).
		s.page(w, r, http.StatusNotFound, msgNoPreview)
		return
	}
	// A service worker outlives its sandbox: registered on PORT-NAME, it
	// would serve (and could read the token URL of) the next sandbox made
	// under that name. Browsers fetch a worker's script with this header:
	// refusing it for every preview host, before any lookup, keeps them
	// all from registering one and tells strangers nothing.
	if len(r.Header.Values("Service-Worker")) > 0 {
		s.page(w, r, http.StatusForbidden, msgServiceWorker)
		return
	}
	info, err := s.sb.Port(r.Context(), name, port)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalidArgument) {
			s.page(w, r, http.StatusNotFound, msgNoPreview)
			return
		}
		if r.Context().Err() == nil {
			s.log.Error("preview: looking up a sandbox port failed", "sandbox", name, "port", port, "err", err)
		}
		s.page(w, r, http.StatusInternalServerError, "nook could not look up this preview: see the daemon's log")
		return
	}
	// A port that is not exposed answers exactly as a sandbox that does
	// not exist: strangers learn no names.
	if !info.Exposed {
		s.page(w, r, http.StatusNotFound, msgNoPreview)
		return
	}
	if !info.Public && !s.authorize(w, r, name, port, info) {
		return
	}
	switch info.State {
	case "running":
	case "paused":
		if !s.wake {
			s.page(w, r, http.StatusServiceUnavailable, "sandbox "+name+" is paused: `nook resume "+name+"`")
			return
		}
		// Connections kept alive from before the pause may be dead or
		// frozen: dial afresh, which wakes the sandbox.
		s.pool.closeIdle(info.SandboxID)
	case "stopped":
		s.pool.closeIdle(info.SandboxID)
		s.page(w, r, http.StatusServiceUnavailable, "sandbox "+name+" is stopped: `nook start "+name+"`")
		return
	default:
		s.pool.closeIdle(info.SandboxID)
		s.page(w, r, http.StatusServiceUnavailable, "sandbox "+name+" is "+info.State)
		return
	}
	s.sb.Used(info.SandboxID)
	t := &target{name: name, id: info.SandboxID, port: port}
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, t)))
}

const (
	msgNoPreview     = "no preview here: nothing is exposed at this address (`nook expose NAME PORT` makes a preview URL)"
	msgServiceWorker = "preview URLs take no service workers: one would outlive its sandbox and serve the next sandbox made under the same name"
)

// rewrite makes the request the sandbox sees: to 127.0.0.1:PORT, with
// the public Host, X-Forwarded-*, and none of nook's credentials.
func (s *Server) rewrite(pr *httputil.ProxyRequest) {
	t := targetOf(pr.In.Context())
	port := 0
	if t != nil {
		port = t.port
	}
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	pr.Out.Host = pr.In.Host
	pr.Out.URL.RawQuery = stripQuery(pr.Out.URL.RawQuery, QueryParam)
	pr.Out.Header.Del(HeaderName)
	stripCookie(pr.Out.Header, CookieName)
	stripCookie(pr.Out.Header, hostCookieName)
	pr.SetXForwarded()
}

// modifyResponse cleans the sandbox's answer (101s included) before it
// passes: see sanitizeSetCookies. 1xx answers that are not final pass
// earlier, cleaned by poolTransport.
func (s *Server) modifyResponse(resp *http.Response) error {
	sanitizeSetCookies(resp.Header)
	return nil
}

// dialError marks an error of sb.DialPort, so that proxyError tells "no
// connection" from "a connection that broke".
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// proxyError answers a request the proxy could not pass on.
func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	t := targetOf(r.Context())
	if t == nil { // cannot happen: ServeHTTP always sets it
		s.page(w, r, http.StatusBadGateway, "bad gateway")
		return
	}
	if r.Context().Err() != nil {
		// The client went away: nobody reads the answer.
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	port := strconv.Itoa(t.port)
	var de *dialError
	if !errors.As(err, &de) {
		// Connected, but no valid answer: the app closed the connection,
		// sent a malformed or oversized header.
		s.log.Debug("preview: the sandbox's answer failed", "sandbox", t.name, "port", t.port, "err", err)
		s.page(w, r, http.StatusBadGateway, "the app on port "+port+" in sandbox "+t.name+" sent no valid answer")
		return
	}
	switch {
	case errors.Is(err, errdefs.ErrLimit), errors.Is(err, errdefs.ErrResourceExhausted):
		s.page(w, r, http.StatusServiceUnavailable, "sandbox "+t.name+" cannot run now: the host is at its limit")
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		s.page(w, r, http.StatusServiceUnavailable, "sandbox "+t.name+" is not running")
	case errors.Is(err, errdefs.ErrUnavailable):
		s.page(w, r, http.StatusServiceUnavailable, "sandbox "+t.name+" does not answer now: try again later")
	default:
		// ErrNotFound is the agent's "nothing answers on the port" (or
		// the sandbox went away since the lookup); an uncategorized error
		// is unexpected.
		if !errors.Is(err, errdefs.ErrNotFound) && !errors.Is(err, errdefs.ErrInvalidArgument) &&
			!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			var ne *net.OpError
			if !errors.As(err, &ne) {
				s.log.Warn("preview: dialing a sandbox port failed", "sandbox", t.name, "port", t.port, "err", err)
			}
		}
		s.page(w, r, http.StatusBadGateway, "nothing listens on port "+port+" in sandbox "+t.name)
	}
}

// authorize checks the request's token for the port: true lets it
// through; false means it has been answered (a 303 that turns the URL's
// token into a cookie, a 401, or a 403 for a cookie used from another
// site's page).
func (s *Server) authorize(w http.ResponseWriter, r *http.Request, name string, port int, info PortInfo) bool {
	now := time.Now()
	cookie := cookieName(r)
	var (
		validQuery, validHeader, validCookie bool
		expired, badCookie, crowded          bool
		queryTok                             string
		queryExp                             int64
		n                                    int // tokens checked: bounded
	)
	check := func(tok string) (tokenResult, int64) {
		n++
		res, exp := s.verify(tok, info.SandboxID, port, info.Nonce, now)
		if res == tokenExpired {
			expired = true
		}
		return res, exp
	}
	for _, tok := range queryValues(r.URL.RawQuery, QueryParam, maxTokens) {
		if res, exp := check(tok); res == tokenValid && !validQuery {
			validQuery, queryTok, queryExp = true, tok, exp
		}
	}
	for _, tok := range r.Header.Values(HeaderName) {
		if n >= maxTokens {
			break
		}
		if res, _ := check(tok); res == tokenValid {
			validHeader = true
		}
	}
	// Every cookie under our name counts: over plain HTTP another host
	// under the domain may have set some for the whole domain next to
	// ours (over TLS the __Host- prefix forbids that).
	for _, c := range r.CookiesNamed(cookie) {
		if n >= maxTokens {
			crowded = true // ours may be among those left unchecked
			break
		}
		if res, _ := check(c.Value); res == tokenValid {
			validCookie = true
		} else {
			badCookie = true
		}
	}
	if validQuery && (r.Method == http.MethodGet || r.Method == http.MethodHead) && !isUpgrade(r) {
		// The first visit, from the printed URL: keep the token in a
		// host-only cookie and take it out of the address bar (and so
		// out of history, bookmarks and Referer headers).
		http.SetCookie(w, &http.Cookie{
			Name:     cookie,
			Value:    queryTok,
			Path:     "/",
			Expires:  time.Unix(queryExp, 0),
			HttpOnly: true,
			Secure:   r.TLS != nil,
			SameSite: http.SameSiteLaxMode,
		})
		h := w.Header()
		h.Set("Location", redirectTarget(r))
		h.Set("Cache-Control", "no-store")
		h.Set("Referrer-Policy", "no-referrer")
		// The origin may have served an earlier sandbox of the same
		// name: drop what that one's pages left in the browser (service
		// workers, storage, cache), which this sandbox's pages would
		// otherwise run with. The cookie set above stays.
		h.Set("Clear-Site-Data", `"cache", "storage"`)
		w.WriteHeader(http.StatusSeeOther)
		return false
	}
	// A token in the query or the header was put there by whoever made
	// the request, which a page of another site cannot know; the
	// cookie, the browser adds to any request to this host.
	if validQuery || validHeader {
		return true
	}
	if validCookie {
		if foreignCookieUse(r) {
			s.page(w, r, http.StatusForbidden, msgForeignCookie)
			return false
		}
		return true
	}
	if badCookie && !crowded {
		// A stale cookie (expired, or of a sandbox since remade or a port
		// since unexposed): drop it. Not when cookies went unchecked: a
		// sibling preview may have crowded ours out with invalid ones,
		// and ours, unseen, may be valid.
		http.SetCookie(w, &http.Cookie{Name: cookie, Value: "", Path: "/", MaxAge: -1,
			HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteLaxMode})
	}
	w.Header().Set("WWW-Authenticate", `Nook-Preview-Token realm="nook preview"`)
	how := "`nook expose " + name + " " + strconv.Itoa(port) + "` prints its URL with a token"
	if expired {
		s.page(w, r, http.StatusUnauthorized, "the token for port "+strconv.Itoa(port)+" of sandbox "+name+" has expired: "+how)
		return false
	}
	s.page(w, r, http.StatusUnauthorized, "port "+strconv.Itoa(port)+" of sandbox "+name+" needs a token: "+how)
	return false
}

// maxTokens bounds how many tokens one request may present.
const maxTokens = 8

// redirectTarget is r's URL on the same host without QueryParam: a path
// reference, never one a browser could read as another host's.
func redirectTarget(r *http.Request) string {
	p := r.URL.EscapedPath()
	switch {
	case p == "" || p[0] != '/':
		p = "/" + p
	case strings.HasPrefix(p, "//") || strings.HasPrefix(p, `/\`):
		// "//host/x" would be another host: "/.//host/x" is the same
		// path on this one.
		p = "/." + p
	}
	if q := stripQuery(r.URL.RawQuery, QueryParam); q != "" {
		p += "?" + q
	}
	return p
}
