package identity

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
)

// Defaults of Config.
const (
	DefaultIssuer      = "https://nook.invalid"
	DefaultTTL         = 10 * time.Minute
	DefaultMaxTTL      = time.Hour
	DefaultRotateEvery = 24 * time.Hour
	// MinTTL is the shortest lifetime a caller may ask for.
	MinTTL = time.Minute
	// maxAudience bounds an audience's length.
	maxAudience = 512
)

// Paths of the discovery document and the key set, under the issuer URL.
const (
	DiscoveryPath = "/.well-known/openid-configuration"
	JWKSPath      = "/.well-known/jwks.json"
)

// Config configures an Issuer.
type Config struct {
	// Dir keeps the signing keys (owner-only); made if missing.
	Dir string
	// Issuer is the `iss` of every token and the URL whose
	// DiscoveryPath relying parties read (default DefaultIssuer, which
	// names no real host: set it to where the documents are served).
	Issuer string
	// TrustDomain is the subjects' SPIFFE trust domain (default the
	// issuer's host name).
	TrustDomain string
	// RotateEvery is how long a key signs (default DefaultRotateEvery).
	RotateEvery time.Duration
	// MaxTTL bounds a token's lifetime (default DefaultMaxTTL); retired
	// keys stay published this long.
	MaxTTL time.Duration
	// Now is the clock (default time.Now); tests move it.
	Now func() time.Time
}

// Issuer signs sandboxes' identity tokens and publishes its keys.
type Issuer struct {
	cfg    Config
	ring   *ring
	prefix string // the subjects' prefix: spiffe://TRUST-DOMAIN/sandbox/
}

// Subject is what a token says about the sandbox it names.
type Subject struct {
	ID, Name   string
	Template   string
	TemplateID string // the template build it was made from
	// TemplateDigest is the image manifest digest the template was built
	// from, when it was.
	TemplateDigest string
	Isolation      string
	Creator        string // the name of the token that created it
	Labels         map[string]string
	ParentID       string // the sandbox it was forked from
	LineageID      string // the first sandbox of its line of forks (its own ID when it is no fork)
	// Repository and Commit are the repository cloned into it at create
	// and the commit checked out.
	Repository, Commit string
	ExpiresAt          time.Time
}

