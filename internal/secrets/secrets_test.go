package secrets

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

const canary = "s3cr3t-CANARY-value-0123456789"

// echo is an upstream that answers with what it received, and records it.
type echo struct {
	mu  sync.Mutex
	got []string
	// stream, if set, answers /events.
	stream func(w http.ResponseWriter)
}

var zeros = make([]byte, 1<<20)

func (e *echo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/ws":
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			http.Error(w, "not an upgrade", http.StatusBadRequest)
			return
		}
		e.mu.Lock()
		e.got = append(e.got, "GET /ws\nAuthorization: "+r.Header.Get("Authorization"))
		e.mu.Unlock()
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-Echo-Authorization: %s\r\n\r\n", r.Header.Get("Authorization"))
		brw.Flush()
		io.Copy(c, brw) // echo the frames
		return
	case "/brotli":
		w.Header().Set("Content-Encoding", "br")
		io.WriteString(w, r.Header.Get("Authorization"))
		return
	case "/hints":
		w.Header().Set("Link", r.Header.Get("Authorization"))
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("Trailer", "X-Echo")
		io.WriteString(w, "body")
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		return
	}
	if r.URL.Path == "/events" && e.stream != nil {
		e.stream(w)
		return
	}
	if r.URL.Path == "/big" {
		w.Header().Set("Content-Length", fmt.Sprint(64<<20))
		for i := 0; i < 64; i++ {
			w.Write(zeros)
		}
		return
	}
	body, _ := io.ReadAll(r.Body)
	var b strings.Builder
	b.WriteString(r.Method + " " + r.URL.RequestURI() + " " + r.Proto + "\n")
	r.Header.Write(&b)
	b.Write(body)
	e.mu.Lock()
	e.got = append(e.got, b.String())
	e.mu.Unlock()
	w.Header().Set("X-Echo-Auth", r.Header.Get("Authorization"))
	io.WriteString(w, b.String())
}

func (e *echo) all() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.got, "\n---\n")
}

// rig is an intercepting Sandbox in front of an echoing TLS upstream,
// and a client that trusts the sandbox's CA.
type rig struct {
	up       *echo
	sb       *Sandbox
	client   *http.Client
	addr     string         // where the interception listens
	pool     *x509.CertPool // the sandbox's CA
	refusals []Refusal
	mu       sync.Mutex
}

func newRigB(b *testing.B) *rig {
	return newRig(b, false, "TOKEN@api.test")
}

func newRig(t testing.TB, h2 bool, bindings ...string) *rig {
	t.Helper()
	r := &rig{up: &echo{}}
	// The upstream's certificate for api.test, from a test CA the host
	// trusts.
	upCA, err := NewCA("upstream", []string{"api.test"})
	if err != nil {
		t.Fatal(err)
	}
	upCert, err := upCA.Leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(r.up)
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*upCert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(upCA.CertPEM)
	var bound []Bound
	var hosts []string
	for _, s := range bindings {
		b, err := ParseBinding(s)
		if err != nil {
			t.Fatal(err)
		}
		bound = append(bound, Bound{Binding: b, Placeholder: NewPlaceholder()})
		hosts = append(hosts, b.Hosts...)
	}
	ca, err := NewCA("test", hosts)
	if err != nil {
		t.Fatal(err)
	}
	r.sb = &Sandbox{CA: ca, Bound: bound, RootCAs: roots,
		Value: func(b Bound) ([]byte, error) {
			if b.Secret == "GONE" {
				return nil, errors.New("gone")
			}
			return []byte(canary + "-" + b.Secret), nil
		},
		OnRefused: func(ref Refusal) { r.mu.Lock(); r.refusals = append(r.refusals, ref); r.mu.Unlock() },
	}
	upAddr := srv.Listener.Addr().String()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				// The "ClientHello" names what the client dialed as.
				r.sb.Serve(ctx, c, "api.test", netip.MustParseAddrPort(upAddr), func(ctx context.Context) (net.Conn, error) {
					return (&net.Dialer{}).DialContext(ctx, "tcp4", upAddr)
				})
			}()
		}
	}()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	r.addr, r.pool = ln.Addr().String(), pool
	tr := &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return net.Dial("tcp4", ln.Addr().String()) },
		TLSClientConfig:   &tls.Config{RootCAs: pool, ServerName: "api.test"},
		ForceAttemptHTTP2: h2,
	}
	t.Cleanup(tr.CloseIdleConnections)
	t.Cleanup(r.sb.Close)
	r.client = &http.Client{Transport: tr, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return r
}

