package e2b

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
)

// Sandbox traffic: what the SDKs send to envd, the daemon inside an E2B
// sandbox. nook has no envd: the edge answers envd's API itself, over the
// Manager (the sandbox's agent). A request names its sandbox by the
// E2b-Sandbox-Id header (with E2B_SANDBOX_URL set every sandbox shares
// the edge's address) and carries the sandbox's access token.

type sandboxKey struct{}

// target is the sandbox an envd request is for, and the user it acts as:
// the one it names, else the sandbox's default ("" for root).
type target struct {
	sb   *core.Sandbox
	user string
}

func targetOf(ctx context.Context) target {
	t, _ := ctx.Value(sandboxKey{}).(target)
	return t
}

// notRunning is E2B's answer for a sandbox that is not there or not
// running (paused, killed): 502, which the SDKs read as "not running"
// (isRunning is false; a call fails with a timeout error).
func notRunning(w http.ResponseWriter, id, why string) {
	writeJSON(w, http.StatusBadGateway, struct {
		SandboxID string `json:"sandboxId"`
		Message   string `json:"message"`
		Code      int    `json:"code"`
	}{id, why, http.StatusBadGateway})
}

func (s *Server) serveSandbox(w http.ResponseWriter, r *http.Request) {
	id, port := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
	if id == "" || port == "" {
		writeError(w, http.StatusBadRequest, "a sandbox request needs both E2b-Sandbox-Id and E2b-Sandbox-Port")
		return
	}
	sb, err := s.m.Get(r.Context(), id)
	if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalidArgument) {
		notRunning(w, id, "The sandbox was not found")
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if port != EnvdPort {
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("E2b-Sandbox-Port %q is not a TCP port", port))
			return
		}
		// A port is anyone's who reaches the edge if its sandbox was
		// made by an E2B create with public traffic (E2B's default);
		// otherwise the request carries its traffic token.
		if sb.Labels[publicLabel] != "true" && !tokenEqual(r.Header.Get("E2b-Traffic-Access-Token"), s.trafficToken(sb.ID)) {
			writeError(w, http.StatusForbidden, "sandbox "+id+"'s ports are not public: send its traffic access token (E2b-Traffic-Access-Token)")
			return
		}
		if sb.State != core.StateRunning {
			notRunning(w, id, "The sandbox is "+string(sb.State))
			return
		}
		s.proxyPort(w, r, sb, n)
		return
	}
	// /health says whether a sandbox runs, without waking it (the SDK's
	// isRunning); without its token it answers as for a sandbox that is
	// not there, so that it tells nobody else which names exist.
	if r.URL.Path == "/health" {
		if !s.tokenOK(sb, r.Header.Get("X-Access-Token")) {
			notRunning(w, id, "The sandbox was not found")
			return
		}
		if sb.State != core.StateRunning {
			notRunning(w, id, "The sandbox is "+string(sb.State))
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if !s.tokenOK(sb, r.Header.Get("X-Access-Token")) {
		writeError(w, http.StatusUnauthorized, "the access token is missing or wrong for sandbox "+id)
		return
	}
	if sb.State != core.StateRunning {
		notRunning(w, id, "The sandbox is "+string(sb.State))
		return
	}
	// Only connect (the control API) wakes a paused sandbox: envd's calls
	// never do, even if it was paused since the check above.
	user := userOf(r)
	if user == "" {
		user = s.m.DefaultUser(sb)
	}
	ctx := context.WithValue(daemon.LookOnly(r.Context()), sandboxKey{}, target{sb: sb, user: user})
	s.envd.ServeHTTP(w, r.WithContext(ctx))
}

func (s *Server) tokenOK(sb *core.Sandbox, tok string) bool {
	return tokenEqual(tok, s.accessToken(sb.ID))
}

func tokenEqual(got, want string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// health is envd's /health for a running sandbox (serveSandbox answers
// the others).
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusNoContent)
}

// proxyPort passes a request (HTTP, a WebSocket, a stream of server-sent
// events) to a port inside the sandbox, through its agent: what E2B
// users reach with getHost(port). Like E2B's, these URLs need no token.
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request, sb *core.Sandbox, port int) {
	ctx := daemon.LookOnly(r.Context())
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			pr.Out.Host = pr.In.Host
			for _, h := range []string{"E2b-Sandbox-Id", "E2b-Sandbox-Port", "X-Access-Token"} {
				pr.Out.Header.Del(h)
			}
			pr.SetXForwarded()
		},
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return s.m.DialPort(ctx, sb.Name, port)
			},
			DisableKeepAlives: true,
			// The answer's headers come from the sandbox: bounded.
			MaxResponseHeaderBytes: 256 << 10,
		},
		FlushInterval: -1, // server-sent events as they come
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeJSON(w, http.StatusBadGateway, struct {
				SandboxID string `json:"sandboxId"`
				Message   string `json:"message"`
				Port      int    `json:"port"`
				Code      int    `json:"code"`
			}{sb.Name, "The sandbox is running but port is not open", port, http.StatusBadGateway})
		},
	}
	rp.ServeHTTP(w, r.WithContext(ctx))
}

// hostRoute reads a sandbox host name, PORT-ID.DOMAIN (what the SDKs'
// getHost builds), into the sandbox and port it names. Only the edge's
// own domain routes: a name of another domain that resolves here (DNS
// rebinding from a web page) reaches no sandbox.
func hostRoute(host, domain string) (id, port string, ok bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if d, _, err := net.SplitHostPort(domain); err == nil {
		domain = d
	}
	label, rest, dotted := strings.Cut(host, ".")
	if !dotted || rest == "" || domain == "" || !strings.EqualFold(rest, domain) {
		return "", "", false
	}
	port, id, ok = strings.Cut(label, "-")
	if !ok || id == "" || port == "" || strings.Trim(port, "0123456789") != "" {
		return "", "", false
	}
	return id, port, true
}
