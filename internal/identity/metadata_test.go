package identity_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/identity"
)

var testCaller = netip.MustParseAddr("10.11.0.2")

const fakeJWT = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"

// fakeSource is a sandbox's Source: it records what it was asked.
type fakeSource struct {
	mu                     sync.Mutex
	tokenErr, factsErr     error
	facts                  any
	tokenCalls, factsCalls int
	aud                    string
	ttl                    time.Duration
}

func (s *fakeSource) Token(ctx context.Context, aud string, ttl time.Duration) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokenCalls++
	s.aud, s.ttl = aud, ttl
	if s.tokenErr != nil {
		return "", s.tokenErr
	}
	return fakeJWT, nil
}

func (s *fakeSource) Facts(ctx context.Context) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.factsCalls++
	if s.factsErr != nil {
		return nil, s.factsErr
	}
	return s.facts, nil
}

func (s *fakeSource) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokenCalls + s.factsCalls
}

// metaRequest is a request the endpoint serves: from the caller, to
// 169.254.169.254, with the header.
func metaRequest(method, target string) *http.Request {
	r := httptest.NewRequest(method, "http://"+identity.MetadataAddr+target, nil)
	r.RemoteAddr = "10.11.0.2:40000"
	r.Header.Set(identity.MetadataHeader, "true")
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMetadataHandlerRequests(t *testing.T) {
	host := func(h string) func(*http.Request) { return func(r *http.Request) { r.Host = h } }
	remote := func(a string) func(*http.Request) { return func(r *http.Request) { r.RemoteAddr = a } }
	header := func(k, v string) func(*http.Request) { return func(r *http.Request) { r.Header.Set(k, v) } }
	noHeader := func(r *http.Request) { r.Header.Del(identity.MetadataHeader) }
	const token = "/v1/token?audience=sts.example.com&ttl=15m"
	tests := []struct {
		name, method, target string
		mod                  []func(*http.Request)
		want                 int
	}{
		{"IP host", "GET", token, nil, 200},
		{"name host", "GET", token, []func(*http.Request){host("metadata.nook.internal")}, 200},
		{"IP host, port 80", "GET", token, []func(*http.Request){host("169.254.169.254:80")}, 200},
		{"name host, port 80", "GET", token, []func(*http.Request){host("metadata.nook.internal:80")}, 200},
		{"name host, any case, trailing dot", "GET", token, []func(*http.Request){host("METADATA.Nook.Internal.")}, 200},
		{"caller as IPv4-mapped IPv6", "GET", token, []func(*http.Request){remote("[::ffff:10.11.0.2]:40000")}, 200},

		{"another sandbox", "GET", token, []func(*http.Request){remote("10.11.0.3:40000")}, 403},
		{"the host", "GET", token, []func(*http.Request){remote("127.0.0.1:40000")}, 403},
		{"IPv6 caller", "GET", token, []func(*http.Request){remote("[fe80::1]:40000")}, 403},
		{"caller without port", "GET", token, []func(*http.Request){remote("10.11.0.2")}, 403},
		{"no remote address", "GET", token, []func(*http.Request){remote("")}, 403},
		{"POST from another sandbox", "POST", token, []func(*http.Request){remote("10.11.0.3:40000")}, 403},

		{"no header", "GET", token, []func(*http.Request){noHeader}, 403},
		{"header false", "GET", token, []func(*http.Request){header(identity.MetadataHeader, "false")}, 403},
		{"header empty", "GET", token, []func(*http.Request){header(identity.MetadataHeader, "")}, 403},
		{"header 1", "GET", token, []func(*http.Request){header(identity.MetadataHeader, "1")}, 403},

		{"X-Forwarded-For", "GET", token, []func(*http.Request){header("X-Forwarded-For", "203.0.113.9")}, 403},
		{"X-Forwarded-For empty", "GET", token, []func(*http.Request){func(r *http.Request) { r.Header["X-Forwarded-For"] = []string{""} }}, 403},
		{"Forwarded", "GET", token, []func(*http.Request){header("Forwarded", "for=203.0.113.9")}, 403},
		{"Via", "GET", token, []func(*http.Request){header("Via", "1.1 proxy.example")}, 403},
		{"X-Forwarded-Host", "GET", token, []func(*http.Request){header("X-Forwarded-Host", "metadata.nook.internal")}, 403},

		{"Host evil.example", "GET", token, []func(*http.Request){host("evil.example")}, 403},
		{"Host port 8080", "GET", token, []func(*http.Request){host("169.254.169.254:8080")}, 403},
		{"Host empty port", "GET", token, []func(*http.Request){host("169.254.169.254:")}, 403},
		{"Host suffix", "GET", token, []func(*http.Request){host("metadata.nook.internal.evil.example")}, 403},
		{"Host rebinding name", "GET", token, []func(*http.Request){host("169.254.169.254.nip.io")}, 403},
		{"Host empty", "GET", token, []func(*http.Request){host("")}, 403},
		{"Host localhost", "GET", token, []func(*http.Request){host("localhost")}, 403},
		{"Host two dots", "GET", token, []func(*http.Request){host("metadata.nook.internal..")}, 403},

		{"POST", "POST", token, nil, 405},
		{"PUT", "PUT", token, nil, 405},
		{"HEAD", "HEAD", token, nil, 405},
		{"DELETE", "DELETE", "/v1/sandbox", nil, 405},

		{"ttl not a duration", "GET", "/v1/token?audience=a&ttl=abc", nil, 400},
		{"ttl without unit", "GET", "/v1/token?audience=a&ttl=10", nil, 400},

		{"unknown path", "GET", "/nope", nil, 404},
		{"token path with slash", "GET", "/v1/token/", nil, 404},
		{"cloud path", "GET", "/latest/meta-data/iam/security-credentials/", nil, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := &fakeSource{}
			h := identity.MetadataHandler(testCaller, src)
			r := metaRequest(tc.method, tc.target)
			for _, m := range tc.mod {
				m(r)
			}
			w := serve(h, r)
			if w.Code != tc.want {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.want, w.Body)
			}
			if w.Header().Get(identity.MetadataHeader) != "true" || w.Header().Get("Cache-Control") != "no-store" {
				t.Errorf("response headers %v", w.Header())
			}
			if tc.want != 200 {
				if n := src.calls(); n != 0 {
					t.Fatalf("a refused request reached the source (%d calls)", n)
				}
				return
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/jwt" {
				t.Errorf("Content-Type %q", ct)
			}
			if w.Body.String() != fakeJWT {
				t.Errorf("body %q, want the token", w.Body)
			}
			if src.tokenCalls != 1 || src.aud != "sts.example.com" || src.ttl != 15*time.Minute {
				t.Errorf("source asked %d times, audience %q ttl %s", src.tokenCalls, src.aud, src.ttl)
			}
		})
	}
}

