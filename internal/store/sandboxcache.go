package store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
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

// written runs write (a statement changing sandbox id's row) and brings
// the cache up to date with what it committed. Before the cache is
// loaded there is nothing to update: its load reads the table.
func (s *Store) written(ctx context.Context, id string, write func() error) error {
	c := &s.sbs
	c.write.Lock()
	defer c.write.Unlock()
	if err := write(); err != nil {
		return err
	}
	c.mu.RLock()
	loaded := c.loaded
	c.mu.RUnlock()
	if !loaded {
		return nil
	}
	rows, err := s.query(context.WithoutCancel(ctx), `WHERE id = ?`, id)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		// The write committed; a cache that may not hold it is dropped
		// and loaded again on the next read (readSandboxes).
		c.loaded, c.byName, c.byID = false, nil, nil
		return nil
	}
	if old := c.byID[id]; old != nil {
		delete(c.byName, old.Name)
		delete(c.byID, id)
	}
	if len(rows) == 1 {
		c.byName[rows[0].Name], c.byID[id] = rows[0], rows[0]
	}
	return nil
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
