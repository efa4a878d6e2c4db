// Package store keeps the daemon's state in an embedded SQLite database
// (modernc.org/sqlite: pure Go, so the binaries stay static). Every write
// is a committed transaction with synchronous=FULL before the API
// acknowledges it, so a daemon killed with -9 loses nothing it answered.
// Sandboxes' records are also kept in memory beside their table
// (sandboxcache.go), so that the reads on every request's path cost no
// SQL, and the writes of their rows (and of their network records) that
// queue while one commits are committed together (a group commit: one
// transaction and one fsync for the lot, a savepoint for each, so that
// each succeeds or fails alone).
package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the database/sql driver "sqlite"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// migrations are applied in order; PRAGMA user_version records how many
// have run. Never edit one that has shipped: append a new one.
var migrations = []string{
	// 1: sandboxes and API tokens.
	`CREATE TABLE sandboxes (
		id            TEXT PRIMARY KEY,
		name          TEXT NOT NULL UNIQUE,
		template      TEXT NOT NULL,
		template_id   TEXT NOT NULL,
		isolation     TEXT NOT NULL,
		state         TEXT NOT NULL,
		reason        TEXT NOT NULL DEFAULT '',
		cpus          REAL NOT NULL,
		memory_bytes  INTEGER NOT NULL,
		disk_bytes    INTEGER NOT NULL,
		pids_limit    INTEGER NOT NULL,
		env           TEXT NOT NULL DEFAULT '{}',
		created_at    INTEGER NOT NULL,
		expires_at    INTEGER NOT NULL,
		backend_state BLOB
	);
	CREATE INDEX sandboxes_expires ON sandboxes(expires_at);
	CREATE TABLE tokens (
		id         TEXT PRIMARY KEY,
		name       TEXT NOT NULL DEFAULT '',
		hash       BLOB NOT NULL UNIQUE,
		created_at INTEGER NOT NULL
	);`,
	// 2: idle pause (nanoseconds, 0: never), what the TTL does, and
	// whether a pause-on-expire TTL has run out.
	`ALTER TABLE sandboxes ADD COLUMN idle_pause INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN on_expire TEXT NOT NULL DEFAULT 'destroy';
	ALTER TABLE sandboxes ADD COLUMN expired INTEGER NOT NULL DEFAULT 0;`,
	// 3: each sandbox's network (subnet, policy, exposed ports) and its
	// log of denied connections and refused DNS queries; both go with
	// the sandbox's record.
	`CREATE TABLE sandbox_net (
		id      TEXT PRIMARY KEY,
		subnet  TEXT NOT NULL,
		policy  TEXT NOT NULL,
		exposed TEXT NOT NULL DEFAULT '{}'
	);
	CREATE TABLE net_log (
		seq         INTEGER PRIMARY KEY AUTOINCREMENT,
		sandbox_id  TEXT NOT NULL,
		time        INTEGER NOT NULL,
		kind        TEXT NOT NULL,
		destination TEXT NOT NULL,
		reason      TEXT NOT NULL,
		detail      TEXT NOT NULL DEFAULT '',
		suppressed  INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX net_log_sandbox ON net_log(sandbox_id, seq);
	CREATE TRIGGER sandboxes_delete_net AFTER DELETE ON sandboxes BEGIN
		DELETE FROM sandbox_net WHERE id = old.id;
		DELETE FROM net_log WHERE sandbox_id = old.id;
	END;`,
	// 4: snapshots (a sandbox's, named uniquely within it; parent: the
	// snapshot its sandbox descended from when it was taken) and each
	// sandbox's head (the snapshot it now descends from: its last
	// snapshot, rollback target or fork source).
	`CREATE TABLE snapshots (
		id         TEXT PRIMARY KEY,
		sandbox_id TEXT NOT NULL,
		name       TEXT NOT NULL,
		parent     TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		size_bytes INTEGER NOT NULL,
		memory     INTEGER NOT NULL,
		UNIQUE (sandbox_id, name)
	);
	CREATE TABLE snapshot_heads (
		sandbox_id  TEXT PRIMARY KEY,
		snapshot_id TEXT NOT NULL
	);
	CREATE TRIGGER sandboxes_delete_snapshots AFTER DELETE ON sandboxes BEGIN
		DELETE FROM snapshots WHERE sandbox_id = old.id;
		DELETE FROM snapshot_heads WHERE sandbox_id = old.id;
	END;`,
	// 5: token scopes and expiry. Tokens made before have no expiry (0)
	// and the admin scope, which is what they could do then.
	`ALTER TABLE tokens ADD COLUMN scope TEXT NOT NULL DEFAULT 'admin';
	ALTER TABLE tokens ADD COLUMN sandbox_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE tokens ADD COLUMN expires_at INTEGER NOT NULL DEFAULT 0;`,
	// 6: the volumes a sandbox mounts (JSON, [] when none).
	`ALTER TABLE sandboxes ADD COLUMN volumes TEXT NOT NULL DEFAULT '[]';`,
	// 7: a sandbox's labels (JSON, {} when none; E2B's metadata).
	`ALTER TABLE sandboxes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';`,
	// 8: who made a sandbox (the token's name) and its line of forks
	// (parent: the sandbox it was forked from; lineage: the first of the
	// line, '' for sandboxes made before, which are their own), for their
	// identity tokens; the audience of the token file its agent keeps;
	// and the log of the tokens each sandbox was issued.
	`ALTER TABLE sandboxes ADD COLUMN creator TEXT NOT NULL DEFAULT '';
	ALTER TABLE sandboxes ADD COLUMN parent_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE sandboxes ADD COLUMN lineage_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE sandboxes ADD COLUMN identity_audience TEXT NOT NULL DEFAULT '';
	CREATE TABLE identity_log (
		seq        INTEGER PRIMARY KEY AUTOINCREMENT,
		sandbox_id TEXT NOT NULL,
		time       INTEGER NOT NULL,
		audience   TEXT NOT NULL,
		jti        TEXT NOT NULL,
		expires_at INTEGER NOT NULL,
		via        TEXT NOT NULL
	);
	CREATE INDEX identity_log_sandbox ON identity_log(sandbox_id, seq);
	CREATE TRIGGER sandboxes_delete_identity_log AFTER DELETE ON sandboxes BEGIN
		DELETE FROM identity_log WHERE sandbox_id = old.id;
	END;`,
	// 9: secrets (sealed values, by name; id: new each time the name is
	// made, so a binding never follows a name to a secret made again;
	// and the token that set them),
	// each sandbox's bindings of them with its placeholders and its CA
	// (the key sealed), and the repository a sandbox cloned at create
	// (JSON, {} when none).
	`CREATE TABLE secrets (
		name       TEXT PRIMARY KEY,
		id         TEXT NOT NULL,
		owner      TEXT NOT NULL,
		sealed     BLOB NOT NULL,
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL
	);
	CREATE TABLE sandbox_secrets (
		sandbox_id TEXT PRIMARY KEY,
		bound      TEXT NOT NULL,
		ca_cert    BLOB NOT NULL,
		ca_key     BLOB NOT NULL
	);
	CREATE TRIGGER sandboxes_delete_secrets AFTER DELETE ON sandboxes BEGIN
		DELETE FROM sandbox_secrets WHERE sandbox_id = old.id;
	END;
	ALTER TABLE sandboxes ADD COLUMN repo TEXT NOT NULL DEFAULT '{}';`,
	// 10: SSH public keys (internal/sshd): a sandbox's (sandbox_id), or a
	// token's for every sandbox it may reach (sandbox_id ''); owner: the
	// token that added it ('' the host), going with their sandbox or
	// that token;
	// and each exposed port's preview settings (JSON, port -> Preview).
	`CREATE TABLE ssh_keys (
		id          TEXT PRIMARY KEY,
		fingerprint TEXT NOT NULL,
		public_key  TEXT NOT NULL,
		comment     TEXT NOT NULL,
		sandbox_id  TEXT NOT NULL,
		owner       TEXT NOT NULL,
		created_at  INTEGER NOT NULL
	);
	CREATE INDEX ssh_keys_fingerprint ON ssh_keys(fingerprint);
	CREATE INDEX ssh_keys_sandbox ON ssh_keys(sandbox_id);
	CREATE TRIGGER sandboxes_delete_ssh_keys AFTER DELETE ON sandboxes BEGIN
		DELETE FROM ssh_keys WHERE sandbox_id = old.id;
	END;
	CREATE TRIGGER tokens_delete_ssh_keys AFTER DELETE ON tokens BEGIN
		DELETE FROM ssh_keys WHERE owner = old.id;
	END;
	ALTER TABLE sandbox_net ADD COLUMN previews TEXT NOT NULL DEFAULT '{}';`,
	// 11: token quotas (JSON, quotas.go) and the token (by ID, never by
	// a name that can be reused) each sandbox counts against; a sandbox
	// made without a token (the Unix socket) has no row.
	`CREATE TABLE token_quotas (
		token_id TEXT PRIMARY KEY,
		quotas   TEXT NOT NULL
	);
	CREATE TABLE sandbox_owners (
		sandbox_id TEXT PRIMARY KEY,
		token_id   TEXT NOT NULL
	);
	CREATE INDEX sandbox_owners_token ON sandbox_owners(token_id);
	CREATE TRIGGER tokens_delete_quotas AFTER DELETE ON tokens BEGIN
		DELETE FROM token_quotas WHERE token_id = old.id;
	END;
	CREATE TRIGGER sandboxes_delete_owner AFTER DELETE ON sandboxes BEGIN
		DELETE FROM sandbox_owners WHERE sandbox_id = old.id;
	END;`,
	// 12: idempotency keys (quotas.go): per caller (a token's ID, or
	// "host"), the request a key was first used with, what it made
	// (links) and, once answered, the answer.
	`CREATE TABLE idempotency_keys (
		owner      TEXT NOT NULL,
		key        TEXT NOT NULL,
		route      TEXT NOT NULL,
		body_hash  BLOB NOT NULL,
		boot       TEXT NOT NULL,
		links      TEXT NOT NULL DEFAULT '[]',
		status     INTEGER NOT NULL DEFAULT 0,
		response   BLOB,
		created_at INTEGER NOT NULL,
		PRIMARY KEY (owner, key)
	);
	CREATE INDEX idempotency_keys_created ON idempotency_keys(created_at);
	CREATE TRIGGER tokens_delete_idempotency_keys AFTER DELETE ON tokens BEGIN
		DELETE FROM idempotency_keys WHERE owner = old.id;
	END;`,
}

