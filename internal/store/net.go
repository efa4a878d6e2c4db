package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Net is a sandbox's network as the daemon persists it: the subnet the
// address pool gave it, its policy (the JSON of policy.Policy, opaque
// here) and its exposed ports (sandbox port -> host port).
type Net struct {
	Subnet  string
	Policy  []byte
	Exposed map[uint16]uint16
	// Previews are the exposed ports' preview URL settings.
	Previews map[uint16]Preview
}

// Preview is an exposed port's preview URL: public (no token needed),
// and the nonce its tokens are signed with, new for each exposure, so
// that unexposing a port revokes the tokens minted for it.
type Preview struct {
	Public bool   `json:"public,omitempty"`
	Nonce  string `json:"nonce"`
}

// PutNet records (or replaces) a sandbox's network. The record goes with
// the sandbox's: deleting the sandbox deletes it, and a sandbox with no
// record (removed) gets none.
func (s *Store) PutNet(ctx context.Context, id string, n Net) error {
	if n.Exposed == nil {
		n.Exposed = map[uint16]uint16{}
	}
	exp, err := json.Marshal(n.Exposed)
	if err != nil {
		return err
	}
	if n.Previews == nil {
		n.Previews = map[uint16]Preview{}
	}
	pub, err := json.Marshal(n.Previews)
	if err != nil {
		return err
	}
	// Only for a sandbox whose record exists: its removal takes the row
	// with it (a trigger), and one written after that removal would be
	// an orphan the in-memory subnets no longer count. Committed with
	// the writes of sandboxes' rows queued beside it (one fsync for all:
	// sandboxcache.go); the subnets in memory change after the commit,
	// in the order the writes were applied.
	var written bool
	err = s.commit(ctx, &pendingWrite{
		write: func(ctx context.Context, ex execer) error {
			res, err := ex.ExecContext(ctx, `INSERT INTO sandbox_net (id, subnet, policy, exposed, previews)
		SELECT ?,?,?,?,? WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)
		ON CONFLICT(id) DO UPDATE SET subnet = excluded.subnet, policy = excluded.policy, exposed = excluded.exposed, previews = excluded.previews`,
				id, n.Subnet, string(n.Policy), string(exp), string(pub), id)
			if err != nil {
				return err
			}
			k, _ := res.RowsAffected()
			written = k > 0
			return nil
		},
		then: func() {
			s.netMu.Lock()
			if written && s.subnets != nil {
				s.subnets[id] = n.Subnet
			}
			s.netMu.Unlock()
		},
	})
	if err != nil {
		// Whether a failed commit reached the disk is not known: the
		// subnets are read from the table again.
		s.netMu.Lock()
		s.subnets = nil
		s.netMu.Unlock()
	}
	return err
}

// NetSubnets calls fn with each recorded sandbox network's sandbox ID and
// subnet, from memory after the first call (the store keeps them beside
// the table), so that it costs no query of every row.
func (s *Store) NetSubnets(ctx context.Context, fn func(id, subnet string)) error {
	s.netMu.Lock()
	defer s.netMu.Unlock()
	if s.subnets == nil {
		rows, err := s.db.QueryContext(ctx, `SELECT id, subnet FROM sandbox_net`)
		if err != nil {
			return err
		}
		defer rows.Close()
		subnets := map[string]string{}
		for rows.Next() {
			var id, subnet string
			if err := rows.Scan(&id, &subnet); err != nil {
				return err
			}
			subnets[id] = subnet
		}
		if err := rows.Err(); err != nil {
			return err
		}
		s.subnets = subnets
	}
	for id, subnet := range s.subnets {
		fn(id, subnet)
	}
	return nil
}

// ListNets returns every recorded sandbox network by sandbox ID.
func (s *Store) ListNets(ctx context.Context) (map[string]Net, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, subnet, policy, exposed, previews FROM sandbox_net`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]Net{}
	for rows.Next() {
		var id, subnet, pol, exp, pub string
		if err := rows.Scan(&id, &subnet, &pol, &exp, &pub); err != nil {
			return nil, err
		}
		n, err := readNet(id, subnet, pol, exp, pub)
		if err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

// GetNet returns a sandbox's recorded network, if it has one.
func (s *Store) GetNet(ctx context.Context, id string) (Net, bool, error) {
	var subnet, pol, exp, pub string
	err := s.db.QueryRowContext(ctx, `SELECT subnet, policy, exposed, previews FROM sandbox_net WHERE id = ?`, id).Scan(&subnet, &pol, &exp, &pub)
	if errors.Is(err, sql.ErrNoRows) {
		return Net{}, false, nil
	}
	if err != nil {
		return Net{}, false, err
	}
	n, err := readNet(id, subnet, pol, exp, pub)
	return n, err == nil, err
}

func readNet(id, subnet, pol, exp, pub string) (Net, error) {
	n := Net{Subnet: subnet, Policy: []byte(pol)}
	if err := json.Unmarshal([]byte(exp), &n.Exposed); err != nil {
		return Net{}, fmt.Errorf("sandbox %s: corrupt exposed ports: %w", id, err)
	}
	if err := json.Unmarshal([]byte(pub), &n.Previews); err != nil {
		return Net{}, fmt.Errorf("sandbox %s: corrupt preview settings: %w", id, err)
	}
	return n, nil
}

// NetLogEntry is one denied connection or refused DNS query.
type NetLogEntry struct {
	SandboxID   string
	Time        time.Time
	Kind        string // "connection" or "dns"
	Destination string
	Reason      string
	Detail      string
	Suppressed  int
}

// AppendNetLog adds entries to their sandboxes' network logs in one
// transaction, then trims each log it touched to its newest keep entries.
// Entries of sandboxes that have no record (warm sandboxes, ones already
// destroyed) are dropped.
func (s *Store) AppendNetLog(ctx context.Context, entries []NetLogEntry, keep int) error {
	if len(entries) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	touched := map[string]bool{}
	for _, e := range entries {
		res, err := tx.ExecContext(ctx, `INSERT INTO net_log (sandbox_id, time, kind, destination, reason, detail, suppressed)
			SELECT ?,?,?,?,?,?,? WHERE EXISTS (SELECT 1 FROM sandboxes WHERE id = ?)`,
			e.SandboxID, e.Time.UnixNano(), e.Kind, e.Destination, e.Reason, e.Detail, e.Suppressed, e.SandboxID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n > 0 {
			touched[e.SandboxID] = true
		}
	}
	for id := range touched {
		if _, err := tx.ExecContext(ctx, `DELETE FROM net_log WHERE sandbox_id = ? AND seq <= (
			SELECT seq FROM net_log WHERE sandbox_id = ? ORDER BY seq DESC LIMIT 1 OFFSET ?)`, id, id, keep); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// NetLog returns a sandbox's network log, oldest first: at most limit of
// its newest entries.
func (s *Store) NetLog(ctx context.Context, id string, limit int) ([]NetLogEntry, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT time, kind, destination, reason, detail, suppressed FROM (
		SELECT * FROM net_log WHERE sandbox_id = ? ORDER BY seq DESC LIMIT ?) ORDER BY seq`, id, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []NetLogEntry
	for rows.Next() {
		e := NetLogEntry{SandboxID: id}
		var t int64
		if err := rows.Scan(&t, &e.Kind, &e.Destination, &e.Reason, &e.Detail, &e.Suppressed); err != nil {
			return nil, err
		}
		e.Time = time.Unix(0, t)
		out = append(out, e)
	}
	return out, rows.Err()
}
