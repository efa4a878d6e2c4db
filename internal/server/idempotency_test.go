package server

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nookhq/nook/internal/daemon"
)

// A streamed create is a failure for its key unless its last event is
// the sandbox.
func TestStreamFailed(t *testing.T) {
	for body, failed := range map[string]bool{
		`{"progress":"building"}` + "\n" + `{"sandbox":{"id":"x","name":"a"}}` + "\n":                 false,
		`{"progress":"building"}` + "\n" + `{"error":{"code":"limit_reached","message":"no"}}` + "\n": true,
		`{"progress":"building"}` + "\n": true,
		"":                               true,
	} {
		if got := streamFailed([]byte(body)); got != failed {
			t.Errorf("streamFailed(%q) = %v, want %v", body, got, failed)
		}
	}
}

// The recorder keeps an answer back (to record it first) unless it is a
// stream, which goes on as it comes.
func TestAnswerRecorder(t *testing.T) {
	w := httptest.NewRecorder()
	a := &answerRecorder{ResponseWriter: w}
	a.WriteHeader(http.StatusCreated)
	a.Write([]byte("kept"))
	if w.Body.Len() != 0 || a.status != http.StatusCreated || a.buf.String() != "kept" {
		t.Fatalf("held answer: sent %q, kept %d %q", w.Body.String(), a.status, a.buf.String())
	}
	w = httptest.NewRecorder()
	a = &answerRecorder{ResponseWriter: w, stream: true}
	a.Write([]byte("line\n"))
	if w.Body.String() != "line\n" || a.status != http.StatusOK || string(a.answer("").Body) != "line\n" {
		t.Fatalf("stream: sent %q, kept %d %q", w.Body.String(), a.status, a.answer("").Body)
	}
}

// Of a streamed create, the key keeps its last line alone, however
// long the stream, and that only up to maxRecordedAnswer: past it (or
// past it in a held answer) the key is forgotten, and the answer is
// sent all the same.
func TestAnswerRecorderBounded(t *testing.T) {
	w := httptest.NewRecorder()
	a := &answerRecorder{ResponseWriter: w, stream: true}
	progress := []byte(`{"progress":"` + strings.Repeat("x", 1000) + `"}` + "\n")
	sent := 0
	for range 5000 { // 5 MB of progress
		a.Write(progress)
		sent += len(progress)
	}
	a.Write([]byte(`{"sandbox":`))
	a.Write([]byte(`{"id":"x","name":"a"}}` + "\n")) // the last line, in two writes
	final := `{"sandbox":{"id":"x","name":"a"}}` + "\n"
	if kept := cap(a.last) + cap(a.line); kept > 64<<10 {
		t.Fatalf("the recorder holds %d bytes of a %d-byte stream", kept, sent)
	}
	if ans := a.answer(ndjsonContentType); ans.Status != http.StatusOK || string(ans.Body) != final || ans.ContentType != ndjsonContentType {
		t.Fatalf("the stream's answer: %d %q", ans.Status, ans.Body)
	}
	if w.Body.Len() != sent+len(final) {
		t.Fatalf("sent %d bytes of %d", w.Body.Len(), sent+len(final))
	}
	// A line over the bound: not recorded.
	a = &answerRecorder{ResponseWriter: httptest.NewRecorder(), stream: true}
	a.Write(progress)
	a.Write([]byte(`{"progress":"` + strings.Repeat("y", maxRecordedAnswer) + `"}` + "\n"))
	a.Write([]byte(final))
	if ans := a.answer(ndjsonContentType); ans.Status < 300 || len(ans.Body) != 0 || a.last != nil {
		t.Fatalf("a stream with a line over the bound: %d, %d bytes kept", ans.Status, len(ans.Body))
	}
	// A held answer over the bound: sent whole, not recorded.
	w = httptest.NewRecorder()
	s := &Server{log: slog.New(slog.DiscardHandler)}
	big := strings.Repeat("z", maxRecordedAnswer+1)
	var got []daemon.IdempotentAnswer
	s.serveRecorded(w, httptest.NewRequest("POST", "/v1/sandboxes/a/fork", nil), func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(big))
	}, func(a daemon.IdempotentAnswer) { got = append(got, a) })
	if len(got) != 1 || got[0].Status < 300 || w.Code != http.StatusCreated || w.Body.String() != big {
		t.Fatalf("a held answer over the bound: recorded %d answers (%+v), sent %d with %d bytes", len(got), statuses(got), w.Code, w.Body.Len())
	}
}

// A handler that wrote its status and then panicked answered nothing
// whole: the key is forgotten, not recorded as a success, and the panic
// goes on (net/http ends the answer).
func TestServeRecordedPanic(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	for _, target := range []string{"/v1/sandboxes", "/v1/sandboxes?progress=ndjson"} {
		var got []daemon.IdempotentAnswer
		w := httptest.NewRecorder()
		func() {
			defer func() {
				if p := recover(); p != "boom" {
					t.Errorf("%s: the panic did not go on: %v", target, p)
				}
			}()
			s.serveRecorded(w, httptest.NewRequest("POST", target, nil), func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				w.Write([]byte(`{"sandbox":{"id":"half`))
				panic("boom")
			}, func(a daemon.IdempotentAnswer) { got = append(got, a) })
		}()
		if len(got) != 1 || got[0].Status < 300 {
			t.Errorf("%s: a handler that panicked after 201 was recorded as %v; want one failure (the key forgotten)", target, statuses(got))
		}
	}
}

func statuses(as []daemon.IdempotentAnswer) []int {
	var out []int
	for _, a := range as {
		out = append(out, a.Status)
	}
	return out
}
