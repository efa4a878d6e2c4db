package vm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/idclaim"
	"github.com/nookhq/nook/internal/procfs"
)

// Each vm's QEMU runs as a user and group of its own, UIDBase+slot, so
// that a guest that escapes into its QEMU can neither signal, trace nor
// read another vm's QEMU, nor open what belongs to another vm. The user
// owns no file: QEMU gets every file as an open descriptor (launch.args).
// The vm's slot is recorded in its directory (the file "uid"), so that a
// restarted daemon starts the vm's next QEMU (resume, rollback) as the
// same user, and claimed host-wide (internal/idclaim, Config.UIDClaimDir),
// so that no other daemon on the host, a test's beside the real one, gives
// it to another QEMU. A destroyed vm's claim goes once its QEMU is dead
// and its directory removed. Template boots, which have no vm directory,
// claim a slot for the daemon's process until they end.

// DefaultUIDBase is the default first QEMU user and group ID, 0x70000000:
// far above the IDs of real users, past the ranges systemd hands to
// containers (up to 0x6FFFFFFF), below its nsresourced range (0x7FFE0000)
// and the container sandboxes' ranges (from 2^31).
const DefaultUIDBase = 0x70000000

// DefaultUIDClaimDir is where QEMU users are claimed host-wide.
const DefaultUIDClaimDir = "/var/lib/nook/qemu-uids"

// uidSlots is how many QEMU users there are: the most vms one host runs.
const uidSlots = 1 << 16

// checkUIDRange refuses a range of QEMU users that holds root or the
// invalid IDs at the top.
func (b *Backend) checkUIDRange() error {
	if b.cfg.UIDBase == 0 || uint64(b.cfg.UIDBase)+uidSlots > 1<<32-2 {
		return errdefs.Invalid("QEMU's user IDs %d..%d must not include root (0) or reach 4294967294: pick another UIDBase",
			b.cfg.UIDBase, uint64(b.cfg.UIDBase)+uidSlots-1)
	}
	return nil
}

// uidClaims is the host-wide directory of claims on QEMU users. A claim
// holds the vm's directory (the vm's while its "uid" file names the
// slot's user) or, for a template boot, "boot:PID:STARTTIME" of the
// daemon (its while that process lives).
func (b *Backend) uidClaims() idclaim.Dir {
	return idclaim.Dir{Path: b.cfg.UIDClaimDir, Slots: uidSlots, Owns: func(owner string, slot int) bool {
		if proc, ok := strings.CutPrefix(owner, "boot:"); ok {
			pid, start, _ := strings.Cut(proc, ":")
			p, _ := strconv.Atoi(pid)
			st, _ := strconv.ParseUint(start, 10, 64)
			return p > 0 && procfs.StartTime(p) == st
		}
		uid, ok := readUID(owner, b.cfg.UIDBase)
		return ok && idclaim.RootOwned(filepath.Join(owner, "uid")) && uid == b.cfg.UIDBase+uint32(slot)
	}}
}

// vmUID returns the user vm id's QEMU runs as, giving it a free one the
// first time, and making sure it is still the vm's alone.
func (b *Backend) vmUID(id string) (uint32, error) {
	if err := b.checkUIDRange(); err != nil {
		return 0, err
	}
	b.uidMu.Lock()
	defer b.uidMu.Unlock()
	claims, owner := b.uidClaims(), b.dir(id)
	if uid, ok := b.recordedUID(id); ok {
		if err := claims.Ensure(int(uid-b.cfg.UIDBase), owner); err != nil {
			return 0, fmt.Errorf("the vm's QEMU user %d: %w", uid, err)
		}
		return uid, nil
	}
	slot, err := claims.Claim(owner)
	if err != nil {
		return 0, errdefs.Exhausted("a QEMU user for the vm: %v", err)
	}
	uid := b.cfg.UIDBase + uint32(slot)
	if err := fsutil.WriteFileAtomic(filepath.Join(owner, "uid"), []byte(strconv.FormatUint(uint64(uid), 10)+"\n")); err != nil {
		claims.Release(slot, owner)
		return 0, fmt.Errorf("record the vm's QEMU user: %w", err)
	}
	return uid, nil
}

// releaseUID gives vm id's user back: its QEMU is dead and its
// directory gone.
func (b *Backend) releaseUID(id string, uid uint32) error {
	return b.uidClaims().Release(int(uid-b.cfg.UIDBase), b.dir(id))
}

// reserveUID holds a free user for a QEMU that has no vm directory (a
// template boot) until release.
func (b *Backend) reserveUID() (uid uint32, release func(), err error) {
	if err := b.checkUIDRange(); err != nil {
		return 0, nil, err
	}
	pid := os.Getpid()
	owner := fmt.Sprintf("boot:%d:%d", pid, procfs.StartTime(pid))
	claims := b.uidClaims()
	slot, err := claims.Claim(owner)
	if err != nil {
		return 0, nil, errdefs.Exhausted("a QEMU user for a template boot: %v", err)
	}
	return b.cfg.UIDBase + uint32(slot), func() { claims.Release(slot, owner) }, nil
}

// recordedUID reads a vm's recorded user, if it has a valid one.
func (b *Backend) recordedUID(id string) (uint32, bool) {
	return readUID(b.dir(id), b.cfg.UIDBase)
}

// readUID reads the user recorded in a vm directory, if it is in the range from base.
func readUID(dir string, base uint32) (uint32, bool) {
	v, ok := recordedUser(dir)
	if !ok || v < base || uint64(v) >= uint64(base)+uidSlots {
		return 0, false
	}
	return v, true
}

// recordedUser reads the user recorded in a vm directory, whatever range
// it is in.
func recordedUser(dir string) (uint32, bool) {
	data, err := os.ReadFile(filepath.Join(dir, "uid"))
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 32)
	if err != nil {
		return 0, false
	}
	return uint32(v), true
}
