// Package idclaim hands out numbered slots (uid ranges of container
// sandboxes, QEMU users of vms) that must be unique on a host, across
// every nook daemon on it: a test's daemon beside the real one, or two
// daemons with different data directories. Two sandboxes given the same
// host uids could signal, trace and read each other.
//
// A slot is claimed by creating the file <dir>/<slot> exclusively; it
// holds the owner, a string the caller chooses (the sandbox's directory).
// A claim older than Grace whose owner does not record the slot is stale
// and may be taken back: the owner's record, not the claim, is the truth,
// so a crash between the claim and the record, or an owner removed
// without a release, costs nothing. (A younger claim is one being
// recorded.) Take-backs are serialized by a lock on the directory, so two
// daemons never both take back the same claim. Slots are probed at random, so a claim costs
// about one file creation whatever the number of slots in use.
package idclaim

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Dir is a directory of claims on slots 0..Slots-1.
type Dir struct {
	Path  string
	Slots int
	// Owns reports whether owner still records slot as its own. It is
	// asked only about a claim found in the way, to tell a stale one.
	// An owner's record should be one only root can write (a claim names
	// a path, and another user could make a path that a removed owner's
	// claim still names): RootOwned tells.
	Owns func(owner string, slot int) bool
	// Grace is how long a claim is held without its owner's record
	// (default: a minute).
	Grace time.Duration
}

// Claim claims a free slot for owner. The caller records the slot in the
// owner afterwards (until then the claim counts as held only if Owns
// says so: record it before anything depends on it).
func (d Dir) Claim(owner string) (int, error) {
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return 0, fmt.Errorf("claims directory: %w", err)
	}
	for try := 0; try < 512; try++ {
		slot := rand.IntN(d.Slots)
		ok, err := d.take(slot, owner)
		if err != nil {
			return 0, err
		}
		if ok {
			return slot, nil
		}
	}
	return 0, fmt.Errorf("no free slot of %d in %s after 512 tries (too many sandboxes on this host?)", d.Slots, d.Path)
}

// take claims slot for owner if it is free or its claim is stale.
func (d Dir) take(slot int, owner string) (bool, error) {
	ok, err := d.create(slot, owner)
	if ok || err != nil {
		return ok, err
	}
	unlock, err := d.lock()
	if err != nil {
		return false, err
	}
	defer unlock()
	if !d.stale(slot) {
		return false, nil
	}
	if err := os.Remove(d.file(slot)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	// A plain claim by another daemon may still come first.
	return d.create(slot, owner)
}

// create claims slot for owner if no claim is there.
func (d Dir) create(slot int, owner string) (bool, error) {
	path := d.file(slot)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("claim slot %d: %w", slot, err)
	}
	_, err = io.WriteString(f, owner)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return false, fmt.Errorf("claim slot %d: %w", slot, err)
	}
	return true, nil
}

// lock takes the directory's take-back lock.
func (d Dir) lock() (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(d.Path, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// Ensure makes sure owner holds slot (a sandbox whose record names it,
// after the claims were lost): it claims it if it is free or stale, and
// fails if another owner holds it.
func (d Dir) Ensure(slot int, owner string) error {
	if slot < 0 || slot >= d.Slots {
		return fmt.Errorf("slot %d out of range 0..%d", slot, d.Slots-1)
	}
	if got, err := os.ReadFile(d.file(slot)); err == nil && string(got) == owner {
		return nil
	}
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return fmt.Errorf("claims directory: %w", err)
	}
	ok, err := d.take(slot, owner)
	if err != nil {
		return err
	}
	if !ok {
		got, _ := os.ReadFile(d.file(slot))
		return fmt.Errorf("slot %d is held by %q, not %q", slot, got, owner)
	}
	return nil
}

// Release gives slot back, if owner still holds it. (Under the lock: a
// take-back by another daemon between the read and the removal would
// otherwise lose its claim.)
func (d Dir) Release(slot int, owner string) error {
	if _, err := os.Stat(d.Path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	unlock, err := d.lock()
	if err != nil {
		return err
	}
	defer unlock()
	path := d.file(slot)
	got, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if string(got) != owner {
		return nil // taken back by another owner since
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// ReleaseAll gives back every slot owner holds: for an owner that lost
// its record (a crash between a claim and the record). It reads every
// claim, so it is for that rare case only.
func (d Dir) ReleaseAll(owner string) error {
	entries, err := os.ReadDir(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		slot, err := strconv.Atoi(e.Name())
		if err != nil || slot < 0 || slot >= d.Slots {
			continue
		}
		if d.Holder(slot) == owner {
			errs = append(errs, d.Release(slot, owner))
		}
	}
	return errors.Join(errs...)
}

// Holder is the owner holding slot, "" if none.
func (d Dir) Holder(slot int) string {
	got, _ := os.ReadFile(d.file(slot))
	return string(got)
}

// stale reports whether slot's claim may be taken back. The caller holds
// the lock.
func (d Dir) stale(slot int) bool {
	fi, err := os.Stat(d.file(slot))
	if err != nil {
		return false // gone meanwhile (the next create tells), or unreadable: leave it
	}
	grace := d.Grace
	if grace == 0 {
		grace = time.Minute
	}
	if time.Since(fi.ModTime()) < grace {
		return false // being recorded
	}
	owner, err := os.ReadFile(d.file(slot))
	if err != nil {
		return false
	}
	return len(owner) == 0 || !d.Owns(string(owner), slot)
}

// RootOwned reports whether path is a regular file owned by root.
func RootOwned(path string) bool {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == 0
}

func (d Dir) file(slot int) string { return filepath.Join(d.Path, strconv.Itoa(slot)) }
