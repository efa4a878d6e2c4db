package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/nookhq/nook/internal/fsutil"
)

// keysFile is the key ring's file in the keys directory.
const keysFile = "keys.json"

// key is one signing key of the ring. A key is published from its
// creation (as the next key), signs from Active until Retired, and stays
// published until every token it signed has expired (Retired + the
// longest token lifetime).
type key struct {
	ID      string    `json:"kid"`
	Private []byte    `json:"private"` // PKCS#8 DER, P-256
	Created time.Time `json:"created"`
	Active  time.Time `json:"active,omitzero"`  // zero: the next key
	Retired time.Time `json:"retired,omitzero"` // zero: not retired

	priv *ecdsa.PrivateKey
}

// ring is the issuer's keys: at most one current (signing) key, one next
// key (published before it signs, so relying parties that cache the JWKS
// know it when it starts), and the retired keys whose tokens may still be
// valid. It is kept in dir/keys.json, owner-only, replaced atomically.
type ring struct {
	dir    string
	every  time.Duration // rotation period
	maxTTL time.Duration // the longest token lifetime
	now    func() time.Time

	mu   sync.Mutex
	keys []*key
	// signer of the current key, made once per rotation.
	signer jose.Signer
	jwks   []byte // the published set, remade on every change
	// dirty: keys changed but were not saved; the save is retried, and
	// nothing signs with the old signer meanwhile.
	dirty bool
}

// openRing loads the key ring from dir, making the directory and the first
// keys when there are none, and rotates when the current key is due.
func openRing(dir string, every, maxTTL time.Duration, now func() time.Time) (*ring, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("identity keys: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("identity keys: %w", err)
	}
	r := &ring{dir: dir, every: every, maxTTL: maxTTL, now: now}
	b, err := os.ReadFile(filepath.Join(dir, keysFile))
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("identity keys: %w", err)
	default:
		if err := json.Unmarshal(b, &r.keys); err != nil {
			return nil, fmt.Errorf("identity keys: %s: %w", filepath.Join(dir, keysFile), err)
		}
		for _, k := range r.keys {
			p, err := x509.ParsePKCS8PrivateKey(k.Private)
			if err != nil {
				return nil, fmt.Errorf("identity keys: key %s: %w", k.ID, err)
			}
			ec, ok := p.(*ecdsa.PrivateKey)
			if !ok || ec.Curve != elliptic.P256() {
				return nil, fmt.Errorf("identity keys: key %s is not a P-256 key", k.ID)
			}
			k.priv = ec
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.maintain(false); err != nil {
		return nil, err
	}
	return r, nil
}

// current returns the signing key's signer and ID, rotating first when it
// is due.
func (r *ring) current() (jose.Signer, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.maintain(false); err != nil {
		return nil, "", err
	}
	return r.signer, r.active().ID, nil
}

// rotate retires the current key now: the next key signs from now on, and
// a new next key is made.
func (r *ring) rotate() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maintain(true)
}

// published returns the JWKS document.
func (r *ring) published() ([]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.maintain(false); err != nil {
		return nil, err
	}
	return r.jwks, nil
}

func (r *ring) active() *key {
	for _, k := range r.keys {
		if !k.Active.IsZero() && k.Retired.IsZero() {
			return k
		}
	}
	return nil
}

func (r *ring) next() *key {
	for _, k := range r.keys {
		if k.Active.IsZero() {
			return k
		}
	}
	return nil
}

// maintain brings the ring in line with the clock (force: rotate now):
// a current and a next key, the current one no older than the rotation
// period, retired keys kept only while their tokens may be valid. It
// writes the ring when it changed it. The caller holds mu.
func (r *ring) maintain(force bool) error {
	now := r.now()
	changed := r.dirty
	if r.next() == nil {
		k, err := newKey(now)
		if err != nil {
			return err
		}
		r.keys = append(r.keys, k)
		changed = true
	}
	cur := r.active()
	if cur == nil || force || !now.Before(cur.Active.Add(r.every)) {
		if cur != nil {
			cur.Retired = now
		}
		nx := r.next()
		nx.Active = now
		k, err := newKey(now)
		if err != nil {
			return err
		}
		r.keys = append(r.keys, k)
		changed = true
	}
	kept := r.keys[:0]
	for _, k := range r.keys {
		if !k.Retired.IsZero() && !now.Before(k.Retired.Add(r.maxTTL)) {
			changed = true // every token it signed has expired
			continue
		}
		kept = append(kept, k)
	}
	r.keys = kept
	if !changed && r.signer != nil {
		return nil
	}
	if changed {
		if err := r.save(); err != nil {
			r.dirty = true
			return err
		}
		r.dirty = false
	}
	cur = r.active()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: cur.priv, KeyID: cur.ID, Algorithm: string(jose.ES256)}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		return fmt.Errorf("identity keys: signer: %w", err)
	}
	set := jose.JSONWebKeySet{}
	for _, k := range r.keys {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.priv.Public(), KeyID: k.ID, Algorithm: string(jose.ES256), Use: "sig"})
	}
	jwks, err := json.Marshal(set)
	if err != nil {
		return fmt.Errorf("identity keys: jwks: %w", err)
	}
	r.signer, r.jwks = s, jwks
	return nil
}

// save writes the ring: a temporary file, fsynced, renamed over the old
// one, and the directory fsynced, so a crash leaves the old ring or the
// new one.
func (r *ring) save() error {
	b, err := json.MarshalIndent(r.keys, "", "  ")
	if err != nil {
		return fmt.Errorf("identity keys: %w", err)
	}
	// The directory is owner-only, and the file too (fsutil makes it 0600).
	return fsutil.WriteFileAtomic(filepath.Join(r.dir, keysFile), b)
}

// newKey makes a P-256 key whose ID is its RFC 7638 thumbprint.
func newKey(now time.Time) (*key, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity keys: generate: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("identity keys: %w", err)
	}
	tp, err := (&jose.JSONWebKey{Key: priv.Public()}).Thumbprint(crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("identity keys: thumbprint: %w", err)
	}
	return &key{ID: base64.RawURLEncoding.EncodeToString(tp[:16]), Private: der, Created: now, priv: priv}, nil
}
