package store

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/nookhq/nook/internal/core"
)

// sandboxCache keeps every sandbox's record in memory beside its table,
// so that the reads on every request's path (a sandbox by name or ID,
// the list, the expired ones) cost a map lookup and a copy instead of a
// SQL statement parsed and run on the store's one connection, where
// they would also wait behind any write's fsync.
//
// The table is the truth: the cache is loaded from it on first use, and
// each write of a sandbox re-reads its row once committed. Writes hold
// write across the statement and the re-read, so the cache applies them
// in the order the database did; readers take mu only for the lookup.
// This process is the database's only writer (the daemon's lock file).
type sandboxCache struct {
	write sync.Mutex

	qmu    sync.Mutex
	queue  []*pendingWrite // writes waiting for a commit (written)
	groups int             // transactions of more than one write committed (under write)

	mu     sync.RWMutex
	loaded bool
	byName map[string]*core.Sandbox
	byID   map[string]*core.Sandbox
}

// sandboxes returns the cache, loaded.
func (s *Store) sandboxes(ctx context.Context) (*sandboxCache, error) {
	c := &s.sbs
	c.mu.RLock()
	loaded := c.loaded
	c.mu.RUnlock()
	if loaded {
		return c, nil
	}
	c.write.Lock()
	defer c.write.Unlock()
	c.mu.RLock()
	loaded = c.loaded
	c.mu.RUnlock()
	if loaded {
		return c, nil
	}
	all, err := s.query(ctx, ``)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byName, c.byID = make(map[string]*core.Sandbox, len(all)), make(map[string]*core.Sandbox, len(all))
	for _, sb := range all {
		c.byName[sb.Name], c.byID[sb.ID] = sb, sb
	}
	c.loaded = true
	return c, nil
}

// execer runs a statement: the database, or the transaction of a group
// of writes.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// pendingWrite is a write waiting to be committed: of a sandbox's row
// (id), or of rows that go with one (id "": the cache has nothing to
// read again).
type pendingWrite struct {
	id    string
	write func(context.Context, execer) error
	// then, if set, runs once the write is committed, under the cache's
	// write lock (so in the order the database applied the writes).
	then func()
	err  error
	done chan struct{} // closed once committed or failed
}

// written runs write (statements changing sandbox id's row, on the
// execer and with the context it is given) and brings the cache up to
// date with what it committed. It returns once the write is committed
// (an fsync of the WAL) or failed. A write once queued is not cancelled
// with ctx: it shares a transaction with others, which an interrupted
// statement would roll back.
//
// Writes that queue while another commits are committed together, as
// one transaction and one fsync (a group commit): with 10 creates at
// once on a host whose fsyncs take milliseconds, each waited for every
// other's fsync in turn. Each write of a group runs in a savepoint of
// its own, so that one failing is rolled back alone; if the transaction
// itself cannot go on, its writes are run again one by one, and if its
// commit fails, every write of the group fails with that error.
func (s *Store) written(ctx context.Context, id string, write func(context.Context, execer) error) error {
	return s.commit(ctx, &pendingWrite{id: id, write: write})
}

// commit queues w and returns once it is committed or failed (written).
func (s *Store) commit(ctx context.Context, w *pendingWrite) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c := &s.sbs
	w.done = make(chan struct{})
	c.qmu.Lock()
	c.queue = append(c.queue, w)
	c.qmu.Unlock()
	// Whoever holds write commits everything queued, this write
	// included unless a holder before committed it already.
	c.write.Lock()
	defer c.write.Unlock()
	select {
	case <-w.done:
		return w.err
	default:
	}
	c.qmu.Lock()
	group := c.queue
	c.queue = nil
	c.qmu.Unlock()
	s.commitGroup(context.WithoutCancel(ctx), group)
	return w.err
}

// commitGroup commits writes (one alone as it is; more in one
// transaction), updates the cache with what was committed and closes
// each write's done. The caller holds the cache's write lock.
func (s *Store) commitGroup(ctx context.Context, group []*pendingWrite) {
	defer func() {
		for _, w := range group {
			close(w.done)
		}
	}()
	if len(group) == 1 {
		s.alone(ctx, group)
		return
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		s.alone(ctx, group)
		return
	}
	for i, w := range group {
		sp := fmt.Sprintf("w%d", i)
		if _, err := tx.ExecContext(ctx, "SAVEPOINT "+sp); err != nil {
			tx.Rollback()
			s.alone(ctx, group)
			return
		}
		if w.err = w.write(ctx, tx); w.err != nil {
			// A failed statement leaves the transaction open (a
			// constraint), or SQLite rolled all of it back (an I/O
			// error, an interrupt): then the savepoint is gone, and the
			// group's other writes with it. They are run again, each
			// alone, so that each one's outcome is its own.
			if _, err := tx.ExecContext(ctx, "ROLLBACK TO "+sp); err != nil {
				tx.Rollback()
				s.alone(ctx, slices.DeleteFunc(slices.Clone(group), func(o *pendingWrite) bool { return o == w }))
				return
			}
		}
		if _, err := tx.ExecContext(ctx, "RELEASE "+sp); err != nil {
			tx.Rollback()
			s.alone(ctx, group)
			return
		}
	}
	if err := tx.Commit(); err != nil {
		// Whether the commit reached the disk is not known (as with a
		// write alone): each write fails, and the caches are read again.
		for _, w := range group {
			if w.err == nil {
				w.err = err
			}
		}
		s.dropCaches()
		return
	}
	s.sbs.groups++
	var ok []*pendingWrite
	for _, w := range group {
		if w.err == nil {
			ok = append(ok, w)
		}
	}
	s.refresh(ctx, ok)
}

