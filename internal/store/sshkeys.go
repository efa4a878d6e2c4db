package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
)

// SSHKey is a registered SSH public key: a sandbox's (SandboxID), or a
// token's for every sandbox the token may reach (SandboxID "", Owner the
// token's ID, "" for the host).
type SSHKey struct {
	ID          string
	Fingerprint string // SHA256:...
	PublicKey   string // authorized_keys form, without options or comment
	Comment     string
	SandboxID   string
	Owner       string
	CreatedAt   time.Time
}

const sshKeyColumns = `id, fingerprint, public_key, comment, sandbox_id, owner, created_at`

// InsertSSHKey records a key.
func (s *Store) InsertSSHKey(ctx context.Context, k SSHKey) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO ssh_keys (`+sshKeyColumns+`) VALUES (?,?,?,?,?,?,?)`,
		k.ID, k.Fingerprint, k.PublicKey, k.Comment, k.SandboxID, k.Owner, k.CreatedAt.UnixNano())
	return err
}

// SSHKeysByFingerprint returns the keys with this fingerprint.
func (s *Store) SSHKeysByFingerprint(ctx context.Context, fp string) ([]SSHKey, error) {
	return s.sshKeys(ctx, `WHERE fingerprint = ?`, fp)
}

// SSHKeysOf returns a sandbox's keys (sandboxID "": the token-wide keys).
func (s *Store) SSHKeysOf(ctx context.Context, sandboxID string) ([]SSHKey, error) {
	return s.sshKeys(ctx, `WHERE sandbox_id = ? ORDER BY created_at`, sandboxID)
}

func (s *Store) sshKeys(ctx context.Context, where string, args ...any) ([]SSHKey, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sshKeyColumns+` FROM ssh_keys `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SSHKey
	for rows.Next() {
		var k SSHKey
		var created int64
		if err := rows.Scan(&k.ID, &k.Fingerprint, &k.PublicKey, &k.Comment, &k.SandboxID, &k.Owner, &created); err != nil {
			return nil, err
		}
		k.CreatedAt = time.Unix(0, created)
		out = append(out, k)
	}
	return out, rows.Err()
}

// DeleteSSHKey removes a key of a sandbox (sandboxID "": a token-wide
// key), only if owner may: anyOwner, or the key's owner is owner.
func (s *Store) DeleteSSHKey(ctx context.Context, id, sandboxID, owner string, anyOwner bool) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM ssh_keys WHERE id = ? AND sandbox_id = ? AND (? OR owner = ?)`, id, sandboxID, anyOwner, owner)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("no SSH key %q here (or it is another token's): see `nook ssh-key ls`", id)
	}
	return nil
}

// TokenByID finds a token by its ID.
func (s *Store) TokenByID(ctx context.Context, id string) (*Token, error) {
	t, err := scanToken(s.db.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("token not found")
	}
	return t, err
}
