package sdk

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
)

// ParseFingerprint reads a certificate fingerprint, "sha256:" and 64 hex
// digits (upper or lower case, optionally with colons between bytes).
func ParseFingerprint(s string) ([]byte, error) {
	hexs, ok := strings.CutPrefix(strings.TrimSpace(s), "sha256:")
	if !ok {
		return nil, fmt.Errorf("NOOK_TLS_FINGERPRINT %q is not valid: write sha256: and 64 hex digits, as `nook serve` and `nook info` show it", clip(s))
	}
	b, err := hex.DecodeString(strings.ReplaceAll(hexs, ":", ""))
	if err != nil || len(b) != sha256.Size {
		return nil, fmt.Errorf("NOOK_TLS_FINGERPRINT %q is not valid: write sha256: and 64 hex digits, as `nook serve` and `nook info` show it", clip(s))
	}
	return b, nil
}

func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "..."
	}
	return s
}

// fingerprintError: the daemon's certificate is not the pinned one.
type fingerprintError struct{ got, want string }

func (e *fingerprintError) Error() string {
	return fmt.Sprintf("the daemon's TLS certificate has fingerprint %s, not the pinned %s (NOOK_TLS_FINGERPRINT): check it with `nook info` on the host; if the certificate was replaced, pin the new one", e.got, e.want)
}

func tlsConfig(o Options) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.TLSCAFile != "" {
		pem, err := os.ReadFile(o.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("NOOK_TLS_CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("NOOK_TLS_CA %s holds no PEM certificate", o.TLSCAFile)
		}
		cfg.RootCAs = pool
	}
	if o.TLSFingerprint != "" {
		want, err := ParseFingerprint(o.TLSFingerprint)
		if err != nil {
			return nil, err
		}
		// The pin replaces chain verification (a self-signed certificate
		// has none), unless a CA file is given too: then both must hold.
		cfg.InsecureSkipVerify = o.TLSCAFile == ""
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the daemon sent no TLS certificate")
			}
			sum := sha256.Sum256(cs.PeerCertificates[0].Raw)
			if !bytes.Equal(sum[:], want) {
				return &fingerprintError{got: "sha256:" + hex.EncodeToString(sum[:]), want: "sha256:" + hex.EncodeToString(want)}
			}
			return nil
		}
	}
	return cfg, nil
}

// tlsError explains a failed TLS handshake, or returns nil for other errors.
func tlsError(host string, err error) error {
	var fe *fingerprintError
	if errors.As(err, &fe) {
		return fmt.Errorf("nook daemon at %s: %w", host, fe)
	}
	var ua x509.UnknownAuthorityError
	var ve *tls.CertificateVerificationError
	var he x509.HostnameError
	if errors.As(err, &ua) || errors.As(err, &ve) || errors.As(err, &he) {
		return fmt.Errorf("the nook daemon at %s has a TLS certificate this client does not trust (%w): pin it with NOOK_TLS_FINGERPRINT=sha256:... as `nook info` shows it on the host, or give its CA in NOOK_TLS_CA", host, err)
	}
	if strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		return fmt.Errorf("the nook daemon at %s serves plain HTTP: use an http:// NOOK_HOST (and prefer TLS: see `nook serve --help`)", host)
	}
	return nil
}
