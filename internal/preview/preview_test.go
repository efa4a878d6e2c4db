package preview

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/nookhq/nook/internal/errdefs"
)

// fakeSandboxes is the daemon: sandboxes by name, each port's app a
// local listener.
type fakeSandboxes struct {
	mu    sync.Mutex
	boxes map[string]*fakeBox
	used  map[string]int
	dials atomic.Int64
	wakes atomic.Int64
}

type fakeBox struct {
	id    string
	state string
	ports map[int]fakePort
}

type fakePort struct {
	exposed, public bool
	addr            string // "" when nothing listens
	nonce           string // the exposure's nonce: testNonce when ""
	noNonce         bool   // no nonce at all
}

const testNonce = "n0nce"

func newFake() *fakeSandboxes {
	return &fakeSandboxes{boxes: map[string]*fakeBox{}, used: map[string]int{}}
}

func (f *fakeSandboxes) set(name string, b *fakeBox) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.boxes[name] = b
}

func (f *fakeSandboxes) Port(ctx context.Context, name string, port int) (PortInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.boxes[name]
	if !ok {
		return PortInfo{}, fmt.Errorf("port: %w", errdefs.NotFound("sandbox %s not found", name))
	}
	p := b.ports[port]
	nonce := p.nonce
	if nonce == "" && !p.noNonce {
		nonce = testNonce
	}
	return PortInfo{SandboxID: b.id, State: b.state, Exposed: p.exposed, Public: p.public, Nonce: nonce}, nil
}

func (f *fakeSandboxes) DialPort(ctx context.Context, name string, port int) (net.Conn, error) {
	f.dials.Add(1)
	f.mu.Lock()
	b, ok := f.boxes[name]
	if !ok {
		f.mu.Unlock()
		return nil, errdefs.NotFound("sandbox %s not found", name)
	}
	if b.state == "paused" {
		b.state = "running"
		f.wakes.Add(1)
	}
	addr := b.ports[port].addr
	f.mu.Unlock()
	if addr == "" {
		return nil, errdefs.NotFound("sandbox %s: nothing answers on port %d in the sandbox", name, port)
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (f *fakeSandboxes) Used(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.used[id]++
}

func (f *fakeSandboxes) usedCount(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.used[id]
}

var testKey = []byte("0123456789abcdef0123456789abcdef")

// env is a preview server in front of fake sandboxes, and a client that
// reaches it whatever the URL's host (so *.localhost needs no DNS) and
// does not follow redirects.
type env struct {
	fake   *fakeSandboxes
	srv    *Server
	front  *httptest.Server
	client *http.Client
}

func newEnv(t *testing.T, cfg Config) *env {
	t.Helper()
	if cfg.Key == nil {
		cfg.Key = testKey
	}
	e := &env{fake: newFake()}
	e.srv = New(e.fake, cfg)
	e.front = httptest.NewServer(e.srv)
	t.Cleanup(e.front.Close)
	t.Cleanup(e.srv.Close)
	addr := e.front.Listener.Addr().String()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	e.client = &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return e
}

// echo is an app that answers with what it got.
type echoed struct {
	App    string `json:"app"`
	Host   string `json:"host"`
	Path   string `json:"path"`
	Query  string `json:"query"`
	Cookie string `json:"cookie"`
	Token  string `json:"token"`
	XFH    string `json:"xfh"`
}

func echoApp(t *testing.T, name string) string {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(echoed{
			App: name, Host: r.Host, Path: r.URL.Path, Query: r.URL.RawQuery,
			Cookie: strings.Join(r.Header.Values("Cookie"), " | "),
			Token:  r.Header.Get(HeaderName), XFH: r.Header.Get("X-Forwarded-Host"),
		})
	}))
	t.Cleanup(app.Close)
	return app.Listener.Addr().String()
}

type result struct {
	code int
	body string
	resp *http.Response
}

func (e *env) do(t *testing.T, method, rawURL string, hdr map[string]string) result {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return result{resp.StatusCode, string(b), resp}
}

func (e *env) get(t *testing.T, rawURL string) result {
	t.Helper()
	return e.do(t, http.MethodGet, rawURL, nil)
}

func decodeEcho(t *testing.T, r result) echoed {
	t.Helper()
	if r.code != http.StatusOK {
		t.Fatalf("status %d, body %s", r.code, r.body)
	}
	var got echoed
	if err := json.Unmarshal([]byte(r.body), &got); err != nil {
		t.Fatalf("not the app's answer: %v: %s", err, r.body)
	}
	return got
}

