package sshd

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pkg/sftp"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
)

// dirFiles is a Files over a host directory: sandbox path /x is root/x.
// Stat does not follow a final symlink; Write writes a temporary file and
// renames it over the target at the end, as the daemon does.
type dirFiles struct {
	root  string
	opens atomic.Int32 // Open calls
}

func (d *dirFiles) host(p string) string {
	return filepath.Join(d.root, filepath.FromSlash(path.Clean("/"+p)))
}

// fsErr gives an os error the daemon's category, as the agent would.
func fsErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.NotFound("%v", err)
	case errors.Is(err, fs.ErrPermission):
		return errdefs.Denied("%v", err)
	case errors.Is(err, fs.ErrExist):
		return errdefs.Exists("%v", err)
	}
	return err
}

func (d *dirFiles) info(p string) (*api.FileInfo, error) {
	h := d.host(p)
	fi, err := os.Lstat(h)
	if err != nil {
		return nil, fsErr(err)
	}
	info := api.NewFileInfo(p, fi, func() (string, error) { return os.Readlink(h) })
	return &info, nil
}

func (d *dirFiles) Stat(_ context.Context, p string) (*api.FileInfo, error) { return d.info(p) }

func (d *dirFiles) List(_ context.Context, dir string) ([]api.FileInfo, error) {
	entries, err := os.ReadDir(d.host(dir))
	if err != nil {
		return nil, fsErr(err)
	}
	var out []api.FileInfo
	for _, e := range entries {
		info, err := d.info(path.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		out = append(out, *info)
	}
	return out, nil
}

func (d *dirFiles) Open(_ context.Context, p string, off int64) (io.ReadCloser, error) {
	d.opens.Add(1)
	f, err := os.Open(d.host(p))
	if err != nil {
		return nil, fsErr(err)
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func (d *dirFiles) Write(_ context.Context, p string, mode uint32, r io.Reader) error {
	h := d.host(p)
	if fi, err := os.Stat(h); err == nil {
		mode = api.ModeBits(fi.Mode()) // a file written over keeps its mode
	}
	tmp, err := os.CreateTemp(filepath.Dir(h), ".upload-*")
	if err != nil {
		return fsErr(err)
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(api.FileModeOf(mode)); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return fsErr(os.Rename(tmp.Name(), h))
}

func (d *dirFiles) Mkdir(_ context.Context, p string, mode uint32) error {
	return fsErr(os.Mkdir(d.host(p), api.FileModeOf(mode)))
}

func (d *dirFiles) Remove(_ context.Context, p string) error { return fsErr(os.Remove(d.host(p))) }

func (d *dirFiles) Rename(_ context.Context, from, to string, overwrite bool) error {
	if !overwrite {
		if _, err := os.Lstat(d.host(to)); err == nil {
			return errdefs.Exists("%s already exists", to)
		}
	}
	return fsErr(os.Rename(d.host(from), d.host(to)))
}

func (d *dirFiles) Chmod(_ context.Context, p string, mode uint32) error {
	return fsErr(os.Chmod(d.host(p), api.FileModeOf(mode)))
}

const testHome = "/home/u"

var fakeTime = time.Unix(1e9, 0)

// startSFTP serves dirFiles over a net.Pipe and returns a pkg/sftp client
// that pipelines reads and writes.
func startSFTP(t *testing.T) (*sftp.Client, *dirFiles) {
	t.Helper()
	files := &dirFiles{root: t.TempDir()}
	if err := os.MkdirAll(files.host(testHome), 0o755); err != nil {
		t.Fatal(err)
	}
	srv, cli := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeSFTP(ctx, srv, files, testHome) }()
	client, err := sftp.NewClientPipe(cli, cli, sftp.UseConcurrentWrites(true), sftp.UseConcurrentReads(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		client.Close()
		if err := <-done; err != nil {
			t.Errorf("ServeSFTP: %v", err)
		}
		cancel()
		srv.Close()
	})
	return client, files
}

func writeHost(t *testing.T, files *dirFiles, p, content string) {
	t.Helper()
	if err := os.WriteFile(files.host(p), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func fxCode(err error) (uint32, bool) {
	var se *sftp.StatusError
	if !errors.As(err, &se) {
		return 0, false
	}
	return se.Code, true
}

func TestSFTPPutGetLarge(t *testing.T) {
	client, files := startSFTP(t)
	data := make([]byte, 20<<20)
	rand.Read(data)
	want := sha256.Sum256(data)

	f, err := client.Create("big.bin") // relative: in the home directory
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadFrom(bytes.NewReader(data)); err != nil {
		t.Fatalf("ReadFrom: %v", err)
	}
	// The file appears when the handle is closed.
	if _, err := files.Stat(context.Background(), testHome+"/big.bin"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("before close: stat = %v, want not found", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	got, err := os.ReadFile(files.host(testHome + "/big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if sha256.Sum256(got) != want {
		t.Fatal("uploaded content differs")
	}
	if fi, _ := os.Stat(files.host(testHome + "/big.bin")); fi.Mode().Perm() != defaultFileMode {
		t.Errorf("new file mode %v, want %o", fi.Mode().Perm(), defaultFileMode)
	}

	f, err = client.Open(testHome + "/big.bin")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if n, err := f.WriteTo(h); err != nil || n != int64(len(data)) {
		t.Fatalf("WriteTo: %d, %v", n, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("downloaded content differs")
	}
	// One stream serves the pipelined, reordered reads (a reopen or two
	// would be tolerable; one per read would not).
	if n := files.opens.Load(); n > 3 {
		t.Errorf("%d Files.Open calls for one sequential download", n)
	}
}

func TestSFTPReaderAtOrdering(t *testing.T) {
	files := &dirFiles{root: t.TempDir()}
	data := make([]byte, 3*readWindow)
	rand.Read(data)
	if err := os.WriteFile(files.host("/f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	s := &server{ctx: context.Background(), files: files, home: "/", attrs: &attrSniffer{}, writers: map[string]*fileWriter{}}
	ra, err := s.Fileread(sftp.NewRequest("Get", "/f"))
	if err != nil {
		t.Fatal(err)
	}
	defer ra.(io.Closer).Close()

	check := func(off int64, size int, wantOpens int32) {
		t.Helper()
		p := make([]byte, size)
		n, err := ra.ReadAt(p, off)
		wantN := min(size, max(0, len(data)-int(off)))
		if n != wantN || (n < size) != errors.Is(err, io.EOF) || (err != nil && !errors.Is(err, io.EOF)) {
			t.Fatalf("ReadAt(%d, %d) = %d, %v; want %d", off, size, n, err, wantN)
		}
		if n > 0 && !bytes.Equal(p[:n], data[off:off+int64(n)]) {
			t.Fatalf("ReadAt(%d, %d): wrong data", off, size)
		}
		if got := files.opens.Load(); got != wantOpens {
			t.Fatalf("after ReadAt(%d): %d opens, want %d", off, got, wantOpens)
		}
	}
	const k = 32 << 10
	check(0, k, 1)
	check(3*k, k, 1) // ahead: the gap is buffered
	check(k, k, 1)   // late reads are served from the buffer
	check(2*k, k, 1)
	check(readWindow, k, 1)             // still within the window
	check(2*readWindow+10*k, k, 2)      // far ahead: reopen
	check(readWindow+k, k, 3)           // far behind: reopen
	check(int64(len(data))-k/2, k, 4)   // far ahead; short read at the end with EOF
	check(int64(len(data))+5*k, k, 4)   // past the end: EOF without reopening
	check(int64(len(data))-3*k, k, 5)   // behind the buffer: reopen
	check(int64(len(data))-2*k, 2*k, 5) // buffered, up to the end exactly
}

func TestSFTPWriterAtOrdering(t *testing.T) {
	files := &dirFiles{root: t.TempDir()}
	s := &server{ctx: context.Background(), files: files, home: "/", attrs: &attrSniffer{}, writers: map[string]*fileWriter{}}
	open := func(name string) io.WriterAt {
		t.Helper()
		r := sftp.NewRequest("Put", name)
		r.Flags = 0x02 | 0x08 | 0x10 // write, create, truncate
		w, err := s.Filewrite(r)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	write := func(w io.WriterAt, p string, off int64) error {
		_, err := w.WriteAt([]byte(p), off)
		return err
	}

	w := open("/a")
	for _, c := range []struct {
		s   string
		off int64
	}{{"cc", 4}, {"bb", 2}, {"ee", 8}, {"aa", 0}, {"dd", 6}} {
		if err := write(w, c.s, c.off); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.(io.Closer).Close(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(files.host("/a")); string(got) != "aabbccddee" {
		t.Fatalf("content %q", got)
	}

	// Rewriting is refused, and the upload is not committed.
	w = open("/b")
	if err := write(w, "xx", 0); err != nil {
		t.Fatal(err)
	}
	if err := write(w, "yy", 1); !errors.Is(err, sftp.ErrSSHFxOpUnsupported) {
		t.Fatalf("rewrite: %v", err)
	}
	if err := w.(io.Closer).Close(); err == nil {
		t.Fatal("close after a refused write succeeded")
	}
	if _, err := os.Stat(files.host("/b")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("failed upload committed: %v", err)
	}

	// A gap never filled fails the close.
	w = open("/c")
	if err := write(w, "zz", 10); err != nil {
		t.Fatal(err)
	}
	if err := w.(io.Closer).Close(); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Fatalf("close with a gap: %v", err)
	}

	// Pending data is bounded.
	w = open("/d")
	chunk := make([]byte, 1<<20)
	var err error
	for i := int64(1); i <= 17 && err == nil; i++ {
		_, err = w.WriteAt(chunk, i<<20)
	}
	if err == nil || !strings.Contains(err.Error(), "out-of-order") {
		t.Fatalf("unbounded pending writes: %v", err)
	}
	w.(io.Closer).Close()
	if n := s.pending.Load(); n != 0 {
		t.Fatalf("%d pending bytes accounted after close", n)
	}
}

func TestSFTPPutVisibleOnClose(t *testing.T) {
	client, files := startSFTP(t)
	writeHost(t, files, testHome+"/old", "old content")
	if err := os.Chmod(files.host(testHome+"/old"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := client.Create("old") // truncate: replaces the file
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("new")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(files.host(testHome + "/old")); string(got) != "old content" {
		t.Fatalf("before close: %q", got)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(files.host(testHome + "/old"))
	fi, _ := os.Stat(files.host(testHome + "/old"))
	if string(got) != "new" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("after close: %q %v", got, fi.Mode())
	}

	// fsetstat on the open handle (OpenSSH's put -p) applies once written.
	f, err = client.Create("exe")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Chmod(0o750); err != nil {
		t.Fatalf("fchmod: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(files.host(testHome + "/exe")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Fatalf("deferred chmod: %v %v", fi, err)
	}

	// An upload into a missing directory fails at open.
	if _, err := client.Create("nodir/x"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("create in missing dir: %v", err)
	}
}

func TestSFTPWriteOpenRefused(t *testing.T) {
	client, files := startSFTP(t)
	writeHost(t, files, testHome+"/f", "content")
	for _, flags := range []int{os.O_WRONLY, os.O_WRONLY | os.O_APPEND, os.O_RDWR | os.O_CREATE} {
		_, err := client.OpenFile("f", flags)
		if code, ok := fxCode(err); !ok || code != uint32(sftp.ErrSSHFxOpUnsupported) {
			t.Errorf("open flags %#x: %v, want op unsupported", flags, err)
		}
	}
	if got, _ := os.ReadFile(files.host(testHome + "/f")); string(got) != "content" {
		t.Fatalf("file changed: %q", got)
	}
	// An existing empty file can be written without truncating.
	writeHost(t, files, testHome+"/empty", "")
	f, err := client.OpenFile("empty", os.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("x"))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// O_EXCL on an existing file.
	if _, err := client.OpenFile("f", os.O_WRONLY|os.O_CREATE|os.O_EXCL); err == nil {
		t.Error("exclusive create of an existing file succeeded")
	}
	// A directory cannot be opened for reading or writing.
	if _, err := client.Open(testHome); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Errorf("read-open of a directory: %v", err)
	}
	if _, err := client.Create(testHome); err == nil {
		t.Error("write-open of a directory succeeded")
	}
}

func TestSFTPMissingFile(t *testing.T) {
	client, _ := startSFTP(t)
	if _, err := client.Open("missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("open: %v", err)
	}
	if _, err := client.Stat("missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat: %v", err)
	}
	if _, err := client.ReadDir("missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("readdir: %v", err)
	}
}

func TestSFTPListAndStat(t *testing.T) {
	client, files := startSFTP(t)
	writeHost(t, files, testHome+"/a.txt", "hello")
	if err := os.Mkdir(files.host(testHome+"/sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", files.host(testHome+"/link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub", files.host(testHome+"/dirlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("loop", files.host(testHome+"/loop")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(files.host(testHome+"/sub"), 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}

	entries, err := client.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
		st, ok := e.Sys().(*sftp.FileStat)
		if !ok || st.UID != uint32(os.Getuid()) || st.GID != uint32(os.Getgid()) {
			t.Errorf("%s: owner %+v", e.Name(), e.Sys())
		}
		switch e.Name() {
		case "a.txt":
			if e.Size() != 5 || !e.Mode().IsRegular() || e.Mode().Perm() != 0o644 {
				t.Errorf("a.txt: %v %d", e.Mode(), e.Size())
			}
		case "sub":
			if !e.IsDir() || e.Mode()&os.ModeSticky == 0 || e.Mode().Perm() != 0o777 {
				t.Errorf("sub: %v", e.Mode())
			}
		case "link":
			if e.Mode()&os.ModeSymlink == 0 {
				t.Errorf("link listed as %v", e.Mode())
			}
		}
	}
	slices.Sort(names)
	if want := []string{"a.txt", "dirlink", "link", "loop", "sub"}; !slices.Equal(names, want) {
		t.Fatalf("ls: %v, want %v", names, want)
	}

	// Listing a file lists it; listing through a symlink lists its target.
	if l, err := client.ReadDir("a.txt"); err != nil || len(l) != 1 || l[0].Name() != "a.txt" {
		t.Fatalf("ls a file: %v %v", l, err)
	}
	writeHost(t, files, testHome+"/sub/inner", "x")
	if l, err := client.ReadDir("dirlink"); err != nil || len(l) != 1 || l[0].Name() != "inner" {
		t.Fatalf("ls through a link: %v %v", l, err)
	}

	st, err := client.Stat("link")
	if err != nil || !st.Mode().IsRegular() || st.Size() != 5 {
		t.Fatalf("stat link: %v %v", st, err)
	}
	lst, err := client.Lstat("link")
	if err != nil || lst.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("lstat link: %v %v", lst, err)
	}
	if target, err := client.ReadLink("link"); err != nil || target != "a.txt" {
		t.Fatalf("readlink: %q %v", target, err)
	}
	if _, err := client.ReadLink("a.txt"); err == nil {
		t.Fatal("readlink of a file succeeded")
	}
	if _, err := client.Stat("loop"); err == nil || !strings.Contains(err.Error(), "symbolic links") {
		t.Fatalf("stat of a link loop: %v", err)
	}
	// Reading through a symlink.
	f, err := client.Open("link")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(f); err != nil || string(b) != "hello" {
		t.Fatalf("read through link: %q %v", b, err)
	}
	f.Close()

	if wd, err := client.Getwd(); err != nil || wd != testHome {
		t.Fatalf("getwd: %q %v", wd, err)
	}
	if p, err := client.RealPath("sub/../x/./y"); err != nil || p != testHome+"/x/y" {
		t.Fatalf("realpath: %q %v", p, err)
	}
	if p, err := client.RealPath("/etc/../tmp"); err != nil || p != "/tmp" {
		t.Fatalf("realpath: %q %v", p, err)
	}
}

func TestSFTPCommands(t *testing.T) {
	client, files := startSFTP(t)
	writeHost(t, files, testHome+"/a", "A")
	writeHost(t, files, testHome+"/b", "B")

	if err := client.Mkdir("d"); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(files.host(testHome + "/d")); err != nil || !fi.IsDir() || fi.Mode().Perm() != defaultDirMode {
		t.Fatalf("mkdir: %v %v", fi, err)
	}
	if err := client.Mkdir("d"); err == nil {
		t.Fatal("mkdir of an existing directory succeeded")
	}

	// Rename does not replace; posix-rename does.
	err := client.Rename("a", "b")
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("rename onto an existing file: %v", err)
	}
	if err := client.PosixRename("a", "b"); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(files.host(testHome + "/b")); string(got) != "A" {
		t.Fatalf("posix-rename: b = %q", got)
	}
	if err := client.Rename("b", "d/c"); err != nil {
		t.Fatal(err)
	}

	if err := client.Chmod("d/c", 0o600); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(files.host(testHome + "/d/c")); fi.Mode().Perm() != 0o600 {
		t.Fatalf("chmod: %v", fi.Mode())
	}
	for name, err := range map[string]error{
		"chown":    client.Chown("d/c", 0, 0),
		"truncate": client.Truncate("d/c", 0),
		"chtimes":  client.Chtimes("d/c", fakeTime, fakeTime),
		"symlink":  client.Symlink("d/c", "s"),
		"link":     client.Link("d/c", "l"),
	} {
		if code, ok := fxCode(err); !ok || code != uint32(sftp.ErrSSHFxOpUnsupported) {
			t.Errorf("%s: %v, want op unsupported", name, err)
		}
	}

	// rmdir refuses files and non-empty directories; remove refuses
	// directories (pkg/sftp's client.Remove falls back to rmdir, so the
	// remove packet is tested at the handler).
	if err := client.RemoveDirectory("d/c"); err == nil {
		t.Fatal("rmdir of a file succeeded")
	}
	if err := client.RemoveDirectory("d"); err == nil {
		t.Fatal("rmdir of a non-empty directory succeeded")
	}
	s := &server{ctx: context.Background(), files: files, attrs: &attrSniffer{}}
	if err := s.Filecmd(sftp.NewRequest("Remove", testHome+"/d")); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Fatalf("remove of a directory: %v", err)
	}
	if err := client.Remove("d/c"); err != nil {
		t.Fatal(err)
	}
	if err := client.RemoveDirectory("d"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(files.host(testHome + "/d")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("rmdir left %v", err)
	}
	if err := client.Remove("missing"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("remove of a missing file: %v", err)
	}
}

func TestSFTPErrorMapping(t *testing.T) {
	for _, c := range []struct {
		err    error
		os     error
		status error
	}{
		{errdefs.NotFound("x: gone"), os.ErrNotExist, sftp.ErrSSHFxNoSuchFile},
		{errdefs.Denied("x: denied"), os.ErrPermission, sftp.ErrSSHFxPermissionDenied},
		{fmt.Errorf("wrapped: %w", errdefs.Exists("x: exists")), os.ErrExist, sftp.ErrSSHFxFailure},
	} {
		got := mapErr(c.err)
		if got.Error() != c.err.Error() || !errors.Is(got, c.os) || !errors.Is(got, c.status) {
			t.Errorf("mapErr(%v) = %v", c.err, got)
		}
	}
	plain := errors.New("other")
	if mapErr(plain) != plain {
		t.Error("an uncategorized error changed")
	}
}

func TestSFTPSniffModes(t *testing.T) {
	str := func(b []byte, s string) []byte {
		return append(binary.BigEndian.AppendUint32(b, uint32(len(s))), s...)
	}
	packet := func(body []byte) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(body))), body...)
	}
	u32 := binary.BigEndian.AppendUint32
	var stream []byte
	// init, then an open for writing with size+permissions+times
	// attributes, a read-only open, an open without attributes, a mkdir
	// with permissions.
	stream = append(stream, packet(u32([]byte{1}, 3))...)
	open := str(u32([]byte{fxpOpen}, 7), "up.sh")
	open = u32(open, fxfWrite|fxfCreat|fxfTrunc)
	open = u32(open, attrSize|attrPermissions|attrACModTime)
	open = binary.BigEndian.AppendUint64(open, 99)
	open = u32(u32(u32(open, 0o100777), 1), 2)
	stream = append(stream, packet(open)...)
	ro := u32(u32(str(u32([]byte{fxpOpen}, 8), "/r"), 1), 0)
	stream = append(stream, packet(ro)...)
	bare := u32(u32(str(u32([]byte{fxpOpen}, 9), "/x/../bare"), fxfWrite|fxfCreat), 0)
	stream = append(stream, packet(bare)...)
	mk := u32(u32(str(u32([]byte{fxpMkdir}, 10), "dir"), attrPermissions), 0o700)
	stream = append(stream, packet(mk)...)

	// Byte by byte, to cross every boundary.
	a := &attrSniffer{home: "/home/u"}
	for i := range stream {
		a.scan(stream[i : i+1])
	}
	if m, ok := a.take(fxpOpen, "/home/u/up.sh"); !ok || m != 0o100777 {
		t.Errorf("open mode %o %v", m, ok)
	}
	if _, ok := a.take(fxpOpen, "/r"); ok {
		t.Error("a read-only open was recorded")
	}
	if _, ok := a.take(fxpOpen, "/bare"); ok {
		t.Error("an open without permissions gave a mode")
	}
	if m, ok := a.take(fxpMkdir, "/home/u/dir"); !ok || m != 0o700 {
		t.Errorf("mkdir mode %o %v", m, ok)
	}
	if a.n != 0 || len(a.modes) != 0 {
		t.Errorf("%d modes left: %v", a.n, a.modes)
	}

	// All at once, through a server: the mode reaches Files.Write, with
	// the umask.
	files := &dirFiles{root: t.TempDir()}
	os.MkdirAll(files.host("/home/u"), 0o755)
	s := &server{ctx: context.Background(), files: files, home: "/home/u", attrs: &attrSniffer{home: "/home/u"},
		writers: map[string]*fileWriter{}}
	s.attrs.scan(stream)
	r := sftp.NewRequest("Put", "/home/u/up.sh")
	r.Flags = fxfWrite | fxfCreat | fxfTrunc
	w, err := s.Filewrite(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.(io.Closer).Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(files.host("/home/u/up.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("uploaded mode: %v %v", fi, err)
	}
	if err := s.Filecmd(sftp.NewRequest("Mkdir", "/home/u/dir")); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(files.host("/home/u/dir")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("mkdir mode: %v %v", fi, err)
	}
}

func TestSFTPContextEnds(t *testing.T) {
	files := &dirFiles{root: t.TempDir()}
	srv, cli := net.Pipe()
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeSFTP(ctx, srv, files, "/") }()
	client, err := sftp.NewClientPipe(cli, cli)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// An upload in progress when the session ends is not committed.
	f, err := client.Create("/partial")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("ServeSFTP: %v", err)
	}
	if _, err := os.Stat(files.host("/partial")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("interrupted upload committed: %v", err)
	}
}

func TestSFTPConcurrentClients(t *testing.T) {
	// Several uploads and downloads at once in one session.
	client, files := startSFTP(t)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 4 {
		wg.Go(func() {
			data := bytes.Repeat([]byte{byte(i)}, 1<<20+i)
			name := fmt.Sprintf("f%d", i)
			f, err := client.Create(name)
			if err == nil {
				_, err = f.ReadFrom(bytes.NewReader(data))
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
			if err == nil {
				var got []byte
				got, err = os.ReadFile(files.host(testHome + "/" + name))
				if err == nil && !bytes.Equal(got, data) {
					err = fmt.Errorf("%s: content differs", name)
				}
			}
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
