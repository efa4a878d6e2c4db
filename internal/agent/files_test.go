package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
)

// These tests run the agent in-process on the host, so paths are host
// paths under a temp dir; inside a sandbox the same code sees the
// sandbox's root (the conformance suite checks that).

func agentCode(err error) string {
	var ae *AgentError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

func writeString(t *testing.T, c *Client, req *FileRequest, data string) *api.FileInfo {
	t.Helper()
	info, err := c.WriteFile(context.Background(), req, strings.NewReader(data))
	if err != nil {
		t.Fatalf("write %s: %v", req.Path, err)
	}
	return info
}

func readAll(t *testing.T, c *Client, path string, off, n int64) (string, error) {
	t.Helper()
	_, rc, err := c.ReadFile(context.Background(), path, off, n)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

func TestFilesWriteReadStat(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	p := filepath.Join(dir, "a", "b", "f.txt")

	// Parents are created only on request.
	_, err := c.WriteFile(ctx, &FileRequest{Path: p}, strings.NewReader("x"))
	if agentCode(err) != CodeNotFound || !strings.Contains(err.Error(), "no such directory") {
		t.Fatalf("write without parents: %v", err)
	}
	mode := uint32(0o640)
	info := writeString(t, c, &FileRequest{Path: p, Parents: true, Mode: &mode}, "hello, world")
	if info.Type != api.FileTypeFile || info.Size != 12 || info.Mode != "0640" || info.Name != "f.txt" {
		t.Fatalf("write: %+v", info)
	}
	if got, err := readAll(t, c, p, 0, 0); err != nil || got != "hello, world" {
		t.Fatalf("read: %q %v", got, err)
	}
	// Ranges.
	if got, err := readAll(t, c, p, 7, 3); err != nil || got != "wor" {
		t.Fatalf("read 7+3: %q %v", got, err)
	}
	if got, err := readAll(t, c, p, 7, 0); err != nil || got != "world" {
		t.Fatalf("read from 7: %q %v", got, err)
	}
	if got, err := readAll(t, c, p, 100, 0); err != nil || got != "" {
		t.Fatalf("read past the end: %q %v", got, err)
	}
	// An overwrite keeps the mode; a 0-byte file round-trips.
	info = writeString(t, c, &FileRequest{Path: p}, "")
	if info.Size != 0 || info.Mode != "0640" {
		t.Fatalf("overwrite: %+v", info)
	}
	if got, err := readAll(t, c, p, 0, 0); err != nil || got != "" {
		t.Fatalf("read empty: %q %v", got, err)
	}
	// Stat: a directory and a symlink (described itself).
	os.Symlink("a/b/f.txt", filepath.Join(dir, "link"))
	st, err := c.Stat(ctx, filepath.Join(dir, "link"))
	if err != nil || st.Type != api.FileTypeSymlink || st.LinkTarget != "a/b/f.txt" {
		t.Fatalf("stat link: %+v %v", st, err)
	}
	// Writing through a symlink writes its target.
	writeString(t, c, &FileRequest{Path: filepath.Join(dir, "link")}, "via link")
	if b, _ := os.ReadFile(p); string(b) != "via link" {
		t.Fatalf("write through a symlink: %q", b)
	}
	if st, _ := c.Stat(ctx, filepath.Join(dir, "link")); st.Type != api.FileTypeSymlink {
		t.Fatalf("the symlink was replaced: %+v", st)
	}
	st, err = c.Stat(ctx, dir+"/a/./b/../b")
	if err != nil || st.Type != api.FileTypeDir || st.Path != dir+"/a/b" {
		t.Fatalf("stat dir: %+v %v", st, err)
	}
	// No temporary files are left behind.
	entries, _ := os.ReadDir(filepath.Join(dir, "a", "b"))
	if len(entries) != 1 {
		t.Fatalf("directory holds %v", entries)
	}
}

func TestFilesBadInput(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644)
	ro := filepath.Join(dir, "ro")
	os.Mkdir(ro, 0o555)

	cases := []struct {
		name string
		err  error
		code string
		msg  string
	}{
		{"stat missing", func() error { _, err := c.Stat(ctx, dir+"/nope"); return err }(), CodeNotFound, "no such file"},
		{"relative path", func() error { _, err := c.Stat(ctx, "etc/passwd"); return err }(), CodeInvalidArgument, "not absolute"},
		{"empty path", func() error { _, err := c.Stat(ctx, ""); return err }(), CodeInvalidArgument, "no path"},
		{"NUL", func() error { _, err := c.Stat(ctx, "/etc\x00/passwd"); return err }(), CodeInvalidArgument, "NUL"},
		{"read a directory", func() error { _, err := readAll(t, c, dir, 0, 0); return err }(), CodeInvalidArgument, "is a directory"},
		{"read missing", func() error { _, err := readAll(t, c, dir+"/nope", 0, 0); return err }(), CodeNotFound, "no such file"},
		{"write a directory", func() error {
			_, err := c.WriteFile(ctx, &FileRequest{Path: dir}, strings.NewReader("x"))
			return err
		}(), CodeInvalidArgument, "is a directory"},
		{"write under a file", func() error {
			_, err := c.WriteFile(ctx, &FileRequest{Path: dir + "/file/x"}, strings.NewReader("x"))
			return err
		}(), CodeInvalidArgument, "not a directory"},
		{"mkdir exists", func() error { _, err := c.Mkdir(ctx, &FileRequest{Path: dir + "/file"}); return err }(), CodeAlreadyExists, "exists"},
		{"mkdir no parent", func() error { _, err := c.Mkdir(ctx, &FileRequest{Path: dir + "/x/y"}); return err }(), CodeNotFound, "parent"},
		{"remove /", c.Remove(ctx, "/", true), CodeInvalidArgument, "refusing"},
		{"remove /.. (is /)", c.Remove(ctx, "/..", true), CodeInvalidArgument, "refusing"},
		{"remove missing", c.Remove(ctx, dir+"/nope", false), CodeNotFound, "no such file"},
		{"remove non-empty", c.Remove(ctx, dir, false), CodeInvalidArgument, "not empty"},
		{"move missing", func() error { _, err := c.Move(ctx, dir+"/nope", dir+"/x", false); return err }(), CodeNotFound, "no such file"},
		{"move into itself", func() error { _, err := c.Move(ctx, dir, dir+"/sub", false); return err }(), CodeInvalidArgument, "into itself"},
		{"chmod missing", func() error { _, err := c.Chmod(ctx, dir+"/nope", 0o644); return err }(), CodeNotFound, "no such file"},
		{"chmod bad mode", func() error { _, err := c.Chmod(ctx, dir+"/file", 0o17777); return err }(), CodeInvalidArgument, "mode"},
		{"list missing", func() error { _, err := c.ListFiles(ctx, &FileRequest{Path: dir + "/nope"}); return err }(), CodeNotFound, "no such file"},
		{"watch missing", func() error { _, err := c.Watch(ctx, dir+"/nope", false); return err }(), CodeNotFound, "no such file"},
		{"tar into a file", func() error { _, err := c.UploadTar(ctx, dir+"/file", false, bytes.NewReader(nil)); return err }(), CodeInvalidArgument, "not a directory"},
		{"negative offset", func() error { _, err := readAll(t, c, dir+"/file", -1, 0); return err }(), CodeInvalidArgument, "offset"},
	}
	if os.Geteuid() != 0 {
		cases = append(cases, struct {
			name string
			err  error
			code string
			msg  string
		}{"write in a read-only dir", func() error {
			_, err := c.WriteFile(ctx, &FileRequest{Path: ro + "/f"}, strings.NewReader("x"))
			return err
		}(), CodePermissionDenied, "permission denied"})
	}
	for _, tc := range cases {
		if agentCode(tc.err) != tc.code || !strings.Contains(tc.err.Error(), tc.msg) {
			t.Errorf("%s: %v (code %q); want %s %q", tc.name, tc.err, agentCode(tc.err), tc.code, tc.msg)
		}
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("agent unhealthy after bad input: %v", err)
	}
}

func TestFilesMkdirRemoveMoveChmod(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	mode := uint32(0o700)
	info, err := c.Mkdir(ctx, &FileRequest{Path: dir + "/x/y/z", Parents: true, Mode: &mode})
	if err != nil || info.Type != api.FileTypeDir || info.Mode != "0700" {
		t.Fatalf("mkdir -p: %+v %v", info, err)
	}
	if _, err := c.Mkdir(ctx, &FileRequest{Path: dir + "/x/y/z", Parents: true}); err != nil {
		t.Fatalf("mkdir -p of an existing directory: %v", err)
	}
	writeString(t, c, &FileRequest{Path: dir + "/x/y/z/f"}, "data")
	// Move: no overwrite by default.
	writeString(t, c, &FileRequest{Path: dir + "/other"}, "other")
	if _, err := c.Move(ctx, dir+"/x/y/z/f", dir+"/other", false); agentCode(err) != CodeAlreadyExists {
		t.Fatalf("move onto an existing file: %v", err)
	}
	info, err = c.Move(ctx, dir+"/x/y/z/f", dir+"/other", true)
	if err != nil || info.Size != 4 {
		t.Fatalf("move with overwrite: %+v %v", info, err)
	}
	if _, err := c.Move(ctx, dir+"/x", dir+"/moved", false); err != nil {
		t.Fatal(err)
	}
	// Across file systems (/dev/shm is a tmpfs) a move copies.
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		shm, err := os.MkdirTemp("/dev/shm", "nook-move-")
		if err == nil {
			defer os.RemoveAll(shm)
			writeString(t, c, &FileRequest{Path: dir + "/moved/y/z/g", Mode: ptr(uint32(0o751))}, "across")
			if _, err := c.Move(ctx, dir+"/moved", shm+"/tree", false); err != nil {
				t.Fatalf("move across file systems: %v", err)
			}
			if b, err := os.ReadFile(shm + "/tree/y/z/g"); err != nil || string(b) != "across" {
				t.Fatalf("after a move across file systems: %q %v", b, err)
			}
			if fi, _ := os.Stat(shm + "/tree/y/z/g"); fi.Mode().Perm() != 0o751 {
				t.Fatalf("mode after copy: %v", fi.Mode())
			}
			if _, err := os.Stat(dir + "/moved"); !os.IsNotExist(err) {
				t.Fatalf("source left after a move: %v", err)
			}
		}
	}
	info, err = c.Chmod(ctx, dir+"/other", 0o4750)
	if err != nil || info.Mode != "4750" {
		t.Fatalf("chmod: %+v %v", info, err)
	}
	if err := c.Remove(ctx, dir+"/other", false); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(dir+"/tree/a/b", 0o755)
	if err := c.Remove(ctx, dir+"/tree", true); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("left: %v", entries)
	}
}