func TestRouting(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, public: true, addr: echoApp(t, "task-8000")},
		3000: {exposed: true, public: true, addr: echoApp(t, "task-3000")},
	}})
	e.fake.set("my-app-2", &fakeBox{id: "id-app", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, public: true, addr: echoApp(t, "app-8000")},
	}})
	for host, app := range map[string]string{
		"8000-task.localhost":       "task-8000",
		"3000-task.localhost:8080":  "task-3000",
		"8000-my-app-2.localhost":   "app-8000",
		"8000-My-App-2.LOCALHOST.":  "app-8000",
		"8000-my-app-2.localhost:1": "app-8000",
	} {
		got := decodeEcho(t, e.get(t, "http://"+host+"/some/path?a=1"))
		if got.App != app {
			t.Errorf("%s reached %s, want %s", host, got.App, app)
		}
		if got.Host != host || got.XFH != host || got.Path != "/some/path" || got.Query != "a=1" {
			t.Errorf("%s: the app saw %+v", host, got)
		}
	}
	for _, host := range []string{
		"8000-task.example.com", "8000-task.localhost.example.com", "task.localhost",
		"localhost", "127.0.0.1", "127.0.0.1:8080", "[::1]:8080", "8000-.localhost",
		"08000-task.localhost", "70000-task.localhost", "8000-task-.localhost",
		"8000_task.localhost", "x8000-task.localhost", "8000-task.sub.localhost",
	} {
		r := e.get(t, "http://"+host+"/")
		if r.code != http.StatusNotFound || !strings.Contains(r.body, "no preview here") {
			t.Errorf("%s: %d %s", host, r.code, r.body)
		}
	}
	if n := e.fake.dials.Load(); n != 3 {
		t.Errorf("%d dials, want 3 (one per port reached)", n)
	}
}

func TestRouteDomain(t *testing.T) {
	e := newEnv(t, Config{Domain: "Preview.Example.COM."})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, public: true, addr: echoApp(t, "task")},
	}})
	decodeEcho(t, e.get(t, "http://8000-task.preview.example.com/"))
	if r := e.get(t, "http://8000-task.localhost/"); r.code != http.StatusNotFound {
		t.Fatalf("another domain: %d", r.code)
	}
}

