package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/events"
)

// events streams the lifecycle's events as NDJSON, one flushed line per
// event: those since ?since= first, then each as it happens, until the
// client goes away (or falls behind: a last "lagged" event ends it).
// Filters: ?sandbox=NAME, ?type=T (repeatable). A sandbox token sees its
// own sandbox's events only.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	since, err := events.ParseSince(q.Get("since"), time.Now())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f := events.Filter{Sandbox: q.Get("sandbox"), Types: q["type"]}
	if err := events.CheckTypes(f.Types); err != nil {
		s.fail(w, r, err)
		return
	}
	if sc := callerFrom(r.Context()).scope; sc.Kind == daemon.ScopeSandbox {
		if sc.SandboxID == "" { // never made so; refused rather than shown every sandbox's
			s.fail(w, r, errdefs.Denied("this token's sandbox is not known"))
			return
		}
		f.SandboxID = sc.SandboxID
	}
	replay, sub := s.m.SubscribeEvents(since, f)
	defer sub.Close()
	w.Header().Set("Content-Type", ndjsonContentType)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(deadlineWriter{w, rc})
	for _, e := range replay {
		if enc.Encode(e) != nil {
			return
		}
	}
	if rc.Flush() != nil {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case e, ok := <-sub.C:
			if !ok {
				return
			}
			if enc.Encode(e) != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// sandboxLogs streams a sandbox's log (?log=agent|console; default the
// one its backend keeps what its init and agent write in) as text: its
// last ?tail= lines (default all of its last MiB), then with ?follow=1
// what is added, until the client goes or the sandbox does. The bytes
// are the sandbox's: the Content-Type says so, and Nook-Log names the log.
func (s *Server) sandboxLogs(w http.ResponseWriter, r *http.Request) {
	flags, err := queryFlags(r, "follow")
	if err != nil {
		s.fail(w, r, err)
		return
	}
	tail := -1
	if v := r.URL.Query().Get("tail"); v != "" {
		if tail, err = strconv.Atoi(v); err != nil || tail < 0 {
			s.fail(w, r, errdefs.Invalid("tail %q is not a number of lines (0 or more)", v))
			return
		}
	}
	l, err := s.m.OpenLog(r.Context(), r.PathValue("name"), r.URL.Query().Get("log"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer l.Close()
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set(api.LogHeader, l.Name())
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := l.Copy(r.Context(), deadlineWriter{w, rc}, tail, flags[0], func() { rc.Flush() }); err != nil && r.Context().Err() == nil {
		s.abort(r, err)
	}
}

// streamWriteTimeout bounds one write of a streamed answer.
var streamWriteTimeout = 30 * time.Second

// deadlineWriter writes a streamed answer with a deadline on each write:
// a client that stops reading ends the stream (and what its handler
// holds) within streamWriteTimeout, though its connection stays open.
type deadlineWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (d deadlineWriter) Write(p []byte) (int, error) {
	d.rc.SetWriteDeadline(time.Now().Add(streamWriteTimeout)) // not every writer has deadlines (tests' recorders)
	return d.w.Write(p)
}
