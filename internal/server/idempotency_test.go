package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
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
	if w.Body.String() != "line\n" || a.status != http.StatusOK || a.buf.String() != "line\n" {
		t.Fatalf("stream: sent %q, kept %d %q", w.Body.String(), a.status, a.buf.String())
	}
}