func TestTokenFlow(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task")},
		9000: {exposed: true, addr: echoApp(t, "task-9000")},
	}})
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	tok := e.srv.Token("id-task", 8000, testNonce, exp)
	u := URL("http", "localhost", 0, "task", 8000, tok)
	if want := "http://8000-task.localhost/?nook_token=" + tok; u != want {
		t.Fatalf("URL %q, want %q", u, want)
	}

	// No token.
	r := e.get(t, "http://8000-task.localhost/")
	if r.code != http.StatusUnauthorized || !strings.Contains(r.body, "nook expose task 8000") {
		t.Fatalf("no token: %d %s", r.code, r.body)
	}

	// First visit: 303 to the same URL without the token, and a cookie.
	r = e.get(t, "http://8000-task.localhost:8080/a/b?x=1&nook_token="+tok+"&y=2")
	if r.code != http.StatusSeeOther {
		t.Fatalf("query token: %d %s", r.code, r.body)
	}
	if loc := r.resp.Header.Get("Location"); loc != "/a/b?x=1&y=2" {
		t.Fatalf("Location %q", loc)
	}
	cookies := r.resp.Cookies()
	if len(cookies) != 1 {
		t.Fatalf("cookies %v", cookies)
	}
	c := cookies[0]
	if c.Name != CookieName || c.Value != tok || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode ||
		c.Path != "/" || c.Domain != "" || c.Secure || !c.Expires.Equal(exp) {
		t.Fatalf("cookie %+v", c)
	}
	if raw := r.resp.Header.Get("Set-Cookie"); strings.Contains(strings.ToLower(raw), "domain") {
		t.Fatalf("cookie not host-only: %s", raw)
	}

	// The cookie works.
	decodeEcho(t, e.do(t, http.MethodGet, "http://8000-task.localhost:8080/a/b", map[string]string{"Cookie": c.String()}))
	// So does the header.
	decodeEcho(t, e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{HeaderName: tok}))
	// A POST with the token in its query is let through, not redirected.
	if got := decodeEcho(t, e.do(t, http.MethodPost, "http://8000-task.localhost/p?nook_token="+tok, nil)); got.Query != "" {
		t.Fatalf("the app saw the token: %+v", got)
	}

	bad := map[string]string{
		"expired":       e.srv.Token("id-task", 8000, testNonce, time.Now().Add(-time.Second)),
		"other port":    e.srv.Token("id-task", 9000, testNonce, exp),
		"garbage":       "not-a-token",
		"truncated":     tok[:len(tok)-1],
		"other key":     New(e.fake, Config{Key: []byte(strings.Repeat("k", 32))}).Token("id-task", 8000, testNonce, exp),
		"flipped":       flip(tok),
		"empty":         "",
		"long garbage":  strings.Repeat("A", 4096),
		"non-canonical": nonCanonical(tok),
	}
	for what, bt := range bad {
		for _, how := range []string{"query", "cookie", "header"} {
			var r result
			switch how {
			case "query":
				r = e.get(t, "http://8000-task.localhost/?nook_token="+url.QueryEscape(bt))
			case "cookie":
				r = e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{"Cookie": CookieName + "=" + bt})
			case "header":
				r = e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{HeaderName: bt})
			}
			if r.code != http.StatusUnauthorized || !strings.Contains(r.body, "nook expose task 8000") {
				t.Errorf("%s token in %s: %d %s", what, how, r.code, r.body)
			}
			if what == "expired" && !strings.Contains(r.body, "expired") {
				t.Errorf("expired token in %s: the page does not say so: %s", how, r.body)
			}
			if how == "cookie" && what != "empty" {
				if cs := r.resp.Cookies(); len(cs) != 1 || cs[0].Name != CookieName || cs[0].MaxAge >= 0 {
					t.Errorf("%s cookie not deleted: %v", what, cs)
				}
			}
		}
	}
	// The port's own token works on port 9000 only.
	decodeEcho(t, e.do(t, http.MethodGet, "http://9000-task.localhost/", map[string]string{HeaderName: bad["other port"]}))
}

// flip changes one character of the MAC part of a token.
func flip(tok string) string {
	b := []byte(tok)
	if b[20] == 'A' {
		b[20] = 'B'
	} else {
		b[20] = 'A'
	}
	return string(b)
}

// nonCanonical is tok with the unused low bits of its last character set.
func nonCanonical(tok string) string {
	b := []byte(tok)
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, b[len(b)-1])
	b[len(b)-1] = alphabet[i|1]
	return string(b)
}

func TestTokenBoundToSandbox(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-1", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task")},
	}})
	e.fake.set("other", &fakeBox{id: "id-other", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "other")},
	}})
	exp := time.Now().Add(time.Hour)
	tok := e.srv.Token("id-1", 8000, testNonce, exp)
	decodeEcho(t, e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{HeaderName: tok}))

	// Another sandbox's host with this sandbox's token.
	for _, h := range []map[string]string{{HeaderName: tok}, {"Cookie": CookieName + "=" + tok}} {
		if r := e.do(t, http.MethodGet, "http://8000-other.localhost/", h); r.code != http.StatusUnauthorized {
			t.Fatalf("task's token on other: %d %s", r.code, r.body)
		}
	}
	if r := e.get(t, "http://8000-other.localhost/?nook_token="+tok); r.code != http.StatusUnauthorized {
		t.Fatalf("task's token in other's query: %d %s", r.code, r.body)
	}

	// The name made again: another ID, the old token fails.
	e.fake.set("task", &fakeBox{id: "id-2", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task-again")},
	}})
	if r := e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{HeaderName: tok}); r.code != http.StatusUnauthorized {
		t.Fatalf("old sandbox's token: %d %s", r.code, r.body)
	}
	got := decodeEcho(t, e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{HeaderName: e.srv.Token("id-2", 8000, testNonce, exp)}))
	if got.App != "task-again" {
		t.Fatalf("reached %s", got.App)
	}
}

