package server

import (
	"net/http"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// SSHEndpoint is nook's SSH server (internal/sshd) as the API uses it.
type SSHEndpoint interface {
	Info() api.SSHInfo
	// SignCert certifies a public key (authorized_keys form) for logging
	// in to sb as user ("" its default user) until ttl from now, while
	// the API token tokenID ("" the host's socket) is valid.
	SignCert(sb *core.Sandbox, user, publicKey, tokenID string, ttl time.Duration) (api.SSHCert, error)
}

// PreviewEndpoint mints preview URLs (internal/preview).
type PreviewEndpoint interface {
	Info() api.PreviewInfo
	// URL is the preview URL of a sandbox's port, carrying a token that
	// opens it unless public.
	URL(sandboxID, name string, port int, public bool) string
}

// SetSSH and SetPreview give the API the endpoints nook serve runs.
func (s *Server) SetSSH(e SSHEndpoint)         { s.ssh = e }
func (s *Server) SetPreview(e PreviewEndpoint) { s.preview = e }

// maxSSHCertTTL bounds a certificate's life: `nook ssh` mints one per login.
const (
	defaultSSHCertTTL = 10 * time.Minute
	maxSSHCertTTL     = 24 * time.Hour
)

func (s *Server) listSSHKeys(w http.ResponseWriter, r *http.Request) {
	keys, err := s.m.SSHKeys(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, keys)
}

func (s *Server) addSSHKey(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("name") == "" && callerFrom(r.Context()).scope.Kind == api.ScopeReadOnly {
		s.fail(w, r, errdefs.Denied("a read-only token cannot run commands, so its SSH keys would log in nowhere: use an admin or sandbox token"))
		return
	}
	var req api.AddSSHKeyRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	k, err := s.m.AddSSHKey(r.Context(), r.PathValue("name"), req.PublicKey)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, k)
}

func (s *Server) removeSSHKey(w http.ResponseWriter, r *http.Request) {
	if err := s.m.RemoveSSHKey(r.Context(), r.PathValue("name"), r.PathValue("id")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) sshCert(w http.ResponseWriter, r *http.Request) {
	if s.ssh == nil {
		s.fail(w, r, errdefs.Precondition("the daemon runs no SSH endpoint: start it with nook serve --ssh-listen ADDR (e.g. :2222)"))
		return
	}
	var req api.SSHCertRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	ttl := defaultSSHCertTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil || d <= 0 || d > maxSSHCertTTL {
			s.fail(w, r, errdefs.Invalid("ttl %q: give a duration up to %s, e.g. 10m", req.TTL, maxSSHCertTTL))
			return
		}
		ttl = d
	}
	sb, err := s.m.Get(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	cert, err := s.ssh.SignCert(sb, req.User, req.PublicKey, callerFrom(r.Context()).tokenID, ttl)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, cert)
}
