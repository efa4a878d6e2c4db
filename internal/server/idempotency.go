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
		s.serveRecorded(w, r.WithContext(ctx), h, func(a daemon.IdempotentAnswer) {
			call.Finish(context.WithoutCancel(ctx), a)
		})
	}
}

// maxRecordedAnswer bounds the answer a key keeps: one longer is not
// recorded, and its key is forgotten (a retry does the work again).
const maxRecordedAnswer = 1 << 20

// serveRecorded serves r with h and gives its answer to finish before
// it is sent (a streamed create's goes out as it comes; its last line,
// the sandbox or the error, is its answer). A handler that panics, even
// after it wrote its status, gave no whole answer: finish gets a failure
// (the key is forgotten), and the panic goes on.
func (s *Server) serveRecorded(w http.ResponseWriter, r *http.Request, h http.HandlerFunc, finish func(daemon.IdempotentAnswer)) {
	rec := &answerRecorder{ResponseWriter: w, stream: r.URL.Query().Get("progress") != ""}
	finished := false
	defer func() {
		p := recover()
		if !finished {
			finish(daemon.IdempotentAnswer{Status: http.StatusInternalServerError})
		}
		if p != nil {
			panic(p)
		}
	}()
	h(rec, r)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if dieBeforeIdempotentAnswer {
		s.log.Warn("NOOK_TEST_DIE_BEFORE_IDEMPOTENT_ANSWER: killing the daemon before it answers")
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	finish(rec.answer(w.Header().Get("Content-Type")))
	finished = true
	if !rec.stream {
		w.WriteHeader(rec.status)
		w.Write(rec.buf.Bytes())
	}
}

// streamFailed says a streamed create's last event is an error (its
// status was 200 before it knew).
func streamFailed(b []byte) bool {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	var ev api.CreateEvent
	return json.Unmarshal(lines[len(lines)-1], &ev) != nil || ev.Error != nil || ev.Sandbox == nil
}

// answerRecorder keeps an answer to record: a held one whole (it is sent
// once recorded); of a streamed one, which goes on to the client as it
// is written, only its last line (progress lines are not worth keeping).
type answerRecorder struct {
	http.ResponseWriter
	stream bool
	status int
	buf    bytes.Buffer // a held answer
	last   []byte       // a stream's last whole line
	line   []byte       // a stream's line being written
	over   bool         // what would be recorded is over maxRecordedAnswer
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
	if a.stream {
		a.keepLastLine(p)
		return a.ResponseWriter.Write(p)
	}
	a.buf.Write(p)
	a.over = a.over || a.buf.Len() > maxRecordedAnswer
	return len(p), nil
}

// keepLastLine keeps, of what a stream has written, its last line; a
// line over maxRecordedAnswer ends the keeping.
func (a *answerRecorder) keepLastLine(p []byte) {
	for !a.over && len(p) > 0 {
		end := len(p)
		if i := bytes.IndexByte(p, '\n'); i >= 0 {
			end = i + 1
		}
		a.line = append(a.line, p[:end]...)
		if len(a.line) > maxRecordedAnswer {
			a.over, a.line, a.last = true, nil, nil
			return
		}
		if a.line[len(a.line)-1] == '\n' {
			a.last, a.line = a.line, a.last[:0]
		}
		p = p[end:]
	}
}

// answer is what the key records: a 2xx is kept for retries; a stream
// whose last event is an error, or an answer over maxRecordedAnswer, is
// a failure (the key is forgotten).
func (a *answerRecorder) answer(contentType string) daemon.IdempotentAnswer {
	ans := daemon.IdempotentAnswer{Status: a.status, ContentType: contentType, Body: a.buf.Bytes()}
	if a.stream {
		ans.Body = a.last
		if len(a.line) > 0 { // it ended without a newline
			ans.Body = a.line
		}
		if streamFailed(ans.Body) {
			ans.Status = http.StatusInternalServerError
		}
	}
	if a.over {
		ans.Status, ans.Body = http.StatusInternalServerError, nil
	}
	return ans
}

// Unwrap lets http.ResponseController flush a streamed answer.
func (a *answerRecorder) Unwrap() http.ResponseWriter {
	if a.stream {
		return a.ResponseWriter
	}
	return nil
}