func (r *rig) ph(secret string) string {
	for _, b := range r.sb.Bound {
		if b.Secret == secret {
			return b.Placeholder
		}
	}
	panic(secret)
}

func (r *rig) do(t *testing.T, method, target string, hdr map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// leaks reports whether s holds the canary in any form a client reads.
func leaks(s string) bool {
	for _, f := range []string{canary, base64.StdEncoding.EncodeToString([]byte(canary)), url.QueryEscape(canary)} {
		if strings.Contains(s, f) {
			return true
		}
	}
	return strings.Contains(s, "czNjcjN0LUNBTkFSWS") // base64 of the canary's start, at any offset 0
}

func TestSubstituteAndScrub(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		r := newRig(t, h2, "TOKEN@api.test", "KEY@api.test:header=X-Api-Key:format=Key {}")
		ph := r.ph("TOKEN")
		resp, body := r.do(t, "GET", "https://api.test/v1/x", map[string]string{"Authorization": "Bearer " + ph, "X-Api-Key": r.ph("KEY")}, "")
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		if h2 && resp.ProtoMajor != 2 {
			t.Errorf("HTTP/2 client got %s", resp.Proto)
		}
		up := r.up.all()
		if !strings.Contains(up, "Authorization: Bearer "+canary+"-TOKEN") || !strings.Contains(up, "X-Api-Key: Key "+canary+"-KEY") {
			t.Fatalf("upstream did not get the values:\n%s", up)
		}
		if leaks(body) || leaks(resp.Header.Get("X-Echo-Auth")) {
			t.Fatalf("the answer carries the secret:\n%s\n%v", body, resp.Header)
		}
		if !strings.Contains(body, "Bearer "+ph) {
			t.Fatalf("the answer should show the placeholder:\n%s", body)
		}
	}
}

func TestBasicAuth(t *testing.T) {
	r := newRig(t, false, "GIT@api.test:path=/org/repo.git")
	ph := r.ph("GIT")
	cred := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+ph))
	resp, body := r.do(t, "GET", "https://api.test/org/repo.git/info/refs?service=git-upload-pack", map[string]string{"Authorization": cred}, "")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+canary+"-GIT"))
	if !strings.Contains(r.up.all(), want) {
		t.Fatalf("upstream did not get the credential:\n%s", r.up.all())
	}
	if strings.Contains(body, want) || strings.Contains(resp.Header.Get("X-Echo-Auth"), strings.TrimPrefix(want, "Basic ")) || !strings.Contains(body, cred) {
		t.Fatalf("the answer carries the credential:\n%s", body)
	}
	// Another path is not bound: refused, and the upstream gets nothing.
	n := len(r.up.got)
	resp, body = r.do(t, "GET", "https://api.test/org/other.git/info/refs", map[string]string{"Authorization": cred}, "")
	if resp.StatusCode != 403 || !strings.Contains(resp.Header.Get(RefusedHeader), "secret GIT") {
		t.Fatalf("another repository: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if len(r.up.got) != n {
		t.Fatal("the upstream got the refused request")
	}
}

