package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Quotas are a token's limits (nook token create --max-*); a zero field
// is no limit.
type Quotas struct {
	MaxSandboxes int           `json:"max_sandboxes,omitempty"`
	MaxCPUs      float64       `json:"max_cpus,omitempty"`
	MaxMemory    int64         `json:"max_memory,omitempty"` // bytes
	MaxDisk      int64         `json:"max_disk,omitempty"`   // bytes
	MaxSnapshots int           `json:"max_snapshots,omitempty"`
	MaxTTL       time.Duration `json:"max_ttl,omitempty"`
}

// IsZero says q limits nothing.
func (q Quotas) IsZero() bool { return q == Quotas{} }

// Usage is what counts against a token: the sandboxes recorded as its
// (any state), their sizes and their snapshots.
type Usage struct {
	Sandboxes   int
	CPUs        float64
	MemoryBytes int64
	DiskBytes   int64
	Snapshots   int
}

// SetTokenQuotas records a token's quotas (none: the row goes).
func (s *Store) SetTokenQuotas(ctx context.Context, tokenID string, q Quotas) error {
	if q.IsZero() {
		_, err := s.db.ExecContext(ctx, `DELETE FROM token_quotas WHERE token_id = ?`, tokenID)
		return err
	}
	b, err := json.Marshal(q)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO token_quotas (token_id, quotas) VALUES (?, ?)
		ON CONFLICT(token_id) DO UPDATE SET quotas = excluded.quotas`, tokenID, string(b))
	return err
}

// TokenQuotas returns a token's quotas (zero: none).
func (s *Store) TokenQuotas(ctx context.Context, tokenID string) (Quotas, error) {
	var q Quotas
	var js string
	err := s.db.QueryRowContext(ctx, `SELECT quotas FROM token_quotas WHERE token_id = ?`, tokenID).Scan(&js)
	if errors.Is(err, sql.ErrNoRows) {
		return q, nil
	}
	if err != nil {
		return q, err
	}
	if err := json.Unmarshal([]byte(js), &q); err != nil {
		return q, fmt.Errorf("token %s: its quotas: %w", tokenID, err)
	}
	return q, nil
}

// AllTokenQuotas returns every token's quotas, by token ID.
func (s *Store) AllTokenQuotas(ctx context.Context) (map[string]Quotas, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT token_id, quotas FROM token_quotas`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]Quotas{}
	for rows.Next() {
		var id, js string
		if err := rows.Scan(&id, &js); err != nil {
			return nil, err
		}
		var q Quotas
		if err := json.Unmarshal([]byte(js), &q); err != nil {
			return nil, fmt.Errorf("token %s: its quotas: %w", id, err)
		}
		out[id] = q
	}
	return out, rows.Err()
}

// SetSandboxOwner records the token a sandbox counts against.
func (s *Store) SetSandboxOwner(ctx context.Context, sandboxID, tokenID string) error {
	_, err := s.db.ExecContext(ctx, `INSERT OR REPLACE INTO sandbox_owners (sandbox_id, token_id) VALUES (?, ?)`, sandboxID, tokenID)
	return err
}