func TestCredentialsStripped(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task")},
	}})
	tok := e.srv.Token("id-task", 8000, testNonce, time.Now().Add(time.Hour))
	for _, tc := range []struct {
		method, query string
		hdr           map[string]string
	}{
		{http.MethodGet, "x=1&y=a%20b", map[string]string{"Cookie": "a=1; " + CookieName + "=" + tok + "; b=2", HeaderName: tok}},
		{http.MethodGet, "x=1&y=a%20b", map[string]string{"Cookie": CookieName + "=" + tok + ";a=1;b=2"}},
		{http.MethodPost, "x=1&nook_token=" + tok + "&y=a%20b", map[string]string{"Cookie": "a=1; b=2; " + CookieName + "=junk"}},
		{http.MethodPost, "nook%5Ftoken=" + tok + "&x=1&y=a%20b", map[string]string{"Cookie": "a=1; b=2"}},
	} {
		got := decodeEcho(t, e.do(t, tc.method, "http://8000-task.localhost/p?"+tc.query, tc.hdr))
		if got.Cookie != "a=1; b=2" || got.Token != "" || got.Query != "x=1&y=a%20b" {
			t.Errorf("%s ?%s %v: the app saw cookie %q, token header %q, query %q", tc.method, tc.query, tc.hdr, got.Cookie, got.Token, got.Query)
		}
	}
	// Only nook's cookie: no Cookie header at all.
	got := decodeEcho(t, e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{"Cookie": CookieName + "=" + tok}))
	if got.Cookie != "" {
		t.Fatalf("the app saw cookie %q", got.Cookie)
	}
}

func TestRedirectStaysOnHost(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task")},
	}})
	tok := e.srv.Token("id-task", 8000, testNonce, time.Now().Add(time.Hour))
	r := e.get(t, "http://8000-task.localhost//evil.example/x?nook_token="+tok)
	if r.code != http.StatusSeeOther {
		t.Fatalf("%d %s", r.code, r.body)
	}
	loc := r.resp.Header.Get("Location")
	if loc != "/.//evil.example/x" {
		t.Fatalf("Location %q", loc)
	}
	base, _ := url.Parse("http://8000-task.localhost//evil.example/x")
	ref, _ := url.Parse(loc)
	if got := base.ResolveReference(ref); got.Host != "8000-task.localhost" {
		t.Fatalf("the redirect leaves the host: %s", got)
	}
}

func TestPublicPort(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, public: true, addr: echoApp(t, "task")},
	}})
	decodeEcho(t, e.get(t, "http://8000-task.localhost/"))
	// A public port still hides nook's credentials from the app.
	got := decodeEcho(t, e.get(t, "http://8000-task.localhost/?nook_token=x&a=b"))
	if got.Query != "a=b" {
		t.Fatalf("query %q", got.Query)
	}
}

func TestNotExposedLikeUnknown(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task")},
		9000: {addr: echoApp(t, "task-9000")},
	}})
	tok := e.srv.Token("id-task", 9000, testNonce, time.Now().Add(time.Hour))
	for _, accept := range []string{"", "application/json"} {
		var first *result
		for _, u := range []string{
			"http://9000-task.localhost/",  // exposed not
			"http://9001-task.localhost/",  // no such port
			"http://9000-ghost.localhost/", // no such sandbox
			"http://9000-ghost.localhost/?nook_token=" + tok,
			"http://nope.localhost/",
		} {
			r := e.do(t, http.MethodGet, u, map[string]string{"Accept": accept, HeaderName: tok})
			if r.code != http.StatusNotFound {
				t.Fatalf("%s: %d %s", u, r.code, r.body)
			}
			if first == nil {
				first = &r
				continue
			}
			if r.body != first.body || r.resp.Header.Get("Content-Type") != first.resp.Header.Get("Content-Type") {
				t.Fatalf("%s answers unlike an unknown sandbox:\n%s\nvs\n%s", u, r.body, first.body)
			}
		}
	}
	if n := e.fake.dials.Load(); n != 0 {
		t.Fatalf("%d dials", n)
	}
}

func TestPages(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, public: true},
	}})
	r := e.get(t, "http://8000-task.localhost/")
	if r.code != http.StatusBadGateway || !strings.Contains(r.body, "nothing listens on port 8000 in sandbox task") {
		t.Fatalf("%d %s", r.code, r.body)
	}
	h := r.resp.Header
	if h.Get("Content-Type") != "text/html; charset=utf-8" || h.Get("Cache-Control") != "no-store" {
		t.Fatalf("headers %v", h)
	}
	r = e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{"Accept": "text/html;q=0.9, application/json"})
	var body struct {
		Error string `json:"error"`
		Code  int    `json:"code"`
	}
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		t.Fatalf("%v: %s", err, r.body)
	}
	if r.code != http.StatusBadGateway || body.Code != http.StatusBadGateway || body.Error != "nothing listens on port 8000 in sandbox task" ||
		r.resp.Header.Get("Content-Type") != "application/json" || r.resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("%d %+v %v", r.code, body, r.resp.Header)
	}
}