// Store is the daemon's database.
type Store struct {
	db *sql.DB
	// netMu guards subnets, the subnets of sandbox_net by sandbox ID,
	// kept beside the table (nil until first used): choosing a free
	// subnet for a create reads them without a query of every row.
	netMu   sync.Mutex
	subnets map[string]string
	// sbs is every sandbox's record, kept beside the table (sandboxcache.go).
	sbs sandboxCache
}

// Open opens (creating if needed) the database at path and migrates it.
// The database (tokens' hashes, every sandbox's record) is root's alone:
// SQLite gives its -wal and -shm files the database file's mode.
func Open(ctx context.Context, path string) (*Store, error) {
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("database %s: %w", p, err)
		}
	}
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o600); err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	} else {
		f.Close()
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(10000)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	// One connection: SQLite serializes writers anyway, and this keeps
	// read-after-write trivially consistent.
	db.SetMaxOpenConns(1)
	s := &Store{db: db}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate database %s: %w", path, err)
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// SchemaVersion returns how many migrations have been applied.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v)
	return v, err
}

func (s *Store) migrate(ctx context.Context) error {
	v, err := s.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if v > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this nook (%d): upgrade nook", v, len(migrations))
	}
	for i := v; i < len(migrations); i++ {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, i+1)); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

const sandboxCols = `id, name, template, template_id, isolation, state, reason, cpus, memory_bytes, disk_bytes, pids_limit, env, created_at, expires_at, backend_state, idle_pause, on_expire, expired, volumes, labels, creator, parent_id, lineage_id, identity_audience, repo`

