package store

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// InsertSnapshot records a snapshot and makes it its sandbox's head (the
// parent of the next one), in one transaction.
func (s *Store) InsertSnapshot(ctx context.Context, sn *core.Snapshot) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `INSERT INTO snapshots (id, sandbox_id, name, parent, created_at, size_bytes, memory) VALUES (?,?,?,?,?,?,?)`,
		sn.ID, sn.SandboxID, sn.Name, sn.Parent, sn.CreatedAt.UnixNano(), sn.SizeBytes, sn.Memory)
	if err != nil {
		if strings.Contains(err.Error(), "UNIQUE") {
			return errdefs.Exists("the sandbox already has a snapshot named %s: choose another --name", sn.Name)
		}
		return err
	}
	if err := setHead(ctx, tx, sn.SandboxID, sn.ID); err != nil {
		return err
	}
	return tx.Commit()
}

func setHead(ctx context.Context, tx *sql.Tx, sandboxID, snapID string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO snapshot_heads (sandbox_id, snapshot_id) VALUES (?,?)
		ON CONFLICT(sandbox_id) DO UPDATE SET snapshot_id = excluded.snapshot_id`, sandboxID, snapID)
	return err
}

// SetSnapshotHead records the snapshot a sandbox now descends from (after
// a rollback, or for a fork).
func (s *Store) SetSnapshotHead(ctx context.Context, sandboxID, snapID string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := setHead(ctx, tx, sandboxID, snapID); err != nil {
		return err
	}
	return tx.Commit()
}

// SnapshotHead returns the snapshot a sandbox descends from ("" if none).
func (s *Store) SnapshotHead(ctx context.Context, sandboxID string) (string, error) {
	var id string
	err := s.db.QueryRowContext(ctx, `SELECT snapshot_id FROM snapshot_heads WHERE sandbox_id = ?`, sandboxID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return id, err
}

const snapshotCols = `id, sandbox_id, name, parent, created_at, size_bytes, memory`

func scanSnapshot(sc interface{ Scan(...any) error }) (*core.Snapshot, error) {
	var sn core.Snapshot
	var created int64
	if err := sc.Scan(&sn.ID, &sn.SandboxID, &sn.Name, &sn.Parent, &created, &sn.SizeBytes, &sn.Memory); err != nil {
		return nil, err
	}
	sn.CreatedAt = time.Unix(0, created)
	return &sn, nil
}

// ListSnapshots returns a sandbox's snapshots, oldest first; with
// sandboxID empty, every snapshot.
func (s *Store) ListSnapshots(ctx context.Context, sandboxID string) ([]*core.Snapshot, error) {
	q := `SELECT ` + snapshotCols + ` FROM snapshots`
	var args []any
	if sandboxID != "" {
		q += ` WHERE sandbox_id = ?`
		args = append(args, sandboxID)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created_at, id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*core.Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// GetSnapshot finds a snapshot by ID, or by name among a sandbox's.
func (s *Store) GetSnapshot(ctx context.Context, sandboxID, ref string) (*core.Snapshot, error) {
	row := s.db.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id = ? OR (sandbox_id = ? AND name = ?)
		ORDER BY id = ? DESC LIMIT 1`, ref, sandboxID, ref, ref)
	sn, err := scanSnapshot(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("no snapshot %q: `nook snapshots NAME` lists them", ref)
	}
	return sn, err
}

// DeleteSnapshot removes a snapshot's record; a sandbox whose head it
// was, and its child snapshots, then descend from its parent.
func (s *Store) DeleteSnapshot(ctx context.Context, sn *core.Snapshot) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, sn.ID); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE snapshot_heads SET snapshot_id = ? WHERE snapshot_id = ?`, sn.Parent, sn.ID); err != nil {
		return err
	}
	// Its children hang on its parent now, so the tree stays a tree.
	if _, err := tx.ExecContext(ctx, `UPDATE snapshots SET parent = ? WHERE parent = ?`, sn.Parent, sn.ID); err != nil {
		return err
	}
	return tx.Commit()
}