// Claims are a token's claims.
type Claims struct {
	Issuer    string `json:"iss"`
	Subject   string `json:"sub"`
	Audience  string `json:"aud"`
	IssuedAt  int64  `json:"iat"`
	NotBefore int64  `json:"nbf"`
	Expiry    int64  `json:"exp"`
	ID        string `json:"jti"`

	SandboxID      string            `json:"sandbox_id"`
	SandboxName    string            `json:"sandbox_name"`
	Template       string            `json:"template,omitempty"`
	TemplateBuild  string            `json:"template_build,omitempty"`
	TemplateDigest string            `json:"template_digest,omitempty"`
	Isolation      string            `json:"isolation,omitempty"`
	Creator        string            `json:"creator,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	ParentID       string            `json:"parent_id,omitempty"`
	LineageID      string            `json:"lineage_id"`
	Repository     string            `json:"repository,omitempty"`
	Commit         string            `json:"commit,omitempty"`
}

// Token is a signed token and what it says.
type Token struct {
	Raw    string
	Claims Claims
	KeyID  string
}

// New opens the key ring in cfg.Dir (making the first keys) and returns
// the issuer.
func New(cfg Config) (*Issuer, error) {
	if cfg.Issuer == "" {
		cfg.Issuer = DefaultIssuer
	}
	iss, err := ParseIssuer(cfg.Issuer)
	if err != nil {
		return nil, err
	}
	cfg.Issuer = iss
	if cfg.TrustDomain == "" {
		u, _ := url.Parse(iss)
		cfg.TrustDomain = strings.ToLower(u.Hostname())
	}
	if !validTrustDomain(cfg.TrustDomain) {
		return nil, errdefs.Invalid("identity: trust domain %q: only lowercase letters, digits, '.', '-' and '_'", cfg.TrustDomain)
	}
	if cfg.RotateEvery <= 0 {
		cfg.RotateEvery = DefaultRotateEvery
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = DefaultMaxTTL
	}
	if cfg.MaxTTL < MinTTL {
		return nil, errdefs.Invalid("identity: the longest token lifetime (%s) is shorter than %s", cfg.MaxTTL, MinTTL)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r, err := openRing(cfg.Dir, cfg.RotateEvery, cfg.MaxTTL, cfg.Now)
	if err != nil {
		return nil, err
	}
	return &Issuer{cfg: cfg, ring: r, prefix: "spiffe://" + cfg.TrustDomain + "/sandbox/"}, nil
}

// ParseIssuer checks an issuer URL (http or https, a host, no query or
// fragment) and returns it without a trailing slash.
func ParseIssuer(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", errdefs.Invalid("identity: issuer %q is not an http(s) URL with a host and no query", s)
	}
	return strings.TrimRight(s, "/"), nil
}

func validTrustDomain(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// URL returns the issuer URL (`iss`).
func (is *Issuer) URL() string { return is.cfg.Issuer }

// SubjectOf returns the `sub` of a sandbox's tokens.
func (is *Issuer) SubjectOf(id string) string { return is.prefix + id }

// MaxTTL returns the longest lifetime of a token.
func (is *Issuer) MaxTTL() time.Duration { return is.cfg.MaxTTL }

// CheckAudience reports whether aud is an audience a token may name.
func CheckAudience(aud string) error {
	if aud == "" {
		return errdefs.Invalid("an audience is required (the relying party's identifier, e.g. sts.amazonaws.com)")
	}
	if len(aud) > maxAudience {
		return errdefs.Invalid("the audience is longer than %d bytes", maxAudience)
	}
	for _, c := range aud {
		if unicode.IsControl(c) || c == unicode.ReplacementChar {
			return errdefs.Invalid("the audience has a control character or invalid UTF-8")
		}
	}
	return nil
}

// Issue signs a token for s, for one audience, valid for ttl (0: the
// default) and never past the sandbox's own expiry.
func (is *Issuer) Issue(s Subject, audience string, ttl time.Duration) (Token, error) {
	if err := CheckAudience(audience); err != nil {
		return Token{}, err
	}
	if ttl == 0 {
		ttl = DefaultTTL
	}
	if ttl < MinTTL || ttl > is.cfg.MaxTTL {
		return Token{}, errdefs.Invalid("token lifetime %s is outside %s..%s", ttl, MinTTL, is.cfg.MaxTTL)
	}
	now := is.cfg.Now().Truncate(time.Second)
	exp := now.Add(ttl)
	if !s.ExpiresAt.IsZero() && s.ExpiresAt.Before(exp) {
		exp = s.ExpiresAt.Truncate(time.Second)
		if !exp.After(now) {
			return Token{}, errdefs.Precondition("sandbox %s has expired: it gets no tokens", s.Name)
		}
	}
	var jti [16]byte
	if _, err := rand.Read(jti[:]); err != nil {
		return Token{}, err
	}
	lineage := s.LineageID
	if lineage == "" {
		lineage = s.ID
	}
	c := Claims{
		Issuer: is.cfg.Issuer, Subject: is.SubjectOf(s.ID), Audience: audience,
		IssuedAt: now.Unix(), NotBefore: now.Unix(), Expiry: exp.Unix(), ID: hex.EncodeToString(jti[:]),
		SandboxID: s.ID, SandboxName: s.Name, Template: s.Template, TemplateBuild: s.TemplateID, TemplateDigest: s.TemplateDigest,
		Isolation: s.Isolation, Creator: s.Creator, Labels: s.Labels, ParentID: s.ParentID, LineageID: lineage,
		Repository: s.Repository, Commit: s.Commit,
	}
	signer, kid, err := is.ring.current()
	if err != nil {
		return Token{}, err
	}
	raw, err := jwt.Signed(signer).Claims(c).Serialize()
	if err != nil {
		return Token{}, fmt.Errorf("identity: sign: %w", err)
	}
	return Token{Raw: raw, Claims: c, KeyID: kid}, nil
}

// Rotate retires the signing key now; the published next key signs from
// now on. Tokens the old key signed verify until they expire.
func (is *Issuer) Rotate() error { return is.ring.rotate() }

// JWKS returns the published key set (JSON).
func (is *Issuer) JWKS() ([]byte, error) { return is.ring.published() }

// Discovery returns the OpenID Provider configuration document (JSON).
func (is *Issuer) Discovery() []byte {
	b, _ := json.Marshal(map[string]any{
		"issuer":                                is.cfg.Issuer,
		"jwks_uri":                              is.cfg.Issuer + JWKSPath,
		"response_types_supported":              []string{"id_token"},
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": []string{"ES256"},
		"claims_supported": []string{"iss", "sub", "aud", "iat", "nbf", "exp", "jti",
			"sandbox_id", "sandbox_name", "template", "template_build", "template_digest", "isolation", "creator", "labels", "parent_id", "lineage_id"},
	})
	return b
}

// WriteDocuments writes an issuer's discovery document and key set under
// dir, at the paths the issuer URL's path and the well-known paths give,
// for hosting dir as static files at the issuer URL. It returns the files
// written.
func WriteDocuments(dir string, discovery, jwks []byte) ([]string, error) {
	var doc struct {
		Issuer string `json:"issuer"`
	}
	if err := json.Unmarshal(discovery, &doc); err != nil {
		return nil, fmt.Errorf("the discovery document: %w", err)
	}
	iss, err := ParseIssuer(doc.Issuer)
	if err != nil {
		return nil, err
	}
	u, _ := url.Parse(iss)
	base := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+u.Path)))
	var wrote []string
	for _, f := range []struct {
		path string
		b    []byte
	}{{DiscoveryPath, discovery}, {JWKSPath, jwks}} {
		p := filepath.Join(base, filepath.FromSlash(f.path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return wrote, err
		}
		if err := fsutil.WriteFileAtomic(p, f.b); err != nil {
			return wrote, err
		}
		// Public documents.
		if err := os.Chmod(p, 0o644); err != nil {
			return wrote, err
		}
		wrote = append(wrote, p)
	}
	return wrote, nil
}
