package server

import (
	"net/http"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/identity"
)

func (s *Server) identityToken(w http.ResponseWriter, r *http.Request) {
	var req api.IdentityTokenRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	t, err := s.m.IdentityToken(r.Context(), r.PathValue("name"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, t)
}

func (s *Server) identityLog(w http.ResponseWriter, r *http.Request) {
	l, err := s.m.IdentityLog(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, l)
}

func (s *Server) rotateIdentityKeys(w http.ResponseWriter, r *http.Request) {
	if err := s.m.RotateIdentityKeys(r.Context()); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// discovery and jwks serve the identity issuer's public documents
// (accessPublic: no token). Relying parties fetch them at the issuer URL:
// this daemon when --issuer names it, else a static copy (nook oidc export).
func (s *Server) discovery(w http.ResponseWriter, r *http.Request) {
	writePublicJSON(w, s.m.Issuer().Discovery())
}

func (s *Server) jwks(w http.ResponseWriter, r *http.Request) {
	b, err := s.m.Issuer().JWKS()
	if err != nil {
		// No details for anyone: the daemon's log has them.
		s.log.Error("identity key set", "err", err)
		writeError(w, http.StatusServiceUnavailable, api.CodeUnavailable, "the key set cannot be read now: try again")
		return
	}
	writePublicJSON(w, b)
}

func writePublicJSON(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	// Relying parties cache the keys; the next key is published a whole
	// rotation period before it signs.
	w.Header().Set("Cache-Control", "public, max-age=300")
	w.Write(b)
}

// publicPath reports whether r asks for a route anyone may read.
func publicPath(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
		(r.URL.Path == identity.DiscoveryPath || r.URL.Path == identity.JWKSPath)
}