// InsertSandbox records a new sandbox. A taken name is an ErrAlreadyExists.
func (s *Store) InsertSandbox(ctx context.Context, sb *core.Sandbox) error {
	env, err := json.Marshal(sb.Env)
	if err != nil {
		return err
	}
	vols, err := json.Marshal(sb.Volumes)
	if err != nil {
		return err
	}
	if sb.Volumes == nil {
		vols = []byte("[]")
	}
	labels := []byte("{}")
	if len(sb.Labels) > 0 {
		if labels, err = json.Marshal(sb.Labels); err != nil {
			return err
		}
	}
	err = s.written(ctx, sb.ID, func(ctx context.Context, ex execer) error {
		_, err := ex.ExecContext(ctx, `INSERT INTO sandboxes (`+sandboxCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
			sb.ID, sb.Name, sb.Template, sb.TemplateID, sb.Isolation, string(sb.State), sb.Reason, sb.CPUs,
			sb.MemoryBytes, sb.DiskBytes, sb.PidsLimit, string(env), sb.CreatedAt.UnixNano(), sb.ExpiresAt.UnixNano(), sb.BackendState,
			int64(sb.IdlePause), onExpire(sb), sb.Expired, string(vols), string(labels), sb.Creator, sb.ParentID, sb.LineageID, sb.IdentityAudience, repoJSON(sb.Repo))
		return err
	})
	if err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed: sandboxes.name") {
		return ErrNameTaken(sb.Name)
	}
	return err
}

