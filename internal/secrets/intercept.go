package secrets

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nookhq/nook/internal/network/policy"
)

// RefusedHeader names, on the 403 a refused request gets, the rule that
// refused it.
const RefusedHeader = "Nook-Refused"

// placeholderPrefix starts every placeholder: letters, digits and _
// only, so it reads the same raw, URL-encoded and in JSON.
const placeholderPrefix = "nook_secret_"

// NewPlaceholder returns a new random placeholder.
func NewPlaceholder() string {
	b := make([]byte, 20)
	rand.Read(b)
	return placeholderPrefix + hex.EncodeToString(b)
}

// Bound is a binding as one sandbox holds it, with its placeholder and
// the ID of the secret it bound (a secret removed and made again under
// its name, by anyone, is another).
type Bound struct {
	Binding
	Placeholder string `json:"placeholder"`
	SecretID    string `json:"secret_id"`
	// Retired: the placeholder of a sandbox this one was forked from,
	// kept only to refuse it with a clear reason (its processes restored
	// from the snapshot still hold it).
	Retired bool `json:"retired,omitempty"`
}

// Refusal is a request refused because of a placeholder or a host.
type Refusal struct {
	Host, Secret, Reason string
}

// Sandbox intercepts one sandbox's connections to the hosts its secrets
// are bound to.
type Sandbox struct {
	CA    *CA
	Bound []Bound
	// Value returns a binding's secret's value (an error: it is gone,
	// or is another secret now).
	Value func(b Bound) ([]byte, error)
	// RootCAs verify upstreams (nil: the host's trust store, which Go
	// reads from SSL_CERT_FILE when that is set).
	RootCAs   *x509.CertPool
	OnRefused func(Refusal)
	Log       *slog.Logger

	mu        sync.Mutex
	upstreams map[string]*upstream // by name@address
}

// Binds reports whether a secret is bound to name (normalized): its
// TLS connections are terminated.
func (s *Sandbox) Binds(name string) bool {
	for _, b := range s.Bound {
		if b.MatchesHost(name) {
			return true
		}
	}
	return false
}

// find returns the secret whose placeholder is in v ("" if none).
func (s *Sandbox) find(v string) string {
	if b := s.findBound(v); b != nil {
		return b.Secret
	}
	return ""
}

// findBound returns the binding whose placeholder is in v (nil if none).
func (s *Sandbox) findBound(v string) *Bound {
	for i := range s.Bound {
		if strings.Contains(v, s.Bound[i].Placeholder) {
			return &s.Bound[i]
		}
	}
	return nil
}

// InRequest returns the secret whose placeholder a request carries
// anywhere a server reads it (its target, a header, a Basic credential)
// and where; "" if none. A request that is not intercepted must not
// carry one.
func (s *Sandbox) InRequest(r *http.Request) (secret, where string) {
	if sec := s.find(r.RequestURI + r.URL.String()); sec != "" {
		return sec, "the request target"
	}
	if u, err := url.PathUnescape(r.URL.RawQuery); err == nil {
		if sec := s.find(u); sec != "" {
			return sec, "the query"
		}
	}
	for k, vs := range r.Header {
		for _, v := range vs {
			if sec := s.find(v); sec != "" {
				return sec, "header " + k
			}
			if dec, ok := basic(v); ok {
				if sec := s.find(dec); sec != "" {
					return sec, "header " + k + " (Basic)"
				}
			}
		}
	}
	return "", ""
}

// basic decodes a Basic credential's "user:password".
func basic(v string) (string, bool) {
	if len(v) > maxCredential {
		return "", false
	}
	scheme, cred, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", false
	}
	return string(b), true
}

// handshakeTimeout bounds the client's TLS handshake.
const handshakeTimeout = 10 * time.Second

