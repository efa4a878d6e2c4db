package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/nookhq/nook/internal/errdefs"
)

// The metadata endpoint's address and name inside a sandbox, and the
// request header it requires.
const (
	MetadataAddr   = "169.254.169.254"
	MetadataName   = "metadata.nook.internal"
	MetadataHeader = "Nook-Metadata"
)

// Rate limits of one sandbox's metadata endpoint.
const (
	metadataRate  = 20 // requests a second
	metadataBurst = 40
)

// metadataIndex is what / answers.
const metadataIndex = "nook metadata endpoint\n" +
	"GET /v1/token?audience=AUD[&ttl=10m]  this sandbox's identity token (a JWT)\n" +
	"GET /v1/sandbox                       this sandbox's facts (JSON)\n" +
	"every request needs the header " + MetadataHeader + ": true\n"

// Source answers one sandbox's metadata requests.
type Source interface {
	// Token issues a token for the sandbox (and logs it).
	Token(ctx context.Context, audience string, ttl time.Duration) (string, error)
	// Facts are the sandbox's own facts, as JSON.
	Facts(ctx context.Context) (any, error)
}

// MetadataHandler serves one sandbox's metadata endpoint (see the package
// docs). It answers only its own sandbox: a connection from any other
// address than caller is refused, whatever it says.
func MetadataHandler(caller netip.Addr, src Source) http.Handler {
	return &metadataHandler{caller: caller, src: src, limiter: rate.NewLimiter(metadataRate, metadataBurst)}
}

type metadataHandler struct {
	caller  netip.Addr
	src     Source
	limiter *rate.Limiter
}

func (h *metadataHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(MetadataHeader, "true")
	w.Header().Set("Cache-Control", "no-store")
	if status, msg := h.refuse(r); status != 0 {
		http.Error(w, msg, status)
		return
	}
	switch r.URL.Path {
	case "/v1/token":
		q := r.URL.Query()
		var ttl time.Duration
		if s := q.Get("ttl"); s != "" {
			d, err := time.ParseDuration(s)
			if err != nil {
				http.Error(w, fmt.Sprintf("ttl %q is not a duration (e.g. 10m)", s), http.StatusBadRequest)
				return
			}
			ttl = d
		}
		tok, err := h.src.Token(r.Context(), q.Get("audience"), ttl)
		if err != nil {
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		w.Header().Set("Content-Type", "application/jwt")
		fmt.Fprint(w, tok)
	case "/v1/sandbox":
		facts, err := h.src.Facts(r.Context())
		if err != nil {
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(facts)
	case "/":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, metadataIndex)
	default:
		http.Error(w, "not found: the endpoint serves /v1/token?audience=AUD[&ttl=10m] and /v1/sandbox", http.StatusNotFound)
	}
}

// refuse returns why a request is not served (0 when it is): the
// protections of clouds' metadata servers against a sandbox's process
// being tricked into fetching a token for someone else.
func (h *metadataHandler) refuse(r *http.Request) (int, string) {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err != nil || ap.Addr().Unmap() != h.caller {
		return http.StatusForbidden, "forbidden: this endpoint serves only its own sandbox"
	}
	if r.Method != http.MethodGet {
		return http.StatusMethodNotAllowed, "only GET is served"
	}
	// Behind a proxy the request is someone else's: refuse what proxies add.
	for _, hdr := range []string{"X-Forwarded-For", "Forwarded", "Via", "X-Forwarded-Host"} {
		if _, ok := r.Header[hdr]; ok {
			return http.StatusForbidden, "forbidden: the request carries " + hdr + " (came through a proxy)"
		}
	}
	if r.Header.Get(MetadataHeader) != "true" {
		return http.StatusForbidden, "forbidden: the request lacks the header " + MetadataHeader + ": true"
	}
	if !validHost(r.Host) {
		return http.StatusForbidden, fmt.Sprintf("forbidden: Host %q is not %s or %s", r.Host, MetadataAddr, MetadataName)
	}
	// The static index costs nothing; what signs or reads the database is
	// limited.
	if r.URL.Path != "/" && !h.limiter.Allow() {
		return http.StatusTooManyRequests, fmt.Sprintf("more than %d requests a second", metadataRate)
	}
	return 0, ""
}

// validHost reports whether a Host header names the endpoint (a DNS
// rebinding attack names the attacker's domain).
func validHost(host string) bool {
	h := host
	if hh, port, err := net.SplitHostPort(host); err == nil {
		if port != "80" {
			return false
		}
		h = hh
	}
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	return h == MetadataAddr || h == MetadataName
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, errdefs.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrFailedPrecondition):
		return http.StatusConflict
	case errors.Is(err, errdefs.ErrLimit):
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}
