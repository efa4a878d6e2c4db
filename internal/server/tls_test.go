package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// infoHandler answers GET /v1/info like the daemon, and streams on
// /stream: a chunk every 50 ms for the given time.
func infoHandler(stream time.Duration) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, api.Info{Version: "test"})
	})
	mux.HandleFunc("GET /ping", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pong") })
	mux.HandleFunc("GET /stream", func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		for end := time.Now().Add(stream); time.Now().Before(end); {
			io.WriteString(w, "tick\n")
			rc.Flush()
			time.Sleep(50 * time.Millisecond)
		}
		io.WriteString(w, "end\n")
	})
	return mux
}

// serveTCP serves h on a TCP listener made as Serve makes it.
func serveTCP(t *testing.T, cfg Config, dataDir string, log *slog.Logger, h http.Handler) *tcpListener {
	t.Helper()
	tl, err := listenTCP(cfg, dataDir, log)
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(h, cfg.IdleTimeout, log)
	done := make(chan struct{})
	go func() { srv.Serve(tl); close(done) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return tl
}

// On first start the TCP listener makes a self-signed certificate (key
// 0600) and logs its fingerprint; a restart reuses it. A client pinning
// the fingerprint (or given the certificate as its CA) connects; a wrong
// pin, no trust at all, and plain HTTP to the TLS port are refused with
// messages saying what to do.
func TestTLSFirstStart(t *testing.T) {
	dir := t.TempDir()
	var logBuf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logBuf, nil))
	cfg := Config{Listen: "127.0.0.1:0"}
	tl := serveTCP(t, cfg, dir, log, infoHandler(0))
	fp := tl.Fingerprint
	if !strings.HasPrefix(fp, "sha256:") || len(fp) != len("sha256:")+64 {
		t.Fatalf("fingerprint %q", fp)
	}
	if !strings.Contains(logBuf.String(), "made a self-signed TLS certificate") || !strings.Contains(logBuf.String(), fp) {
		t.Fatalf("first start did not log the new certificate's fingerprint:\n%s", logBuf.String())
	}
	certPath, keyPath := filepath.Join(dir, "tls", "cert.pem"), filepath.Join(dir, "tls", "key.pem")
	if st, err := os.Stat(keyPath); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	pemBytes, err := os.ReadFile(certPath)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(pemBytes)
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if Fingerprint(leaf.Raw) != fp {
		t.Fatal("the listener's fingerprint is not the stored certificate's")
	}
	hn, _ := os.Hostname()
	for _, name := range []string{"localhost", "127.0.0.1", "::1", hn} {
		if err := leaf.VerifyHostname(name); err != nil {
			t.Errorf("certificate does not name %s: %v", name, err)
		}
	}
	if leaf.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("key algorithm %v, want ECDSA", leaf.PublicKeyAlgorithm)
	}

	addr := tl.Addr().String()
	ctx := context.Background()
	info := func(host string, o sdk.Options) error {
		c, err := sdk.NewWithOptions(host, o)
		if err != nil {
			return err
		}
		_, err = c.Info(ctx)
		return err
	}
	if err := info("https://"+addr, sdk.Options{TLSFingerprint: fp}); err != nil {
		t.Fatalf("pinned client: %v", err)
	}
	if err := info("https://"+addr, sdk.Options{TLSFingerprint: fp[:20]}); err == nil || !strings.Contains(err.Error(), "64 hex digits") {
		t.Fatalf("a malformed pin: %v", err)
	}
	wrong := "sha256:" + strings.Repeat("ab", 32)
	if err := info("https://"+addr, sdk.Options{TLSFingerprint: wrong}); err == nil || !strings.Contains(err.Error(), "not the pinned") {
		t.Fatalf("wrong pin: %v", err)
	}
	if err := info("https://"+addr, sdk.Options{}); err == nil || !strings.Contains(err.Error(), "NOOK_TLS_FINGERPRINT") {
		t.Fatalf("no trust: %v", err)
	}
	if err := info("https://"+addr, sdk.Options{TLSCAFile: certPath}); err != nil {
		t.Fatalf("the certificate as CA: %v", err)
	}
	if err := info("http://"+addr, sdk.Options{}); err == nil || !strings.Contains(err.Error(), "serves HTTPS") {
		t.Fatalf("plain HTTP to the TLS port: %v", err)
	}

	// A restart keeps the certificate.
	tl.Close()
	logBuf.Reset()
	tl2 := serveTCP(t, cfg, dir, log, infoHandler(0))
	if tl2.Fingerprint != fp {
		t.Fatalf("restart made a new certificate: %s, was %s", tl2.Fingerprint, fp)
	}
	if strings.Contains(logBuf.String(), "made a self-signed") {
		t.Fatalf("restart logged a new certificate:\n%s", logBuf.String())
	}
	if err := info("https://"+tl2.Addr().String(), sdk.Options{TLSFingerprint: fp}); err != nil {
		t.Fatalf("pinned client after restart: %v", err)
	}

	// A given certificate is used as it is; half of one is refused.
	given := serveTCP(t, Config{Listen: "127.0.0.1:0", TLSCert: certPath, TLSKey: keyPath}, t.TempDir(), log, infoHandler(0))
	if given.Fingerprint != fp {
		t.Fatalf("--tls-cert: fingerprint %s, want %s", given.Fingerprint, fp)
	}
	if _, err := listenTCP(Config{Listen: "127.0.0.1:0", TLSCert: certPath}, t.TempDir(), log); err == nil || !strings.Contains(err.Error(), "go together") {
		t.Fatalf("--tls-cert without --tls-key: %v", err)
	}
	if _, err := listenTCP(Config{Listen: "127.0.0.1:0", TLSCert: certPath, TLSKey: keyPath, InsecureHTTP: true}, t.TempDir(), log); err == nil || !strings.Contains(err.Error(), "--insecure-http") {
		t.Fatalf("--insecure-http with --tls-cert: %v", err)
	}
}

