package preview

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

func TestTokenRevokedByUnexpose(t *testing.T) {
	e := newEnv(t, Config{})
	addr := echoApp(t, "task")
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: addr, nonce: "first"},
	}})
	exp := time.Now().Add(time.Hour)
	old := e.srv.Token("id-task", 8000, "first", exp)
	decodeEcho(t, e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{HeaderName: old}))

	// Unexposed and exposed again: another nonce, the old token fails
	// however it comes.
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: addr, nonce: "second"},
	}})
	for how, r := range map[string]result{
		"header": e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{HeaderName: old}),
		"cookie": e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{"Cookie": CookieName + "=" + old}),
		"query":  e.get(t, "http://8000-task.localhost/?"+QueryParam+"="+old),
	} {
		if r.code != http.StatusUnauthorized {
			t.Errorf("old nonce's token in the %s: %d %s", how, r.code, r.body)
		}
	}
	decodeEcho(t, e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{HeaderName: e.srv.Token("id-task", 8000, "second", exp)}))

	// A port with no nonce opens to no token, not even one minted for
	// the empty nonce.
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: addr, noNonce: true},
	}})
	if r := e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{HeaderName: e.srv.Token("id-task", 8000, "", exp)}); r.code != http.StatusUnauthorized {
		t.Fatalf("no nonce: %d %s", r.code, r.body)
	}
}

func TestTokenFieldsApart(t *testing.T) {
	s := New(newFake(), Config{Key: testKey})
	exp := time.Now().Add(time.Hour)
	// The same bytes split differently between ID and nonce are other
	// tokens.
	a, b := s.Token("id-ab", 8000, "c", exp), s.Token("id-a", 8000, "bc", exp)
	if a == b {
		t.Fatal("the ID ran into the nonce")
	}
	if res, _ := s.verify(a, "id-a", 8000, "bc", time.Now()); res != tokenBad {
		t.Fatalf("verify: %v", res)
	}
	// The port and nonce too.
	if s.Token("id", 1, "2", exp) == s.Token("id", 12, "", exp) {
		t.Fatal("the nonce ran into the port")
	}
	// A NUL in a field could make two field lists one input.
	tok := s.Token("id\x00x", 8000, "n", exp)
	if res, _ := s.verify(tok, "id\x00x", 8000, "n", time.Now()); res != tokenBad {
		t.Fatalf("an ID with a NUL: %v", res)
	}
}

// crossSiteEnv is a sandbox whose port needs a token, and the cookie that
// opens it.
func crossSiteEnv(t *testing.T) (*env, string) {
	e := newEnv(t, Config{Domain: "preview.example.com"})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task")},
	}})
	return e, e.srv.Token("id-task", 8000, testNonce, time.Now().Add(time.Hour))
}

