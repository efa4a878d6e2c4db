package server

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Every answer carries a request id, the caller's own when it is one a
// log line cannot be forged with, and the request's log line has it.
func TestRequestID(t *testing.T) {
	var log bytes.Buffer
	s := &Server{log: slog.New(slog.NewJSONHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	var seen string
	h := s.logRequests(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = requestIDOf(r)
		http.Error(w, "nope", http.StatusTeapot)
	}))
	for _, c := range []struct{ given, want string }{
		{"", ""},
		{"trace-42:abc.DEF_9", "trace-42:abc.DEF_9"},
		{"two words", ""},
		{"a\" level=ERROR msg=forged", ""},
		{strings.Repeat("x", 129), ""},
	} {
		log.Reset()
		req := httptest.NewRequest("GET", "/v1/info", nil)
		if c.given != "" {
			req.Header.Set(RequestIDHeader, c.given)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		got := rec.Header().Get(RequestIDHeader)
		switch {
		case c.want != "" && got != c.want:
			t.Errorf("given %q: answered %q, want it kept", c.given, got)
		case c.want == "" && (got == c.given || len(got) != 24 || strings.Trim(got, "0123456789abcdef") != ""):
			t.Errorf("given %q: answered %q, want a new hex id", c.given, got)
		}
		if seen != got {
			t.Errorf("given %q: the handler saw %q, the answer says %q", c.given, seen, got)
		}
		if !strings.Contains(log.String(), `"request_id":"`+got+`"`) || !strings.Contains(log.String(), `"status":418`) {
			t.Errorf("given %q: the log line lacks the id %q: %s", c.given, got, log.String())
		}
	}
}