func TestMetadataHandlerTokenDefaults(t *testing.T) {
	src := &fakeSource{}
	h := identity.MetadataHandler(testCaller, src)
	w := serve(h, metaRequest("GET", "/v1/token?audience="+url.QueryEscape("api://Azure AD&x")))
	if w.Code != 200 {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if src.aud != "api://Azure AD&x" || src.ttl != 0 {
		t.Errorf("audience %q ttl %s: want the decoded audience and no ttl (the default)", src.aud, src.ttl)
	}
	// The Source judges the audience: an empty one is passed on.
	w = serve(h, metaRequest("GET", "/v1/token"))
	if w.Code != 200 || src.aud != "" {
		t.Errorf("no audience: status %d, audience %q", w.Code, src.aud)
	}
}

func TestMetadataHandlerFactsAndIndex(t *testing.T) {
	src := &fakeSource{facts: map[string]any{"id": "sb-1", "name": "web", "labels": map[string]string{"a": "b"}}}
	h := identity.MetadataHandler(testCaller, src)
	w := serve(h, metaRequest("GET", "/v1/sandbox"))
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d type %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	var got map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got["id"] != "sb-1" || got["name"] != "web" || got["labels"].(map[string]any)["a"] != "b" {
		t.Errorf("facts %v", got)
	}
	if src.factsCalls != 1 || src.tokenCalls != 0 {
		t.Errorf("facts %d token %d calls", src.factsCalls, src.tokenCalls)
	}

	w = serve(h, metaRequest("GET", "/"))
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") || !strings.Contains(w.Body.String(), "/v1/token") {
		t.Errorf("index: status %d type %q: %s", w.Code, w.Header().Get("Content-Type"), w.Body)
	}
	r := metaRequest("GET", "/")
	r.Header.Del(identity.MetadataHeader)
	if w := serve(h, r); w.Code != 403 {
		t.Errorf("index without the header: status %d", w.Code)
	}
}

func TestMetadataHandlerSourceErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{errdefs.Invalid("an audience is required"), 400},
		{fmt.Errorf("issue: %w", errdefs.Invalid("token lifetime 2h is outside 1m..1h")), 400},
		{errdefs.Precondition("sandbox web has expired: it gets no tokens"), 409},
		{fmt.Errorf("issue: %w", errdefs.Precondition("stopped")), 409},
		{errdefs.NotFound("sandbox gone"), 404},
		{errdefs.Limit("too many"), 429},
		{errors.New("disk on fire"), 500},
	} {
		t.Run(tc.err.Error(), func(t *testing.T) {
			for _, path := range []string{"/v1/token?audience=a", "/v1/sandbox"} {
				src := &fakeSource{tokenErr: tc.err, factsErr: tc.err}
				w := serve(identity.MetadataHandler(testCaller, src), metaRequest("GET", path))
				if w.Code != tc.want {
					t.Errorf("%s: status %d, want %d", path, w.Code, tc.want)
				}
				if !strings.Contains(w.Body.String(), tc.err.Error()) {
					t.Errorf("%s: body %q lacks the error", path, w.Body)
				}
				if ct := w.Header().Get("Content-Type"); ct == "application/jwt" || ct == "application/json" {
					t.Errorf("%s: an error served as %s", path, ct)
				}
			}
		})
	}
}

func TestMetadataHandlerRateLimit(t *testing.T) {
	src := &fakeSource{}
	h := identity.MetadataHandler(testCaller, src)
	codes := make([]int, 200)
	start := time.Now()
	for i := range codes {
		codes[i] = serve(h, metaRequest("GET", "/v1/token?audience=a")).Code
	}
	elapsed := time.Since(start)
	ok, limited := 0, 0
	for i, c := range codes {
		switch {
		case c == 200:
			ok++
		case c == 429:
			limited++
		default:
			t.Fatalf("request %d: status %d", i, c)
		}
		if i < 40 && c != 200 {
			t.Fatalf("request %d of the burst of 40: status %d", i, c)
		}
	}
	if limited == 0 {
		t.Fatalf("%d requests in %s: none limited", len(codes), elapsed)
	}
	// 40 at once, then 20 a second.
	if most := 40 + int(math.Ceil(elapsed.Seconds()*20)) + 1; ok > most {
		t.Errorf("%d requests served in %s, want at most %d", ok, elapsed, most)
	}
	if src.tokenCalls != ok {
		t.Errorf("the source was asked %d times for %d served requests", src.tokenCalls, ok)
	}
	// A refused request is refused, not limited.
	r := metaRequest("GET", "/v1/token?audience=a")
	r.Header.Del(identity.MetadataHeader)
	if c := serve(h, r).Code; c != 403 {
		t.Errorf("request without the header, limiter empty: status %d, want 403", c)
	}
	// Facts share the limit.
	if c := serve(h, metaRequest("GET", "/v1/sandbox")).Code; c != 429 {
		t.Errorf("facts with the limiter empty: status %d, want 429", c)
	}
	// Another sandbox's endpoint has its own limiter.
	if c := serve(identity.MetadataHandler(testCaller, src), metaRequest("GET", "/v1/token?audience=a")).Code; c != 200 {
		t.Errorf("another handler: status %d", c)
	}
}

