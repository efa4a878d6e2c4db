package idclaim

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// records is what owners record: owner -> slot, as a sandbox directory would.
type records struct {
	mu sync.Mutex
	m  map[string]int
}

func (r *records) owns(owner string, slot int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	got, ok := r.m[owner]
	return ok && got == slot
}

func (r *records) set(owner string, slot int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[owner] = slot
}

func newDir(t *testing.T, slots int) (Dir, *records) {
	r := &records{m: map[string]int{}}
	return Dir{Path: filepath.Join(t.TempDir(), "claims"), Slots: slots, Owns: r.owns}, r
}

// Every slot goes to one owner, however many claim at once (goroutines
// here stand for daemons: the directory is all they share), and a full
// directory says so.
func TestClaimsAreUnique(t *testing.T) {
	const slots = 32
	d, r := newDir(t, slots)
	var wg sync.WaitGroup
	got := make([]int, slots)
	errs := make([]error, slots)
	for i := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := "owner-" + strconv.Itoa(i)
			// Each its own Dir value, as each daemon has.
			dd := d
			slot, err := dd.Claim(owner)
			if err != nil {
				errs[i] = err
				return
			}
			r.set(owner, slot)
			got[i] = slot
		}()
	}
	wg.Wait()
	seen := map[int]int{}
	for i, slot := range got {
		if errs[i] != nil {
			// 512 random probes of 32 slots may miss the last free one.
			continue
		}
		if j, ok := seen[slot]; ok {
			t.Fatalf("owners %d and %d both hold slot %d", i, j, slot)
		}
		seen[slot] = i
	}
	if len(seen) < slots-1 {
		t.Fatalf("only %d of %d owners got a slot: %v", len(seen), slots, errs)
	}
	for len(seen) < slots { // fill the rest
		slot, err := d.Claim("late")
		if err != nil {
			break
		}
		r.set("late", slot)
		seen[slot] = -1
	}
	if _, err := d.Claim("one-too-many"); err == nil {
		t.Fatal("a claim on a full directory succeeded")
	}
}

// A claim whose owner does not record it is taken back once it is older
// than the grace period; a younger one (being recorded) is not.
func TestStaleClaims(t *testing.T) {
	d, r := newDir(t, 1)
	d.Grace = time.Hour
	slot, err := d.Claim("crashed") // never records it
	if err != nil || slot != 0 {
		t.Fatal(slot, err)
	}
	if _, err := d.Claim("next"); err == nil {
		t.Fatal("a claim younger than the grace period was taken back")
	}
	d.Grace = time.Nanosecond
	if slot, err := d.Claim("next"); err != nil || slot != 0 {
		t.Fatalf("a stale claim was not taken back: %d %v", slot, err)
	}
	r.set("next", 0)
	if _, err := d.Claim("third"); err == nil {
		t.Fatal("a recorded claim was taken back")
	}
	if got := d.Holder(0); got != "next" {
		t.Fatalf("holder %q", got)
	}
	// Only its holder releases it.
	if err := d.Release(0, "crashed"); err != nil || d.Holder(0) != "next" {
		t.Fatalf("released by a former holder: %v %q", err, d.Holder(0))
	}
	if err := d.Release(0, "next"); err != nil || d.Holder(0) != "" {
		t.Fatalf("release: %v %q", err, d.Holder(0))
	}
}

// Ensure gives an owner back the slot it records (claims lost), and
// refuses one another owner holds.
func TestEnsure(t *testing.T) {
	d, r := newDir(t, 4)
	if err := d.Ensure(2, "a"); err != nil || d.Holder(2) != "a" {
		t.Fatalf("ensure a free slot: %v %q", err, d.Holder(2))
	}
	r.set("a", 2)
	if err := d.Ensure(2, "a"); err != nil {
		t.Fatalf("ensure a held slot again: %v", err)
	}
	if err := d.Ensure(2, "b"); err == nil {
		t.Fatal("ensure took another owner's slot")
	}
	if err := d.Ensure(4, "b"); err == nil {
		t.Fatal("ensure of a slot out of range")
	}
	if err := os.WriteFile(filepath.Join(d.Path, "3"), []byte(""), 0o600); err != nil {
		t.Fatal(err)
	}
	d.Grace = time.Nanosecond
	if err := d.Ensure(3, "b"); err != nil {
		t.Fatalf("ensure over an empty (stale) claim: %v", err)
	}
	if fmt.Sprint(d.Holder(3)) != "b" {
		t.Fatalf("holder %q", d.Holder(3))
	}
}

// ReleaseAll gives back what an owner holds without knowing the slots.
func TestReleaseAll(t *testing.T) {
	d, _ := newDir(t, 64)
	var mine []int
	for range 3 {
		slot, err := d.Claim("lost")
		if err != nil {
			t.Fatal(err)
		}
		mine = append(mine, slot)
	}
	other, err := d.Claim("other")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.ReleaseAll("lost"); err != nil {
		t.Fatal(err)
	}
	for _, slot := range mine {
		if h := d.Holder(slot); h != "" {
			t.Errorf("slot %d still held by %q", slot, h)
		}
	}
	if h := d.Holder(other); h != "other" {
		t.Errorf("another owner's slot went: %q", h)
	}
}
