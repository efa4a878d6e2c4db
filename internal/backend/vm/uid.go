package vm

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
)

// Each vm's QEMU runs as a user and group of its own, UIDBase+slot, so
// that a guest that escapes into its QEMU can neither signal, trace nor
// read another vm's QEMU, nor open what belongs to another vm. The user
// owns no file: QEMU gets every file as an open descriptor (launch.args).
// The vm's slot is recorded in its directory (the file "uid"), so that a
// restarted daemon starts the vm's next QEMU (resume, rollback) as the
// same user; a destroyed vm's directory goes, and its slot with it.
// Template boots, which have no vm directory, hold a slot in memory.

// DefaultUIDBase is the default first QEMU user and group ID: far above
// the IDs of real users and of user namespaces' usual ranges.
const DefaultUIDBase = 1_000_000_000

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

// vmUID returns the user vm id's QEMU runs as, giving it a free one the
// first time.
func (b *Backend) vmUID(id string) (uint32, error) {
	if err := b.checkUIDRange(); err != nil {
		return 0, err
	}
	b.uidMu.Lock()
	defer b.uidMu.Unlock()
	if uid, ok := b.recordedUID(id); ok {
		return uid, nil
	}
	uid, err := b.freeUID()
	if err != nil {
		return 0, err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(b.dir(id), "uid"), []byte(strconv.FormatUint(uint64(uid), 10)+"\n")); err != nil {
		return 0, fmt.Errorf("record the vm's QEMU user: %w", err)
	}
	return uid, nil
}

// reserveUID holds a free user for a QEMU that has no vm directory (a
// template boot) until release.
func (b *Backend) reserveUID() (uid uint32, release func(), err error) {
	if err := b.checkUIDRange(); err != nil {
		return 0, nil, err
	}
	b.uidMu.Lock()
	defer b.uidMu.Unlock()
	uid, err = b.freeUID()
	if err != nil {
		return 0, nil, err
	}
	b.uidHeld[uid] = true
	return uid, func() {
		b.uidMu.Lock()
		delete(b.uidHeld, uid)
		b.uidMu.Unlock()
	}, nil
}

// recordedUID reads a vm's recorded user, if it has a valid one.
func (b *Backend) recordedUID(id string) (uint32, bool) {
	data, err := os.ReadFile(filepath.Join(b.dir(id), "uid"))
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 32)
	if err != nil || v < uint64(b.cfg.UIDBase) || v >= uint64(b.cfg.UIDBase)+uidSlots {
		return 0, false
	}
	return uint32(v), true
}

// freeUID is the lowest user no vm records and no template boot holds.
// The caller holds uidMu.
func (b *Backend) freeUID() (uint32, error) {
	used := map[uint32]bool{}
	for uid := range b.uidHeld {
		used[uid] = true
	}
	entries, err := os.ReadDir(b.cfg.StateDir)
	if err != nil && !os.IsNotExist(err) {
		return 0, err
	}
	for _, e := range entries {
		if uid, ok := b.recordedUID(e.Name()); ok {
			used[uid] = true
		}
	}
	for slot := uint32(0); slot < uidSlots; slot++ {
		if uid := b.cfg.UIDBase + slot; !used[uid] {
			return uid, nil
		}
	}
	return 0, errdefs.Exhausted("all %d QEMU users are in use", uidSlots)
}
