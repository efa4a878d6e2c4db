package secrets

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
	"sync"
	"time"
)

// CA is a sandbox's certificate authority: the sandbox trusts it, and
// the host signs with it, on demand, a certificate for each bound host
// the sandbox connects to. Its name constraints permit only the bound
// hosts' names, so even a copy of its key cannot vouch for any other
// site.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// caLifetime: a sandbox's CA outlives any sandbox; its leaves are short.
const (
	caLifetime   = 20 * 365 * 24 * time.Hour
	leafLifetime = 7 * 24 * time.Hour
)

// NewCA makes a CA for a sandbox whose secrets are bound to hosts.
func NewCA(sandbox string, hosts []string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	var permitted []string
	for _, h := range hosts {
		permitted = append(permitted, strings.TrimPrefix(h, "*."))
	}
	now := time.Now()
	tpl := &x509.Certificate{
		SerialNumber:                serial(),
		Subject:                     pkix.Name{CommonName: "nook sandbox " + sandbox + " secrets CA", Organization: []string{"nook"}},
		NotBefore:                   now.Add(-time.Hour),
		NotAfter:                    now.Add(caLifetime),
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid:       true,
		IsCA:                        true,
		MaxPathLenZero:              true,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         permitted,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return LoadCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyDER)
}

// LoadCA loads a CA from its certificate (PEM) and key (DER, SEC 1).
func LoadCA(certPEM, keyDER []byte) (*CA, error) {
	blk, _ := pem.Decode(certPEM)
	if blk == nil {
		return nil, errors.New("secrets: CA certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("secrets: CA certificate: %w", err)
	}
	key, err := x509.ParseECPrivateKey(keyDER)
	if err != nil {
		return nil, fmt.Errorf("secrets: CA key: %w", err)
	}
	return &CA{cert: cert, key: key, CertPEM: certPEM, leaves: map[string]*tls.Certificate{}}, nil
}

// KeyDER is the CA's private key (SEC 1 DER), to seal and keep.
func (c *CA) KeyDER() []byte {
	b, _ := x509.MarshalECPrivateKey(c.key)
	return b
}

// Leaf returns a certificate for name signed by the CA, made on first
// use and kept until a day before it expires.
func (c *CA) Leaf(name string) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l := c.leaves[name]; l != nil && time.Until(l.Leaf.NotAfter) > 24*time.Hour {
		return l, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	l := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	if len(c.leaves) > 256 {
		clear(c.leaves)
	}
	c.leaves[name] = l
	return l, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
