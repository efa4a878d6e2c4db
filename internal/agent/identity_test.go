package agent

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

func fakeJWT(exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"ES256"}`)) + "." + enc([]byte(fmt.Sprintf(`{"exp":%d}`, exp.Unix()))) + ".c2ln"
}

// The keeper fetches the token with the metadata header, writes it whole
// and readable, fetches again when woken, and stops when told.
func TestTokenKeeper(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Nook-Metadata") != "true" || r.URL.Query().Get("audience") != "aud" {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		n.Add(1)
		fmt.Fprint(w, fakeJWT(time.Now().Add(10*time.Minute)))
	}))
	defer srv.Close()
	s := &Server{log: slog.New(slog.DiscardHandler)}
	file := filepath.Join(t.TempDir(), "identity", "token")
	s.keepToken(&IdentityConfig{Audience: "aud", File: file, URL: srv.URL + "/v1/token?audience=aud"})
	defer s.keepToken(nil)
	waitToken := func(count int32) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for n.Load() < count || !fileHasToken(file) {
			if time.Now().After(deadline) {
				t.Fatalf("the token file after %d fetches: %d fetches", count, n.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The first token is there when keepToken returns.
	if !fileHasToken(file) || n.Load() != 1 {
		t.Fatalf("after keepToken: %d fetches, token file written: %v", n.Load(), fileHasToken(file))
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o644 {
		t.Fatalf("token file: %v %v", fi, err)
	}
	s.wakeToken()
	waitToken(2)
	s.keepToken(nil)
	if s.token != nil {
		t.Fatal("the keeper is still running")
	}
}

func fileHasToken(path string) bool {
	b, err := os.ReadFile(path)
	_, terr := tokenExpiry(string(b))
	return err == nil && terr == nil
}

// Answers that are not a token are errors, never written.
func TestHTTPGetAndExpiry(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/denied":
			http.Error(w, "forbidden: no header", http.StatusForbidden)
		default:
			fmt.Fprint(w, "not a jwt")
		}
	}))
	defer srv.Close()
	if _, err := httpGet(context.Background(), srv.URL+"/denied", nil, 5*time.Second); err == nil {
		t.Fatal("a 403 was taken")
	}
	b, err := httpGet(context.Background(), srv.URL+"/ok", nil, 5*time.Second)
	if err != nil || string(b) != "not a jwt" {
		t.Fatalf("GET: %q %v", b, err)
	}
	for _, tok := range []string{"", "a.b", "a.!!!.c", "a." + base64.RawURLEncoding.EncodeToString([]byte(`{}`)) + ".c"} {
		if _, err := tokenExpiry(tok); err == nil {
			t.Errorf("tokenExpiry(%q) took it", tok)
		}
	}
	if _, err := httpGet(context.Background(), "https://example.invalid/", nil, time.Second); err == nil {
		t.Fatal("an https URL was taken")
	}
}