func ptr[T any](v T) *T { return &v }

func TestFilesList(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	for _, p := range []string{"b/2", "b/1", "a", "c/d/e"} {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(dir, p), []byte(p), 0o644)
	}
	os.Symlink("/", filepath.Join(dir, "root-link"))
	list := func(req *FileRequest) ([]string, bool) {
		l, err := c.ListFiles(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		var names []string
		for {
			batch, err := l.Next()
			if err == io.EOF {
				return names, l.Truncated
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range batch {
				names = append(names, strings.TrimPrefix(e.Path, dir+"/"))
			}
		}
	}
	got, trunc := list(&FileRequest{Path: dir})
	if strings.Join(got, " ") != "a b c root-link" || trunc {
		t.Fatalf("list: %v %v", got, trunc)
	}
	got, trunc = list(&FileRequest{Path: dir, Recursive: true})
	if strings.Join(got, " ") != "a b b/1 b/2 c c/d c/d/e root-link" || trunc {
		t.Fatalf("list -r: %v %v", got, trunc)
	}
	got, trunc = list(&FileRequest{Path: dir, Recursive: true, MaxEntries: 8})
	if len(got) != 8 || trunc {
		t.Fatalf("list -r of exactly the cap: %v %v", got, trunc)
	}
	got, trunc = list(&FileRequest{Path: dir, Recursive: true, MaxEntries: 3})
	if len(got) != 3 || !trunc {
		t.Fatalf("list -r capped at 3: %v %v", got, trunc)
	}
	got, _ = list(&FileRequest{Path: dir + "/a"})
	if strings.Join(got, " ") != "a" {
		t.Fatalf("list of a file: %v", got)
	}
	// Many entries arrive in several batches.
	big := filepath.Join(dir, "big")
	os.Mkdir(big, 0o755)
	for i := 0; i < 3000; i++ {
		os.WriteFile(filepath.Join(big, fmt.Sprintf("file-with-a-longish-name-%05d", i)), nil, 0o644)
	}
	got, trunc = list(&FileRequest{Path: big})
	if len(got) != 3000 || trunc || got[0] != "big/file-with-a-longish-name-00000" {
		t.Fatalf("list of 3000: %d %v", len(got), trunc)
	}
}

func TestFilesLargeStreamBoundedMemory(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	const size = 64 << 20
	h := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.Reader, size), h)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	info, err := c.WriteFile(ctx, &FileRequest{Path: dir + "/big"}, src)
	if err != nil || info.Size != size {
		t.Fatalf("write: %+v %v", info, err)
	}
	want := h.Sum(nil)
	_, rc, err := c.ReadFile(ctx, dir+"/big", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	h.Reset()
	n, err := io.Copy(h, rc)
	rc.Close()
	if err != nil || n != size || !bytes.Equal(h.Sum(nil), want) {
		t.Fatalf("read back %d bytes, %v; sha256 match %v", n, err, bytes.Equal(h.Sum(nil), want))
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapInuse) - int64(before.HeapInuse); grown > 32<<20 {
		t.Fatalf("heap grew by %d MiB moving a 64 MiB file", grown>>20)
	}
}