// ErrNameTaken is the ErrAlreadyExists for a sandbox name in use.
func ErrNameTaken(name string) error {
	return errdefs.Exists("a sandbox named %q already exists: pick another name or remove it with `nook rm %s`", name, name)
}

func onExpire(sb *core.Sandbox) string {
	if sb.OnExpire == "" {
		return core.OnExpireDestroy
	}
	return sb.OnExpire
}

// UpdateSandbox writes a sandbox's mutable fields: state, reason, expiry
// (and whether it has expired) and backend state.
func (s *Store) UpdateSandbox(ctx context.Context, sb *core.Sandbox) error {
	return s.written(ctx, sb.ID, func(ctx context.Context, ex execer) error {
		res, err := ex.ExecContext(ctx, `UPDATE sandboxes SET state = ?, reason = ?, expires_at = ?, expired = ?, backend_state = ? WHERE id = ?`,
			string(sb.State), sb.Reason, sb.ExpiresAt.UnixNano(), sb.Expired, sb.BackendState, sb.ID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return errdefs.NotFound("sandbox %s not found", sb.Name)
		}
		return nil
	})
}

// SetSandboxRepo records the repository a sandbox cloned.
func (s *Store) SetSandboxRepo(ctx context.Context, id string, r core.Repo) error {
	return s.written(ctx, id, func(ctx context.Context, ex execer) error {
		_, err := ex.ExecContext(ctx, `UPDATE sandboxes SET repo = ? WHERE id = ?`, repoJSON(r), id)
		return err
	})
}

func repoJSON(r core.Repo) string {
	if r == (core.Repo{}) {
		return "{}"
	}
	b, _ := json.Marshal(r)
	return string(b)
}

// DeleteSandbox removes a sandbox's record.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	return s.commit(ctx, &pendingWrite{
		id: id,
		write: func(ctx context.Context, ex execer) error {
			_, err := ex.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
			return err
		},
		// Its sandbox_net row went with it (a trigger).
		then: func() {
			s.netMu.Lock()
			delete(s.subnets, id)
			s.netMu.Unlock()
		},
	})
}

// GetSandbox returns the sandbox with this name, or an ErrNotFound.
func (s *Store) GetSandbox(ctx context.Context, name string) (*core.Sandbox, error) {
	sb, err := s.get(ctx, false, name)
	if err != nil || sb != nil {
		return sb, err
	}
	return nil, errdefs.NotFound("no sandbox named %q: see `nook ls`", name)
}

// GetSandboxByID returns a sandbox by ID.
func (s *Store) GetSandboxByID(ctx context.Context, id string) (*core.Sandbox, error) {
	sb, err := s.get(ctx, true, id)
	if err != nil || sb != nil {
		return sb, err
	}
	return nil, errdefs.NotFound("no sandbox with id %q", id)
}

// ListSandboxes returns every sandbox, oldest first.
func (s *Store) ListSandboxes(ctx context.Context) ([]*core.Sandbox, error) {
	all, err := s.all(ctx, func(*core.Sandbox) bool { return true })
	if err != nil {
		return nil, err
	}
	slices.SortFunc(all, byCreation)
	return all, nil
}

// Expired returns the sandboxes whose TTL ran out before now, except
// those already paused for it (Expired), soonest expired first.
func (s *Store) Expired(ctx context.Context, now time.Time) ([]*core.Sandbox, error) {
	at := now.UnixNano()
	out, err := s.all(ctx, func(sb *core.Sandbox) bool {
		return sb.ExpiresAt.UnixNano() <= at && sb.State != core.StateDestroying && !sb.Expired
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b *core.Sandbox) int {
		return cmp.Or(cmp.Compare(a.ExpiresAt.UnixNano(), b.ExpiresAt.UnixNano()), strings.Compare(a.ID, b.ID))
	})
	return out, nil
}

