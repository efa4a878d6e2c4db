package identity_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
	josejwt "github.com/go-jose/go-jose/v4/jwt"
	"github.com/golang-jwt/jwt/v5"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/identity"
)

const testAudience = "sts.example.com"

var b64 = base64.RawURLEncoding

// fakeClock is the issuer's (and the Go verifiers') controllable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock(t time.Time) *fakeClock { return &fakeClock{t: t} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testEnv is an Issuer whose documents an httptest.Server serves at the
// issuer URL.
type testEnv struct {
	t0       time.Time // where the clock starts: the real time, whole seconds
	clk      *fakeClock
	dir      string
	srv      *httptest.Server
	is       *identity.Issuer
	cur      atomic.Pointer[identity.Issuer]
	jwksHits atomic.Int64
}

func newEnv(t *testing.T, mod func(*identity.Config)) *testEnv {
	t.Helper()
	e := &testEnv{t0: time.Now().Truncate(time.Second), dir: t.TempDir()}
	e.clk = newClock(e.t0)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+identity.DiscoveryPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(e.cur.Load().Discovery())
	})
	mux.HandleFunc("GET "+identity.JWKSPath, func(w http.ResponseWriter, r *http.Request) {
		e.jwksHits.Add(1)
		b, err := e.cur.Load().JWKS()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	})
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	cfg := identity.Config{Dir: e.dir, Issuer: e.srv.URL, Now: e.clk.Now}
	if mod != nil {
		mod(&cfg)
	}
	is, err := identity.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.is = is
	e.cur.Store(is)
	return e
}

func (e *testEnv) issue(t *testing.T, s identity.Subject, aud string, ttl time.Duration) identity.Token {
	t.Helper()
	tok, err := e.is.Issue(s, aud, ttl)
	if err != nil {
		t.Fatalf("Issue(%q, %s): %v", aud, ttl, err)
	}
	return tok
}

// fetchJWKS gets the key set as the server serves it.
func (e *testEnv) fetchJWKS(t *testing.T) []byte {
	t.Helper()
	resp, err := http.Get(e.srv.URL + identity.JWKSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET jwks: %d %s %v", resp.StatusCode, b, err)
	}
	return b
}

// newIssuer makes an issuer without a server.
func newIssuer(t *testing.T, clk *fakeClock, mod func(*identity.Config)) (*identity.Issuer, identity.Config) {
	t.Helper()
	cfg := identity.Config{Dir: filepath.Join(t.TempDir(), "keys"), Issuer: "https://nook.example", Now: clk.Now}
	if mod != nil {
		mod(&cfg)
	}
	is, err := identity.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return is, cfg
}

func mustIssue(t *testing.T, is *identity.Issuer, s identity.Subject, aud string, ttl time.Duration) identity.Token {
	t.Helper()
	tok, err := is.Issue(s, aud, ttl)
	if err != nil {
		t.Fatalf("Issue(%q, %s): %v", aud, ttl, err)
	}
	return tok
}