// errAfter yields n bytes, then fails: a client that disconnects mid-upload.
type errAfter struct{ n int }

func (e *errAfter) Read(p []byte) (int, error) {
	if e.n <= 0 {
		return 0, errors.New("client went away")
	}
	k := min(len(p), e.n)
	e.n -= k
	return k, nil
}

func TestFilesAbortedTransfers(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	p := dir + "/f"
	writeString(t, c, &FileRequest{Path: p}, "original")
	_, err := c.WriteFile(ctx, &FileRequest{Path: p}, &errAfter{n: 5 << 20})
	var se *SourceError
	if !errors.As(err, &se) {
		t.Fatalf("aborted upload: %v", err)
	}
	// The file is untouched and no temporary file is left.
	deadline := time.Now().Add(5 * time.Second)
	for {
		entries, _ := os.ReadDir(dir)
		if len(entries) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left after an aborted write: %v", entries)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b, _ := os.ReadFile(p); string(b) != "original" {
		t.Fatalf("aborted write changed the file: %q", b)
	}
	// A reader that stops early releases the agent.
	f, _ := os.Create(dir + "/big")
	f.Truncate(256 << 20)
	f.Close()
	_, rc, err := c.ReadFile(ctx, dir+"/big", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	io.CopyN(io.Discard, rc, 1<<20)
	rc.Close()
	// A context that ends cancels a download.
	cctx, cancel := context.WithCancel(ctx)
	_, rc, err = c.DownloadTar(cctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	io.CopyN(io.Discard, rc, 1<<20)
	cancel()
	if _, err := io.Copy(io.Discard, rc); err == nil {
		t.Fatal("a canceled download ended cleanly")
	}
	rc.Close()
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("agent after aborted transfers: %v", err)
	}
}

func TestFilesTarRoundTrip(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	src := t.TempDir()
	os.MkdirAll(src+"/tree/sub/deeper", 0o755)
	os.WriteFile(src+"/tree/a.txt", []byte("alpha"), 0o600)
	os.WriteFile(src+"/tree/sub/exe", []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(src+"/tree/sub/deeper/empty", nil, 0o644)
	os.Symlink("../a.txt", src+"/tree/sub/link")
	os.Link(src+"/tree/a.txt", src+"/tree/hard")

	_, rc, err := c.DownloadTar(ctx, src+"/tree")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := io.Copy(&buf, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	var names []string
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if want := "tree/ tree/a.txt tree/hard tree/sub/ tree/sub/deeper/ tree/sub/deeper/empty tree/sub/exe tree/sub/link"; strings.Join(names, " ") != want {
		t.Fatalf("tar entries %v", names)
	}
	dst := t.TempDir()
	if _, err := c.UploadTar(ctx, dst+"/new/dir", false, bytes.NewReader(buf.Bytes())); agentCode(err) != CodeNotFound {
		t.Fatalf("upload into a missing dir: %v", err)
	}
	if _, err := c.UploadTar(ctx, dst+"/new/dir", true, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	out := dst + "/new/dir/tree"
	if b, _ := os.ReadFile(out + "/sub/link"); string(b) != "alpha" {
		t.Fatalf("symlink: %q", b)
	}
	if fi, _ := os.Stat(out + "/sub/exe"); fi == nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("mode of exe: %v", fi)
	}
	var a, h syscall.Stat_t
	syscall.Stat(out+"/a.txt", &a)
	syscall.Stat(out+"/hard", &h)
	if a.Ino != h.Ino {
		t.Fatal("hard link not kept")
	}
	// A second upload over the same tree replaces the files.
	if _, err := c.UploadTar(ctx, dst+"/new/dir", false, bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatalf("upload over an existing tree: %v", err)
	}
	// A bad archive is refused with a clear error, and the agent lives on.
	_, err = c.UploadTar(ctx, dst, false, strings.NewReader(strings.Repeat("not a tar ", 200)))
	if agentCode(err) != CodeInvalidArgument || !strings.Contains(err.Error(), "tar") {
		t.Fatalf("garbage upload: %v", err)
	}
	_, err = c.UploadTar(ctx, dst, false, bytes.NewReader(evilTar(t)))
	if agentCode(err) != CodeInvalidArgument {
		t.Fatalf("escaping upload: %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(dst), "escaped")); err == nil {
		t.Fatal("a tar entry escaped the target directory")
	}
}

func evilTar(t *testing.T) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "../escaped", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	return buf.Bytes()
}

func TestFilesWatch(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	w, err := c.Watch(ctx, dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	events := make(chan api.FileEvent, 100)
	go func() {
		for {
			ev, err := w.Next()
			if err != nil {
				close(events)
				return
			}
			events <- ev
		}
	}()
	expect := func(typ, path string) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("watch ended waiting for %s %s", typ, path)
				}
				if ev.Type == typ && ev.Path == path {
					return
				}
			case <-timeout:
				t.Fatalf("no %s event for %s", typ, path)
			}
		}
	}
	os.WriteFile(dir+"/f", []byte("x"), 0o644)
	expect(api.FileEventCreate, dir+"/f")
	expect(api.FileEventWrite, dir+"/f")
	os.Mkdir(dir+"/sub", 0o755)
	expect(api.FileEventCreate, dir+"/sub")
	time.Sleep(100 * time.Millisecond) // the new directory's watch takes hold
	os.WriteFile(dir+"/sub/g", []byte("y"), 0o644)
	expect(api.FileEventCreate, dir+"/sub/g")
	os.Rename(dir+"/f", dir+"/f2")
	expect(api.FileEventRename, dir+"/f")
	expect(api.FileEventCreate, dir+"/f2")
	os.Chmod(dir+"/f2", 0o600)
	expect(api.FileEventChmod, dir+"/f2")
	os.Remove(dir + "/f2")
	expect(api.FileEventRemove, dir+"/f2")
	w.Close()
	// The watch stream ends for the agent too: more watches than the cap
	// can be opened one after the other.
	for i := 0; i < 2*maxWatchStreams; i++ {
		deadline := time.Now().Add(5 * time.Second)
		for {
			w, err := c.Watch(ctx, dir, false)
			if err == nil {
				w.Close()
				break
			}
			if agentCode(err) != CodeResourceExhausted || time.Now().After(deadline) {
				t.Fatalf("watch %d: %v", i, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Past the cap, a watch is refused with a clear error.
	var open []*FileWatch
	defer func() {
		for _, w := range open {
			w.Close()
		}
	}()
	for i := 0; ; i++ {
		w, err := c.Watch(ctx, dir, false)
		if err != nil {
			if agentCode(err) != CodeResourceExhausted || i > maxWatchStreams {
				t.Fatalf("watch %d past the cap: %v", i, err)
			}
			break
		}
		open = append(open, w)
	}
}

func FuzzFileRequest(f *testing.F) {
	f.Add([]byte(`{"op":"read","files":{"path":"/etc/passwd","offset":3,"length":10}}`))
	f.Add([]byte(`{"op":"write","files":{"path":"/root/x","mode":420,"parents":true}}`))
	f.Add([]byte(`{"op":"move","files":{"path":"/a","dest":"/b","overwrite":true}}`))
	f.Add([]byte(`{"op":"chmod","files":{"path":"/a"}}`))
	f.Add([]byte(`{"op":"list","files":{"path":"/","recursive":true,"max_entries":5}}`))
	f.Add([]byte(`{"op":"tar_put","files":{"path":"relative"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeRequest(data)
		if err != nil || r.Files == nil {
			return
		}
		if CheckPath(r.Files.Path) != nil || !strings.HasPrefix(filepath.Clean(r.Files.Path), "/") {
			t.Fatalf("accepted a bad path: %q", r.Files.Path)
		}
		if r.Op == OpMove && CheckPath(r.Files.Dest) != nil {
			t.Fatalf("accepted a bad destination: %q", r.Files.Dest)
		}
		if r.Op == OpChmod && r.Files.Mode == nil || r.Files.Mode != nil && *r.Files.Mode > 0o7777 {
			t.Fatalf("accepted a bad mode: %s", data)
		}
		if r.Files.Offset < 0 || r.Files.Length < 0 || r.Files.MaxEntries < 0 || r.Files.MaxEntries > MaxListEntries {
			t.Fatalf("accepted bad numbers: %s", data)
		}
	})
}

// A write or mkdir with a user gives what it creates, parents included,
// to that user; a file written over keeps its owner; an unknown user is
// refused before anything is made.
func TestFilesOwner(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chown needs root")
	}
	c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	p := filepath.Join(dir, "a", "b", "f.txt")
	writeString(t, c, &FileRequest{Path: p, Parents: true, User: "65534"}, "x")
	for _, q := range []string{filepath.Join(dir, "a"), filepath.Join(dir, "a", "b"), p} {
		var st syscall.Stat_t
		if err := syscall.Lstat(q, &st); err != nil || st.Uid != 65534 {
			t.Fatalf("%s: uid %d %v", q, st.Uid, err)
		}
	}
	var st syscall.Stat_t
	if syscall.Lstat(dir, &st); st.Uid != 0 {
		t.Fatalf("the directory that was there changed owner: %d", st.Uid)
	}
	os.Chown(p, 0, 0)
	writeString(t, c, &FileRequest{Path: p, User: "65534"}, "y")
	if syscall.Lstat(p, &st); st.Uid != 0 {
		t.Fatalf("a file written over took the user: %d", st.Uid)
	}
	if _, err := c.Mkdir(ctx, &FileRequest{Path: filepath.Join(dir, "m", "n"), Parents: true, User: "65534:65534"}); err != nil {
		t.Fatal(err)
	}
	if syscall.Lstat(filepath.Join(dir, "m"), &st); st.Uid != 65534 || st.Gid != 65534 {
		t.Fatalf("mkdir parents: %d:%d", st.Uid, st.Gid)
	}
	if _, err := c.WriteFile(ctx, &FileRequest{Path: filepath.Join(dir, "x", "y"), Parents: true, User: "no-such-user-here"}, strings.NewReader("z")); agentCode(err) != CodeInvalidArgument {
		t.Fatalf("unknown user: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Fatalf("an unknown user's write made its parent: %v", err)
	}
}

// A write's metadata become the file's user.* attributes, which stat and
// list show (bounded); too many are refused before anything is written.
func TestFilesMetadata(t *testing.T) {
	c := startAgent(t)
	ctx := context.Background()
	dir := t.TempDir()
	p := filepath.Join(dir, "m.txt")
	info := writeString(t, c, &FileRequest{Path: p, Metadata: map[string]string{"author": "me", "k": ""}}, "x")
	if info.Metadata["author"] != "me" || len(info.Metadata) != 2 {
		t.Fatalf("write's answer: %+v", info.Metadata)
	}
	if got, err := c.Stat(ctx, p); err != nil || got.Metadata["author"] != "me" {
		t.Fatalf("stat: %+v %v", got, err)
	}
	// Another program's attribute of another namespace is not shown.
	if err := unix.Setxattr(p, "trusted.secret", []byte("no"), 0); err != nil {
		t.Fatal(err)
	}
	got, err := c.Stat(ctx, p)
	if err != nil || len(got.Metadata) != 2 {
		t.Fatalf("stat after a trusted.* attribute: %+v %v", got.Metadata, err)
	}
	many := map[string]string{}
	for i := range maxMetadata + 1 {
		many[fmt.Sprint("k", i)] = "v"
	}
	if _, err := c.WriteFile(ctx, &FileRequest{Path: filepath.Join(dir, "n.txt"), Metadata: many}, strings.NewReader("x")); err == nil {
		t.Fatal("a write with too much metadata was taken")
	}
	if _, err := os.Stat(filepath.Join(dir, "n.txt")); !os.IsNotExist(err) {
		t.Fatalf("a refused write left its file: %v", err)
	}
}