// CountByTemplate returns how many sandboxes use a template build.
func (s *Store) CountByTemplate(ctx context.Context, templateID string) (int, error) {
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sandboxes WHERE template_id = ?`, templateID).Scan(&n)
	return n, err
}

func (s *Store) query(ctx context.Context, where string, args ...any) ([]*core.Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*core.Sandbox
	for rows.Next() {
		var sb core.Sandbox
		var state, env, vols, labels, repo string
		var created, expires, idle int64
		if err := rows.Scan(&sb.ID, &sb.Name, &sb.Template, &sb.TemplateID, &sb.Isolation, &state, &sb.Reason, &sb.CPUs,
			&sb.MemoryBytes, &sb.DiskBytes, &sb.PidsLimit, &env, &created, &expires, &sb.BackendState,
			&idle, &sb.OnExpire, &sb.Expired, &vols, &labels, &sb.Creator, &sb.ParentID, &sb.LineageID, &sb.IdentityAudience, &repo); err != nil {
			return nil, err
		}
		if labels != "{}" {
			if err := json.Unmarshal([]byte(labels), &sb.Labels); err != nil {
				return nil, fmt.Errorf("sandbox %s: its labels: %w", sb.Name, err)
			}
		}
		if repo != "{}" {
			if err := json.Unmarshal([]byte(repo), &sb.Repo); err != nil {
				return nil, fmt.Errorf("sandbox %s: its repository: %w", sb.Name, err)
			}
		}
		if err := json.Unmarshal([]byte(vols), &sb.Volumes); err != nil {
			return nil, fmt.Errorf("sandbox %s: its volumes: %w", sb.Name, err)
		}
		sb.IdlePause = time.Duration(idle)
		sb.State = core.State(state)
		sb.CreatedAt = time.Unix(0, created)
		sb.ExpiresAt = time.Unix(0, expires)
		if err := json.Unmarshal([]byte(env), &sb.Env); err != nil {
			return nil, fmt.Errorf("sandbox %s: corrupt env: %w", sb.ID, err)
		}
		out = append(out, &sb)
	}
	return out, rows.Err()
}

// Token is a stored API token: only the hash of its secret is kept.
type Token struct {
	ID        string
	Name      string
	Hash      []byte
	CreatedAt time.Time
	// Scope is what the token may do: "admin", "read-only" or
	// "sandbox:NAME"; SandboxID is that sandbox's ID (a later sandbox
	// of the same name is not the token's).
	Scope     string
	SandboxID string
	// ExpiresAt is when the token stops working; zero: never.
	ExpiresAt time.Time
}

func unixNanoOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func timeOrZero(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// InsertToken stores a token.
func (s *Store) InsertToken(ctx context.Context, t Token) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO tokens (id, name, hash, created_at, scope, sandbox_id, expires_at) VALUES (?,?,?,?,?,?,?)`,
		t.ID, t.Name, t.Hash, t.CreatedAt.UnixNano(), t.Scope, t.SandboxID, unixNanoOrZero(t.ExpiresAt))
	return err
}

const tokenColumns = `id, name, hash, created_at, scope, sandbox_id, expires_at`

func scanToken(row interface{ Scan(...any) error }) (*Token, error) {
	var t Token
	var created, expires int64
	if err := row.Scan(&t.ID, &t.Name, &t.Hash, &created, &t.Scope, &t.SandboxID, &expires); err != nil {
		return nil, err
	}
	t.CreatedAt = time.Unix(0, created)
	t.ExpiresAt = timeOrZero(expires)
	return &t, nil
}

// TokenByHash finds a token by the hash of its secret.
func (s *Store) TokenByHash(ctx context.Context, hash []byte) (*Token, error) {
	t, err := scanToken(s.db.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, errdefs.NotFound("token not found")
	}
	return t, err
}

// ListTokens lists tokens (without secrets, which are never stored).
func (s *Store) ListTokens(ctx context.Context) ([]Token, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+tokenColumns+` FROM tokens ORDER BY created_at`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Token
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, err
		}
		t.Hash = nil
		out = append(out, *t)
	}
	return out, rows.Err()
}

// DeleteToken revokes a token.
func (s *Store) DeleteToken(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM tokens WHERE id = ?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFound("no token with id %q: see `nook token ls`", id)
	}
	return nil
}