func mustJWKS(t *testing.T, is *identity.Issuer) []byte {
	t.Helper()
	b, err := is.JWKS()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// segments splits a compact JWS.
func segments(t *testing.T, raw string) (header, payload, sig string) {
	t.Helper()
	p := strings.Split(raw, ".")
	if len(p) != 3 {
		t.Fatalf("token %q has %d segments", raw, len(p))
	}
	return p[0], p[1], p[2]
}

// decodeSegment decodes a header or payload, keeping numbers exact.
func decodeSegment(t *testing.T, seg string) map[string]any {
	t.Helper()
	b, err := b64.DecodeString(seg)
	if err != nil {
		t.Fatalf("segment %q: %v", seg, err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	m := map[string]any{}
	if err := d.Decode(&m); err != nil {
		t.Fatalf("segment %s: %v", b, err)
	}
	return m
}

func headerKID(t *testing.T, raw string) string {
	t.Helper()
	h, _, _ := segments(t, raw)
	kid, _ := decodeSegment(t, h)["kid"].(string)
	return kid
}

func kidsOf(t *testing.T, jwks []byte) []string {
	t.Helper()
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(jwks, &set); err != nil {
		t.Fatalf("jwks %s: %v", jwks, err)
	}
	var kids []string
	for _, k := range set.Keys {
		kids = append(kids, k.KeyID)
	}
	return kids
}

// verifyLocal checks a token's signature against a key set (go-jose) and,
// when at is not zero, its times at that instant.
func verifyLocal(t *testing.T, jwks []byte, raw string, at time.Time) (identity.Claims, error) {
	t.Helper()
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(jwks, &set); err != nil {
		t.Fatalf("jwks %s: %v", jwks, err)
	}
	tok, err := josejwt.ParseSigned(raw, []jose.SignatureAlgorithm{jose.ES256})
	if err != nil {
		return identity.Claims{}, err
	}
	keys := set.Key(tok.Headers[0].KeyID)
	if len(keys) != 1 {
		return identity.Claims{}, fmt.Errorf("kid %q: %d keys in the set", tok.Headers[0].KeyID, len(keys))
	}
	var c identity.Claims
	var std josejwt.Claims
	if err := tok.Claims(keys[0].Key, &c, &std); err != nil {
		return identity.Claims{}, err
	}
	if !at.IsZero() {
		if err := std.ValidateWithLeeway(josejwt.Expected{Time: at}, 0); err != nil {
			return c, err
		}
	}
	return c, nil
}

// ---------------------------------------------------------------------
// Verification by three independent libraries.

type tokenCase struct {
	name, token string
	pyOptions   map[string]any // PyJWT decode options
}

type verdict struct {
	sub, sandboxID string
	err            error
}

type verifyFunc func(t *testing.T, cases []tokenCase) map[string]verdict

func oidcVerifier(t *testing.T, ctx context.Context, issuer string, at time.Time) *oidc.IDTokenVerifier {
	t.Helper()
	p, err := oidc.NewProvider(ctx, issuer)
	if err != nil {
		t.Fatalf("go-oidc discovery: %v", err)
	}
	return p.Verifier(&oidc.Config{ClientID: testAudience, Now: func() time.Time { return at }})
}

func oidcVerify(ctx context.Context, v *oidc.IDTokenVerifier) verifyFunc {
	return func(t *testing.T, cases []tokenCase) map[string]verdict {
		out := map[string]verdict{}
		for _, c := range cases {
			idt, err := v.Verify(ctx, c.token)
			if err != nil {
				out[c.name] = verdict{err: err}
				continue
			}
			var cl struct {
				SandboxID string `json:"sandbox_id"`
			}
			if err := idt.Claims(&cl); err != nil {
				t.Fatalf("%s: claims: %v", c.name, err)
			}
			out[c.name] = verdict{sub: idt.Subject, sandboxID: cl.SandboxID}
		}
		return out
	}
}

type jwtClaims struct {
	jwt.RegisteredClaims
	SandboxID string `json:"sandbox_id"`
}

func jwtVerify(kf keyfunc.Keyfunc, issuer string, at time.Time) verifyFunc {
	p := jwt.NewParser(
		jwt.WithAudience(testAudience),
		jwt.WithIssuer(issuer),
		jwt.WithValidMethods([]string{"ES256"}),
		jwt.WithTimeFunc(func() time.Time { return at }),
		jwt.WithExpirationRequired(),
	)
	return func(t *testing.T, cases []tokenCase) map[string]verdict {
		out := map[string]verdict{}
		for _, c := range cases {
			var cl jwtClaims
			tok, err := p.ParseWithClaims(c.token, &cl, kf.Keyfunc)
			if err == nil && !tok.Valid {
				err = errors.New("parsed but not valid")
			}
			if err != nil {
				out[c.name] = verdict{err: err}
				continue
			}
			out[c.name] = verdict{sub: cl.Subject, sandboxID: cl.SandboxID}
		}
		return out
	}
}

// pyVerifyScript verifies each token with PyJWT against the JWKS it
// fetches (PyJWKClient), at the real time.
const pyVerifyScript = `
import json, sys
import jwt
req = json.load(sys.stdin)
client = jwt.PyJWKClient(req["jwks_url"])
out = {}
for c in req["cases"]:
    try:
        key = client.get_signing_key_from_jwt(c["token"]).key
        claims = jwt.decode(c["token"], key, algorithms=["ES256"], audience=req["aud"], issuer=req["iss"], options=c.get("options"))
        out[c["name"]] = {"ok": True, "sub": claims.get("sub", ""), "sandbox_id": claims.get("sandbox_id", "")}
    except Exception as e:
        out[c["name"]] = {"ok": False, "error": type(e).__name__ + ": " + str(e)}
json.dump(out, sys.stdout)
`

var (
	pythonOnce sync.Once
	pythonPath string
	pythonWhy  string
)

// findPython returns a python3 that has Debian's python3-jwt (and
// python3-cryptography): the first python3 on PATH may be another one
// (pyenv's), so /usr/bin/python3 is tried too. Without one the test
// skips, or fails under CI.
func findPython(t *testing.T) string {
	t.Helper()
	pythonOnce.Do(func() {
		var tried []string
		seen := map[string]bool{}
		for _, c := range []string{"python3", "/usr/bin/python3"} {
			p, err := exec.LookPath(c)
			if err != nil || seen[p] {
				continue
			}
			seen[p] = true
			out, err := exec.Command(p, "-c", "import jwt, cryptography").CombinedOutput()
			if err == nil {
				pythonPath = p
				return
			}
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			tried = append(tried, fmt.Sprintf("%s: %s", p, lines[len(lines)-1]))
		}
		if len(tried) == 0 {
			pythonWhy = "python3 is missing"
		} else {
			pythonWhy = "the python3 jwt module (Debian's python3-jwt, with python3-cryptography) is missing: " + strings.Join(tried, "; ")
		}
	})
	if pythonPath == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(pythonWhy)
		}
		t.Skip(pythonWhy)
	}
	return pythonPath
}

func pyVerify(jwksURL, issuer string) verifyFunc {
	return func(t *testing.T, cases []tokenCase) map[string]verdict {
		t.Helper()
		py := findPython(t)
		type pyCase struct {
			Name    string         `json:"name"`
			Token   string         `json:"token"`
			Options map[string]any `json:"options,omitempty"`
		}
		req := struct {
			JWKSURL string   `json:"jwks_url"`
			Aud     string   `json:"aud"`
			Iss     string   `json:"iss"`
			Cases   []pyCase `json:"cases"`
		}{JWKSURL: jwksURL, Aud: testAudience, Iss: issuer}
		for _, c := range cases {
			req.Cases = append(req.Cases, pyCase{c.name, c.token, c.pyOptions})
		}
		in, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, py, "-c", pyVerifyScript)
		cmd.Stdin = bytes.NewReader(in)
		// The JWKS is on the loopback: no proxy.
		for _, kv := range os.Environ() {
			if k, _, _ := strings.Cut(kv, "="); !strings.HasSuffix(strings.ToLower(k), "_proxy") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		outb, err := cmd.Output()
		if err != nil {
			t.Fatalf("python: %v\n%s", err, stderr.String())
		}
		var res map[string]struct {
			OK        bool   `json:"ok"`
			Sub       string `json:"sub"`
			SandboxID string `json:"sandbox_id"`
			Error     string `json:"error"`
		}
		if err := json.Unmarshal(outb, &res); err != nil {
			t.Fatalf("python output %q: %v", outb, err)
		}
		out := map[string]verdict{}
		for name, r := range res {
			if r.OK {
				out[name] = verdict{sub: r.Sub, sandboxID: r.SandboxID}
			} else {
				out[name] = verdict{err: errors.New(r.Error)}
			}
		}
		return out
	}
}

// reason is what a verifier's error must say.
type reason struct {
	desc string
	ok   func(error) bool
}

func errIs(targets ...error) reason {
	var descs []string
	for _, e := range targets {
		descs = append(descs, e.Error())
	}
	return reason{"errors.Is " + strings.Join(descs, " and "), func(err error) bool {
		for _, e := range targets {
			if !errors.Is(err, e) {
				return false
			}
		}
		return true
	}}
}

func errHas(s string) reason {
	return reason{"contains " + s, func(err error) bool { return strings.Contains(err.Error(), s) }}
}

func pyErr(names ...string) reason {
	return reason{"python " + strings.Join(names, " or "), func(err error) bool {
		for _, n := range names {
			if strings.HasPrefix(err.Error(), n+":") {
				return true
			}
		}
		return false
	}}
}

var oidcExpired = reason{"*oidc.TokenExpiredError", func(err error) bool {
	var e *oidc.TokenExpiredError
	return errors.As(err, &e)
}}

// rejection is a token every verifier must refuse, and why.
type rejection struct {
	name          string
	oidc, jwt, py reason
}

func checkAccepted(t *testing.T, got map[string]verdict, name, sub, sandboxID string) {
	t.Helper()
	v, ok := got[name]
	switch {
	case !ok:
		t.Errorf("%s: no verdict", name)
	case v.err != nil:
		t.Errorf("%s: rejected: %v", name, v.err)
	case v.sub != sub || v.sandboxID != sandboxID:
		t.Errorf("%s: sub %q sandbox_id %q, want %q %q", name, v.sub, v.sandboxID, sub, sandboxID)
	}
}

func checkRejected(t *testing.T, got map[string]verdict, name string, why reason) {
	t.Helper()
	v, ok := got[name]
	switch {
	case !ok:
		t.Errorf("%s: no verdict", name)
	case v.err == nil:
		t.Errorf("%s: accepted (sub %q), want rejected", name, v.sub)
	case !why.ok(v.err):
		t.Errorf("%s: rejected for the wrong reason: %v (want %s)", name, v.err, why.desc)
	}
}

// signES256 signs payload (a JWT's claims) with key, naming kid.
func signES256(t *testing.T, key *ecdsa.PrivateKey, kid string, payload []byte) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: key, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		t.Fatal(err)
	}
	jws, err := s.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// hs256 makes an HS256 token over payloadSeg whose HMAC key is key (a
// public value: the key-confusion attack).
func hs256(t *testing.T, kid, payloadSeg string, key []byte) string {
	t.Helper()
	h, _ := json.Marshal(map[string]string{"alg": "HS256", "typ": "JWT", "kid": kid})
	input := b64.EncodeToString(h) + "." + payloadSeg
	m := hmac.New(sha256.New, key)
	m.Write([]byte(input))
	return input + "." + b64.EncodeToString(m.Sum(nil))
}