func TestRefused(t *testing.T) {
	r := newRig(t, false, "TOKEN@api.test:methods=GET", "QTOKEN@api.test:query", "GONE@api.test")
	ph := r.ph("TOKEN")
	for _, tc := range []struct {
		name   string
		method string
		target string
		hdr    map[string]string
		body   string
	}{
		{"other header", "GET", "https://api.test/", map[string]string{"X-Leak": ph}, ""},
		{"query", "GET", "https://api.test/?t=" + ph, nil, ""},
		{"path", "GET", "https://api.test/" + ph, nil, ""},
		{"method", "POST", "https://api.test/", map[string]string{"Authorization": "Bearer " + ph}, ""},
		{"other host", "GET", "https://api.test/", map[string]string{"Host": "other.test", "Authorization": "Bearer " + ph}, ""},
		{"other host no secret", "GET", "https://api.test/", map[string]string{"Host": "evil.test"}, ""},
		{"gone", "GET", "https://api.test/", map[string]string{"Authorization": "Bearer " + r.ph("GONE")}, ""},
		{"cookie", "GET", "https://api.test/", map[string]string{"Cookie": "a=" + ph}, ""},
	} {
		resp, body := r.do(t, tc.method, tc.target, tc.hdr, tc.body)
		if resp.StatusCode != 403 || resp.Header.Get(RefusedHeader) == "" {
			t.Errorf("%s: %d %q %s", tc.name, resp.StatusCode, resp.Header.Get(RefusedHeader), body)
		}
	}
	if got := r.up.all(); got != "" {
		t.Fatalf("the upstream got refused requests:\n%s", got)
	}
	// :query replaces it in the query.
	resp, body := r.do(t, "GET", "https://api.test/?key="+r.ph("QTOKEN"), nil, "")
	if resp.StatusCode != 200 || !strings.Contains(r.up.all(), "key="+url.QueryEscape(canary+"-QTOKEN")) || leaks(body) {
		t.Fatalf("query: %d %s\n%s", resp.StatusCode, body, r.up.all())
	}
	// A placeholder in a body goes as it is, unless :body.
	resp, body = r.do(t, "PUT", "https://api.test/x", nil, "data "+ph)
	if resp.StatusCode != 200 || leaks(r.up.all()[strings.LastIndex(r.up.all(), "PUT"):]) {
		t.Fatalf("body: %d %s", resp.StatusCode, body)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.refusals) < 8 {
		t.Fatalf("refusals reported: %v", r.refusals)
	}
}

func TestBodySubstitution(t *testing.T) {
	r := newRig(t, false, "B@api.test:body:methods=POST")
	ph := r.ph("B")
	resp, body := r.do(t, "POST", "https://api.test/login", nil, `{"password":"`+ph+`"}`)
	if resp.StatusCode != 200 || !strings.Contains(r.up.all(), `{"password":"`+canary+`-B"}`) || leaks(body) {
		t.Fatalf("%d %s\n%s", resp.StatusCode, body, r.up.all())
	}
}

func TestReplacerChunks(t *testing.T) {
	pairs := []pair{{[]byte("abcab"), []byte("X")}, {[]byte("ab"), []byte("YYY")}, {[]byte("zzzzzz"), []byte("")}}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 500; i++ {
		in := make([]byte, rng.IntN(200))
		for j := range in {
			in[j] = "abcz"[rng.IntN(4)]
		}
		want := replaceAll(in, pairs)
		got, err := io.ReadAll(newReplacer(&chunky{b: in, rng: rng}, pairs))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%q: got %q want %q (%v)", in, got, want, err)
		}
	}
}

// chunky reads b in random small pieces.
type chunky struct {
	b   []byte
	rng *rand.Rand
}

func (c *chunky) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.b), 1+c.rng.IntN(7))
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}

