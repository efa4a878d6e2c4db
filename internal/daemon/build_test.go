package daemon

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A build cache goes to its step sandbox as a tar of the directory
// itself ("./", its owner and mode), its files with their owners and no
// host account names, each extra hard link as a link (not its data
// again), symlinks as they are, and no device or fifo.
func TestWriteTree(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("giving files owners needs root")
	}
	dir := filepath.Join(t.TempDir(), "cache")
	os.Mkdir(dir, 0o750)
	os.Chown(dir, 1000, 1001)
	os.MkdirAll(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "sub/big"), bytes.Repeat([]byte("x"), 1<<16), 0o644)
	os.Chown(filepath.Join(dir, "sub/big"), 1234, 1235)
	os.Link(filepath.Join(dir, "sub/big"), filepath.Join(dir, "sub/link"))
	os.Symlink("/etc/shadow", filepath.Join(dir, "sym"))
	syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := writeTree(tw, dir); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	got := map[string]*tar.Header{}
	var order []string
	tr := tar.NewReader(&buf)
	var data int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, tr)
		data += n
		got[h.Name], order = h, append(order, h.Name)
		if h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: names %q %q", h.Name, h.Uname, h.Gname)
		}
	}
	if len(order) == 0 || order[0] != "./" || got["./"].Uid != 1000 || got["./"].Gid != 1001 || got["./"].Mode&0o7777 != 0o750 {
		t.Fatalf("the directory itself first, with its owner and mode: %v %+v", order, got["./"])
	}
	if h := got["sub/big"]; h == nil || h.Uid != 1234 || h.Gid != 1235 || h.Size != 1<<16 {
		t.Errorf("sub/big: %+v", h)
	}
	if h := got["sub/link"]; h == nil || h.Typeflag != tar.TypeLink || h.Linkname != "sub/big" {
		t.Errorf("sub/link: %+v", h)
	}
	if data != 1<<16 {
		t.Errorf("%d bytes of file data, want one copy of sub/big", data)
	}
	if h := got["sym"]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != "/etc/shadow" || h.Size != 0 {
		t.Errorf("sym: %+v", h)
	}
	if got["fifo"] != nil {
		t.Errorf("a fifo was carried")
	}
}