// metadataHosts are the Host headers that name the endpoint (in lower
// case): the address or the name, with a trailing dot or not, with port
// 80 or none, bracketed with the port.
var metadataHosts = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range []string{identity.MetadataAddr, identity.MetadataName} {
		for _, h := range []string{n, n + "."} {
			m[h] = true
			m[h+":80"] = true
			m["["+h+"]:80"] = true
		}
	}
	return m
}()

func FuzzMetadataRequest(f *testing.F) {
	f.Add("GET", "/v1/token", "audience=sts.example.com&ttl=10m", "169.254.169.254", "10.11.0.2:40000", "Accept", "*/*", "true")
	f.Add("GET", "/v1/sandbox", "", "metadata.nook.internal:80", "[::ffff:10.11.0.2]:1", "X-Forwarded-For", "1.2.3.4", "true")
	f.Add("POST", "/v1/token", "ttl=abc", "evil.example", "10.11.0.3:1", "Via", "1.1 proxy", "false")
	f.Add("GET", "/", "", "169.254.169.254:8080", "", "nook-metadata", "true", "")
	f.Add("GET", "/v1/token", "audience=%00&ttl=-5m", "METADATA.NOOK.INTERNAL.", "10.11.0.2:1", "Forwarded", "for=1.2.3.4", "true")
	f.Add("GET", "/v1/token", "ttl=9999999999999h", "[169.254.169.254]:80", "[::ffff:10.11.0.2%eth0]:80", "Nook-Metadata", "true", "")
	f.Add("", "//v1/token", "audience=a;ttl=1m", "169.254.169.254:80:80", "10.11.0.2:0", "X-Forwarded-Host", "", "TRUE")
	f.Fuzz(func(t *testing.T, method, path, query, host, remote, hdrName, hdrValue, meta string) {
		src := &fakeSource{facts: map[string]string{"id": "sb-1"}}
		if strings.Contains(query, "fail") {
			src.tokenErr = errdefs.Invalid("bad audience")
		}
		h := identity.MetadataHandler(testCaller, src)
		r := &http.Request{
			Method: method, URL: &url.URL{Path: path, RawQuery: query}, Host: host, RemoteAddr: remote,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{},
		}
		if meta != "" {
			r.Header.Set(identity.MetadataHeader, meta)
		}
		if hdrName != "" {
			r.Header[hdrName] = append(r.Header[hdrName], hdrValue) // as given, canonical or not
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r) // must not panic

		// What a request needs to be served, checked here independently.
		hasHeader := false
		for k, vs := range r.Header {
			if strings.EqualFold(k, identity.MetadataHeader) && len(vs) > 0 && vs[0] == "true" {
				hasHeader = true
			}
		}
		proxied := false
		for _, p := range []string{"X-Forwarded-For", "Forwarded", "Via", "X-Forwarded-Host"} {
			if _, ok := r.Header[p]; ok {
				proxied = true
			}
		}
		hostOK := metadataHosts[strings.ToLower(host)]
		ap, err := netip.ParseAddrPort(remote)
		callerOK := err == nil && ap.Addr().WithZone("").Unmap() == testCaller
		served := hasHeader && !proxied && hostOK && callerOK && method == http.MethodGet

		if w.Code == http.StatusOK && !served {
			t.Fatalf("200 for %s %q?%q Host %q from %q, header %q=%q, %s=%q: header %v proxy %v host %v caller %v",
				method, path, query, host, remote, hdrName, hdrValue, identity.MetadataHeader, meta, hasHeader, proxied, hostOK, callerOK)
		}
		if src.calls() > 0 && !served {
			t.Fatalf("a refused request reached the source: %s %q Host %q from %q", method, path, host, remote)
		}
		switch w.Code {
		case 200, 400, 403, 404, 405, 429:
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		if w.Code == http.StatusOK && path == "/v1/token" && (w.Body.String() != fakeJWT || w.Header().Get("Content-Type") != "application/jwt") {
			t.Fatalf("token response %q type %q", w.Body, w.Header().Get("Content-Type"))
		}
		if w.Header().Get(identity.MetadataHeader) != "true" || w.Header().Get("Cache-Control") != "no-store" {
			t.Fatalf("response headers %v", w.Header())
		}
	})
}
