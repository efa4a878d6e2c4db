package server

import (
	"io"
	"net/http"
	"os"

	"github.com/nookhq/nook/internal/volume"
)

// The files of a volume, without a sandbox: the same query parameters
// and answers as a sandbox's file routes, served by the daemon itself
// through an os.Root on the volume (internal/volume/files.go).

// withVolume runs fn on the files of the volume the route names.
func (s *Server) withVolume(w http.ResponseWriter, r *http.Request, fn func(root *os.Root)) {
	root, release, err := s.m.VolumeFiles(r.Context(), r.PathValue("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer release()
	fn(root)
}

func (s *Server) statVolumeFile(w http.ResponseWriter, r *http.Request) {
	s.withVolume(w, r, func(root *os.Root) {
		info, err := volume.Stat(root, r.URL.Query().Get("path"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, info)
	})
}

func (s *Server) listVolumeFiles(w http.ResponseWriter, r *http.Request) {
	flags, err := queryFlags(r, "recursive")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	maxEntries, err := queryInt(r, "max_entries")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.withVolume(w, r, func(root *os.Root) {
		p := r.URL.Query().Get("path")
		top, err := volume.Stat(root, p)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		lw := &listingWriter{w: w, path: top.Path}
		truncated, err := volume.List(root, p, flags[0], int(min(maxEntries, volume.MaxListEntries)), lw.entry)
		if err != nil {
			if !lw.started {
				s.fail(w, r, err)
				return
			}
			s.abort(r, err)
		}
		if err := lw.end(truncated); err != nil {
			s.abort(r, err)
		}
	})
}

func (s *Server) readVolumeFile(w http.ResponseWriter, r *http.Request) {
	s.withVolume(w, r, func(root *os.Root) {
		f, err := volume.OpenFile(root, r.URL.Query().Get("path"))
		if err != nil {
			s.fail(w, r, err)
			return
		}
		defer f.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusOK)
		if _, err := io.Copy(w, f); err != nil {
			s.abort(r, err)
		}
	})
}

func (s *Server) writeVolumeFile(w http.ResponseWriter, r *http.Request) {
	flags, err := queryFlags(r, "parents")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.withVolume(w, r, func(root *os.Root) {
		info, err := volume.Write(root, r.URL.Query().Get("path"), r.Body, flags[0])
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, info)
	})
}

func (s *Server) downloadVolumeArchive(w http.ResponseWriter, r *http.Request) {
	s.withVolume(w, r, func(root *os.Root) {
		p := r.URL.Query().Get("path")
		if _, err := volume.Stat(root, p); err != nil {
			s.fail(w, r, err)
			return
		}
		w.Header().Set("Content-Type", tarContentType)
		w.WriteHeader(http.StatusOK)
		if err := volume.WriteTar(root, p, w); err != nil {
			s.abort(r, err)
		}
	})
}

func (s *Server) uploadVolumeArchive(w http.ResponseWriter, r *http.Request) {
	flags, err := queryFlags(r, "parents")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.withVolume(w, r, func(root *os.Root) {
		info, err := volume.ReadTar(root, r.URL.Query().Get("path"), r.Body, flags[0])
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, info)
	})
}