// Serve terminates the TLS connection c, whose ClientHello named name
// (a bound host, normalized), with a certificate from the sandbox's CA,
// and forwards its requests (HTTP/1.1, HTTP/2, WebSocket) to name over
// TLS verified against the host's trust store, through dial (the
// connection's checked destination dst), with placeholders replaced
// where their bindings say and refused anywhere else. It returns when c
// ends. Upstream connections to name at dst are kept and reused by the
// sandbox's later connections.
func (s *Sandbox) Serve(ctx context.Context, c net.Conn, name string, dst netip.AddrPort, dial func(context.Context) (net.Conn, error)) {
	leaf, err := s.CA.Leaf(name)
	if err != nil {
		s.logger().Error("secrets: certificate", "host", name, "err", err)
		return
	}
	tc := tls.Server(c, &tls.Config{
		Certificates: []tls.Certificate{*leaf},
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
	})
	tc.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := tc.HandshakeContext(ctx); err != nil {
		return
	}
	tc.SetDeadline(time.Time{})

	tr := s.transport(name, dst, dial)
	h := &handler{s: s, host: name}
	h.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "https"
			pr.Out.URL.Host = pr.In.Host
			pr.Out.Host = pr.In.Host
		},
		Transport: tr,
		// Answers of unknown length (streams, server-sent events) are
		// flushed at every write (ReverseProxy's own rule); others at
		// least this often.
		FlushInterval:  50 * time.Millisecond,
		ModifyResponse: h.scrubResponse,
		BufferPool:     copyBuffers,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			// Not the URL: it may hold a secret's value now.
			s.logger().Debug("secrets: upstream", "host", name, "err", errors.Unwrap(err))
			msg := fmt.Sprintf("nook: %s did not answer", name)
			if errors.Is(err, errEncoded) {
				msg = "nook: " + err.Error()
			}
			http.Error(w, msg, http.StatusBadGateway)
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	var handlers sync.WaitGroup
	ln := &oneConn{c: tc, done: make(chan struct{})}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handlers.Add(1)
			defer handlers.Done()
			h.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: handshakeTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: 16},
		ErrorLog:          log.New(io.Discard, "", 0),
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				ln.Close()
			}
		},
	}
	srv.Serve(ln)
	handlers.Wait() // a hijacked (WebSocket) connection's copy ends
}

// copyBuffers are the reverse proxy's buffers: large, so that a download
// is written in few, large TLS writes.
var copyBuffers = &bufferPool{}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 256<<10)
}

func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }

// maxTransports bounds the upstreams (name and address) a sandbox keeps
// connections to.
const maxTransports = 64

// upstream is the transport of a sandbox's requests to one name at one
// address, and how it dials (the latest connection's way: a restarted
// egress proxy dials anew).
type upstream struct {
	tr   *http.Transport
	mu   sync.Mutex
	dial func(context.Context) (net.Conn, error)
	used time.Time
}

// transport returns the transport to name at dst, made on first use.
func (s *Sandbox) transport(name string, dst netip.AddrPort, dial func(context.Context) (net.Conn, error)) *http.Transport {
	key := name + "@" + dst.String()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.upstreams == nil {
		s.upstreams = map[string]*upstream{}
	}
	u := s.upstreams[key]
	if u == nil {
		if len(s.upstreams) >= maxTransports {
			var oldest string
			for k, v := range s.upstreams {
				if oldest == "" || v.used.Before(s.upstreams[oldest].used) {
					oldest = k
				}
			}
			s.upstreams[oldest].tr.CloseIdleConnections()
			delete(s.upstreams, oldest)
		}
		u = &upstream{}
		u.tr = &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				u.mu.Lock()
				d := u.dial
				u.mu.Unlock()
				return d(ctx)
			},
			TLSClientConfig:     &tls.Config{RootCAs: s.RootCAs, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2:   true,
			ReadBufferSize:      64 << 10,
			WriteBufferSize:     64 << 10,
			MaxIdleConnsPerHost: 8,
			// A sandbox's requests to one host at once share these
			// (beyond them they wait): its 1024 connections cannot
			// become a thousand upstream ones each.
			MaxConnsPerHost:       8,
			ResponseHeaderTimeout: 5 * time.Minute,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   handshakeTimeout,
		}
		s.upstreams[key] = u
	}
	u.used = time.Now()
	u.mu.Lock()
	u.dial = dial
	u.mu.Unlock()
	return u.tr
}

// Close closes the idle upstream connections the sandbox keeps (its
// connections in use end with them).
func (s *Sandbox) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range s.upstreams {
		u.tr.CloseIdleConnections()
	}
	s.upstreams = nil
}

func (s *Sandbox) logger() *slog.Logger {
	if s.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Log
}

// oneConn is a listener that accepts one connection, then waits for
// Close.
type oneConn struct {
	c    net.Conn
	once sync.Once
	mu   sync.Mutex
	done chan struct{}
	used bool
}

func (l *oneConn) Accept() (net.Conn, error) {
	l.mu.Lock()
	if !l.used {
		l.used = true
		l.mu.Unlock()
		return l.c, nil
	}
	l.mu.Unlock()
	<-l.done
	return nil, net.ErrClosed
}
func (l *oneConn) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

// handler forwards one intercepted connection's requests.
type handler struct {
	s    *Sandbox
	host string
	rp   *httputil.ReverseProxy
}

type scrubKey struct{}