func TestParseBinding(t *testing.T) {
	b, err := ParseBinding("GH_TOKEN@github.com,*.cdn.example.com:header=authorization:format='token {}':path=/org:methods=get,post:query:inherit")
	if err != nil {
		t.Fatal(err)
	}
	if b.Secret != "GH_TOKEN" || len(b.Hosts) != 2 || b.Header != "Authorization" || b.Format != "token {}" || b.Path != "/org" ||
		len(b.Methods) != 2 || !b.Query || !b.Inherit || b.Body {
		t.Fatalf("%+v", b)
	}
	if !b.MatchesHost("raw.cdn.example.com") || b.MatchesHost("cdn.example.com") || b.MatchesHost("evilgithub.com") {
		t.Fatal("host matching")
	}
	again, err := ParseBinding(b.String())
	if err != nil || again.String() != b.String() {
		t.Fatalf("round trip: %v %q %q", err, b.String(), again.String())
	}
	for _, bad := range []string{"", "X", "1X@a.com", "X@", "X@*.com", "X@a..com", "X@a.com:header=Host", "X@a.com:format=nothing",
		"X@a.com:path=rel", "X@a.com:query=1", "X@*.github.io", "X@*.co.uk", "X@a.com:bogus", "X@a.com:query:query", "X@exämple.com", "X-Y@a.com"} {
		if _, err := ParseBinding(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func FuzzParseBinding(f *testing.F) {
	for _, s := range []string{"A@b.c", "GH@github.com,*.x.y:header=X:format=Bearer {}:path=/a:methods=GET:query:body:inherit", "X@a.com:path=/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseBinding(s)
		if err != nil {
			return
		}
		again, err := ParseBinding(b.String())
		if err != nil || again.String() != b.String() {
			t.Fatalf("%q: round trip %q: %v", s, b.String(), err)
		}
	})
}

func TestBoxAndCA(t *testing.T) {
	dir := t.TempDir()
	box, err := OpenBox(dir + "/s")
	if err != nil {
		t.Fatal(err)
	}
	sealed := box.Seal("secret:A", []byte(canary))
	if bytes.Contains(sealed, []byte(canary)) {
		t.Fatal("sealed value holds the plain text")
	}
	box2, err := OpenBox(dir + "/s")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := box2.Open("secret:A", sealed); err != nil || string(got) != canary {
		t.Fatalf("open: %q %v", got, err)
	}
	if _, err := box2.Open("secret:B", sealed); err == nil {
		t.Fatal("a value opened as another secret's")
	}
	ca, err := NewCA("x", []string{"api.test"})
	if err != nil {
		t.Fatal(err)
	}
	ca2, err := LoadCA(ca.CertPEM, ca.KeyDER())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.CertPEM)
	for name, ok := range map[string]bool{"api.test": true, "evil.test": false} {
		leaf, err := ca2.Leaf(name)
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name})
		if (err == nil) != ok {
			t.Errorf("%s: verify %v (name constraints should permit only the bound hosts)", name, err)
		}
	}
}

// FuzzRewrite feeds the request rewriter what a sandbox controls: any
// request. Whatever it is, a request that goes out carries a value only
// in the bound header (and where :query says), and no placeholder
// anywhere.
func FuzzRewrite(f *testing.F) {
	ph := "nook_secret_00112233445566778899aabbccddeeff00112233"
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + ph + "\r\n\r\n",
		"GET /?k=" + ph + " HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"GET /x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+ph)) + "\r\nX-A: " + ph + "\r\n\r\n",
	} {
		f.Add(s)
	}
	b1, _ := ParseBinding("T@api.test:path=/x")
	b2, _ := ParseBinding("Q@api.test:header=X-Key:query")
	s := &Sandbox{Bound: []Bound{{Binding: b1, Placeholder: ph}, {Binding: b2, Placeholder: ph[:len(ph)-2] + "ff"}},
		Value: func(b Bound) ([]byte, error) { return []byte(canary + b.Secret), nil }}
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return
		}
		h := &handler{s: s, host: "api.test"}
		if _, ref := h.rewrite(r); ref != nil {
			return
		}
		for k, vs := range r.Header {
			for _, v := range vs {
				dec, _ := basic(v)
				if s.find(v) != "" || s.find(dec) != "" {
					t.Fatalf("a placeholder went out in %s: %q", k, v)
				}
				if (strings.Contains(v, canary) || strings.Contains(dec, canary)) && k != "Authorization" && k != "X-Key" {
					t.Fatalf("a value went out in %s", k)
				}
			}
		}
		if s.find(r.URL.RawQuery) != "" || s.find(r.URL.EscapedPath()) != "" {
			t.Fatalf("a placeholder went out in the target %q", r.URL)
		}
	})
}

// FuzzReplacer checks the streaming replacer against replaceAll for any
// input read in any pieces.
func FuzzReplacer(f *testing.F) {
	f.Add([]byte("xxabcabyyab"), uint64(1))
	pairs := []pair{{[]byte("abcab"), []byte("X")}, {[]byte("ab"), []byte("YYY")}, {[]byte("b"), []byte("")}}
	f.Fuzz(func(t *testing.T, in []byte, seed uint64) {
		want := replaceAll(in, pairs)
		got, err := io.ReadAll(newReplacer(&chunky{b: in, rng: rand.New(rand.NewPCG(seed, 1))}, pairs))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("got %q want %q", got, want)
		}
	})
}

