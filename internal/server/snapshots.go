package server

import (
	"net/http"

	"github.com/nookhq/nook/api"
)

// decodeOptional is decode for bodies whose every field is optional: no
// body at all means all defaults.
func decodeOptional(r *http.Request, v any) error {
	if r.ContentLength == 0 {
		return nil
	}
	return decode(r, v)
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req api.CreateSnapshotRequest
	if err := decodeOptional(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sn, err := s.m.Snapshot(r.Context(), r.PathValue("name"), req.Name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	sn.Sandbox = r.PathValue("name")
	writeJSON(w, http.StatusCreated, sn.API())
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	list, err := s.m.Snapshots(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]api.Snapshot, 0, len(list))
	for _, sn := range list {
		out = append(out, sn.API())
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.m.DeleteSnapshot(r.Context(), r.PathValue("name"), r.PathValue("snapshot")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) rollback(w http.ResponseWriter, r *http.Request) {
	var req api.RollbackRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.m.Rollback(r.Context(), r.PathValue("name"), req.Snapshot)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.m.View(sb))
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req api.ForkRequest
	if err := decodeOptional(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	sbs, err := s.m.Fork(r.Context(), r.PathValue("name"), req.Snapshot, req.Count, req.Name)
	resp := api.ForkResponse{Sandboxes: []api.Sandbox{}}
	for _, sb := range sbs {
		resp.Sandboxes = append(resp.Sandboxes, s.m.View(sb))
	}
	if err != nil {
		// Forks made before the failure are kept (and listed by ls).
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, resp)
}