func TestTokensVerifyWithThreeLibraries(t *testing.T) {
	e := newEnv(t, nil)
	ctx := t.Context()
	at := e.t0 // the Go verifiers' clock; PyJWT's is the real one, a few seconds on
	sub := identity.Subject{ID: "sb-1", Name: "web", Template: "base", Isolation: "container"}
	wantSub := "spiffe://127.0.0.1/sandbox/sb-1"

	valid := e.issue(t, sub, testAudience, 10*time.Minute)
	kidA := valid.KeyID
	if valid.Claims.Subject != wantSub {
		t.Fatalf("sub %q, want %q", valid.Claims.Subject, wantSub)
	}

	e.clk.Set(at.Add(-2 * time.Hour))
	expired := e.issue(t, sub, testAudience, 10*time.Minute)
	e.clk.Set(at.Add(time.Hour))
	notYet := e.issue(t, sub, testAudience, 10*time.Minute)
	e.clk.Set(at)
	wrongAud := e.issue(t, sub, "other.example.com", 10*time.Minute)

	// The same keys, another issuer: the signature is right, only iss is
	// wrong.
	evil, err := identity.New(identity.Config{Dir: e.dir, Issuer: "https://evil.example", Now: e.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	wrongIss, err := evil.Issue(sub, testAudience, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if wrongIss.KeyID != kidA {
		t.Fatalf("the wrong-issuer token is signed by %s, want the real key %s", wrongIss.KeyID, kidA)
	}

	_, payloadSeg, sigSeg := segments(t, valid.Raw)
	payload, err := b64.DecodeString(payloadSeg)
	if err != nil {
		t.Fatal(err)
	}
	jwks := e.fetchJWKS(t)
	if got := kidsOf(t, jwks); len(got) != 2 || !slices.Contains(got, kidA) {
		t.Fatalf("JWKS kids %v: want the current key %s and the next", got, kidA)
	}

	// alg none: header {"alg":"none","typ":"JWT"}, the real claims, no signature.
	noneTok := b64.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + payloadSeg + "."
	noneKidTok := b64.EncodeToString([]byte(`{"alg":"none","typ":"JWT","kid":"`+kidA+`"}`)) + "." + payloadSeg + "."

	// Key confusion: HS256 keyed with public material.
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(jwks, &set); err != nil {
		t.Fatal(err)
	}
	pub := set.Key(kidA)[0].Key.(*ecdsa.PublicKey)
	var rawSet struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(jwks, &rawSet); err != nil {
		t.Fatal(err)
	}
	var oneJWK []byte
	for _, k := range rawSet.Keys {
		if bytes.Contains(k, []byte(`"`+kidA+`"`)) {
			oneJWK = k
		}
	}
	spki, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: spki})
	ecdhPub, err := pub.ECDH()
	if err != nil {
		t.Fatal(err)
	}

	// Keys the issuer never had.
	rogue, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	unknownKid := signES256(t, rogue, "rogue-kid-not-in-the-jwks", payload)
	forged := signES256(t, rogue, kidA, payload)

	// Tampered claims under the real signature.
	var claims map[string]any
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	claims["sub"] = "spiffe://127.0.0.1/sandbox/someone-else"
	claims["sandbox_id"] = "someone-else"
	tp, _ := json.Marshal(claims)
	hdrSeg, _, _ := segments(t, valid.Raw)
	tampered := hdrSeg + "." + b64.EncodeToString(tp) + "." + sigSeg

	cases := []tokenCase{
		{name: "valid", token: valid.Raw},
		{name: "expired", token: expired.Raw},
		{name: "not yet valid", token: notYet.Raw},
		// PyJWT refuses a future iat first: check its nbf check alone too.
		{name: "not yet valid (nbf alone)", token: notYet.Raw, pyOptions: map[string]any{"verify_iat": false}},
		{name: "wrong audience", token: wrongAud.Raw},
		{name: "wrong issuer", token: wrongIss.Raw},
		{name: "alg none", token: noneTok},
		{name: "alg none with the real kid", token: noneKidTok},
		{name: "HS256 keyed with the JWKS", token: hs256(t, kidA, payloadSeg, jwks)},
		{name: "HS256 keyed with the JWK", token: hs256(t, kidA, payloadSeg, oneJWK)},
		{name: "HS256 keyed with the PEM public key", token: hs256(t, kidA, payloadSeg, pemKey)},
		{name: "HS256 keyed with the DER public key", token: hs256(t, kidA, payloadSeg, spki)},
		{name: "HS256 keyed with the EC point", token: hs256(t, kidA, payloadSeg, ecdhPub.Bytes())},
		{name: "unknown kid", token: unknownKid},
		{name: "forged with the real kid", token: forged},
		{name: "tampered claims", token: tampered},
	}
	rejections := []rejection{
		{"expired", oidcExpired, errIs(jwt.ErrTokenExpired), pyErr("ExpiredSignatureError")},
		{"not yet valid", errHas("nbf"), errIs(jwt.ErrTokenNotValidYet), pyErr("ImmatureSignatureError")},
		{"not yet valid (nbf alone)", errHas("nbf"), errIs(jwt.ErrTokenNotValidYet), reason{"python ImmatureSignatureError (nbf)", func(err error) bool {
			return strings.HasPrefix(err.Error(), "ImmatureSignatureError:") && strings.Contains(err.Error(), "nbf")
		}}},
		{"wrong audience", errHas("expected audience"), errIs(jwt.ErrTokenInvalidAudience), pyErr("InvalidAudienceError")},
		{"wrong issuer", errHas("different provider"), errIs(jwt.ErrTokenInvalidIssuer), pyErr("InvalidIssuerError")},
		{"alg none", errHas("malformed jwt"), errIs(jwt.ErrTokenSignatureInvalid), pyErr("PyJWKClientError", "InvalidAlgorithmError")},
		{"alg none with the real kid", errHas("malformed jwt"), errIs(jwt.ErrTokenSignatureInvalid), pyErr("InvalidAlgorithmError")},
		{"HS256 keyed with the JWKS", errHas("malformed jwt"), errIs(jwt.ErrTokenSignatureInvalid), pyErr("InvalidAlgorithmError")},
		{"HS256 keyed with the JWK", errHas("malformed jwt"), errIs(jwt.ErrTokenSignatureInvalid), pyErr("InvalidAlgorithmError")},
		{"HS256 keyed with the PEM public key", errHas("malformed jwt"), errIs(jwt.ErrTokenSignatureInvalid), pyErr("InvalidAlgorithmError")},
		{"HS256 keyed with the DER public key", errHas("malformed jwt"), errIs(jwt.ErrTokenSignatureInvalid), pyErr("InvalidAlgorithmError")},
		{"HS256 keyed with the EC point", errHas("malformed jwt"), errIs(jwt.ErrTokenSignatureInvalid), pyErr("InvalidAlgorithmError")},
		{"unknown kid", errHas("failed to verify signature"), errIs(jwt.ErrTokenUnverifiable, keyfunc.ErrKeyfunc), pyErr("PyJWKClientError")},
		{"forged with the real kid", errHas("failed to verify signature"), errIs(jwt.ErrTokenSignatureInvalid), pyErr("InvalidSignatureError")},
		{"tampered claims", errHas("failed to verify signature"), errIs(jwt.ErrTokenSignatureInvalid), pyErr("InvalidSignatureError")},
	}
	if len(rejections) != len(cases)-1 {
		t.Fatalf("%d rejections for %d cases", len(rejections), len(cases))
	}

	jwksURL := e.srv.URL + identity.JWKSPath
	oidcV := oidcVerifier(t, ctx, e.srv.URL, at)
	kf, err := keyfunc.NewDefaultCtx(ctx, []string{jwksURL})
	if err != nil {
		t.Fatal(err)
	}
	type namedVerifier struct {
		name string
		run  verifyFunc
		why  func(rejection) reason
	}
	verifiers := []namedVerifier{
		{"go-oidc", oidcVerify(ctx, oidcV), func(r rejection) reason { return r.oidc }},
		{"golang-jwt+keyfunc", jwtVerify(kf, e.srv.URL, at), func(r rejection) reason { return r.jwt }},
		{"pyjwt", pyVerify(jwksURL, e.srv.URL), func(r rejection) reason { return r.py }},
	}
	for _, v := range verifiers {
		t.Run(v.name, func(t *testing.T) {
			got := v.run(t, cases)
			checkAccepted(t, got, "valid", wantSub, "sb-1")
			for _, r := range rejections {
				checkRejected(t, got, r.name, v.why(r))
			}
		})
	}

	// Rotation: the token signed before it still verifies, and the new
	// signing key was in the JWKS the verifiers fetched before it.
	if err := e.is.Rotate(); err != nil {
		t.Fatal(err)
	}
	rotated := e.issue(t, sub, testAudience, 10*time.Minute)
	kidB := rotated.KeyID
	if kidB == kidA {
		t.Fatalf("the key did not change on Rotate: %s", kidB)
	}
	if !slices.Contains(kidsOf(t, jwks), kidB) {
		t.Fatalf("the new signing key %s was not published before the rotation (JWKS %v)", kidB, kidsOf(t, jwks))
	}
	around := []tokenCase{{name: "signed before the rotation", token: valid.Raw}, {name: "signed after the rotation", token: rotated.Raw}}
	hits := e.jwksHits.Load()
	for _, v := range verifiers[:2] {
		t.Run(v.name+"/cached JWKS after rotation", func(t *testing.T) {
			got := v.run(t, around)
			checkAccepted(t, got, "signed before the rotation", wantSub, "sb-1")
			checkAccepted(t, got, "signed after the rotation", wantSub, "sb-1")
		})
	}
	if h := e.jwksHits.Load(); h != hits {
		t.Errorf("the Go verifiers fetched the JWKS %d more times to verify the new key's token: it was not published before it signed", h-hits)
	}
	t.Run("pyjwt/after rotation", func(t *testing.T) {
		got := verifiers[2].run(t, around)
		checkAccepted(t, got, "signed before the rotation", wantSub, "sb-1")
		checkAccepted(t, got, "signed after the rotation", wantSub, "sb-1")
	})

	// Retirement: past Retired + MaxTTL the old key leaves the JWKS, and a
	// verifier with a fresh JWKS refuses what it signed (the verifiers'
	// clock stays at `at`, where the token is otherwise valid).
	e.clk.Set(at.Add(e.is.MaxTTL() + time.Second))
	pruned := mustJWKS(t, e.is)
	if kids := kidsOf(t, pruned); slices.Contains(kids, kidA) || !slices.Contains(kids, kidB) {
		t.Fatalf("JWKS after retirement: %v (retired %s, current %s)", kids, kidA, kidB)
	}
	served := e.fetchJWKS(t)
	if !bytes.Equal(served, pruned) {
		t.Fatalf("served JWKS %s differs from %s", served, pruned)
	}
	kf2, err := keyfunc.NewJWKSetJSON(served)
	if err != nil {
		t.Fatal(err)
	}
	retired := []tokenCase{{name: "retired key", token: valid.Raw}, {name: "current key", token: rotated.Raw}}
	fresh := []namedVerifier{
		{"go-oidc", oidcVerify(ctx, oidcVerifier(t, ctx, e.srv.URL, at)), func(rejection) reason { return errHas("failed to verify signature") }},
		{"golang-jwt+keyfunc", jwtVerify(kf2, e.srv.URL, at), func(rejection) reason { return errIs(jwt.ErrTokenUnverifiable, keyfunc.ErrKeyfunc) }},
		{"pyjwt", verifiers[2].run, func(rejection) reason { return pyErr("PyJWKClientError") }},
	}
	for _, v := range fresh {
		t.Run(v.name+"/after retirement", func(t *testing.T) {
			got := v.run(t, retired)
			checkRejected(t, got, "retired key", v.why(rejection{}))
			checkAccepted(t, got, "current key", wantSub, "sb-1")
		})
	}
}

// TestOIDCFindsKeyOfLaterRotation: a go-oidc verifier whose cached JWKS
// predates two rotations refetches it for the unknown kid.
func TestOIDCFindsKeyOfLaterRotation(t *testing.T) {
	e := newEnv(t, nil)
	ctx := t.Context()
	sub := identity.Subject{ID: "sb-2", Name: "api"}
	at := e.t0
	v := oidcVerify(ctx, oidcVerifier(t, ctx, e.srv.URL, at))
	first := e.issue(t, sub, testAudience, 0)
	got := v(t, []tokenCase{{name: "first", token: first.Raw}})
	checkAccepted(t, got, "first", "spiffe://127.0.0.1/sandbox/sb-2", "sb-2")
	for range 2 {
		if err := e.is.Rotate(); err != nil {
			t.Fatal(err)
		}
	}
	later := e.issue(t, sub, testAudience, 0)
	hits := e.jwksHits.Load()
	got = v(t, []tokenCase{{name: "later", token: later.Raw}})
	checkAccepted(t, got, "later", "spiffe://127.0.0.1/sandbox/sb-2", "sb-2")
	if e.jwksHits.Load() == hits {
		t.Error("go-oidc verified a key it never fetched")
	}
}

// ---------------------------------------------------------------------
// The key ring.

func TestKeysSurviveReopen(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	is1, cfg := newIssuer(t, clk, nil)
	sub := identity.Subject{ID: "sb-1", Name: "web"}
	tok1 := mustIssue(t, is1, sub, testAudience, 0)
	jwks1 := mustJWKS(t, is1)

	is2, err := identity.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tok2 := mustIssue(t, is2, sub, testAudience, 0)
	if tok2.KeyID != tok1.KeyID {
		t.Fatalf("after reopening, kid %s signs, want %s", tok2.KeyID, tok1.KeyID)
	}
	if jwks2 := mustJWKS(t, is2); !bytes.Equal(jwks2, jwks1) {
		t.Fatalf("JWKS changed on reopen:\n%s\n%s", jwks1, jwks2)
	}
	// The same private key: the first JWKS verifies the reopened issuer's token.
	if _, err := verifyLocal(t, jwks1, tok2.Raw, time.Time{}); err != nil {
		t.Fatalf("reopened issuer's token: %v", err)
	}

	// Another directory is another ring.
	is3, _ := newIssuer(t, clk, nil)
	tok3 := mustIssue(t, is3, sub, testAudience, 0)
	if tok3.KeyID == tok1.KeyID {
		t.Fatal("two key directories made the same key")
	}
	if _, err := verifyLocal(t, jwks1, tok3.Raw, time.Time{}); err == nil {
		t.Fatal("a token of another ring verified")
	}
}

func TestKeyFilesOwnerOnly(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	dir := filepath.Join(t.TempDir(), "keys")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	is, _ := newIssuer(t, clk, func(c *identity.Config) { c.Dir = dir })
	check := func() {
		t.Helper()
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o700 {
			t.Errorf("keys directory mode %o, want 700", st.Mode().Perm())
		}
		st, err = os.Stat(filepath.Join(dir, "keys.json"))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("keys.json mode %o, want 600", st.Mode().Perm())
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 1 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("keys directory holds %v, want keys.json alone", names)
		}
	}
	check()
	if err := is.Rotate(); err != nil {
		t.Fatal(err)
	}
	check()

	// The ring on disk has the private keys, the JWKS none.
	b, err := os.ReadFile(filepath.Join(dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ring []map[string]any
	if err := json.Unmarshal(b, &ring); err != nil {
		t.Fatal(err)
	}
	if len(ring) != 3 {
		t.Fatalf("keys.json has %d keys after one rotation, want 3", len(ring))
	}
	for _, k := range ring {
		if s, _ := k["private"].(string); s == "" {
			t.Errorf("key %v has no private key", k["kid"])
		}
	}
}

func TestJWKSPublicKeysOnly(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	is, _ := newIssuer(t, clk, nil)
	b := mustJWKS(t, is)
	var raw struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if len(raw.Keys) != 2 {
		t.Fatalf("%d keys published, want the current and the next", len(raw.Keys))
	}
	for _, k := range raw.Keys {
		for field, want := range map[string]string{"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig"} {
			if k[field] != want {
				t.Errorf("key %v: %s %v, want %s", k["kid"], field, k[field], want)
			}
		}
		if _, ok := k["d"]; ok {
			t.Errorf("key %v publishes its private part", k["kid"])
		}
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(b, &set); err != nil {
		t.Fatal(err)
	}
	for _, k := range set.Keys {
		if !k.IsPublic() {
			t.Errorf("key %s is not public", k.KeyID)
		}
		// kid: the RFC 7638 thumbprint, truncated.
		tp, err := k.Thumbprint(crypto.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		if want := b64.EncodeToString(tp[:16]); k.KeyID != want {
			t.Errorf("kid %s, want the thumbprint %s", k.KeyID, want)
		}
	}
}

func TestRotate(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := newClock(t0)
	is, cfg := newIssuer(t, clk, nil)
	sub := identity.Subject{ID: "sb-1", Name: "web"}
	before := mustJWKS(t, is)
	tokA := mustIssue(t, is, sub, testAudience, 0)
	clk.Add(time.Minute)
	if err := is.Rotate(); err != nil {
		t.Fatal(err)
	}
	tokB := mustIssue(t, is, sub, testAudience, 0)
	if tokB.KeyID == tokA.KeyID {
		t.Fatalf("the same kid %s signs after Rotate", tokA.KeyID)
	}
	if headerKID(t, tokB.Raw) != tokB.KeyID {
		t.Fatalf("token header kid %s, Token.KeyID %s", headerKID(t, tokB.Raw), tokB.KeyID)
	}
	// The new key was published before the rotation: the old JWKS verifies its token.
	if !slices.Contains(kidsOf(t, before), tokB.KeyID) {
		t.Fatalf("kid %s was not in the JWKS before the rotation: %v", tokB.KeyID, kidsOf(t, before))
	}
	if _, err := verifyLocal(t, before, tokB.Raw, clk.Now()); err != nil {
		t.Fatalf("the new key's token against the JWKS of before the rotation: %v", err)
	}
	after := mustJWKS(t, is)
	kids := kidsOf(t, after)
	if len(kids) != 3 || !slices.Contains(kids, tokA.KeyID) || !slices.Contains(kids, tokB.KeyID) {
		t.Fatalf("JWKS after rotation: %v, want the retired %s, the current %s and a next", kids, tokA.KeyID, tokB.KeyID)
	}
	if _, err := verifyLocal(t, after, tokA.Raw, clk.Now()); err != nil {
		t.Fatalf("the token signed before the rotation: %v", err)
	}
	// The rotation is on disk.
	is2, err := identity.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if tok := mustIssue(t, is2, sub, testAudience, 0); tok.KeyID != tokB.KeyID {
		t.Fatalf("reopened after rotation, kid %s signs, want %s", tok.KeyID, tokB.KeyID)
	}
}

func TestAutomaticRotation(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := newClock(t0)
	is, _ := newIssuer(t, clk, func(c *identity.Config) { c.RotateEvery = 6 * time.Hour })
	sub := identity.Subject{ID: "sb-1", Name: "web"}
	tokA := mustIssue(t, is, sub, testAudience, 0)
	published := mustJWKS(t, is)

	clk.Set(t0.Add(6*time.Hour - time.Second))
	if tok := mustIssue(t, is, sub, testAudience, 0); tok.KeyID != tokA.KeyID {
		t.Fatalf("rotated before RotateEvery: %s, want %s", tok.KeyID, tokA.KeyID)
	}
	clk.Set(t0.Add(6 * time.Hour))
	tokB := mustIssue(t, is, sub, testAudience, 0)
	if tokB.KeyID == tokA.KeyID {
		t.Fatal("did not rotate at RotateEvery")
	}
	if !slices.Contains(kidsOf(t, published), tokB.KeyID) {
		t.Fatalf("the automatically rotated-in key %s was not published before: %v", tokB.KeyID, kidsOf(t, published))
	}
	// The next period rotates again, from the time of the last rotation.
	clk.Set(t0.Add(12*time.Hour - time.Second))
	if tok := mustIssue(t, is, sub, testAudience, 0); tok.KeyID != tokB.KeyID {
		t.Fatalf("rotated early: %s, want %s", tok.KeyID, tokB.KeyID)
	}
	clk.Set(t0.Add(12 * time.Hour))
	if tok := mustIssue(t, is, sub, testAudience, 0); tok.KeyID == tokB.KeyID || tok.KeyID == tokA.KeyID {
		t.Fatalf("no second rotation: %s", tok.KeyID)
	}
	// JWKS alone rotates too.
	clk.Set(t0.Add(18 * time.Hour))
	before := kidsOf(t, mustJWKS(t, is))
	clk.Set(t0.Add(24 * time.Hour))
	if after := kidsOf(t, mustJWKS(t, is)); slices.Equal(before, after) {
		t.Fatalf("JWKS did not change when the key was due: %v", after)
	}
}

func TestRetiredKeyLeavesJWKS(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := newClock(t0)
	is, cfg := newIssuer(t, clk, func(c *identity.Config) { c.MaxTTL = 2 * time.Hour })
	sub := identity.Subject{ID: "sb-1", Name: "web"}
	// The last token the old key signs, for as long as a token may live.
	tokA := mustIssue(t, is, sub, testAudience, 2*time.Hour)
	if err := is.Rotate(); err != nil {
		t.Fatal(err)
	}
	lastValid := time.Unix(tokA.Claims.Expiry, 0).Add(-time.Second)

	clk.Set(t0.Add(2*time.Hour - time.Second))
	jwks := mustJWKS(t, is)
	if !slices.Contains(kidsOf(t, jwks), tokA.KeyID) {
		t.Fatalf("retired key %s left the JWKS before its tokens expired: %v", tokA.KeyID, kidsOf(t, jwks))
	}
	if _, err := verifyLocal(t, jwks, tokA.Raw, lastValid); err != nil {
		t.Fatalf("the retired key's last token in its last second: %v", err)
	}

	clk.Set(t0.Add(2 * time.Hour))
	jwks = mustJWKS(t, is)
	kids := kidsOf(t, jwks)
	if slices.Contains(kids, tokA.KeyID) {
		t.Fatalf("retired key %s still published at Retired+MaxTTL: %v", tokA.KeyID, kids)
	}
	if len(kids) != 2 {
		t.Fatalf("JWKS %v, want the current and the next key", kids)
	}
	if _, err := verifyLocal(t, jwks, tokA.Raw, time.Time{}); err == nil {
		t.Fatal("the retired key's token verified after it left")
	}
	// Gone from the disk too.
	b, err := os.ReadFile(filepath.Join(cfg.Dir, "keys.json"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte(tokA.KeyID)) {
		t.Fatalf("keys.json still holds the pruned key %s", tokA.KeyID)
	}
}

func TestConcurrentIssueRotate(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	is, _ := newIssuer(t, clk, nil)
	sub := identity.Subject{ID: "sb-1", Name: "web"}
	var wg sync.WaitGroup
	toks := make(chan identity.Token, 200)
	errs := make(chan error, 220)
	for range 4 {
		wg.Go(func() {
			for range 50 {
				tok, err := is.Issue(sub, testAudience, 0)
				if err != nil {
					errs <- err
					return
				}
				toks <- tok
			}
		})
	}
	wg.Go(func() {
		for range 10 {
			if err := is.Rotate(); err != nil {
				errs <- err
			}
			if _, err := is.JWKS(); err != nil {
				errs <- err
			}
		}
	})
	wg.Wait()
	close(toks)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	jwks := mustJWKS(t, is)
	kids := map[string]bool{}
	for tok := range toks {
		if h := headerKID(t, tok.Raw); h != tok.KeyID {
			t.Fatalf("header kid %s, Token.KeyID %s", h, tok.KeyID)
		}
		if _, err := verifyLocal(t, jwks, tok.Raw, clk.Now()); err != nil {
			t.Fatalf("token of kid %s: %v", tok.KeyID, err)
		}
		kids[tok.KeyID] = true
	}
	if len(kids) < 2 {
		t.Logf("all tokens signed by one key (the rotations came first or last)")
	}
}

// TestRotateSaveFailure: when the ring cannot be written, the issuer
// neither signs with a key other than the one it names nor diverges from
// the ring on disk once writing works again.
func TestRotateSaveFailure(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	is, cfg := newIssuer(t, clk, nil)
	sub := identity.Subject{ID: "sb-1", Name: "web"}
	tokA := mustIssue(t, is, sub, testAudience, 0)
	// A non-empty directory where the temporary file goes: the write
	// fails, even for root.
	block := filepath.Join(cfg.Dir, "keys.json.tmp")
	if err := os.MkdirAll(filepath.Join(block, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := is.Rotate(); err == nil {
		t.Fatal("Rotate succeeded without writing the ring")
	}
	if tok, err := is.Issue(sub, testAudience, 0); err == nil {
		if h := headerKID(t, tok.Raw); h != tok.KeyID {
			t.Fatalf("after a failed save, the token is signed by %s but Token.KeyID says %s", h, tok.KeyID)
		}
		if !slices.Contains(kidsOf(t, mustJWKS(t, is)), tok.KeyID) {
			t.Fatalf("after a failed save, kid %s signs unpublished", tok.KeyID)
		}
	}
	if err := os.RemoveAll(block); err != nil {
		t.Fatal(err)
	}
	tok := mustIssue(t, is, sub, testAudience, 0)
	if h := headerKID(t, tok.Raw); h != tok.KeyID {
		t.Fatalf("token signed by %s, Token.KeyID %s", h, tok.KeyID)
	}
	if tok.KeyID == tokA.KeyID {
		t.Fatalf("the rotation was lost: %s still signs", tokA.KeyID)
	}
	if _, err := verifyLocal(t, mustJWKS(t, is), tok.Raw, clk.Now()); err != nil {
		t.Fatal(err)
	}
	// Memory and disk agree.
	is2, err := identity.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if tok2 := mustIssue(t, is2, sub, testAudience, 0); tok2.KeyID != tok.KeyID {
		t.Fatalf("the ring on disk signs with %s, the issuer in memory with %s", tok2.KeyID, tok.KeyID)
	}
}

func TestOpenRingRejectsBadFile(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(p384)
	if err != nil {
		t.Fatal(err)
	}
	wrongCurve, _ := json.Marshal([]map[string]any{{"kid": "k", "private": der, "created": clk.Now()}})
	for name, content := range map[string][]byte{
		"not JSON":    []byte("{"),
		"not PKCS#8":  []byte(`[{"kid":"k","private":"AAAA","created":"2030-01-01T00:00:00Z"}]`),
		"P-384 key":   wrongCurve,
		"wrong shape": []byte(`{"keys":[]}`),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "keys.json"), content, 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := identity.New(identity.Config{Dir: dir, Now: clk.Now}); err == nil {
				t.Fatal("New accepted a bad keys.json")
			}
		})
	}
}

// ---------------------------------------------------------------------
// Config and Issue.

func TestNewConfig(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	for _, iss := range []string{"ftp://example.com", "https://", "example.com", "https://example.com?x=1", "https://example.com#f", "https://u:p@example.com", "://x"} {
		if _, err := identity.New(identity.Config{Dir: t.TempDir(), Issuer: iss, Now: clk.Now}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("issuer %q: %v, want an invalid-argument error", iss, err)
		}
	}
	if _, err := identity.New(identity.Config{Dir: t.TempDir(), MaxTTL: 30 * time.Second, Now: clk.Now}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("MaxTTL below MinTTL: %v", err)
	}
	if _, err := identity.New(identity.Config{Dir: t.TempDir(), TrustDomain: "Bad Domain", Now: clk.Now}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad trust domain: %v", err)
	}

	is, err := identity.New(identity.Config{Dir: t.TempDir(), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if is.URL() != identity.DefaultIssuer || is.MaxTTL() != identity.DefaultMaxTTL {
		t.Errorf("defaults: issuer %s, MaxTTL %s", is.URL(), is.MaxTTL())
	}
	if got := is.SubjectOf("x"); got != "spiffe://nook.invalid/sandbox/x" {
		t.Errorf("default subject %s", got)
	}
	is, err = identity.New(identity.Config{Dir: t.TempDir(), Issuer: "https://Nook.Example:8443/base/", Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if is.URL() != "https://Nook.Example:8443/base" {
		t.Errorf("issuer %q: the trailing slash stays", is.URL())
	}
	if got := is.SubjectOf("sb-1"); got != "spiffe://nook.example/sandbox/sb-1" {
		t.Errorf("subject %q: the trust domain is the issuer's host name, lowercase", got)
	}
	is, err = identity.New(identity.Config{Dir: t.TempDir(), Issuer: "https://nook.example", TrustDomain: "corp.example", Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if got := is.SubjectOf("sb-1"); got != "spiffe://corp.example/sandbox/sb-1" {
		t.Errorf("subject %q with an explicit trust domain", got)
	}
}

func TestIssueClaims(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := newClock(t0.Add(700 * time.Millisecond)) // times are whole seconds
	is, _ := newIssuer(t, clk, func(c *identity.Config) { c.Issuer = "https://Nook.Example:8443/base" })
	s := identity.Subject{
		ID: "sb-1", Name: "web", Template: "python", TemplateID: "tb-9", TemplateDigest: "sha256:abc",
		Isolation: "vm", Creator: "ci-token", Labels: map[string]string{"team": "a"},
	}
	tok := mustIssue(t, is, s, testAudience, 0)
	hdrSeg, payloadSeg, _ := segments(t, tok.Raw)
	hdr := decodeSegment(t, hdrSeg)
	if hdr["alg"] != "ES256" || hdr["typ"] != "JWT" || hdr["kid"] != tok.KeyID || tok.KeyID == "" {
		t.Errorf("header %v, Token.KeyID %q", hdr, tok.KeyID)
	}
	p := decodeSegment(t, payloadSeg)
	if aud, ok := p["aud"].(string); !ok || aud != testAudience {
		t.Errorf("aud %#v: want the single audience as a JSON string", p["aud"])
	}
	num := func(k string) int64 {
		n, ok := p[k].(json.Number)
		if !ok {
			t.Fatalf("%s %#v is not a number", k, p[k])
		}
		v, err := n.Int64()
		if err != nil {
			t.Fatalf("%s %s: %v", k, n, err)
		}
		return v
	}
	if num("iat") != t0.Unix() || num("nbf") != t0.Unix() || num("exp") != t0.Add(identity.DefaultTTL).Unix() {
		t.Errorf("iat %d nbf %d exp %d, want %d %d %d", num("iat"), num("nbf"), num("exp"), t0.Unix(), t0.Unix(), t0.Add(identity.DefaultTTL).Unix())
	}
	want := map[string]any{
		"iss": "https://Nook.Example:8443/base", "sub": "spiffe://nook.example/sandbox/sb-1",
		"sandbox_id": "sb-1", "sandbox_name": "web", "template": "python", "template_build": "tb-9",
		"template_digest": "sha256:abc", "isolation": "vm", "creator": "ci-token", "lineage_id": "sb-1",
	}
	for k, v := range want {
		if p[k] != v {
			t.Errorf("%s %#v, want %q", k, p[k], v)
		}
	}
	if labels, _ := p["labels"].(map[string]any); labels["team"] != "a" || len(labels) != 1 {
		t.Errorf("labels %#v", p["labels"])
	}
	if _, ok := p["parent_id"]; ok {
		t.Errorf("parent_id %#v in a token of no fork", p["parent_id"])
	}
	if jti, _ := p["jti"].(string); !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(jti) || jti != tok.Claims.ID {
		t.Errorf("jti %q (Claims.ID %q)", jti, tok.Claims.ID)
	}
	// Token.Claims is what the token says.
	c, err := verifyLocal(t, mustJWKS(t, is), tok.Raw, t0)
	if err != nil {
		t.Fatal(err)
	}
	cj, _ := json.Marshal(c)
	tj, _ := json.Marshal(tok.Claims)
	if !bytes.Equal(cj, tj) {
		t.Errorf("Token.Claims %s, the token says %s", tj, cj)
	}
}

func TestIssueLineage(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	is, _ := newIssuer(t, clk, nil)
	tok := mustIssue(t, is, identity.Subject{ID: "sb-2", Name: "fork", ParentID: "sb-1", LineageID: "sb-0"}, testAudience, 0)
	if tok.Claims.LineageID != "sb-0" || tok.Claims.ParentID != "sb-1" {
		t.Errorf("fork: lineage %q parent %q", tok.Claims.LineageID, tok.Claims.ParentID)
	}
	tok = mustIssue(t, is, identity.Subject{ID: "sb-3", Name: "root"}, testAudience, 0)
	if tok.Claims.LineageID != "sb-3" {
		t.Errorf("no fork: lineage %q, want its own ID", tok.Claims.LineageID)
	}
	_, p, _ := segments(t, tok.Raw)
	if decodeSegment(t, p)["lineage_id"] != "sb-3" {
		t.Errorf("payload lineage_id %v", decodeSegment(t, p)["lineage_id"])
	}
}

func TestIssueExpiryCap(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := newClock(t0)
	is, _ := newIssuer(t, clk, nil)
	sub := func(exp time.Time) identity.Subject { return identity.Subject{ID: "sb-1", Name: "web", ExpiresAt: exp} }

	tok := mustIssue(t, is, sub(t0.Add(3*time.Minute+500*time.Millisecond)), testAudience, 10*time.Minute)
	if want := t0.Add(3 * time.Minute).Unix(); tok.Claims.Expiry != want {
		t.Errorf("exp %d, want the sandbox's expiry %d", tok.Claims.Expiry, want)
	}
	_, p, _ := segments(t, tok.Raw)
	if n := decodeSegment(t, p)["exp"].(json.Number).String(); n != fmt.Sprint(t0.Add(3*time.Minute).Unix()) {
		t.Errorf("payload exp %s", n)
	}
	tok = mustIssue(t, is, sub(t0.Add(2*time.Hour)), testAudience, 10*time.Minute)
	if want := t0.Add(10 * time.Minute).Unix(); tok.Claims.Expiry != want {
		t.Errorf("exp %d, want now+ttl %d", tok.Claims.Expiry, want)
	}
	for _, exp := range []time.Time{t0, t0.Add(-time.Second), t0.Add(-48 * time.Hour)} {
		if _, err := is.Issue(sub(exp), testAudience, 0); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("sandbox expired at %s (now %s): %v, want a precondition error", exp, t0, err)
		}
	}
}

func TestIssueTTL(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clk := newClock(t0)
	is, _ := newIssuer(t, clk, nil)
	s := identity.Subject{ID: "sb-1", Name: "web"}
	for _, ttl := range []time.Duration{identity.MinTTL - time.Second, -time.Minute, identity.DefaultMaxTTL + time.Second, 48 * time.Hour} {
		if _, err := is.Issue(s, testAudience, ttl); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ttl %s: %v, want an invalid-argument error", ttl, err)
		}
	}
	for ttl, want := range map[time.Duration]time.Duration{0: identity.DefaultTTL, identity.MinTTL: identity.MinTTL, identity.DefaultMaxTTL: identity.DefaultMaxTTL, 17 * time.Minute: 17 * time.Minute} {
		tok := mustIssue(t, is, s, testAudience, ttl)
		if got := time.Duration(tok.Claims.Expiry-tok.Claims.IssuedAt) * time.Second; got != want {
			t.Errorf("ttl %s: lifetime %s, want %s", ttl, got, want)
		}
	}
	long, _ := newIssuer(t, clk, func(c *identity.Config) { c.MaxTTL = 3 * time.Hour })
	mustIssue(t, long, s, testAudience, 150*time.Minute)
	if _, err := long.Issue(s, testAudience, 3*time.Hour+time.Second); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("past a configured MaxTTL: %v", err)
	}
}

func TestIssueAudience(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	is, _ := newIssuer(t, clk, nil)
	s := identity.Subject{ID: "sb-1", Name: "web"}
	bad := map[string]string{
		"empty":         "",
		"513 bytes":     strings.Repeat("a", 513),
		"newline":       "sts.example.com\nx",
		"NUL":           "a\x00b",
		"tab":           "a\tb",
		"DEL":           "a\x7fb",
		"C1 control":    "a\u0085b",
		"invalid UTF-8": "a\xffb",
	}
	for name, aud := range bad {
		if _, err := is.Issue(s, aud, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("audience %s: Issue: %v, want an invalid-argument error", name, err)
		}
		if err := identity.CheckAudience(aud); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("audience %s: CheckAudience: %v", name, err)
		}
	}
	for _, aud := range []string{strings.Repeat("a", 512), "https://relying.example/x?y=1", "api://AzureADTokenExchange", "ünïcode"} {
		tok, err := is.Issue(s, aud, 0)
		if err != nil {
			t.Errorf("audience %q: %v", aud, err)
			continue
		}
		if tok.Claims.Audience != aud {
			t.Errorf("aud %q, want %q", tok.Claims.Audience, aud)
		}
	}
}

func TestIssueUniqueJTI(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	is, _ := newIssuer(t, clk, nil)
	s := identity.Subject{ID: "sb-1", Name: "web"}
	seen := map[string]bool{}
	for range 500 {
		tok := mustIssue(t, is, s, testAudience, 0)
		if seen[tok.Claims.ID] {
			t.Fatalf("jti %s issued twice", tok.Claims.ID)
		}
		seen[tok.Claims.ID] = true
	}
}

// ---------------------------------------------------------------------
// Documents.

func TestDiscoveryDocument(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	is, _ := newIssuer(t, clk, func(c *identity.Config) { c.Issuer = "https://example.com/nook/" })
	var d struct {
		Issuer  string   `json:"issuer"`
		JWKSURI string   `json:"jwks_uri"`
		Algs    []string `json:"id_token_signing_alg_values_supported"`
		Claims  []string `json:"claims_supported"`
	}
	if err := json.Unmarshal(is.Discovery(), &d); err != nil {
		t.Fatal(err)
	}
	if d.Issuer != "https://example.com/nook" || d.JWKSURI != "https://example.com/nook/.well-known/jwks.json" {
		t.Errorf("issuer %q jwks_uri %q", d.Issuer, d.JWKSURI)
	}
	if !slices.Equal(d.Algs, []string{"ES256"}) {
		t.Errorf("algs %v", d.Algs)
	}
	for _, c := range []string{"sub", "aud", "sandbox_id", "lineage_id"} {
		if !slices.Contains(d.Claims, c) {
			t.Errorf("claims_supported lacks %s", c)
		}
	}
}

func TestWriteDocuments(t *testing.T) {
	clk := newClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	for _, tc := range []struct{ issuer, under string }{
		{"https://example.com", ""},
		{"https://example.com/", ""},
		{"https://example.com/nook", "nook"},
		{"https://example.com/a/b/", "a/b"},
	} {
		t.Run(tc.issuer, func(t *testing.T) {
			is, _ := newIssuer(t, clk, func(c *identity.Config) { c.Issuer = tc.issuer })
			dir := t.TempDir()
			jwks := mustJWKS(t, is)
			wrote, err := identity.WriteDocuments(dir, is.Discovery(), jwks)
			if err != nil {
				t.Fatal(err)
			}
			base := filepath.Join(dir, filepath.FromSlash(tc.under))
			want := []string{
				filepath.Join(base, ".well-known", "openid-configuration"),
				filepath.Join(base, ".well-known", "jwks.json"),
			}
			if !slices.Equal(wrote, want) {
				t.Fatalf("wrote %v, want %v", wrote, want)
			}
			for i, content := range [][]byte{is.Discovery(), jwks} {
				b, err := os.ReadFile(want[i])
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(b, content) {
					t.Errorf("%s: %s, want %s", want[i], b, content)
				}
				st, _ := os.Stat(want[i])
				if st.Mode().Perm() != 0o644 {
					t.Errorf("%s: mode %o, want 644", want[i], st.Mode().Perm())
				}
			}
		})
	}
}

func TestWriteDocumentsBadIssuer(t *testing.T) {
	for _, doc := range []string{
		`{"issuer":"ftp://example.com"}`,
		`{"issuer":"file:///etc"}`,
		`{"issuer":"example.com"}`,
		`{"issuer":""}`,
		`{}`,
		`{"issuer":"https://example.com?x"}`,
		`not json`,
	} {
		dir := t.TempDir()
		if _, err := identity.WriteDocuments(dir, []byte(doc), []byte(`{"keys":[]}`)); err == nil {
			t.Errorf("discovery %s: written", doc)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("discovery %s: left %d entries", doc, len(ents))
		}
	}
}

// TestWriteDocumentsStaysInDir: an issuer path with ".." segments (or
// encoded ones) writes under dir all the same.
func TestWriteDocumentsStaysInDir(t *testing.T) {
	for _, iss := range []string{
		"https://example.com/..",
		"https://example.com/../../../escape",
		"https://example.com/a/../../escape",
		"https://example.com/%2e%2e/%2e%2e/escape",
		"https://example.com/a%2f..%2f..%2fescape",
		"https://example.com/..%2f..%2fescape",
	} {
		t.Run(iss, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "a", "b", "site")
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			disc, _ := json.Marshal(map[string]string{"issuer": iss})
			wrote, err := identity.WriteDocuments(dir, disc, []byte(`{"keys":[]}`))
			if err != nil {
				t.Fatalf("%v", err)
			}
			for _, p := range wrote {
				rel, err := filepath.Rel(dir, p)
				if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) || filepath.IsAbs(rel) {
					t.Errorf("wrote %s outside %s", p, dir)
				}
			}
			// Nothing anywhere but under dir.
			filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err != nil {
					return err
				}
				if !d.IsDir() && !strings.HasPrefix(p, dir+string(filepath.Separator)) {
					t.Errorf("file %s outside %s", p, dir)
				}
				return nil
			})
		})
	}
}

// TestWriteDocumentsServeStatically: the written tree, served as static
// files at the issuer URL, is what go-oidc needs.
func TestWriteDocumentsServeStatically(t *testing.T) {
	dir := t.TempDir()
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	at := time.Now().Truncate(time.Second)
	clk := newClock(at)
	is, err := identity.New(identity.Config{Dir: filepath.Join(t.TempDir(), "keys"), Issuer: srv.URL + "/nook", Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := identity.WriteDocuments(dir, is.Discovery(), mustJWKS(t, is)); err != nil {
		t.Fatal(err)
	}
	tok := mustIssue(t, is, identity.Subject{ID: "sb-1", Name: "web"}, testAudience, 0)
	ctx := t.Context()
	got := oidcVerify(ctx, oidcVerifier(t, ctx, srv.URL+"/nook", at))(t, []tokenCase{{name: "static", token: tok.Raw}})
	checkAccepted(t, got, "static", "spiffe://127.0.0.1/sandbox/sb-1", "sb-1")
}