// TestEscapeConnCap: the TCP listener holds at most MaxConns connections;
// one past the cap is not served until another closes, idle keep-alive
// connections are closed after IdleTimeout, and a stream longer than
// IdleTimeout is not cut.
func TestEscapeConnCap(t *testing.T) {
	const max = 3
	idle := 700 * time.Millisecond
	cfg := Config{Listen: "127.0.0.1:0", InsecureHTTP: true, MaxConns: max, IdleTimeout: idle}
	tl := serveTCP(t, cfg, t.TempDir(), slog.New(slog.DiscardHandler), infoHandler(3*idle))
	addr := tl.Addr().String()
	type conn struct {
		net.Conn
		r *bufio.Reader
	}
	dial := func() *conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return &conn{c, bufio.NewReader(c)}
	}
	ping := func(c *conn, wait time.Duration) error {
		if _, err := io.WriteString(c, "GET /ping HTTP/1.1\r\nHost: nook\r\n\r\n"); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(wait))
		resp, err := http.ReadResponse(c.r, nil)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != "pong" {
			return errors.New("answer " + string(b))
		}
		return nil
	}
	var held []*conn
	for range max {
		c := dial()
		if err := ping(c, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// One more: the kernel completes its handshake, but nook does not
	// take it while the cap is reached.
	extra := dial()
	var ne net.Error
	if err := ping(extra, 300*time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("a connection past the cap was served: %v", err)
	}
	held[0].Close()
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(extra.r, nil)
	if err != nil {
		t.Fatalf("after a slot freed, the waiting connection was not served: %v", err)
	}
	resp.Body.Close()
	// Idle keep-alive connections are closed after IdleTimeout.
	start := time.Now()
	held[1].SetReadDeadline(time.Now().Add(idle + 5*time.Second))
	if _, err := held[1].r.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: %v, want EOF from the server", err)
	}
	if d := time.Since(start); d > idle+4*time.Second {
		t.Fatalf("idle connection closed after %v", d)
	}
	held[2].Close()
	extra.Close()
	// A stream longer than IdleTimeout runs to its end.
	c := dial()
	io.WriteString(c, "GET /stream HTTP/1.1\r\nHost: nook\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err = http.ReadResponse(c.r, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || !strings.HasSuffix(string(b), "end\n") {
		t.Fatalf("stream longer than IdleTimeout: %v, %q", err, b)
	}
}