// alone commits each write by itself (autocommit), in order, and
// refreshes the cache with each that succeeded.
func (s *Store) alone(ctx context.Context, ws []*pendingWrite) {
	for _, w := range ws {
		if w.err = w.write(ctx, s.db); w.err == nil {
			s.refresh(ctx, []*pendingWrite{w})
		}
	}
}

// refresh re-reads the rows of committed writes into the cache (before
// the cache is loaded there is nothing to update: its load reads the
// table), then runs each write's then.
func (s *Store) refresh(ctx context.Context, ws []*pendingWrite) {
	defer func() {
		for _, w := range ws {
			if w.then != nil {
				w.then()
			}
		}
	}()
	c := &s.sbs
	c.mu.RLock()
	loaded := c.loaded
	c.mu.RUnlock()
	if !loaded {
		return
	}
	for _, w := range ws {
		if w.id == "" {
			continue
		}
		rows, err := s.query(ctx, `WHERE id = ?`, w.id)
		if err != nil {
			// The write committed; a cache that may not hold it is
			// dropped and loaded again on the next read (readSandboxes).
			c.drop()
			return
		}
		c.mu.Lock()
		if old := c.byID[w.id]; old != nil {
			delete(c.byName, old.Name)
			delete(c.byID, w.id)
		}
		if len(rows) == 1 {
			c.byName[rows[0].Name], c.byID[w.id] = rows[0], rows[0]
		}
		c.mu.Unlock()
	}
}

// dropCaches forgets what the caches hold after a group whose outcome
// they may not match: they are loaded again from the tables on the next
// read.
func (s *Store) dropCaches() {
	s.sbs.drop()
	s.netMu.Lock()
	s.subnets = nil
	s.netMu.Unlock()
}

// drop forgets the cache: the next read loads it again from the table.
func (c *sandboxCache) drop() {
	c.mu.Lock()
	c.loaded, c.byName, c.byID = false, nil, nil
	c.mu.Unlock()
}

// readSandboxes runs read on the loaded cache (its lock held for
// reading), loading it again if a write dropped it meanwhile.
func (s *Store) readSandboxes(ctx context.Context, read func(c *sandboxCache)) error {
	for range 3 {
		c, err := s.sandboxes(ctx)
		if err != nil {
			return err
		}
		c.mu.RLock()
		loaded := c.loaded
		if loaded {
			read(c)
		}
		c.mu.RUnlock()
		if loaded {
			return nil
		}
	}
	return errors.New("the sandboxes' records: the cache was dropped while loaded three times")
}

// get returns a copy of the sandbox with this name (or ID), nil if none.
func (s *Store) get(ctx context.Context, byID bool, key string) (*core.Sandbox, error) {
	var out *core.Sandbox
	err := s.readSandboxes(ctx, func(c *sandboxCache) {
		m := c.byName
		if byID {
			m = c.byID
		}
		if sb := m[key]; sb != nil {
			out = cloneSandbox(sb)
		}
	})
	return out, err
}

// all returns copies of the sandboxes keep selects, in no order.
func (s *Store) all(ctx context.Context, keep func(*core.Sandbox) bool) ([]*core.Sandbox, error) {
	var out []*core.Sandbox
	err := s.readSandboxes(ctx, func(c *sandboxCache) {
		for _, sb := range c.byID {
			if keep(sb) {
				out = append(out, cloneSandbox(sb))
			}
		}
	})
	return out, err
}

// cloneSandbox copies a record deeply enough that its caller may change
// any of it.
func cloneSandbox(sb *core.Sandbox) *core.Sandbox {
	c := *sb
	c.Env = maps.Clone(sb.Env)
	c.Labels = maps.Clone(sb.Labels)
	c.Volumes = slices.Clone(sb.Volumes)
	if sb.BackendState != nil {
		c.BackendState = bytes.Clone(sb.BackendState)
	}
	return &c
}

// byCreation orders sandboxes as ListSandboxes does: by creation, then name.
func byCreation(a, b *core.Sandbox) int {
	if c := cmp.Compare(a.CreatedAt.UnixNano(), b.CreatedAt.UnixNano()); c != 0 {
		return c
	}
	return strings.Compare(a.Name, b.Name)
}