var errEncoded = errors.New("an answer encoded")

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, _, err := net.SplitHostPort(r.Host)
	if err != nil {
		name = r.Host
	}
	if policy.NormalizeName(name) != h.host {
		sec, _ := h.s.InRequest(r)
		h.refuse(w, Refusal{Host: h.host, Secret: sec, Reason: fmt.Sprintf("a request for host %q on a connection to %s", r.Host, h.host)})
		return
	}
	if up := r.Header.Get("Upgrade"); up != "" && !strings.EqualFold(strings.TrimSpace(up), "websocket") {
		sec, _ := h.s.InRequest(r)
		h.refuse(w, Refusal{Host: h.host, Secret: sec, Reason: fmt.Sprintf("an upgrade to %q (only websocket)", up)})
		return
	}
	pairs, ref := h.rewrite(r)
	if ref != nil {
		h.refuse(w, *ref)
		return
	}
	// Answers come uncompressed (Go's transport asks for gzip and
	// decodes it), so that they can be scrubbed of the values.
	r.Header.Del("Accept-Encoding")
	h.rp.ServeHTTP(&scrubWriter{ResponseWriter: w, pairs: pairs}, r.WithContext(context.WithValue(r.Context(), scrubKey{}, pairs)))
}

// scrubWriter scrubs the headers of every answer written, the
// informational ones (103 Early Hints) too, which the reverse proxy
// passes on before the answer that ModifyResponse sees.
type scrubWriter struct {
	http.ResponseWriter
	pairs []pair
}

func (w *scrubWriter) WriteHeader(code int) {
	scrubHeader(w.Header(), w.pairs)
	w.ResponseWriter.WriteHeader(code)
}