func TestPageEscapes(t *testing.T) {
	s := New(newFake(), Config{Key: testKey})
	w := httptest.NewRecorder()
	s.page(w, httptest.NewRequest(http.MethodGet, "/", nil), http.StatusServiceUnavailable, "sandbox x is <script>alert(1)</script>: `nook resume <b>`")
	body := w.Body.String()
	if strings.Contains(body, "<script>") || strings.Contains(body, "<b>") || !strings.Contains(body, "<code>nook resume &lt;b&gt;</code>") {
		t.Fatalf("not escaped: %s", body)
	}
}

func TestDialError(t *testing.T) {
	e := newEnv(t, Config{})
	// A listener closed: a real "connection refused".
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, public: true},               // the agent's "nothing answers"
		8001: {exposed: true, public: true, addr: closed}, // refused
	}})
	for _, port := range []string{"8000", "8001"} {
		r := e.get(t, "http://"+port+"-task.localhost/")
		if r.code != http.StatusBadGateway || !strings.Contains(r.body, "nothing listens on port "+port+" in sandbox task") {
			t.Fatalf("%s: %d %s", port, r.code, r.body)
		}
	}
}

func TestBadAnswer(t *testing.T) {
	e := newEnv(t, Config{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Big", strings.Repeat("x", 300<<10))
	}))
	t.Cleanup(app.Close)
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, public: true, addr: app.Listener.Addr().String()},
	}})
	r := e.get(t, "http://8000-task.localhost/")
	if r.code != http.StatusBadGateway || !strings.Contains(r.body, "sent no valid answer") {
		t.Fatalf("%d %.200s", r.code, r.body)
	}
}

func TestStates(t *testing.T) {
	for _, wake := range []bool{false, true} {
		t.Run(fmt.Sprint("wake=", wake), func(t *testing.T) {
			e := newEnv(t, Config{Wake: wake})
			e.fake.set("task", &fakeBox{id: "id-task", state: "paused", ports: map[int]fakePort{
				8000: {exposed: true, addr: echoApp(t, "task")},
			}})
			tok := e.srv.Token("id-task", 8000, testNonce, time.Now().Add(time.Hour))
			hdr := map[string]string{HeaderName: tok}
			r := e.do(t, http.MethodGet, "http://8000-task.localhost/", hdr)
			if wake {
				decodeEcho(t, r)
				if e.fake.wakes.Load() != 1 || e.fake.usedCount("id-task") == 0 {
					t.Fatalf("wakes %d, used %d", e.fake.wakes.Load(), e.fake.usedCount("id-task"))
				}
			} else {
				if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "sandbox task is paused") ||
					!strings.Contains(r.body, "nook resume task") {
					t.Fatalf("%d %s", r.code, r.body)
				}
				if e.fake.dials.Load() != 0 || e.fake.usedCount("id-task") != 0 {
					t.Fatalf("a paused sandbox was dialed or used")
				}
			}
			// A stranger learns nothing of a paused sandbox.
			if r := e.get(t, "http://8000-task.localhost/"); r.code != http.StatusUnauthorized {
				t.Fatalf("no token: %d", r.code)
			}
			for _, state := range []string{"stopped", "failed", "creating", "destroying"} {
				e.fake.set("task", &fakeBox{id: "id-task", state: state, ports: map[int]fakePort{
					8000: {exposed: true, addr: echoApp(t, "task")},
				}})
				r := e.do(t, http.MethodGet, "http://8000-task.localhost/", hdr)
				if r.code != http.StatusServiceUnavailable || !strings.Contains(r.body, "sandbox task is "+state) {
					t.Fatalf("%s: %d %s", state, r.code, r.body)
				}
			}
		})
	}
}

func TestDialErrorCategories(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, public: true, addr: "x"},
	}})
	s := New(dialFailer{e.fake, errdefs.Limit("host limit: memory")}, Config{Key: testKey})
	w := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "http://8000-task.localhost/", nil)
	s.ServeHTTP(w, req)
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "at its limit") || strings.Contains(w.Body.String(), "memory") {
		t.Fatalf("%d %s", w.Code, w.Body.String())
	}
}

