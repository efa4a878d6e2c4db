package volume

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/diskimg"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Getuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("volumes need root (loop devices, mounts); CI runs as root")
		}
		t.Skip("volumes need root (loop devices, mounts)")
	}
}

func mounted(t *testing.T, dir string) bool {
	t.Helper()
	m, err := fsutil.IsMountPoint(dir)
	return err == nil && m
}

// A volume is made, mounted, written to its size (then ENOSPC), listed,
// and removed with nothing left: no directory, no mount.
func TestVolume(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	s, err := Open(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	v, err := s.Create(ctx, "data", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { diskimg.Unmount(filepath.Join(dir, "data", "mnt")) })
	if v.Name != "data" || v.SizeBytes != 64<<20 {
		t.Fatalf("created %+v", v)
	}
	p, err := s.Path("data")
	if err != nil || p != filepath.Join(dir, "data", "mnt", "data") || !mounted(t, filepath.Join(dir, "data", "mnt")) {
		t.Fatalf("path %q %v", p, err)
	}
	f, err := os.Create(filepath.Join(p, "big"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	var werr error
	for i := 0; i < 100 && werr == nil; i++ {
		_, werr = f.Write(chunk)
	}
	f.Close()
	if !errors.Is(werr, syscall.ENOSPC) {
		t.Fatalf("writing 100 MiB into a 64 MiB volume: %v", werr)
	}
	if l, err := s.List(); err != nil || len(l) != 1 || l[0].Name != "data" || l[0].UsedBytes < 50<<20 {
		t.Fatalf("list: %+v %v", l, err)
	}
	if _, err := s.Create(ctx, "data", 0); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("a second volume data: %v", err)
	}
	for _, c := range []struct {
		name string
		size int64
	}{{"Bad", 0}, {"../x", 0}, {"", 0}, {"small", 1 << 20}, {"huge", 1 << 60}} {
		if _, err := s.Create(ctx, c.name, c.size); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("create %q of %d: %v", c.name, c.size, err)
		}
	}
	if _, err := s.Get("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get nope: %v", err)
	}
	if err := s.Remove(ctx, "data"); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("left in the store: %v", entries)
	}
	if err := s.Remove(ctx, "data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("remove it again: %v", err)
	}
}

// What a crash leaves is finished when the store opens again: a volume
// half made goes, one half removed (still mounted) is unmounted and
// goes, and one a host restart unmounted is mounted again with its files.
func TestVolumeAfterCrash(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	s, err := Open(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, n := range []string{"kept", "removed", "nodata"} {
		if _, err := s.Create(ctx, n, 64<<20); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { diskimg.Unmount(filepath.Join(dir, n, "mnt")) })
	}
	p, _ := s.Path("kept")
	os.WriteFile(filepath.Join(p, "f"), []byte("kept"), 0o644)
	// A remove cut after its rename, a create cut before its own.
	gone := filepath.Join(dir, ".gone-removed-0")
	if err := os.Rename(filepath.Join(dir, "removed"), gone); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { diskimg.Unmount(filepath.Join(gone, "mnt")) })
	os.MkdirAll(filepath.Join(dir, ".new-half-0"), 0o700)
	os.WriteFile(filepath.Join(dir, ".new-half-0", "disk.img"), []byte("x"), 0o600)
	// A create cut between its rename and the directory of its files.
	os.Remove(filepath.Join(dir, "nodata", "mnt", "data"))
	// A host restart: nothing mounted.
	for _, n := range []string{"kept", "nodata"} {
		if err := diskimg.Unmount(filepath.Join(dir, n, "mnt")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Open(dir, log); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 || entries[0].Name() != "kept" || entries[1].Name() != "nodata" {
		t.Fatalf("after the crash the store holds %v", entries)
	}
	if fi, err := os.Stat(filepath.Join(dir, "nodata", "mnt", "data")); err != nil || !fi.IsDir() {
		t.Fatalf("the directory of a volume's files is not made again: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "kept", "mnt", "data", "f")); err != nil || string(b) != "kept" || !mounted(t, filepath.Join(dir, "kept", "mnt")) {
		t.Fatalf("the kept volume: %q %v", b, err)
	}
}

// A volume's files without a sandbox: a fifo a sandbox left is refused
// at once (not waited on), symlinks out of the volume are refused,
// inside it followed; a tar of a tree holds it and no fifo.
func TestVolumeFiles(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	s, err := Open(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(context.Background(), "f", 64<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { diskimg.Unmount(filepath.Join(dir, "f", "mnt")) })
	p, _ := s.Path("f")
	os.MkdirAll(filepath.Join(p, "d"), 0o755)
	os.WriteFile(filepath.Join(p, "d", "x"), []byte("x"), 0o644)
	syscall.Mkfifo(filepath.Join(p, "d", "fifo"), 0o644)
	os.Symlink("/etc", filepath.Join(p, "out"))
	os.Symlink("d", filepath.Join(p, "in"))
	root, err := os.OpenRoot(p)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := OpenFile(root, "/d/fifo"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a fifo: %v", err)
	}
	if _, err := OpenFile(root, "/out/passwd"); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("through a symlink out of the volume: %v", err)
	}
	if f, err := OpenFile(root, "/in/x"); err != nil {
		t.Errorf("through a symlink inside the volume: %v", err)
	} else {
		f.Close()
	}
	if _, err := Write(root, "/out/new", bytes.NewReader([]byte("x")), false); err == nil {
		t.Error("a write through a symlink out of the volume")
	}
	var listed []string
	if _, err := List(root, "/", true, 0, func(e api.FileInfo) error { listed = append(listed, e.Path); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(listed, " "); !strings.Contains(got, "/d/x") || !strings.Contains(got, "/out") || strings.Contains(got, "/out/") || strings.Contains(got, "/in/") {
		t.Errorf("list follows no symlink: %s", got)
	}
	if trunc, err := List(root, "/", true, 2, func(api.FileInfo) error { return nil }); err != nil || !trunc {
		t.Errorf("a listing cut at 2: truncated %v %v", trunc, err)
	}
	// A tree deeper than a walk goes is a clear error.
	deep := filepath.Join(p, "deep")
	for i := 0; i <= maxDepth+1; i++ {
		deep = filepath.Join(deep, "d")
	}
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := List(root, "/deep", true, 0, func(api.FileInfo) error { return nil }); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a tree too deep: %v", err)
	}
	var top bytes.Buffer
	if err := WriteTar(root, "/in", &top); err != nil || !strings.Contains(top.String(), "in") || strings.Contains(top.String(), "x") {
		t.Errorf("a tar of a symlink is the symlink: %v", err)
	}
	var buf bytes.Buffer
	if err := WriteTar(root, "/d", &buf); err != nil {
		t.Fatal(err)
	}
	if b := buf.String(); !strings.Contains(b, "d/x") || strings.Contains(b, "fifo") {
		t.Errorf("the tar of /d has %q", b)
	}
	if _, err := os.Stat("/etc/new"); err == nil {
		t.Fatal("a write landed in the host's /etc")
	}
}
