package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"syscall"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/daemon"
	"github.com/nookhq/nook/internal/errdefs"
)

// dieBeforeIdempotentAnswer is a switch for tests alone (internal/e2e's
// TestQuotasAndIdempotency): with NOOK_TEST_DIE_BEFORE_IDEMPOTENT_ANSWER=1
// in its environment at start, the daemon kills itself (SIGKILL) once a
// request with an Idempotency-Key has done its work and before its answer
// is recorded or sent, to prove a retry after the restart gets what the
// first request made. Never set it on a real daemon.
var dieBeforeIdempotentAnswer = os.Getenv("NOOK_TEST_DIE_BEFORE_IDEMPOTENT_ANSWER") == "1"

// idempotent serves h with Idempotency-Key (daemon/idempotency.go): a
// request without the header goes straight to h; the first with a key
// does the work, and its answer is kept; a retry gets that answer again
// (with Idempotent-Replayed: true), or waits for the first to end.
func (s *Server) idempotent(kind string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(api.IdempotencyKeyHeader)
		if key == "" {
			h(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
		if err != nil {
			s.fail(w, r, errdefs.Invalid("read the request body: %v", err))
			return
		}
		if len(body) > maxBody {
			s.fail(w, r, errdefs.Invalid("request body is over %d bytes", maxBody))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		route := r.Method + " " + r.URL.Path
		if q := r.URL.RawQuery; q != "" {
			route += "?" + q
		}
		ctx, call, again, err := s.m.BeginIdempotent(r.Context(), kind, key, route, body)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if again != nil {
			w.Header().Set("Content-Type", again.ContentType)
			w.Header().Set(api.IdempotentReplayedHeader, "true")
			w.WriteHeader(again.Status)
			w.Write(again.Body)
			return
		}
		// A streamed create (progress=ndjson) goes out as it comes and is
		// kept too; any other answer is kept first, then sent.
		rec := &answerRecorder{ResponseWriter: w, stream: r.URL.Query().Get("progress") != ""}
		defer func() {
			if rec.status == 0 {
				rec.status = http.StatusInternalServerError // h panicked
			}
			call.Finish(context.WithoutCancel(ctx), daemon.IdempotentAnswer{Status: rec.status, ContentType: w.Header().Get("Content-Type"), Body: rec.buf.Bytes()})
		}()
		h(rec, r.WithContext(ctx))
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		if dieBeforeIdempotentAnswer {
			s.log.Warn("NOOK_TEST_DIE_BEFORE_IDEMPOTENT_ANSWER: killing the daemon before it answers")
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
		status := rec.status
		if rec.stream && streamFailed(rec.buf.Bytes()) {
			status = http.StatusInternalServerError // a failure: the key is forgotten
		}
		call.Finish(context.WithoutCancel(ctx), daemon.IdempotentAnswer{Status: status, ContentType: w.Header().Get("Content-Type"), Body: rec.buf.Bytes()})
		if !rec.stream {
			w.WriteHeader(rec.status)
			w.Write(rec.buf.Bytes())
		}
	}
}

// streamFailed says a streamed create's last event is an error (its
// status was 200 before it knew).
func streamFailed(b []byte) bool {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	var ev api.CreateEvent
	return json.Unmarshal(lines[len(lines)-1], &ev) != nil || ev.Error != nil || ev.Sandbox == nil
}

// answerRecorder keeps an answer; a streamed one goes on to the client
// as it is written.
type answerRecorder struct {
	http.ResponseWriter
	stream bool
	status int
	buf    bytes.Buffer
}

func (a *answerRecorder) WriteHeader(status int) {
	if a.status != 0 {
		return
	}
	a.status = status
	if a.stream {
		a.ResponseWriter.WriteHeader(status)
	}
}

func (a *answerRecorder) Write(p []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	a.buf.Write(p)
	if a.stream {
		return a.ResponseWriter.Write(p)
	}
	return len(p), nil
}

// Unwrap lets http.ResponseController flush a streamed answer.
func (a *answerRecorder) Unwrap() http.ResponseWriter {
	if a.stream {
		return a.ResponseWriter
	}
	return nil
}
