package egress

import (
	"net/netip"
	"sync"
	"time"
)

// Names is what a sandbox's resolver answered it: each name's addresses,
// each until its TTL runs out. The proxy admits a name at an address only
// when this sandbox resolved the name to it, through nook.
type Names struct {
	max int
	now func() time.Time

	mu     sync.Mutex
	byName map[string]map[netip.Addr]time.Time
	byAddr map[netip.Addr]map[string]struct{}
	n      int // name-address pairs held
}

// NewNames returns a table of at most max name-address pairs (older
// ones go first when full).
func NewNames(max int) *Names {
	return &Names{max: max, now: time.Now, byName: map[string]map[netip.Addr]time.Time{}, byAddr: map[netip.Addr]map[string]struct{}{}}
}

// Learn records that name resolved to addrs, valid for ttl.
func (t *Names) Learn(name string, addrs []netip.Addr, ttl time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	until := now.Add(ttl)
	for _, a := range addrs {
		m := t.byName[name]
		if m == nil {
			m = map[netip.Addr]time.Time{}
			t.byName[name] = m
		}
		if _, ok := m[a]; !ok {
			if t.n >= t.max {
				t.evict(now)
			}
			t.n++
			if t.byAddr[a] == nil {
				t.byAddr[a] = map[string]struct{}{}
			}
			t.byAddr[a][name] = struct{}{}
		}
		if until.After(m[a]) {
			m[a] = until
		}
	}
}

// evict drops the expired pairs, or when none has expired the one that
// expires first. The caller holds mu.
func (t *Names) evict(now time.Time) {
	var oldName string
	var oldAddr netip.Addr
	var oldUntil time.Time
	dropped := false
	for name, m := range t.byName {
		for a, until := range m {
			if !until.After(now) {
				t.drop(name, a)
				dropped = true
				continue
			}
			if oldName == "" || until.Before(oldUntil) {
				oldName, oldAddr, oldUntil = name, a, until
			}
		}
	}
	if !dropped && oldName != "" {
		t.drop(oldName, oldAddr)
	}
}

func (t *Names) drop(name string, a netip.Addr) {
	delete(t.byName[name], a)
	if len(t.byName[name]) == 0 {
		delete(t.byName, name)
	}
	delete(t.byAddr[a], name)
	if len(t.byAddr[a]) == 0 {
		delete(t.byAddr, a)
	}
	t.n--
}

// Resolved reports whether name resolved to a and has not expired.
func (t *Names) Resolved(name string, a netip.Addr) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	until, ok := t.byName[name][a]
	return ok && until.After(t.now())
}

// For returns the unexpired names that resolved to a.
func (t *Names) For(a netip.Addr) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	var out []string
	for name := range t.byAddr[a] {
		if t.byName[name][a].After(now) {
			out = append(out, name)
		}
	}
	return out
}
