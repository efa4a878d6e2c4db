package keylock

import (
	"sync"
	"testing"
)

func TestLock(t *testing.T) {
	var m Map
	unlock := m.Lock("a")
	if _, ok := m.TryLock("a"); ok {
		t.Fatal("TryLock took a held lock")
	}
	other, ok := m.TryLock("b")
	if !ok {
		t.Fatal("keys are not independent")
	}
	other()
	unlock()
	u, ok := m.TryLock("a")
	if !ok {
		t.Fatal("TryLock after release failed")
	}
	u()
	if len(m.locks) != 0 {
		t.Fatalf("%d locks kept after release", len(m.locks))
	}
}

func TestExclusive(t *testing.T) {
	var m Map
	var wg sync.WaitGroup
	n := 0
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer m.Lock("k")()
			n++
		}()
	}
	wg.Wait()
	if n != 50 || len(m.locks) != 0 {
		t.Fatalf("n=%d, %d locks kept", n, len(m.locks))
	}
}