func (w *scrubWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *scrubWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

func scrubHeader(hdr http.Header, pairs []pair) {
	if len(pairs) == 0 {
		return
	}
	for k, vs := range hdr {
		for i, v := range vs {
			hdr[k][i] = string(replaceAll([]byte(v), pairs))
		}
	}
}

func (h *handler) refuse(w http.ResponseWriter, ref Refusal) {
	if h.s.OnRefused != nil {
		h.s.OnRefused(ref)
	}
	rule := "secret"
	if ref.Secret != "" {
		rule += " " + ref.Secret
	}
	w.Header().Set(RefusedHeader, rule+": "+ref.Reason)
	http.Error(w, "nook: refused: "+rule+": "+ref.Reason, http.StatusForbidden)
}

// rewrite replaces the placeholders of the bindings that apply to r in
// the places they name, and refuses r if a placeholder is left anywhere
// else. It returns what answers are scrubbed of: each secret bound to
// the host, in the forms it may come back in, becomes its placeholder.
func (h *handler) rewrite(r *http.Request) ([]pair, *Refusal) {
	var pairs []pair
	values := map[string][]byte{}
	refused := func(secret, why string) ([]pair, *Refusal) {
		return nil, &Refusal{Host: h.host, Secret: secret, Reason: why}
	}
	for _, b := range h.s.Bound {
		if b.Retired || !b.MatchesHost(h.host) {
			continue
		}
		v, err := h.s.Value(b)
		if err != nil {
			continue // gone: its placeholder is refused below
		}
		values[b.Secret] = v
		ph := []byte(b.Placeholder)
		pairs = append(pairs,
			pair{v, ph},
			pair{[]byte(base64.StdEncoding.EncodeToString(v)), []byte(base64.StdEncoding.EncodeToString(ph))},
			pair{[]byte(base64.RawURLEncoding.EncodeToString(v)), []byte(base64.RawURLEncoding.EncodeToString(ph))},
			pair{[]byte(url.QueryEscape(string(v))), ph},
		)
	}
	path := r.URL.EscapedPath()
	substituted := false
	for _, b := range h.s.Bound {
		v, ok := values[b.Secret]
		if b.Retired || !ok || !b.matchesRequest(r) {
			continue
		}
		if hvs := r.Header.Values(b.Header); len(hvs) > 1 && slices.ContainsFunc(hvs, func(hv string) bool { return h.s.find(hv) != "" || len(hv) > maxCredential }) {
			return refused(b.Secret, fmt.Sprintf("header %s given %d times", b.Header, len(hvs)))
		}
		for i, hv := range r.Header.Values(b.Header) {
			if len(hv) > maxCredential {
				continue // left as it is: a placeholder in it is refused below
			}
			substituted = substituted || strings.Contains(hv, b.Placeholder)
			if strings.Contains(hv, b.Placeholder) {
				if b.Format != "" {
					hv = strings.Replace(b.Format, "{}", string(v), 1)
				} else {
					hv = strings.ReplaceAll(hv, b.Placeholder, string(v))
				}
			} else if dec, ok := basic(hv); ok && strings.Contains(dec, b.Placeholder) {
				sent := "Basic " + base64.StdEncoding.EncodeToString([]byte(strings.ReplaceAll(dec, b.Placeholder, string(v))))
				pairs = append(pairs, pair{[]byte(sent), []byte(hv)}, pair{[]byte(strings.TrimPrefix(sent, "Basic ")), []byte(strings.TrimPrefix(strings.TrimSpace(hv), "Basic "))})
				hv = sent
			}
			r.Header[b.Header][i] = hv
		}
		if b.Query && strings.Contains(r.URL.RawQuery, b.Placeholder) {
			r.URL.RawQuery = strings.ReplaceAll(r.URL.RawQuery, b.Placeholder, url.QueryEscape(string(v)))
			substituted = true
		}
		if b.Body && r.Body != nil && r.Body != http.NoBody {
			substituted = true
			r.Body = readCloser{newReplacer(r.Body, []pair{{[]byte(b.Placeholder), v}}), r.Body}
			r.ContentLength = -1
			r.Header.Del("Content-Length")
		}
	}
	if sec := h.s.find(path); sec != "" {
		return refused(sec, "a placeholder in the path")
	}
	if sec := h.s.find(r.URL.RawQuery); sec != "" {
		return refused(sec, "a placeholder in the query (the binding does not say :query, or does not apply to this request)")
	}
	for k, vs := range r.Header {
		for _, hv := range vs {
			found := h.s.findBound(hv)
			if found == nil {
				if dec, ok := basic(hv); ok {
					found = h.s.findBound(dec)
				}
			}
			if found == nil {
				continue
			}
			sec := found.Secret
			if found.Retired {
				return refused(sec, fmt.Sprintf("the placeholder of the sandbox this one was forked from (a fork gets its own: use $%s as it is now)", sec))
			}
			if _, ok := values[sec]; !ok && h.s.bindsSecret(sec, h.host) {
				return refused(sec, "the secret is gone (nook secret set it again)")
			}
			return refused(sec, fmt.Sprintf("a placeholder in header %s, which no binding of it for %s %s%s names", k, r.Method, h.host, r.URL.Path))
		}
	}
	if substituted {
		// The answer whole: a range of it could hold part of a value,
		// which no scrubbing recognizes.
		r.Header.Del("Range")
		r.Header.Del("If-Range")
	}
	return pairs, nil
}

// maxCredential bounds a bound header's value that nook reads (and a
// Basic credential it decodes).
const maxCredential = 8 << 10

// bindsSecret reports whether secret is bound to host.
func (s *Sandbox) bindsSecret(secret, host string) bool {
	for _, b := range s.Bound {
		if b.Secret == secret && !b.Retired && b.MatchesHost(host) {
			return true
		}
	}
	return false
}

// scrubResponse replaces what the request's scrub pairs name in the
// answer's headers and body: a host that echoes the request gives back
// placeholders, never values.
func (h *handler) scrubResponse(resp *http.Response) error {
	pairs, _ := resp.Request.Context().Value(scrubKey{}).([]pair)
	if len(pairs) == 0 {
		return nil
	}
	scrubHeader(resp.Header, pairs)
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil || resp.Body == http.NoBody || resp.Request.Method == http.MethodHead {
		return nil
	}
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		// Go's transport decodes the gzip it asked for; anything else
		// cannot be scrubbed.
		resp.Body.Close()
		return fmt.Errorf("%w %q, which nook cannot scrub of the secret", errEncoded, ce)
	}
	rb := newReplacing(resp.Body, pairs)
	rb.atEOF = func() { scrubHeader(resp.Trailer, pairs) } // the proxy sends them after the body
	resp.Body = rb
	// Its length may change: no Content-Length goes to the client (it
	// gets the answer chunked, or in HTTP/2 frames). resp.ContentLength
	// stays as the upstream said: the reverse proxy flushes an answer of
	// unknown length (-1) at every write, which a known one need not be.
	resp.Header.Del("Content-Length")
	return nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// replacing is a body read through a replacer, whose buffers go back to
// their pool when it is closed.
type replacing struct {
	*replacer
	body  io.Closer
	once  sync.Once
	atEOF func() // once the body is read to its end
}

func (r *replacing) Read(p []byte) (int, error) {
	n, err := r.replacer.Read(p)
	if err == io.EOF && r.atEOF != nil {
		r.atEOF()
		r.atEOF = nil
	}
	return n, err
}

func newReplacing(body io.ReadCloser, pairs []pair) *replacing {
	return &replacing{replacer: newReplacer(body, pairs), body: body}
}

func (r *replacing) Close() error {
	err := r.body.Close()
	r.once.Do(r.replacer.release)
	return err
}
