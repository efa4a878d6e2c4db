package store

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/nookhq/nook/internal/errdefs"
)

// Secret is a secret's record: its value sealed (internal/secrets.Box),
// and the name of the token that set it (its owner).
type Secret struct {
	Name      string
	ID        string // new each time the name is made
	Owner     string
	Sealed    []byte
	CreatedAt time.Time
	UpdatedAt time.Time
}

// PutSecret records a secret's value: a new secret (its ID, owner and
// creation from sec), or a new value of one that anyOwner or sec.Owner
// may replace (it keeps its ID and owner). False: the secret exists and
// belongs to another owner; nothing changed. One statement: no other
// owner's secret can appear between a check and the write.
func (s *Store) PutSecret(ctx context.Context, sec Secret, anyOwner bool) (bool, error) {
	res, err := s.db.ExecContext(ctx, `INSERT INTO secrets (name, id, owner, sealed, created_at, updated_at) VALUES (?,?,?,?,?,?)
		ON CONFLICT (name) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at
		WHERE ? OR secrets.owner = excluded.owner`,
		sec.Name, sec.ID, sec.Owner, sec.Sealed, sec.CreatedAt.UnixNano(), sec.UpdatedAt.UnixNano(), anyOwner)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// GetSecret returns a secret, or an ErrNotFound.
func (s *Store) GetSecret(ctx context.Context, name string) (Secret, error) {
	var sec Secret
	var created, updated int64
	err := s.db.QueryRowContext(ctx, `SELECT name, id, owner, sealed, created_at, updated_at FROM secrets WHERE name = ?`, name).
		Scan(&sec.Name, &sec.ID, &sec.Owner, &sec.Sealed, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return Secret{}, errdefs.NotFound("no secret named %q: see `nook secret ls`", name)
	}
	sec.CreatedAt, sec.UpdatedAt = time.Unix(0, created), time.Unix(0, updated)
	return sec, err
}

// ListSecrets returns every secret, by name, without its value.
func (s *Store) ListSecrets(ctx context.Context) ([]Secret, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, owner, created_at, updated_at FROM secrets ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Secret
	for rows.Next() {
		var sec Secret
		var created, updated int64
		if err := rows.Scan(&sec.Name, &sec.Owner, &created, &updated); err != nil {
			return nil, err
		}
		sec.CreatedAt, sec.UpdatedAt = time.Unix(0, created), time.Unix(0, updated)
		out = append(out, sec)
	}
	return out, rows.Err()
}

// DeleteSecret removes a secret that owner (or, with anyOwner, anyone)
// may remove: ErrNotFound when there is none, ErrPermissionDenied when it
// is another owner's.
func (s *Store) DeleteSecret(ctx context.Context, name, owner string, anyOwner bool) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE name = ? AND (? OR owner = ?)`, name, anyOwner, owner)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	if _, err := s.GetSecret(ctx, name); err != nil {
		return err
	}
	return errdefs.Denied("secret %s belongs to another token: only it (or the host's socket) may remove it", name)
}

// SandboxSecrets is what a sandbox holds of secrets: its bindings with
// their placeholders (JSON) and its CA (the key sealed).
type SandboxSecrets struct {
	Bound  []byte
	CACert []byte
	CAKey  []byte
}

// PutSandboxSecrets records a sandbox's bindings and CA.
func (s *Store) PutSandboxSecrets(ctx context.Context, id string, ss SandboxSecrets) error {
	_, err := s.db.ExecContext(ctx, `INSERT OR REPLACE INTO sandbox_secrets (sandbox_id, bound, ca_cert, ca_key)
		SELECT ?,?,?,? WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)`, id, string(ss.Bound), ss.CACert, ss.CAKey, id)
	return err
}

// GetSandboxSecrets returns a sandbox's bindings and CA (ok false: it
// has none).
func (s *Store) GetSandboxSecrets(ctx context.Context, id string) (SandboxSecrets, bool, error) {
	var ss SandboxSecrets
	var bound string
	err := s.db.QueryRowContext(ctx, `SELECT bound, ca_cert, ca_key FROM sandbox_secrets WHERE sandbox_id = ?`, id).Scan(&bound, &ss.CACert, &ss.CAKey)
	if errors.Is(err, sql.ErrNoRows) {
		return SandboxSecrets{}, false, nil
	}
	ss.Bound = []byte(bound)
	return ss, err == nil, err
}
