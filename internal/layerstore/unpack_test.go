package layerstore

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// ent is one tar entry of a test layer.
type ent struct {
	name, link, data string
	typ              byte
	mode             int64
	uid, gid         int
	xattrs           map[string]string
}

func layerTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	mt := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: mt, Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.data))
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(e.data))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// scene is a layer directory beside an "outside" tree the layer must
// never touch.
type scene struct {
	root, layer, outside string
	before               map[string]string
}

func newScene(t testing.TB) *scene {
	t.Helper()
	root := t.TempDir()
	s := &scene{root: root, layer: filepath.Join(root, "layer"), outside: filepath.Join(root, "outside")}
	for _, d := range []string{s.layer, s.outside, filepath.Join(s.outside, "dir")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(s.outside, "file"), []byte("keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s.before = snapshot(t, root, "layer")
	return s
}

// snapshot describes every path under root but skip (type, mode, owner,
// size, content).
func snapshot(t testing.TB, root, skip string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if rel == skip || strings.HasPrefix(rel, skip+"/") {
			return nil
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%s %d:%d", fi.Mode(), st.Uid, st.Gid)
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			desc += " " + string(b)
		}
		out[rel] = desc
		return nil
	})
	return out
}

// untouched fails the test if anything outside the layer changed.
func (s *scene) untouched(t testing.TB) {
	t.Helper()
	after := snapshot(t, s.root, "layer")
	if len(after) != len(s.before) {
		t.Fatalf("outside the layer: %v, was %v", keys(after), keys(s.before))
	}
	for k, v := range s.before {
		if after[k] != v {
			t.Fatalf("outside the layer, %s changed: %q -> %q", k, v, after[k])
		}
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func unpack(t testing.TB, dst string, opt Options, ents ...ent) (Stats, error) {
	t.Helper()
	return Unpack(context.Background(), bytes.NewReader(layerTar(t, ents...)), dst, opt)
}

func TestUnpackTree(t *testing.T) {
	requireRoot(t)
	s := newScene(t)
	st, err := unpack(t, s.layer, Options{},
		ent{name: "./", typ: tar.TypeDir, mode: 0o755},
		ent{name: "/usr/bin/tool", data: "#!/bin/sh\n", mode: 0o4755, uid: 0, gid: 0,
			xattrs: map[string]string{"user.k": "v", "trusted.overlay.redirect": "/etc", "security.selinux": "x"}},
		ent{name: "home/app", typ: tar.TypeDir, mode: 0o700, uid: 1000, gid: 1000},
		ent{name: "home/app/notes", data: "hi\n", mode: 0o600, uid: 1000, gid: 1000},
		ent{name: "usr/bin/alias", typ: tar.TypeSymlink, link: "/usr/bin/tool"},
		ent{name: "usr/bin/hard", typ: tar.TypeLink, link: "usr/bin/tool"},
		ent{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
		ent{name: "high", data: "x", uid: 100000, gid: 100000},
	)
	if err != nil {
		t.Fatal(err)
	}
	s.untouched(t)
	if st.Entries != 8 || st.DroppedXattrs != 2 || st.HighIDs != 1 || st.Bytes != int64(len("#!/bin/sh\nhi\nx")) {
		t.Errorf("stats %+v", st)
	}
	var fst unix.Stat_t
	if err := unix.Lstat(filepath.Join(s.layer, "usr/bin/tool"), &fst); err != nil || fst.Mode&0o7777 != 0o4755 {
		t.Errorf("tool: mode %o, %v (setuid must survive the chown)", fst.Mode&0o7777, err)
	}
	var hst unix.Stat_t
	unix.Lstat(filepath.Join(s.layer, "usr/bin/hard"), &hst)
	if hst.Ino != fst.Ino {
		t.Error("the hard link is not the same inode")
	}
	if v, _ := getXattr(filepath.Join(s.layer, "usr/bin/tool"), "user.k"); v != "v" {
		t.Errorf("user.k = %q", v)
	}
	if _, err := getXattr(filepath.Join(s.layer, "usr/bin/tool"), "trusted.overlay.redirect"); err == nil {
		t.Error("an overlay xattr from the layer was kept")
	}
	if l, _ := os.Readlink(filepath.Join(s.layer, "usr/bin/alias")); l != "/usr/bin/tool" {
		t.Errorf("symlink %q", l)
	}
	var ast unix.Stat_t
	unix.Lstat(filepath.Join(s.layer, "home/app/notes"), &ast)
	if ast.Uid != 1000 || ast.Gid != 1000 || ast.Mode&0o777 != 0o600 {
		t.Errorf("notes: %d:%d %o", ast.Uid, ast.Gid, ast.Mode&0o777)
	}
	var dst unix.Stat_t
	unix.Lstat(filepath.Join(s.layer, "home/app"), &dst)
	if dst.Mode&0o777 != 0o700 || time.Unix(dst.Mtim.Unix()).Year() != 2024 {
		t.Errorf("home/app: %o, mtime %v (directory times are set last)", dst.Mode&0o777, time.Unix(dst.Mtim.Unix()))
	}
	var pst unix.Stat_t
	unix.Lstat(filepath.Join(s.layer, "run/fifo"), &pst)
	if pst.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("fifo: mode %o", pst.Mode)
	}
	// run/ was left out of the tar: made 0755 root.
	var rst unix.Stat_t
	unix.Lstat(filepath.Join(s.layer, "run"), &rst)
	if rst.Mode&0o777 != 0o755 || rst.Uid != 0 {
		t.Errorf("implicit run/: %o %d", rst.Mode&0o777, rst.Uid)
	}
}

func getXattr(p, key string) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, key, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// The kernel is the oracle: two layers unpacked here and mounted as
// overlay lowers show what the image spec says they hold.
func TestWhiteoutsInOverlay(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	l1, l2, mnt := filepath.Join(dir, "l1"), filepath.Join(dir, "l2"), filepath.Join(dir, "mnt")
	for _, d := range []string{l1, l2, mnt} {
		os.Mkdir(d, 0o755)
	}
	if _, err := unpack(t, l1, Options{},
		ent{name: "etc/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "etc/gone", data: "old"},
		ent{name: "etc/kept", data: "kept"},
		ent{name: "opaque/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "opaque/old", data: "old"},
		ent{name: "redo/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "redo/old", data: "old"},
		ent{name: "bin/a", data: "a-data", mode: 0o755},
	); err != nil {
		t.Fatal(err)
	}
	st, err := unpack(t, l2, Options{Lowers: []string{l1}},
		ent{name: "etc/.wh.gone", data: ""},
		ent{name: "opaque/.wh..wh..opq", data: ""},
		ent{name: "opaque/new", data: "new"},
		ent{name: ".wh.redo", data: ""},
		ent{name: "redo/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "redo/fresh", data: "fresh"},
		ent{name: "bin/b", typ: tar.TypeLink, link: "bin/a"},
	)
	if err != nil {
		t.Fatal(err)
	}
	if st.CopiedUp != 1 || st.Whiteouts != 3 {
		t.Errorf("stats %+v", st)
	}
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+l2+":"+l1); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	got := snapshot(t, mnt, "\x00")
	want := map[string]string{
		"etc/kept": "kept", "opaque/new": "new", "redo/fresh": "fresh", "bin/a": "a-data", "bin/b": "a-data",
	}
	for p, content := range want {
		if !strings.HasSuffix(got[p], " "+content) {
			t.Errorf("%s in the merged view: %q, want content %q", p, got[p], content)
		}
	}
	for _, p := range []string{"etc/gone", "opaque/old", "redo/old"} {
		if _, ok := got[p]; ok {
			t.Errorf("%s is in the merged view", p)
		}
	}
}

// Each archive tries to write outside the layer or through a symlink:
// it is refused (ErrUnsafe), or (a name with a leading /, a symlink an
// entry replaces) lands inside; nothing outside changes either way.
func TestEscape(t *testing.T) {
	requireRoot(t)
	for _, c := range []struct {
		name   string
		ents   func(s *scene) []ent
		unsafe bool
	}{
		{"dotdot", func(*scene) []ent { return []ent{{name: "../outside/evil", data: "x"}} }, true},
		{"dotdot inside a name", func(*scene) []ent { return []ent{{name: "a/../../outside/evil", data: "x"}} }, true},
		{"absolute name lands inside", func(*scene) []ent { return []ent{{name: "/outside/file", data: "x"}} }, false},
		{"symlink to / then a child", func(*scene) []ent {
			return []ent{{name: "s", typ: tar.TypeSymlink, link: "/"}, {name: "s/tmp/evil", data: "x"}}
		}, true},
		{"symlink to .. then a child", func(*scene) []ent {
			return []ent{{name: "s", typ: tar.TypeSymlink, link: ".."}, {name: "s/outside/evil", data: "x"}}
		}, true},
		{"symlink to the outside then a child", func(s *scene) []ent {
			return []ent{{name: "s", typ: tar.TypeSymlink, link: s.outside}, {name: "s/evil", data: "x"}}
		}, true},
		{"symlink to the outside then a dir over it", func(s *scene) []ent {
			return []ent{{name: "s", typ: tar.TypeSymlink, link: s.outside}, {name: "s", typ: tar.TypeDir, mode: 0o777}, {name: "s/x", data: "x"}}
		}, false},
		{"symlink to an outside file then a file over it", func(s *scene) []ent {
			return []ent{{name: "f", typ: tar.TypeSymlink, link: filepath.Join(s.outside, "file")}, {name: "f", data: "overwritten"}}
		}, false},
		{"hard link out", func(*scene) []ent { return []ent{{name: "h", typ: tar.TypeLink, link: "../outside/file"}} }, true},
		{"hard link through a symlink", func(s *scene) []ent {
			return []ent{{name: "s", typ: tar.TypeSymlink, link: s.outside}, {name: "h", typ: tar.TypeLink, link: "s/file"}}
		}, true},
		{"hard link to a symlink's target", func(s *scene) []ent {
			return []ent{{name: "s", typ: tar.TypeSymlink, link: filepath.Join(s.outside, "file")}, {name: "h", typ: tar.TypeLink, link: "s"}}
		}, false}, // links the symlink itself
		{"hard link to a directory", func(*scene) []ent {
			return []ent{{name: "d", typ: tar.TypeDir, mode: 0o755}, {name: "h", typ: tar.TypeLink, link: "d"}}
		}, true},
		{"whiteout of ..", func(*scene) []ent { return []ent{{name: "a/.wh...", data: ""}} }, true},
		{"opaque marker below a symlink", func(s *scene) []ent {
			return []ent{{name: "s", typ: tar.TypeSymlink, link: s.outside}, {name: "s/.wh..wh..opq", data: ""}}
		}, true},
		{"whiteout below a symlink", func(s *scene) []ent {
			return []ent{{name: "s", typ: tar.TypeSymlink, link: s.outside}, {name: "s/.wh.file", data: ""}}
		}, true},
		{"hard link below a symlink", func(s *scene) []ent {
			return []ent{{name: "a", data: "a"}, {name: "s", typ: tar.TypeSymlink, link: s.outside}, {name: "s/h", typ: tar.TypeLink, link: "a"}}
		}, true},
		{"device over an outside symlink", func(s *scene) []ent {
			return []ent{{name: "f", typ: tar.TypeSymlink, link: filepath.Join(s.outside, "file")}, {name: "f", typ: tar.TypeFifo}}
		}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newScene(t)
			_, err := unpack(t, s.layer, Options{}, c.ents(s)...)
			if c.unsafe != errors.Is(err, ErrUnsafe) {
				t.Errorf("unsafe %v: err %v", c.unsafe, err)
			}
			if !c.unsafe && err != nil {
				t.Errorf("err %v", err)
			}
			s.untouched(t)
		})
	}
}

// A layer whose files, entries and directories hold more than MaxBytes
// stops with ErrTooLarge: each entry and each directory made for one
// counts inodeCost besides its data, so a few bytes of tar cannot make
// a deep tree of empty directories either.
func TestMaxBytes(t *testing.T) {
	requireRoot(t)
	two := []ent{{name: "a", data: "12345"}, {name: "b", data: "123456"}}
	if _, err := unpack(t, t.TempDir(), Options{MaxBytes: 2*inodeCost + 10}, two...); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err %v, want ErrTooLarge", err)
	}
	if _, err := unpack(t, t.TempDir(), Options{MaxBytes: 2*inodeCost + 11}, two...); err != nil {
		t.Fatalf("at the bound: %v", err)
	}
	deep := strings.Repeat("d/", 100) + "f"
	if _, err := unpack(t, t.TempDir(), Options{MaxBytes: 50 * inodeCost}, ent{name: deep}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("100 implicit directories within 50 inodes' worth: %v", err)
	}
}

// A name deeper than MaxDepth is refused: it bounds what one entry makes
// and what a removal of a tree holds open.
func TestMaxDepth(t *testing.T) {
	requireRoot(t)
	s := newScene(t)
	ok := strings.Repeat("a/", MaxDepth-1) + "f"
	if _, err := unpack(t, s.layer, Options{}, ent{name: ok}, ent{name: "a", data: "replaces the tree"}); err != nil {
		t.Fatalf("%d levels: %v", MaxDepth, err)
	}
	if _, err := unpack(t, t.TempDir(), Options{}, ent{name: "a/" + ok}); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("%d levels: %v, want ErrUnsafe", MaxDepth+1, err)
	}
	s.untouched(t)
}

// FuzzUnpack: whatever the stream, nothing outside the layer changes and
// Unpack returns (no panic).
func FuzzUnpack(f *testing.F) {
	f.Add(layerTar(f, ent{name: "a/b", data: "x"}, ent{name: "a/.wh.c"}, ent{name: "a/.wh..wh..opq"}))
	f.Add(layerTar(f, ent{name: "s", typ: tar.TypeSymlink, link: ".."}, ent{name: "s/x", data: "x"}))
	f.Add(layerTar(f, ent{name: "h", typ: tar.TypeLink, link: "../outside/file"}))
	f.Add(layerTar(f, ent{name: "d", typ: tar.TypeDir, mode: 0o755}, ent{name: "d", data: "x"}, ent{name: "d/x", data: "y"}))
	f.Fuzz(func(t *testing.T, data []byte) {
		if os.Geteuid() != 0 {
			t.Skip("needs root: owners and device nodes")
		}
		s := newScene(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			Unpack(ctx, bytes.NewReader(data), s.layer, Options{MaxBytes: 1 << 20, Lowers: []string{s.outside}})
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			buf := make([]byte, 1<<20)
			panic(fmt.Sprintf("Unpack hung:\n%s", buf[:runtime.Stack(buf, true)]))
		}
		s.untouched(t)
	})
}
