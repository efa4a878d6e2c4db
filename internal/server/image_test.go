package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
)

// A remote token, even an admin's, never has the daemon read its host's
// files (oci:, docker-archive:) or its loopback and link-local services
// (a registry there) through an image build: 403 before anything is
// read. The host's own socket may, and so may a remote admin a registry
// elsewhere (remoteImageDenied lets those through).
func TestEscapeRemoteImageBuild(t *testing.T) {
	s := scopeServer(t)
	routes := s.routes()
	for i := range routes {
		if routes[i].pattern == "POST /v1/templates" {
			routes[i].handler = s.buildTemplateFrom
		}
	}
	s.mux = s.newMux(routes)
	tcp := s.Handler(true)
	for _, from := range []string{
		"oci:/etc", "docker-archive:/etc/shadow", "docker-archive:/root/img.tar:app:1",
		"127.0.0.1:5000/app:1", "localhost:5000/app", "LOCALHOST./app", "[::1]:5000/app", "169.254.169.254/latest:1",
		"0.0.0.0:5000/app", "reg.localhost:5000/app",
	} {
		req := httptest.NewRequest(http.MethodPost, "/v1/templates", strings.NewReader(`{"name":"x","from":"`+from+`"}`))
		req.Header.Set("Authorization", "Bearer admin")
		rec := httptest.NewRecorder()
		tcp.ServeHTTP(rec, req)
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), api.CodePermissionDenied) {
			t.Errorf("remote admin building from %s: %d %q", from, rec.Code, rec.Body)
		}
	}
	for _, from := range []string{"python:3.12-slim", "ghcr.io/org/img@sha256:" + strings.Repeat("ab", 32), "10.0.0.5:5000/app:1", "registry.example.com/app"} {
		if msg := remoteImageDenied(from); msg != "" {
			t.Errorf("%s refused for a remote admin: %s", from, msg)
		}
	}
}