// SandboxOwner is the ID of the token a sandbox counts against ("": none).
func (s *Store) SandboxOwner(ctx context.Context, sandboxID string) (string, error) {
	var id string
	err := s.db.QueryRowContext(ctx, `SELECT token_id FROM sandbox_owners WHERE sandbox_id = ?`, sandboxID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return id, err
}

const usageQuery = `SELECT o.token_id, count(*), coalesce(sum(s.cpus), 0), coalesce(sum(s.memory_bytes), 0), coalesce(sum(s.disk_bytes), 0)
	FROM sandbox_owners o JOIN sandboxes s ON s.id = o.sandbox_id`

const snapshotUsageQuery = `SELECT o.token_id, count(*) FROM sandbox_owners o JOIN snapshots sn ON sn.sandbox_id = o.sandbox_id`

// TokenUsage is what counts against one token now.
func (s *Store) TokenUsage(ctx context.Context, tokenID string) (Usage, error) {
	all, err := s.usage(ctx, ` WHERE o.token_id = ?`, tokenID)
	return all[tokenID], err
}

// AllTokenUsage is what counts against each token, by token ID.
func (s *Store) AllTokenUsage(ctx context.Context) (map[string]Usage, error) {
	return s.usage(ctx, "")
}

func (s *Store) usage(ctx context.Context, where string, args ...any) (map[string]Usage, error) {
	out := map[string]Usage{}
	rows, err := s.db.QueryContext(ctx, usageQuery+where+` GROUP BY o.token_id`, args...)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		var u Usage
		if err := rows.Scan(&id, &u.Sandboxes, &u.CPUs, &u.MemoryBytes, &u.DiskBytes); err != nil {
			rows.Close()
			return nil, err
		}
		out[id] = u
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = s.db.QueryContext(ctx, snapshotUsageQuery+where+` GROUP BY o.token_id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		u := out[id]
		u.Snapshots = n
		out[id] = u
	}
	return out, rows.Err()
}

// IdempotencyRecord is a use of an idempotency key.
type IdempotencyRecord struct {
	Owner, Key, Route string
	BodyHash          []byte
	// Boot names the daemon run that took the key: a record of another
	// run that has no answer was cut short by the daemon's death.
	Boot string
	// Links are the IDs of what the request made, recorded before each is.
	Links []string
	// Status and Response are the answer (Status 0: none yet).
	Status    int
	Response  []byte
	CreatedAt time.Time
}

// ClaimIdempotencyKey records rec as the key's first use, unless the key
// has a record not older than since: then that record is returned and
// claimed is false. An older record is replaced.
func (s *Store) ClaimIdempotencyKey(ctx context.Context, rec IdempotencyRecord, since time.Time) (_ *IdempotencyRecord, claimed bool, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, false, err
	}
	defer tx.Rollback()
	var old IdempotencyRecord
	var links string
	var created int64
	err = tx.QueryRowContext(ctx, `SELECT owner, key, route, body_hash, boot, links, status, response, created_at FROM idempotency_keys WHERE owner = ? AND key = ?`,
		rec.Owner, rec.Key).Scan(&old.Owner, &old.Key, &old.Route, &old.BodyHash, &old.Boot, &links, &old.Status, &old.Response, &created)
	switch {
	case err == nil && created >= since.UnixNano():
		old.CreatedAt = time.Unix(0, created)
		if err := json.Unmarshal([]byte(links), &old.Links); err != nil {
			return nil, false, fmt.Errorf("idempotency key: its links: %w", err)
		}
		return &old, false, nil
	case err != nil && !errors.Is(err, sql.ErrNoRows):
		return nil, false, err
	}
	_, err = tx.ExecContext(ctx, `INSERT OR REPLACE INTO idempotency_keys (owner, key, route, body_hash, boot, links, status, response, created_at) VALUES (?,?,?,?,?,'[]',0,NULL,?)`,
		rec.Owner, rec.Key, rec.Route, rec.BodyHash, rec.Boot, rec.CreatedAt.UnixNano())
	if err != nil {
		return nil, false, err
	}
	return &rec, true, tx.Commit()
}

// TakeOverIdempotencyKey gives an unanswered key of an earlier run to
// boot, forgetting its links (none of which exists any more).
func (s *Store) TakeOverIdempotencyKey(ctx context.Context, owner, key, boot string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE idempotency_keys SET boot = ?, links = '[]' WHERE owner = ? AND key = ? AND status = 0`, boot, owner, key)
	return err
}

// LinkIdempotencyKey adds id to what a key's request made.
func (s *Store) LinkIdempotencyKey(ctx context.Context, owner, key, id string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE idempotency_keys SET links = json_insert(links, '$[#]', ?) WHERE owner = ? AND key = ?`, id, owner, key)
	return err
}

// AnswerIdempotencyKey records a key's answer.
func (s *Store) AnswerIdempotencyKey(ctx context.Context, owner, key string, status int, response []byte) error {
	_, err := s.db.ExecContext(ctx, `UPDATE idempotency_keys SET status = ?, response = ? WHERE owner = ? AND key = ?`, status, response, owner, key)
	return err
}

// ReleaseIdempotencyKey forgets a key whose request failed: a retry does
// the work again.
func (s *Store) ReleaseIdempotencyKey(ctx context.Context, owner, key string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE owner = ? AND key = ?`, owner, key)
	return err
}

// PruneIdempotencyKeys deletes the records made before t; it returns how
// many.
func (s *Store) PruneIdempotencyKeys(ctx context.Context, t time.Time) (int64, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE created_at < ?`, t.UnixNano())
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}