type dialFailer struct {
	*fakeSandboxes
	err error
}

func (d dialFailer) DialPort(context.Context, string, int) (net.Conn, error) { return nil, d.err }

func TestPortLookupError(t *testing.T) {
	s := New(portFailer{newFake()}, Config{Key: testKey})
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://8000-task.localhost/", nil))
	if w.Code != http.StatusInternalServerError {
		t.Fatalf("%d %s", w.Code, w.Body.String())
	}
}

type portFailer struct{ *fakeSandboxes }

func (portFailer) Port(context.Context, string, int) (PortInfo, error) {
	return PortInfo{}, io.ErrUnexpectedEOF
}

func TestSSENotBuffered(t *testing.T) {
	e := newEnv(t, Config{})
	release := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(release) }) }
	t.Cleanup(done)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Content-Length", "") // no length: a stream
		fmt.Fprint(w, "data: hello\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(app.Close)
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, public: true, addr: app.Listener.Addr().String()},
	}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://8000-task.localhost/events", nil)
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "data: hello\n" {
		t.Fatalf("the event did not come before the stream ended: %q %v", line, err)
	}
	done()
}

func TestWebSocket(t *testing.T) {
	e := newEnv(t, Config{})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery != "" {
			http.Error(w, "the token reached the app: "+r.URL.RawQuery, http.StatusBadRequest)
			return
		}
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, msg); err != nil {
				return
			}
		}
	}))
	t.Cleanup(app.Close)
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: app.Listener.Addr().String()},
	}})
	tok := e.srv.Token("id-task", 8000, testNonce, time.Now().Add(time.Hour))
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// The token in the query: an upgrade is not redirected.
	c, resp, err := websocket.Dial(ctx, "ws://8000-task.localhost:8080/ws?nook_token="+tok, &websocket.DialOptions{HTTPClient: e.client})
	if err != nil {
		if resp != nil {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("dial: %v: %d %s", err, resp.StatusCode, b)
		}
		t.Fatalf("dial: %v", err)
	}
	defer c.CloseNow()
	for _, msg := range []string{"hello", "again"} {
		if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		typ, got, err := c.Read(ctx)
		if err != nil || typ != websocket.MessageText || string(got) != msg {
			t.Fatalf("echo: %v %q %v", typ, got, err)
		}
	}
	c.Close(websocket.StatusNormalClosure, "")

	// Without a token, no upgrade.
	_, resp, err = websocket.Dial(ctx, "ws://8000-task.localhost/ws", &websocket.DialOptions{HTTPClient: e.client})
	if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no token: %v %v", err, resp)
	}
}

func TestKeepAlive(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task")},
	}})
	hdr := map[string]string{HeaderName: e.srv.Token("id-task", 8000, testNonce, time.Now().Add(time.Hour))}
	for range 20 {
		decodeEcho(t, e.do(t, http.MethodGet, "http://8000-task.localhost/", hdr))
	}
	if n := e.fake.dials.Load(); n != 1 {
		t.Fatalf("%d dials for 20 requests", n)
	}
	if n := e.fake.usedCount("id-task"); n < 20 {
		t.Fatalf("Used %d times for 20 requests", n)
	}
	// Forget drops the pool: the next request dials again.
	e.srv.Forget("id-task")
	decodeEcho(t, e.do(t, http.MethodGet, "http://8000-task.localhost/", hdr))
	if n := e.fake.dials.Load(); n != 2 {
		t.Fatalf("%d dials after Forget", n)
	}
}

func TestPoolBounded(t *testing.T) {
	e := newEnv(t, Config{})
	e.srv.pool.max = 2
	ports := map[int]fakePort{}
	for p := 8000; p < 8004; p++ {
		ports[p] = fakePort{exposed: true, public: true, addr: echoApp(t, fmt.Sprint(p))}
	}
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: ports})
	for p := 8000; p < 8004; p++ {
		decodeEcho(t, e.get(t, fmt.Sprintf("http://%d-task.localhost/", p)))
		decodeEcho(t, e.get(t, fmt.Sprintf("http://%d-task.localhost/", p)))
	}
	if n := e.srv.pool.len(); n != 2 {
		t.Fatalf("%d transports kept, want 2", n)
	}
	if n := e.fake.dials.Load(); n != 4 {
		t.Fatalf("%d dials", n)
	}
	// 8000 was evicted: it dials again.
	decodeEcho(t, e.get(t, "http://8000-task.localhost/"))
	if n := e.fake.dials.Load(); n != 5 {
		t.Fatalf("%d dials", n)
	}
}

