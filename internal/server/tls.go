package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/net/netutil"
)

// Defaults for the TCP listener.
const (
	// DefaultMaxConns caps the TCP listener's open connections; past it
	// new ones wait in the kernel's backlog until one closes.
	DefaultMaxConns = 256
	// DefaultIdleTimeout closes a keep-alive connection with no request
	// for this long. Streams (exec, attach, watch) are requests in flight,
	// not idle, so it does not cut them; there is no WriteTimeout for the
	// same reason.
	DefaultIdleTimeout = 2 * time.Minute
	// readHeaderTimeout bounds the TLS handshake and a request's headers.
	readHeaderTimeout = 10 * time.Second
	maxHeaderBytes    = 64 << 10
	// selfSignedValidity is how long a generated certificate is valid.
	selfSignedValidity = 5 * 365 * 24 * time.Hour
)

// newHTTPServer returns the API's http.Server: bounded headers and idle
// keep-alives, no read or write deadline on a request (streams run long).
// Its own errors (failed TLS handshakes, mostly) are logged at debug level.
func newHTTPServer(h http.Handler, idle time.Duration, log *slog.Logger) *http.Server {
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	return &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout, IdleTimeout: idle, MaxHeaderBytes: maxHeaderBytes,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
}

// tcpListener is the API's TCP listener and what clients need to trust it.
type tcpListener struct {
	net.Listener
	// Fingerprint is the certificate's "sha256:<hex>" ("" without TLS).
	Fingerprint string
}

// listenTCP listens on cfg.Listen with at most cfg.MaxConns connections
// open, serving TLS unless cfg.InsecureHTTP: with cfg.TLSCert and
// cfg.TLSKey, or else a self-signed certificate kept in dataDir/tls
// (made on first start, reused after).
func listenTCP(cfg Config, dataDir string, log *slog.Logger) (*tcpListener, error) {
	var cert tls.Certificate
	var err error
	if cfg.InsecureHTTP && (cfg.TLSCert != "" || cfg.TLSKey != "") {
		return nil, errors.New("--insecure-http serves no TLS: drop it to use --tls-cert and --tls-key")
	}
	if !cfg.InsecureHTTP {
		switch {
		case cfg.TLSCert != "" && cfg.TLSKey != "":
			cert, err = tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
			if err != nil {
				return nil, fmt.Errorf("load the TLS certificate %s and key %s: %w", cfg.TLSCert, cfg.TLSKey, err)
			}
		case cfg.TLSCert != "" || cfg.TLSKey != "":
			return nil, errors.New("--tls-cert and --tls-key go together: give both, or neither for a self-signed certificate")
		default:
			host, _, _ := net.SplitHostPort(cfg.Listen)
			cert, err = selfSignedCert(filepath.Join(dataDir, "tls"), host, log)
			if err != nil {
				return nil, err
			}
		}
	}
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	max := cfg.MaxConns
	if max <= 0 {
		max = DefaultMaxConns
	}
	// The cap counts connections before their TLS handshake, so slow
	// handshakes hold slots too (readHeaderTimeout bounds them).
	l = netutil.LimitListener(l, max)
	if cfg.InsecureHTTP {
		log.Warn("the TCP listener serves plain HTTP (--insecure-http): tokens and everything else cross the network readable; use it only behind a TLS proxy on the same host", "address", l.Addr().String())
		return &tcpListener{Listener: l}, nil
	}
	fp := Fingerprint(cert.Certificate[0])
	tl := tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	return &tcpListener{Listener: tl, Fingerprint: fp}, nil
}

// Fingerprint is a certificate's SHA-256 fingerprint as clients pin it:
// "sha256:" and 64 lowercase hex digits of its DER.
func Fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// selfSignedCert returns the certificate in dir (cert.pem, key.pem),
// making an ECDSA P-256 one valid for host, localhost, 127.0.0.1, ::1
// and the machine's hostname if there is none (or it has expired).
func selfSignedCert(dir, host string, log *slog.Logger) (tls.Certificate, error) {
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	switch {
	case err == nil && time.Now().Before(cert.Leaf.NotAfter):
		if host != "" && cert.Leaf.VerifyHostname(host) != nil && !unspecified(host) {
			log.Warn("the TLS certificate does not name the listen address: clients must pin its fingerprint (a CA file will not verify)", "certificate", certPath, "host", host)
		}
		return cert, nil
	case err == nil:
		log.Warn("the self-signed TLS certificate has expired: making a new one (clients must pin the new fingerprint)", "certificate", certPath)
	case !errors.Is(err, fs.ErrNotExist):
		return tls.Certificate{}, fmt.Errorf("the TLS certificate in %s cannot be used (%w): remove %s and %s to make a new one", dir, err, certPath, keyPath)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "nook daemon"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(selfSignedValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true, // its own issuer, so it can be given as a CA file (NOOK_TLS_CA)
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	if hn, err := os.Hostname(); err == nil && hn != "" && hn != "localhost" {
		tmpl.DNSNames = append(tmpl.DNSNames, hn)
	}
	if host != "" && !unspecified(host) {
		if ip := net.ParseIP(host); ip != nil {
			if !ip.IsLoopback() {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		} else if host != "localhost" {
			tmpl.DNSNames = append(tmpl.DNSNames, host)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return tls.Certificate{}, err
	}
	// The key first, 0600, each file written whole before it is renamed
	// into place: a crash leaves no half certificate.
	if err := writeFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return tls.Certificate{}, err
	}
	if err := writeFileAtomic(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return tls.Certificate{}, err
	}
	log.Info("made a self-signed TLS certificate for the TCP listener", "certificate", certPath, "fingerprint", Fingerprint(der))
	return tls.LoadX509KeyPair(certPath, keyPath)
}

func unspecified(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
