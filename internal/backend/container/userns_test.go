package container

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nookhq/nook/internal/fsutil"
)

// Sandboxes made before user namespaces (no idmap.json) are recorded as
// legacy once, and run on as before; a sandbox without a record after
// that (a crash between its directory and its record, a lost file) is
// refused, never run as root on the host.
func TestLegacySandboxes(t *testing.T) {
	state := filepath.Join(t.TempDir(), "sandboxes")
	for _, d := range []string{"old", "new"} {
		if err := os.MkdirAll(filepath.Join(state, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	ranged := idmap{Base: idBase + 3*idRangeSize}
	if err := fsutil.WriteJSONAtomic(filepath.Join(state, "new", "idmap.json"), ranged); err != nil {
		t.Fatal(err)
	}
	b := New(Config{StateDir: state, IDClaimDir: filepath.Join(t.TempDir(), "claims"), Log: slog.New(slog.DiscardHandler)})
	if m, err := b.readIDMap("old"); err != nil || m.enabled() || !m.Legacy {
		t.Fatalf("a sandbox from before: %+v %v, want legacy", m, err)
	}
	if m, err := b.readIDMap("new"); err != nil || m != ranged {
		t.Fatalf("a sandbox with a range: %+v %v", m, err)
	}
	if err := os.Mkdir(filepath.Join(state, "crashed"), 0o700); err != nil {
		t.Fatal(err)
	}
	if m, err := b.readIDMap("crashed"); err == nil || !strings.Contains(err.Error(), "refusing to run the sandbox as root") {
		t.Fatalf("a sandbox without a record: %+v %v, want it refused", m, err)
	}
	// And so for the next daemon: the marking is done once.
	b2 := New(Config{StateDir: state, IDClaimDir: b.cfg.IDClaimDir, Log: slog.New(slog.DiscardHandler)})
	if _, err := b2.readIDMap("crashed"); err == nil {
		t.Fatal("a restarted backend took a sandbox without a record for one from before")
	}
	if m, err := b2.readIDMap("old"); err != nil || !m.Legacy {
		t.Fatalf("a sandbox from before, after a restart: %+v %v", m, err)
	}
	// A record that names no valid range is refused too.
	if err := fsutil.WriteJSONAtomic(filepath.Join(state, "crashed", "idmap.json"), idmap{Base: 12345}); err != nil {
		t.Fatal(err)
	}
	if _, err := b2.readIDMap("crashed"); err == nil {
		t.Fatal("a bad range was accepted")
	}
}

func aclBytes(ids ...uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 2)
	entry := func(tag, perm uint16, id uint32) {
		b = binary.LittleEndian.AppendUint16(b, tag)
		b = binary.LittleEndian.AppendUint16(b, perm)
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	entry(0x01, 6, 0xFFFFFFFF)
	for _, id := range ids {
		entry(0x02, 6, id)
	}
	entry(0x04, 4, 0xFFFFFFFF)
	for _, id := range ids {
		entry(0x08, 4, id)
	}
	entry(0x10, 6, 0xFFFFFFFF)
	entry(0x20, 4, 0xFFFFFFFF)
	return b
}

// The uids in ACLs and namespaced file capabilities are shifted with the
// owners; nothing else is touched, and nothing out of the range moves.
func TestShiftXattr(t *testing.T) {
	const base = idBase + 7*idRangeSize
	if got := shiftXattr("system.posix_acl_access", aclBytes(base+1000, base, 42), base); !bytes.Equal(got, aclBytes(1000, 0, 42)) {
		t.Errorf("ACL: %x", got)
	}
	if got := shiftXattr("system.posix_acl_default", aclBytes(base+5), base); !bytes.Equal(got, aclBytes(5)) {
		t.Errorf("default ACL: %x", got)
	}
	v3 := append(binary.LittleEndian.AppendUint32(nil, 0x03000001), make([]byte, 20)...)
	binary.LittleEndian.PutUint32(v3[20:], base)
	if got := shiftXattr("security.capability", v3, base); binary.LittleEndian.Uint32(got[20:]) != 0 || binary.LittleEndian.Uint32(v3[20:]) != base {
		t.Errorf("v3 capability: %x (input %x)", got, v3)
	}
	for _, c := range []struct {
		name string
		val  []byte
	}{
		{"user.x", aclBytes(base + 1)},
		{"system.posix_acl_access", aclBytes(base + 1)[:9]},
		{"security.capability", v3[:20]},
	} {
		if got := shiftXattr(c.name, c.val, base); !bytes.Equal(got, c.val) {
			t.Errorf("%s %x changed to %x", c.name, c.val, got)
		}
	}
	if got := shiftXattr("system.posix_acl_access", aclBytes(base+1), 0); !bytes.Equal(got, aclBytes(base+1)) {
		t.Errorf("base 0 changed %x", got)
	}
}

// FuzzShiftXattr: a value from a sandbox never crashes the copy, keeps
// its length, and is changed only where it names a uid of the range.
func FuzzShiftXattr(f *testing.F) {
	const base = idBase + 2*idRangeSize
	f.Add("system.posix_acl_access", aclBytes(base+3, 9))
	f.Add("security.capability", append(binary.LittleEndian.AppendUint32(nil, 0x03000000), make([]byte, 20)...))
	f.Add("system.posix_acl_default", []byte{2, 0, 0, 0, 2, 0})
	f.Fuzz(func(t *testing.T, name string, val []byte) {
		in := bytes.Clone(val)
		got := shiftXattr(name, val, base)
		if len(got) != len(val) || !bytes.Equal(val, in) {
			t.Fatalf("length %d -> %d, or the input changed", len(val), len(got))
		}
		for i := 0; i+4 <= len(got); i += 4 {
			a, b := binary.LittleEndian.Uint32(in[i:]), binary.LittleEndian.Uint32(got[i:])
			if a != b && (a < base || a-base >= idRangeSize || b != a-base) {
				t.Fatalf("word %d: %d -> %d", i/4, a, b)
			}
		}
	})
}

func TestKernelAtLeast(t *testing.T) {
	if ok, release := kernelAtLeast(2, 6); !ok || release == "" {
		t.Fatalf("this kernel (%q) is older than 2.6", release)
	}
	if ok, release := kernelAtLeast(999, 0); ok {
		t.Fatalf("this kernel (%q) is 999.0 or later", release)
	}
}

// A create a crash cut short between its range's claim and the record of
// it leaves a claim its sandbox does not name: Destroy still gives it back.
func TestDestroyReleasesUnrecordedClaim(t *testing.T) {
	b, _ := newTestBackend(t)
	if err := b.markLegacy(); err != nil { // done by an earlier start
		t.Fatal(err)
	}
	id := "0123456789abcdef"
	if err := os.MkdirAll(b.dir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	slot, err := b.claims().Claim(b.dir(id))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Destroy(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if h := b.claims().Holder(slot); h != "" {
		t.Fatalf("the half-created sandbox's claim on %d is still held by %q", slot, h)
	}
}