func TestCookieFromOtherSites(t *testing.T) {
	e, tok := crossSiteEnv(t)
	const (
		self    = "http://8000-task.preview.example.com:8080"
		sibling = "http://3000-evil.preview.example.com:8080"
	)
	type fm = map[string]string
	for _, tc := range []struct {
		what, method string
		hdr          fm
		ok           bool
	}{
		{"same-origin fetch", "GET", fm{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}, true},
		{"same-origin POST", "POST", fm{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Origin": self}, true},
		// A page with Referrer-Policy: no-referrer sends Origin: null
		// even to itself.
		{"same-origin POST, Origin null", "POST", fm{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "navigate", "Origin": "null"}, true},
		{"typed in the address bar", "GET", fm{"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, true},
		{"cross-site link", "GET", fm{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, true},
		{"same-site link", "GET", fm{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, true},
		{"same-site link, no Sec-Fetch-Dest", "HEAD", fm{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate"}, true},
		{"same-site POST", "POST", fm{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Origin": sibling}, false},
		{"same-site form POST", "POST", fm{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document", "Origin": sibling}, false},
		{"same-site fetch", "GET", fm{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Origin": sibling}, false},
		{"same-site script", "GET", fm{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "script"}, false},
		{"same-site frame", "GET", fm{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}, false},
		{"cross-site image", "GET", fm{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}, false},
		{"unknown Sec-Fetch-Site", "GET", fm{"Sec-Fetch-Site": "elsewhere", "Sec-Fetch-Mode": "cors"}, false},
		{"curl GET", "GET", fm{}, true},
		{"curl POST", "POST", fm{}, true},
		{"old browser, same-origin POST", "POST", fm{"Origin": self}, true},
		{"old browser, foreign GET", "GET", fm{"Origin": sibling}, true},
		{"old browser, foreign POST", "POST", fm{"Origin": sibling}, false},
		{"old browser, foreign PUT", "PUT", fm{"Origin": sibling}, false},
		{"old browser, other scheme", "POST", fm{"Origin": "https://8000-task.preview.example.com:8080"}, false},
	} {
		hdr := fm{"Cookie": CookieName + "=" + tok}
		for k, v := range tc.hdr {
			hdr[k] = v
		}
		r := e.do(t, tc.method, self+"/x", hdr)
		switch {
		case tc.ok && r.code != http.StatusOK:
			t.Errorf("%s: refused: %d %s", tc.what, r.code, r.body)
		case !tc.ok && (r.code != http.StatusForbidden || !strings.Contains(r.body, "other sites")):
			t.Errorf("%s: %d %s", tc.what, r.code, r.body)
		case !tc.ok && len(r.resp.Cookies()) != 0:
			t.Errorf("%s: the valid cookie was touched: %v", tc.what, r.resp.Cookies())
		}
		if tc.ok {
			continue
		}
		// A token its request carries itself is no cookie riding along.
		delete(hdr, "Cookie")
		hdr[HeaderName] = tok
		if r := e.do(t, tc.method, self+"/x", hdr); r.code != http.StatusOK {
			t.Errorf("%s with the header token: %d %s", tc.what, r.code, r.body)
		}
		delete(hdr, HeaderName)
		if r := e.do(t, tc.method, self+"/x?"+QueryParam+"="+tok, hdr); r.code != http.StatusOK && r.code != http.StatusSeeOther {
			t.Errorf("%s with the query token: %d %s", tc.what, r.code, r.body)
		}
	}
}

// wsEchoApp is an app that echoes WebSocket messages.
func wsEchoApp(t *testing.T) string {
	t.Helper()
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
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
	return app.Listener.Addr().String()
}

func TestWebSocketOrigin(t *testing.T) {
	e := newEnv(t, Config{Domain: "preview.example.com"})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: wsEchoApp(t)},
	}})
	tok := e.srv.Token("id-task", 8000, testNonce, time.Now().Add(time.Hour))
	const u = "ws://8000-task.preview.example.com:8080/ws"
	dial := func(hdr map[string]string) (*websocket.Conn, int, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		h := http.Header{}
		for k, v := range hdr {
			h.Set(k, v)
		}
		c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: e.client, HTTPHeader: h})
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		return c, code, err
	}
	cookie := CookieName + "=" + tok
	for what, hdr := range map[string]map[string]string{
		"a sibling's Origin": {"Cookie": cookie, "Origin": "http://3000-evil.preview.example.com:8080"},
		"another port":       {"Cookie": cookie, "Origin": "http://8000-task.preview.example.com:9090"},
		"no Origin":          {"Cookie": cookie},
		"same-site metadata": {"Cookie": cookie, "Origin": "http://8000-task.preview.example.com:8080", "Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "websocket"},
	} {
		if c, code, err := dial(hdr); err == nil || code != http.StatusForbidden {
			if c != nil {
				c.CloseNow()
			}
			t.Errorf("%s: %d %v", what, code, err)
		}
	}
	for what, hdr := range map[string]map[string]string{
		"its own Origin":                  {"Cookie": cookie, "Origin": "http://8000-task.preview.example.com:8080"},
		"its own Origin, in another case": {"Cookie": cookie, "Origin": "http://8000-Task.Preview.Example.com:8080", "Sec-Fetch-Site": "same-origin"},
		"the header token, no Origin":     {HeaderName: tok},
	} {
		c, code, err := dial(hdr)
		if err != nil {
			t.Errorf("%s: %d %v", what, code, err)
			continue
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		if err := c.Write(ctx, websocket.MessageText, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		if _, got, err := c.Read(ctx); err != nil || string(got) != "hi" {
			t.Errorf("%s: echo %q %v", what, got, err)
		}
		cancel()
		c.Close(websocket.StatusNormalClosure, "")
	}
}

func TestOwnOriginOverTLS(t *testing.T) {
	r := httptest.NewRequest(http.MethodGet, "https://8000-task.preview.example.com/ws", nil)
	r.Header.Set("Upgrade", "websocket")
	r.Header.Set("Origin", "https://8000-task.preview.example.com")
	if r.TLS == nil || foreignCookieUse(r) {
		t.Fatal("refused its own https origin")
	}
	r.Header.Set("Origin", "http://8000-task.preview.example.com")
	if !foreignCookieUse(r) {
		t.Fatal("took an http origin over TLS")
	}
}

func TestSetCookieSanitized(t *testing.T) {
	sent := []string{
		"a=1; Domain=preview.example.com; Path=/",
		"b=2; path=/; DOMAIN=.example.com; HttpOnly",
		"c=3",
		"d=4;  domain = x ;Secure",
		"e=domain; Path=/domain",
		CookieName + "=evil; Path=/",
		"__Host-" + CookieName + "=evil; Secure; Path=/",
		"__HOST-" + CookieName + "=evil; Secure; Path=/",
		" " + CookieName + " =evil",
		"=" + CookieName + "=evil",
		CookieName,
		"f=6; Domain=x; Domain=y; Max-Age=60",
	}
	want := []string{
		"a=1; Path=/",
		"b=2; path=/; HttpOnly",
		"c=3",
		"d=4;Secure",
		"e=domain; Path=/domain",
		"f=6; Max-Age=60",
	}
	for i, l := range sent {
		h := http.Header{"Set-Cookie": {l}}
		sanitizeSetCookies(h)
		if got := h["Set-Cookie"]; len(got) > 1 || len(got) == 1 && !slices.Contains(want, got[0]) {
			t.Errorf("%d %q: %q", i, l, got)
		}
	}

	// Through the proxy: the final answer, a 103 before it, and a 101.
	e := newEnv(t, Config{Domain: "preview.example.com"})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, l := range sent {
			w.Header().Add("Set-Cookie", l)
		}
		if r.URL.Path == "/ws" {
			c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
			if err == nil {
				c.Close(websocket.StatusNormalClosure, "")
			}
			return
		}
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		io.WriteString(w, "ok")
	}))
	t.Cleanup(app.Close)
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, public: true, addr: app.Listener.Addr().String()},
	}})
	var early []string
	ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			if code == http.StatusEarlyHints {
				early = append(early, h["Set-Cookie"]...)
			}
			return nil
		},
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://8000-task.preview.example.com/", nil)
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header["Set-Cookie"]; !slices.Equal(got, want) {
		t.Errorf("final answer: Set-Cookie %q", got)
	}
	if !slices.Equal(early, want) {
		t.Errorf("103: Set-Cookie %q", early)
	}

	wctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	c, wresp, err := websocket.Dial(wctx, "ws://8000-task.preview.example.com/ws", &websocket.DialOptions{HTTPClient: e.client})
	if err != nil {
		t.Fatal(err)
	}
	c.CloseNow()
	if got := wresp.Header["Set-Cookie"]; !slices.Equal(got, want) {
		t.Errorf("101: Set-Cookie %q", got)
	}
}

// newTLSEnv is newEnv over TLS.
func newTLSEnv(t *testing.T) *env {
	t.Helper()
	e := &env{fake: newFake()}
	e.srv = New(e.fake, Config{Key: testKey})
	e.front = httptest.NewTLSServer(e.srv)
	t.Cleanup(e.front.Close)
	t.Cleanup(e.srv.Close)
	addr := e.front.Listener.Addr().String()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}
	t.Cleanup(tr.CloseIdleConnections)
	e.client = &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return e
}

func TestHostCookieOverTLS(t *testing.T) {
	e := newTLSEnv(t)
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task")},
	}})
	tok := e.srv.Token("id-task", 8000, testNonce, time.Now().Add(time.Hour))
	r := e.get(t, "https://8000-task.localhost/?"+QueryParam+"="+tok)
	if r.code != http.StatusSeeOther {
		t.Fatalf("%d %s", r.code, r.body)
	}
	raw := r.resp.Header.Values("Set-Cookie")
	cs := r.resp.Cookies()
	if len(cs) != 1 || cs[0].Name != "__Host-"+CookieName || cs[0].Value != tok || !cs[0].Secure || cs[0].Path != "/" ||
		cs[0].Domain != "" || strings.Contains(strings.ToLower(raw[0]), "domain") {
		t.Fatalf("cookie %q", raw)
	}
	got := decodeEcho(t, e.do(t, http.MethodGet, "https://8000-task.localhost/", map[string]string{"Cookie": "a=1; " + cs[0].Name + "=" + tok}))
	if got.Cookie != "a=1" {
		t.Fatalf("the app saw cookie %q", got.Cookie)
	}
	// The plain name is not taken over TLS (a sibling could have set it
	// for the whole domain), nor deleted (it is not ours to touch), and
	// still not shown to the app.
	r = e.do(t, http.MethodGet, "https://8000-task.localhost/", map[string]string{"Cookie": CookieName + "=" + tok})
	if r.code != http.StatusUnauthorized || len(r.resp.Cookies()) != 0 {
		t.Fatalf("plain name over TLS: %d %v", r.code, r.resp.Cookies())
	}
	got = decodeEcho(t, e.do(t, http.MethodGet, "https://8000-task.localhost/", map[string]string{
		HeaderName: tok, "Cookie": CookieName + "=" + tok + "; b=2"}))
	if got.Cookie != "b=2" {
		t.Fatalf("the app saw cookie %q", got.Cookie)
	}
	// A stale one is deleted under its own name, Secure.
	r = e.do(t, http.MethodGet, "https://8000-task.localhost/", map[string]string{"Cookie": "__Host-" + CookieName + "=junk"})
	if cs := r.resp.Cookies(); r.code != http.StatusUnauthorized || len(cs) != 1 || cs[0].Name != "__Host-"+CookieName || !cs[0].Secure || cs[0].MaxAge >= 0 {
		t.Fatalf("stale cookie: %d %v", r.code, cs)
	}

	// And over plain HTTP only the plain name is taken.
	h := newEnv(t, Config{})
	h.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task")},
	}})
	tok = h.srv.Token("id-task", 8000, testNonce, time.Now().Add(time.Hour))
	if r := h.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{"Cookie": "__Host-" + CookieName + "=" + tok}); r.code != http.StatusUnauthorized {
		t.Fatalf("__Host- name over HTTP: %d", r.code)
	}
	decodeEcho(t, h.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{"Cookie": CookieName + "=" + tok}))
}

