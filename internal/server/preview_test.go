package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/daemon"
)

// With --preview-cert and --preview-key the preview listener serves
// HTTPS with the operator's wildcard certificate, and the URLs it mints
// are https ones.
func TestPreviewTLS(t *testing.T) {
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "*.preview.test"}, DNSNames: []string{"*.preview.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)

	cfg := Config{PreviewListen: "127.0.0.1:0", PreviewDomain: "preview.test", PreviewCert: certFile, PreviewKey: keyFile,
		Daemon: daemon.Config{Log: slog.New(slog.DiscardHandler)}}
	srv, l, ep, err := listenPreview(cfg, nil, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(l)
	defer hs.Close()
	if info := ep.Info(); info.URL != "https://PORT-NAME.preview.test:"+strconv.Itoa(ep.port)+"/" {
		t.Fatalf("preview info %q", info.URL)
	}
	if u := ep.URL("id", "task", 8000, true); u != "https://8000-task.preview.test:"+strconv.Itoa(ep.port)+"/" {
		t.Fatalf("public URL %q", u)
	}
	pool := x509.NewCertPool()
	leaf, _ := x509.ParseCertificate(der)
	pool.AddCert(leaf)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "x.preview.test"},
	}}
	// Another domain over the operator's certificate: nook's own 404 page,
	// reached over TLS verified against it.
	req, _ := http.NewRequest("GET", "https://"+l.Addr().String()+"/", nil)
	req.Host = "8000-task.elsewhere.test"
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("HTTPS to the preview listener: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || resp.TLS == nil || !strings.Contains(string(body), "nook preview") {
		t.Fatalf("another domain over TLS: %d %v %.200s", resp.StatusCode, resp.TLS != nil, body)
	}
	// Plain HTTP to the TLS listener is no preview.
	plain := &http.Client{Timeout: 10 * time.Second}
	if resp, err := plain.Get("http://" + l.Addr().String() + "/"); err == nil {
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("plain HTTP answered %d", resp.StatusCode)
		}
	}
	// The key that signs tokens is kept, root's alone.
	if fi, err := os.Stat(filepath.Join(dir, "preview.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("preview.key: %v %v", fi, err)
	}
	// A certificate without its key is refused.
	cfg.PreviewKey = ""
	if _, _, _, err := listenPreview(cfg, nil, dir); err == nil || !strings.Contains(err.Error(), "go together") {
		t.Fatalf("--preview-cert without --preview-key: %v", err)
	}
}
