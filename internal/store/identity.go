package store

import (
	"context"
	"time"
)

// IdentityLogEntry is one identity token issued to a sandbox.
type IdentityLogEntry struct {
	Seq       int64
	SandboxID string
	Time      time.Time
	Audience  string
	JTI       string
	ExpiresAt time.Time
	// Via is who asked: "metadata" (the sandbox's endpoint) or "api:TOKEN"
	// (an operator, by token name).
	Via string
}

// AppendIdentityLog records issued tokens in one transaction and keeps
// each sandbox's last keep entries.
func (s *Store) AppendIdentityLog(ctx context.Context, es []IdentityLogEntry, keep int) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	trim := map[string]bool{}
	for _, e := range es {
		// Only for a sandbox that still exists: an entry written after its
		// removal would outlive it (the delete trigger ran already).
		if _, err := tx.ExecContext(ctx, `INSERT INTO identity_log (sandbox_id, time, audience, jti, expires_at, via)
			SELECT ?,?,?,?,?,? WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)`,
			e.SandboxID, e.Time.UnixNano(), e.Audience, e.JTI, e.ExpiresAt.UnixNano(), e.Via, e.SandboxID); err != nil {
			return err
		}
		trim[e.SandboxID] = true
	}
	// Each sandbox of the batch keeps its newest keep entries (one
	// indexed query per sandbox and batch).
	for id := range trim {
		if _, err := tx.ExecContext(ctx, `DELETE FROM identity_log WHERE sandbox_id = ? AND seq <= (
			SELECT seq FROM identity_log WHERE sandbox_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`, id, id, keep); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// IdentityLog returns a sandbox's last limit issued tokens, oldest first.
func (s *Store) IdentityLog(ctx context.Context, sandboxID string, limit int) ([]IdentityLogEntry, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT seq, time, audience, jti, expires_at, via FROM (
		SELECT * FROM identity_log WHERE sandbox_id = ? ORDER BY seq DESC LIMIT ?) ORDER BY seq`, sandboxID, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []IdentityLogEntry
	for rows.Next() {
		e := IdentityLogEntry{SandboxID: sandboxID}
		var t, exp int64
		if err := rows.Scan(&e.Seq, &t, &e.Audience, &e.JTI, &exp, &e.Via); err != nil {
			return nil, err
		}
		e.Time, e.ExpiresAt = time.Unix(0, t), time.Unix(0, exp)
		out = append(out, e)
	}
	return out, rows.Err()
}
