// Package keylock serializes work per key (a sandbox's name or ID): one
// mutex per key in use, forgotten when nobody holds or waits for it.
package keylock

import "sync"

// Map is a set of per-key locks. The zero value is ready to use.
type Map struct {
	mu    sync.Mutex
	locks map[string]*entry
}

type entry struct {
	mu   sync.Mutex
	refs int // holders and waiters
}

func (m *Map) ref(key string) *entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.locks == nil {
		m.locks = map[string]*entry{}
	}
	e := m.locks[key]
	if e == nil {
		e = &entry{}
		m.locks[key] = e
	}
	e.refs++
	return e
}

func (m *Map) unref(key string, e *entry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(m.locks, key)
	}
}

// Lock waits for key's lock and returns the function that releases it.
func (m *Map) Lock(key string) func() {
	e := m.ref(key)
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		m.unref(key, e)
	}
}

// TryLock takes key's lock if nobody holds it.
func (m *Map) TryLock(key string) (unlock func(), ok bool) {
	e := m.ref(key)
	if !e.mu.TryLock() {
		m.unref(key, e)
		return nil, false
	}
	return func() {
		e.mu.Unlock()
		m.unref(key, e)
	}, true
}