func TestServiceWorker(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task")},
		9000: {exposed: true, public: true, addr: echoApp(t, "task-9000")},
	}})
	tok := e.srv.Token("id-task", 8000, testNonce, time.Now().Add(time.Hour))
	for _, u := range []string{
		"http://8000-task.localhost/sw.js",
		"http://9000-task.localhost/sw.js",  // public
		"http://8000-ghost.localhost/sw.js", // no such sandbox: the same answer
	} {
		r := e.do(t, http.MethodGet, u, map[string]string{"Service-Worker": "script", HeaderName: tok, "Cookie": CookieName + "=" + tok})
		if r.code != http.StatusForbidden || !strings.Contains(r.body, "service workers") {
			t.Errorf("%s: %d %s", u, r.code, r.body)
		}
	}
	if n := e.fake.dials.Load(); n != 0 {
		t.Fatalf("%d dials", n)
	}
	// The token's redirect clears what an earlier sandbox of the name
	// left: its service workers among the storage.
	r := e.get(t, "http://8000-task.localhost/?"+QueryParam+"="+url.QueryEscape(tok))
	if r.code != http.StatusSeeOther || r.resp.Header.Get("Clear-Site-Data") != `"cache", "storage"` {
		t.Fatalf("%d %v", r.code, r.resp.Header)
	}
	// Other answers do not clear the app's storage.
	r = e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{HeaderName: tok})
	if r.code != http.StatusOK || r.resp.Header.Get("Clear-Site-Data") != "" {
		t.Fatalf("%d %v", r.code, r.resp.Header)
	}
}

