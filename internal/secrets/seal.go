package secrets

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Box seals values at rest with AES-256-GCM under a key that lives in a
// file only root reads (DATA/secrets/key); each value is bound to what
// it is (its additional data), so a sealed value cannot be moved to
// another secret's row.
type Box struct {
	aead cipher.AEAD
}

// OpenBox opens the key in dir, making dir (0700) and the key (0600,
// from its creation) the first time.
func OpenBox(dir string) (*Box, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("secrets: %w", err)
	}
	path := filepath.Join(dir, "key")
	key, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		key, err = newKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("secrets: key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("secrets: key %s is %d bytes, not 32", path, len(key))
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		return nil, err
	}
	return &Box{aead: aead}, nil
}

// newKey writes a new random key to path, owner-only from creation,
// through a temporary file renamed into place (a crash leaves no short
// key behind).
func newKey(path string) ([]byte, error) {
	key := make([]byte, 32)
	rand.Read(key)
	tmp := path + ".tmp"
	os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	_, err = f.Write(key)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return nil, err
	}
	return key, nil
}

// Seal encrypts plain, bound to what (e.g. "secret:NAME").
func (b *Box) Seal(what string, plain []byte) []byte {
	nonce := make([]byte, b.aead.NonceSize())
	rand.Read(nonce)
	return b.aead.Seal(nonce, nonce, plain, []byte(what))
}

// Open decrypts what Seal sealed for the same what.
func (b *Box) Open(what string, sealed []byte) ([]byte, error) {
	n := b.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("secrets: sealed value too short")
	}
	plain, err := b.aead.Open(nil, sealed[:n], sealed[n:], []byte(what))
	if err != nil {
		return nil, fmt.Errorf("secrets: cannot open %s (another key, or the value was changed): %w", what, err)
	}
	return plain, nil
}
