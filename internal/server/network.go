package server

import (
	"net/http"
	"strconv"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
)

func (s *Server) getNetwork(w http.ResponseWriter, r *http.Request) {
	n, err := s.m.Network(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, n)
}

func (s *Server) setNetwork(w http.ResponseWriter, r *http.Request) {
	var req api.SetNetworkRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	n, err := s.m.SetNetwork(r.Context(), r.PathValue("name"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, n)
}

func (s *Server) netLog(w http.ResponseWriter, r *http.Request) {
	l, err := s.m.NetLog(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, l)
}

func (s *Server) expose(w http.ResponseWriter, r *http.Request) {
	var req api.ExposeRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	var public bool
	switch req.Auth {
	case "", api.PreviewAuthToken:
	case api.PreviewAuthNone:
		public = true
	default:
		s.fail(w, r, errdefs.Invalid("auth %q: give token (the preview URL needs its token, the default) or none (anyone who reaches the preview listener)", req.Auth))
		return
	}
	e, err := s.m.Expose(r.Context(), r.PathValue("name"), req.Port, public)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if s.preview != nil {
		if id, err := s.sandboxID(r.Context(), r.PathValue("name")); err == nil {
			e.URL = s.preview.URL(id, r.PathValue("name"), e.Port, public)
		}
	}
	writeJSON(w, http.StatusOK, e)
}

func (s *Server) unexpose(w http.ResponseWriter, r *http.Request) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil {
		s.fail(w, r, errdefs.Invalid("port %q is not a number", r.PathValue("port")))
		return
	}
	if err := s.m.Unexpose(r.Context(), r.PathValue("name"), port); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