func TestCookieCrowding(t *testing.T) {
	e := newEnv(t, Config{})
	e.fake.set("task", &fakeBox{id: "id-task", state: "running", ports: map[int]fakePort{
		8000: {exposed: true, addr: echoApp(t, "task")},
	}})
	tok := e.srv.Token("id-task", 8000, testNonce, time.Now().Add(time.Hour))
	junk := func(n int) []string {
		var cs []string
		for range n {
			cs = append(cs, CookieName+"=junk")
		}
		return cs
	}
	for _, tc := range []struct {
		what    string
		cookies []string
		hdr     map[string]string
		deleted bool
	}{
		// Within the limit, all checked and none valid: stale, deleted.
		{"8 invalid", junk(maxTokens), nil, true},
		// Past it: ours may be among those not checked.
		{"9 invalid", junk(maxTokens + 1), nil, false},
		{"8 invalid then ours", append(junk(maxTokens), CookieName+"="+tok), nil, false},
		{"a header token and 8 invalid", junk(maxTokens), map[string]string{HeaderName: "junk"}, false},
	} {
		hdr := map[string]string{"Cookie": strings.Join(tc.cookies, "; ")}
		for k, v := range tc.hdr {
			hdr[k] = v
		}
		r := e.do(t, http.MethodGet, "http://8000-task.localhost/", hdr)
		if r.code != http.StatusUnauthorized {
			t.Errorf("%s: %d %s", tc.what, r.code, r.body)
		}
		if deleted := len(r.resp.Header.Values("Set-Cookie")) > 0; deleted != tc.deleted {
			t.Errorf("%s: Set-Cookie %q", tc.what, r.resp.Header.Values("Set-Cookie"))
		}
	}
	// Ours among the checked ones still opens.
	decodeEcho(t, e.do(t, http.MethodGet, "http://8000-task.localhost/", map[string]string{
		"Cookie": strings.Join(append([]string{CookieName + "=" + tok}, junk(maxTokens+4)...), "; ")}))
}
