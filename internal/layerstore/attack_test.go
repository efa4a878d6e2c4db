package layerstore

// Regressions from an attacker's review of unpack.go: each test failed
// while the finding it names was there. (Two more findings, a deep tree of
// implicit directories MaxBytes did not count and a removal holding a
// descriptor per level, are TestMaxBytes and TestMaxDepth.)

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Finding 1 (high): copyUp opens the lower's entry O_RDONLY (blocking,
// no O_NOCTTY) before checking that it is a regular file. A hard link in
// layer N to a FIFO made by layer N-1 hangs the unpacker forever (ctx
// cannot interrupt it); to a char/block device it makes root open an
// arbitrary host device node (a watchdog arms on open, a tty can become
// the daemon's controlling terminal, ...).
func TestAttackCopyUpOpensFifo(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	l1, l2 := filepath.Join(dir, "l1"), filepath.Join(dir, "l2")
	os.Mkdir(l1, 0o755)
	os.Mkdir(l2, 0o755)
	if _, err := unpack(t, l1, Options{}, ent{name: "p", typ: tar.TypeFifo, mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	layer := layerTar(t, ent{name: "h", typ: tar.TypeLink, link: "p"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Unpack(ctx, bytes.NewReader(layer), l2, Options{Lowers: []string{l1}})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnsafe) {
			t.Errorf("err %v, want ErrUnsafe", err)
		}
		return
	case <-time.After(3 * time.Second):
	}
	// The unpacker is blocked in open(2) of the lower's FIFO: a writer
	// releases it (and proves the host opened the node).
	w, err := os.OpenFile(filepath.Join(l1, "p"), os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err == nil {
		w.Close()
	}
	err2 := <-done
	t.Fatalf("FINDING: a hard link to a FIFO of a lower layer blocked Unpack in open(2) for >3s despite a 1s ctx "+
		"(the host opened the lower's FIFO: a writer could connect: %v; Unpack then returned %v); "+
		"copyUp must check the type before a blocking open (O_PATH+fstat, then O_NONBLOCK|O_NOCTTY)", err == nil, err2)
}

// Finding 4 (low, overlay semantics): a whiteout that follows an entry
// of the same name in the same layer is dropped (unpack.go:158), so the
// lower's contents show through. image-spec layer.md: whiteouts apply
// to the lower layers whatever their order in the tar; the directory of
// this layer must be opaque.
func TestAttackWhiteoutAfterEntryIgnored(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	l1, l2, mnt := filepath.Join(dir, "l1"), filepath.Join(dir, "l2"), filepath.Join(dir, "mnt")
	for _, d := range []string{l1, l2, mnt} {
		os.Mkdir(d, 0o755)
	}
	if _, err := unpack(t, l1, Options{}, ent{name: "a/", typ: tar.TypeDir, mode: 0o755}, ent{name: "a/secret", data: "deleted"}); err != nil {
		t.Fatal(err)
	}
	if _, err := unpack(t, l2, Options{Lowers: []string{l1}},
		ent{name: "a/", typ: tar.TypeDir, mode: 0o755}, ent{name: "a/new", data: "new"}, ent{name: ".wh.a"}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+l2+":"+l1); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	if _, err := os.Stat(filepath.Join(mnt, "a/secret")); err == nil {
		t.Fatal("FINDING: a/secret of the lower is visible although the layer whites out a/ (the whiteout came after a/ in the tar and was dropped); make the existing directory opaque")
	}
}

// Finding 5 (low): a whiteout followed by entries below the same name
// with no directory entry for it (".wh.a", "a/x") fails the layer with
// ErrUnsafe: the whiteout's char device is in the way of parent().
func TestAttackWhiteoutThenChildFails(t *testing.T) {
	requireRoot(t)
	s := newScene(t)
	if _, err := unpack(t, s.layer, Options{}, ent{name: ".wh.a"}, ent{name: "a/x", data: "x"}); err != nil {
		t.Fatalf("FINDING: \".wh.a\" then \"a/x\" fails: %v (parent() should replace this layer's whiteout by an opaque directory)", err)
	}
}

// Finding 6 (low): directory times are applied at the end through
// u.parent (which creates missing directories) by name: a directory the
// layer later replaced fails the whole layer, or its times land on the
// non-directory that replaced it.
func TestAttackDirTimesAfterReplace(t *testing.T) {
	requireRoot(t)
	s := newScene(t)
	_, err := unpack(t, s.layer, Options{},
		ent{name: "d/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "d/sub/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "d", typ: tar.TypeSymlink, link: "elsewhere"},
	)
	if err != nil {
		t.Fatalf("FINDING: a directory replaced later in the same layer fails the layer in the dir-times pass: %v", err)
	}
}

// Finding 7 (low): copyUp takes the first lower that opens the name and
// skips the rest: a whiteout (0:0 device: ENXIO), a symlink (ELOOP) or
// an opaque directory in a higher lower is passed over, and a deleted
// file comes back from a lower below. It also drops the file's xattrs
// (security.capability, user.*) although its comment says they are kept.
func TestAttackCopyUpIgnoresWhiteouts(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	l1, l2, l3 := filepath.Join(dir, "l1"), filepath.Join(dir, "l2"), filepath.Join(dir, "l3")
	for _, d := range []string{l1, l2, l3} {
		os.Mkdir(d, 0o755)
	}
	if _, err := unpack(t, l1, Options{}, ent{name: "f", data: "deleted-in-l2", xattrs: map[string]string{"user.k": "v"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := unpack(t, l2, Options{Lowers: []string{l1}}, ent{name: ".wh.f"}); err != nil {
		t.Fatal(err)
	}
	_, err := unpack(t, l3, Options{Lowers: []string{l2, l1}}, ent{name: "h", typ: tar.TypeLink, link: "f"})
	if err == nil {
		b, _ := os.ReadFile(filepath.Join(l3, "h"))
		t.Fatalf("FINDING: a hard link to f, which layer 2 whited out, was copied up from layer 1 (%q): copyUp must stop at a whiteout/opaque dir/non-regular entry in a higher lower", b)
	}
}

func TestAttackCopyUpDropsXattrs(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	l1, l2 := filepath.Join(dir, "l1"), filepath.Join(dir, "l2")
	os.Mkdir(l1, 0o755)
	os.Mkdir(l2, 0o755)
	if _, err := unpack(t, l1, Options{}, ent{name: "f", data: "x", xattrs: map[string]string{"user.k": "v"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := unpack(t, l2, Options{Lowers: []string{l1}}, ent{name: "h", typ: tar.TypeLink, link: "f"}); err != nil {
		t.Fatal(err)
	}
	if v, err := getXattr(filepath.Join(l2, "f"), "user.k"); v != "v" {
		t.Fatalf("FINDING: the copied-up f lost its xattr user.k (%q, %v): copyUp's comment says kept xattrs are copied (security.capability is lost the same way)", v, err)
	}
}
