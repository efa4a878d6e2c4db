package server

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strconv"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
)

// The file API. Content and archives travel as raw bytes in both
// directions, streamed: nothing holds a whole file. Once a download's
// body has started, an error cannot become an HTTP status any more: the
// daemon then aborts the response, so that a client sees a cut transfer
// (never a short file that looks whole), and logs why.

const (
	tarContentType    = "application/x-tar"
	ndjsonContentType = "application/x-ndjson"
)

func queryBool(r *http.Request, key string) (bool, error) {
	s := r.URL.Query().Get(key)
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, errdefs.Invalid("%s=%q is not valid: use true or false", key, s)
	}
	return b, nil
}

func queryInt(r *http.Request, key string) (int64, error) {
	s := r.URL.Query().Get(key)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, errdefs.Invalid("%s=%q is not valid: give a number of bytes >= 0", key, s)
	}
	return n, nil
}

// queryFlags parses boolean query parameters, in order.
func queryFlags(r *http.Request, keys ...string) ([]bool, error) {
	out := make([]bool, len(keys))
	for i, k := range keys {
		b, err := queryBool(r, k)
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	info, err := s.m.StatFile(r.Context(), r.PathValue("name"), r.URL.Query().Get("path"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// listFiles streams the listing as one JSON object (api.FileList), entry
// by entry as the agent sends them.
func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
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
	l, err := s.m.ListFiles(r.Context(), r.PathValue("name"), r.URL.Query().Get("path"), flags[0], int(min(maxEntries, 1<<30)))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer l.Close()
	lw := &listingWriter{w: w, path: l.Root.Path}
	lw.start()
	for {
		batch, err := l.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			s.abort(r, err)
		}
		for _, e := range batch {
			if err := lw.entry(e); err != nil {
				return // the client went away
			}
		}
	}
	lw.end(l.Truncated)
}

// listingWriter streams an api.FileList as one JSON object, entry by
// entry as they are found: a listing is never held whole.
type listingWriter struct {
	w       http.ResponseWriter
	bw      *bufio.Writer
	path    string
	started bool
	n       int
}

// start writes the answer's status and head (once).
func (l *listingWriter) start() {
	if l.started {
		return
	}
	l.started = true
	l.w.Header().Set("Content-Type", "application/json")
	l.w.WriteHeader(http.StatusOK)
	l.bw = bufio.NewWriterSize(l.w, 64<<10)
	p, _ := json.Marshal(l.path)
	l.bw.WriteString(`{"path":`)
	l.bw.Write(p)
	l.bw.WriteString(`,"entries":[`)
}

// entry writes one entry (the head first if it is not written yet).
func (l *listingWriter) entry(e api.FileInfo) error {
	l.start()
	if l.n > 0 {
		l.bw.WriteByte(',')
	}
	l.n++
	b, _ := json.Marshal(e)
	_, err := l.bw.Write(b)
	return err
}

// end writes the tail and flushes.
func (l *listingWriter) end(truncated bool) error {
	l.start()
	l.bw.WriteString(`],"truncated":` + strconv.FormatBool(truncated) + "}\n")
	return l.bw.Flush()
}

// uploadFail answers a failed upload; a client that went away mid-upload
// is not the daemon's error (and cannot read an answer).
func (s *Server) uploadFail(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		s.log.Debug("upload abandoned by the client", "path", r.URL.Path, "err", err)
		return
	}
	s.fail(w, r, err)
}

// abort ends a response whose body has started: the client sees the
// transfer cut, not a clean end.
func (s *Server) abort(r *http.Request, err error) {
	if r.Context().Err() == nil {
		s.log.Error("file transfer cut", "method", r.Method, "path", r.URL.Path, "query", r.URL.RawQuery, "err", err)
	}
	panic(http.ErrAbortHandler)
}

// sendStream copies a download to the client.
func (s *Server) sendStream(w http.ResponseWriter, r *http.Request, contentType string, rc io.ReadCloser) {
	defer rc.Close()
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(http.StatusOK)
	buf := make([]byte, 128<<10)
	for {
		n, err := rc.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the client went away; closing rc stops the agent
			}
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			s.abort(r, err)
		}
	}
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	off, err := queryInt(r, "offset")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	length, err := queryInt(r, "length")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	info, rc, err := s.m.ReadFile(r.Context(), r.PathValue("name"), r.URL.Query().Get("path"), off, length)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("X-Nook-File-Size", strconv.FormatInt(info.Size, 10))
	w.Header().Set("X-Nook-File-Mode", info.Mode)
	s.sendStream(w, r, "application/octet-stream", rc)
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	flags, err := queryFlags(r, "parents")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var mode *uint32
	if ms := r.URL.Query().Get("mode"); ms != "" {
		m, err := daemon.ParseMode(ms)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		mode = &m
	}
	info, err := s.m.WriteFile(r.Context(), r.PathValue("name"), r.URL.Query().Get("path"), daemon.WriteOptions{Mode: mode, Parents: flags[0]}, r.Body)
	if err != nil {
		s.uploadFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) mkdirFile(w http.ResponseWriter, r *http.Request) {
	var req api.MkdirRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	info, err := s.m.Mkdir(r.Context(), r.PathValue("name"), "", req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	flags, err := queryFlags(r, "recursive")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.m.RemoveFile(r.Context(), r.PathValue("name"), r.URL.Query().Get("path"), flags[0]); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) moveFile(w http.ResponseWriter, r *http.Request) {
	var req api.MoveRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	info, err := s.m.MoveFile(r.Context(), r.PathValue("name"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) chmodFile(w http.ResponseWriter, r *http.Request) {
	var req api.ChmodRequest
	if err := decode(r, &req); err != nil {
		s.fail(w, r, err)
		return
	}
	info, err := s.m.ChmodFile(r.Context(), r.PathValue("name"), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) downloadArchive(w http.ResponseWriter, r *http.Request) {
	_, rc, err := s.m.DownloadArchive(r.Context(), r.PathValue("name"), r.URL.Query().Get("path"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	s.sendStream(w, r, tarContentType, rc)
}

func (s *Server) uploadArchive(w http.ResponseWriter, r *http.Request) {
	flags, err := queryFlags(r, "parents")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	info, err := s.m.UploadArchive(r.Context(), r.PathValue("name"), r.URL.Query().Get("path"), flags[0], r.Body)
	if err != nil {
		s.uploadFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// watchFiles streams events as NDJSON, one flushed line per event, until
// the client goes away. The response starts once the watch is in place.
func (s *Server) watchFiles(w http.ResponseWriter, r *http.Request) {
	flags, err := queryFlags(r, "recursive")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	fw, err := s.m.WatchFiles(r.Context(), r.PathValue("name"), r.URL.Query().Get("path"), flags[0])
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer fw.Close()
	w.Header().Set("Content-Type", ndjsonContentType)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		return
	}
	enc := json.NewEncoder(w)
	for {
		ev, err := fw.Next()
		if err != nil {
			if r.Context().Err() != nil {
				return
			}
			s.abort(r, err)
		}
		if enc.Encode(ev) != nil || rc.Flush() != nil {
			return
		}
	}
}