// A streamed answer (server-sent events) reaches the client as it comes.
func TestStreamedAnswer(t *testing.T) {
	r := newRig(t, false, "TOKEN@api.test")
	next := make(chan struct{})
	r.up.stream = func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-next:
		case <-time.After(10 * time.Second):
		}
		io.WriteString(w, "data: two "+canary+"-TOKEN\n\n")
	}
	resp, err := r.client.Get("https://api.test/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	close(next)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "data: two "+r.ph("TOKEN")) || leaks(string(rest)) {
		t.Fatalf("second event: %q", rest)
	}
}

// BenchmarkDownload measures an answer's bytes through the interception
// (TLS terminated, scrubbed, TLS again).
func BenchmarkDownload(b *testing.B) {
	r := newRigB(b)
	const size = 64 << 20
	b.SetBytes(size)
	for i := 0; i < b.N; i++ {
		resp, err := r.client.Get("https://api.test/big")
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n != size {
			b.Fatalf("%d bytes", n)
		}
	}
}

// What a server could read past the binding, and answers that could
// carry the value past the scrubbing, are refused.
func TestEvasions(t *testing.T) {
	r := newRig(t, false, "GIT@api.test:path=/org/repo.git:methods=GET", "TOKEN@api.test")
	cred := "Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+r.ph("GIT")))
	for _, target := range []string{"/org/repo.git/../other.git/info", "/org/repo.git/%2e%2e/other.git", "/org/repo.git%2F..%2Fother.git", "/org/repo.git/./x", `/org/repo.git\..\x`, "/org/repo.git;x=1"} {
		resp, body := r.do(t, "GET", "https://api.test"+target, map[string]string{"Authorization": cred}, "")
		if resp.StatusCode != 403 {
			t.Errorf("%s: %d %s", target, resp.StatusCode, body)
		}
	}
	resp, body := r.do(t, "GET", "https://api.test/org/repo.git/x", map[string]string{"Authorization": cred, "X-HTTP-Method-Override": "DELETE"}, "")
	if resp.StatusCode != 403 {
		t.Errorf("a method override: %d %s", resp.StatusCode, body)
	}
	bearer := map[string]string{"Authorization": "Bearer " + r.ph("TOKEN")}
	resp, body = r.do(t, "GET", "https://api.test/brotli", bearer, "")
	if resp.StatusCode != 502 || leaks(body) {
		t.Errorf("an answer nook cannot decode: %d %s", resp.StatusCode, body)
	}
	resp, body = r.do(t, "GET", "https://api.test/hints", bearer, "")
	if leaks(body) || leaks(fmt.Sprint(resp.Header, resp.Trailer)) || resp.Trailer.Get("X-Echo") != "Bearer "+r.ph("TOKEN") {
		t.Errorf("early hints or trailers: %v %v %s", resp.Header, resp.Trailer, body)
	}
	up := map[string]string{"Authorization": "Bearer " + r.ph("TOKEN"), "Upgrade": "h2c", "Connection": "Upgrade"}
	if resp, body = r.do(t, "GET", "https://api.test/", up, ""); resp.StatusCode != 403 {
		t.Errorf("an h2c upgrade: %d %s", resp.StatusCode, body)
	}
	if got := r.up.all(); strings.Contains(got, "other.git") || strings.Contains(got, "GIT") && strings.Contains(got, canary+"-GIT") {
		t.Errorf("the upstream got a refused request:\n%s", got)
	}
}

// A WebSocket upgrade through the interception: the value goes in the
// upgrade request, the 101's headers are scrubbed, then the bytes flow
// both ways.
func TestWebSocket(t *testing.T) {
	r := newRig(t, false, "TOKEN@api.test")
	c, err := tls.Dial("tcp4", r.addr, &tls.Config{RootCAs: r.pool, ServerName: "api.test", NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer %s\r\n\r\n", r.ph("TOKEN"))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("X-Echo-Authorization") != "Bearer "+r.ph("TOKEN") {
		t.Fatalf("upgrade: %d %v", resp.StatusCode, resp.Header)
	}
	if !strings.Contains(r.up.all(), "Authorization: Bearer "+canary+"-TOKEN") {
		t.Fatalf("the upgrade request did not carry the value:\n%s", r.up.all())
	}
	io.WriteString(c, "frame-1")
	got := make([]byte, len("frame-1"))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != "frame-1" {
		t.Fatalf("echoed frame: %q %v", got, err)
	}
}
