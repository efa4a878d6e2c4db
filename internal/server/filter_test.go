package server

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
)

// GET /v1/sandboxes refuses a filter it does not know, or a bad value,
// with a 400 that names what it takes, before it lists anything (the
// server has no manager here: a list would panic).
func TestListSandboxesBadFilter(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	for q, want := range map[string]string{
		"bogus=1":           "the filters are label, state, template, isolation, name",
		"state=asleep":      "the states are running, paused",
		"label=":            "filter label has no value",
		"name=%5B":          "syntax error in pattern",
		"metadata=team%3Da": `unknown filter \"metadata\"`,
		"name=*" + strings.Repeat("%5Bb-b%5D", 60):  "more than the 126 allowed",
		strings.Repeat("name=a%2A&", 17) + "name=b": "filter name is given 18 times",
	} {
		rec := httptest.NewRecorder()
		s.listSandboxes(rec, httptest.NewRequest("GET", "/v1/sandboxes?"+q, nil))
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), want) || !strings.Contains(rec.Body.String(), api.CodeInvalidArgument) {
			t.Errorf("?%s: %d %s; want 400 %s with %q", q, rec.Code, rec.Body, api.CodeInvalidArgument, want)
		}
	}
}