func TestURL(t *testing.T) {
	for _, tc := range []struct {
		scheme, domain string
		listen         int
		tok, want      string
	}{
		{"http", "localhost", 8080, "", "http://8000-task.localhost:8080/"},
		{"http", "localhost", 80, "", "http://8000-task.localhost/"},
		{"https", "preview.example.com", 443, "t_-1", "https://8000-task.preview.example.com/?nook_token=t_-1"},
		{"https", "preview.example.com", 8443, "", "https://8000-task.preview.example.com:8443/"},
		{"http", "localhost", 0, "", "http://8000-task.localhost/"},
	} {
		got := URL(tc.scheme, tc.domain, tc.listen, "task", 8000, tc.tok)
		if got != tc.want {
			t.Errorf("URL = %q, want %q", got, tc.want)
		}
		u, err := url.Parse(got)
		if err != nil {
			t.Fatal(err)
		}
		if name, port, ok := Route(u.Host, tc.domain); !ok || name != "task" || port != 8000 {
			t.Errorf("Route(%q) = %q %d %v", u.Host, name, port, ok)
		}
	}
}

func TestQueryHelpers(t *testing.T) {
	for raw, want := range map[string]string{
		"":                             "",
		"a=1":                          "a=1",
		"nook_token=x":                 "",
		"a=1&nook_token=x&b=%20&c":     "a=1&b=%20&c",
		"nook%5ftoken=x&nook_token&&a": "a",
		"nook_tokenx=1":                "nook_tokenx=1",
	} {
		if got := stripQuery(raw, QueryParam); got != want {
			t.Errorf("stripQuery(%q) = %q, want %q", raw, got, want)
		}
	}
	if got := queryValues("a=1&nook_token=x%2By&nook%5Ftoken=z&nook_token=%zz", QueryParam, 8); strings.Join(got, ",") != "x+y,z" {
		t.Errorf("queryValues = %q", got)
	}
}

func TestCheckDomain(t *testing.T) {
	for _, d := range []string{"localhost", "Preview.Example.com.", "localhost:8080", "a_b.test"} {
		if err := CheckDomain(d); err != nil {
			t.Errorf("%q: %v", d, err)
		}
	}
	for _, d := range []string{"", ".", ".localhost", "a..b", "a/b", "[::1]", "a b", "x:y:z", strings.Repeat("a", 64)} {
		if err := CheckDomain(d); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v", d, err)
		}
		if _, _, ok := Route("8000-task."+d, d); ok {
			t.Errorf("%q routes", d)
		}
	}
}

func FuzzRoute(f *testing.F) {
	for _, s := range []string{
		"8000-task.localhost", "8000-task.localhost:8080", "8000-my-app.localhost.", "8000-TASK.LocalHost",
		"localhost", "127.0.0.1:80", "[::1]:80", "-task.localhost", "8000-.localhost", "0-a.localhost",
		"65535-a.localhost", "65536-a.localhost", "1-a\u212a.localhost", "8000-task.locaLhost:", "::::",
	} {
		f.Add(s, "localhost")
	}
	f.Add("8000-task.preview.example.com", "Preview.Example.com.")
	f.Add("8000-task.", "")
	f.Add("8000-task.a/b", "a/b")
	f.Fuzz(func(t *testing.T, host, domain string) {
		name, port, ok := Route(host, domain)
		if !ok {
			if name != "" || port != 0 {
				t.Fatalf("not ok but %q %d", name, port)
			}
			return
		}
		if port < 1 || port > 65535 || !validName(name) || name != strings.ToLower(name) {
			t.Fatalf("Route(%q, %q) = %q %d", host, domain, name, port)
		}
		// What routes is a preview URL's host, and reads back the same.
		u, err := url.Parse(URL("http", domain, 0, name, port, ""))
		if err != nil {
			t.Fatalf("URL of %q %d: %v", name, port, err)
		}
		if n2, p2, ok2 := Route(u.Host, domain); !ok2 || n2 != name || p2 != port {
			t.Fatalf("URL host %q routes to %q %d %v, want %q %d", u.Host, n2, p2, ok2, name, port)
		}
	})
}
