package safetar

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

type entry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
}

func mkTar(t testing.TB, entries ...entry) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body))}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// sandbox is a target directory inside a parent that must stay untouched.
func sandbox(t testing.TB) (parent, dir string) {
	parent = t.TempDir()
	dir = filepath.Join(parent, "target")
	os.Mkdir(dir, 0o755)
	os.WriteFile(filepath.Join(parent, "secret"), []byte("host secret"), 0o600)
	return parent, dir
}

// outside lists what is in parent besides the target and the secret.
func outside(t testing.TB, parent string) []string {
	var extra []string
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if e.Name() != "target" && e.Name() != "secret" {
			extra = append(extra, e.Name())
		}
	}
	if b, _ := os.ReadFile(filepath.Join(parent, "secret")); string(b) != "host secret" {
		extra = append(extra, "secret was modified")
	}
	return extra
}

func TestRoundTrip(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(src+"/top/sub", 0o755)
	os.WriteFile(src+"/top/f", []byte("file"), 0o640)
	os.WriteFile(src+"/top/sub/suid", []byte("x"), 0o755)
	os.Chmod(src+"/top/sub/suid", 0o755|os.ModeSetuid)
	os.Symlink("../f", src+"/top/sub/link")
	os.Mkdir(src+"/top/locked", 0o500)
	os.WriteFile(src+"/top/empty", nil, 0o644)
	os.Chmod(src+"/top/locked", 0o500)
	var buf bytes.Buffer
	if err := Write(&buf, src+"/top", "top"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		top, root string
		noSetID   bool
	}{{"", "top", false}, {"renamed", "renamed", true}, {".", ".", false}} {
		_, dir := sandbox(t)
		if err := Extract(bytes.NewReader(buf.Bytes()), dir, Options{Top: tc.top, NoSetID: tc.noSetID}); err != nil {
			t.Fatalf("top %q: %v", tc.top, err)
		}
		out := filepath.Join(dir, tc.root)
		if b, _ := os.ReadFile(out + "/sub/link"); string(b) != "file" {
			t.Errorf("top %q: link reads %q", tc.top, b)
		}
		fi, err := os.Stat(out + "/sub/suid")
		if err != nil {
			t.Fatal(err)
		}
		if want := tc.noSetID; (fi.Mode()&os.ModeSetuid == 0) != want {
			t.Errorf("top %q: suid file mode %v", tc.top, fi.Mode())
		}
		if fi, _ := os.Stat(out + "/locked"); fi == nil || fi.Mode().Perm() != 0o500 {
			t.Errorf("top %q: locked dir %v", tc.top, fi)
		}
		if fi, _ := os.Stat(out + "/empty"); fi == nil || fi.Size() != 0 {
			t.Errorf("top %q: empty file %v", tc.top, fi)
		}
		os.Chmod(out+"/locked", 0o700)
	}
	os.Chmod(src+"/top/locked", 0o700)
}

func TestExtractRefusesEscapes(t *testing.T) {
	cases := map[string][]entry{
		"dotdot":        {{name: "../escaped", typ: tar.TypeReg, body: "x"}},
		"dotdot inside": {{name: "a/../../escaped", typ: tar.TypeReg, body: "x"}},
		"absolute":      {{name: "/escaped", typ: tar.TypeReg, body: "x"}},
		"abs symlink, then through it": {
			{name: "link", link: filepath.Dir(os.TempDir()), typ: tar.TypeSymlink},
			{name: "link/escaped", typ: tar.TypeReg, body: "x"},
		},
		"relative symlink up, then through it": {
			{name: "link", link: "..", typ: tar.TypeSymlink},
			{name: "link/escaped", typ: tar.TypeReg, body: "x"},
		},
		"symlink up, then a dir through it": {
			{name: "link", link: "..", typ: tar.TypeSymlink},
			{name: "link/escaped/", typ: tar.TypeDir},
		},
		"symlink up, then a symlink through it": {
			{name: "link", link: "..", typ: tar.TypeSymlink},
			{name: "link/escaped", link: "x", typ: tar.TypeSymlink},
		},
		"overwrite outside through symlink": {
			{name: "link", link: "../secret", typ: tar.TypeSymlink},
			{name: "link/x", typ: tar.TypeReg, body: "pwned"},
		},
		"hard link up": {{name: "h", link: "../secret", typ: tar.TypeLink}},
		"hard link through a symlink": {
			{name: "link", link: "..", typ: tar.TypeSymlink},
			{name: "h", link: "link/secret", typ: tar.TypeLink},
		},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			parent, dir := sandbox(t)
			err := Extract(bytes.NewReader(mkTar(t, entries...)), dir, Options{})
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v, want ErrInvalid", err)
			}
			if extra := outside(t, parent); len(extra) > 0 {
				t.Errorf("escaped: %v", extra)
			}
			// A symlink that only points out may exist, but nothing was written through it.
			if b, err := os.ReadFile(filepath.Join(dir, "h")); err == nil && string(b) == "host secret" {
				t.Error("hard link to a file outside")
			}
		})
	}
}

func TestExtractInsideSymlinksAndReplacements(t *testing.T) {
	parent, dir := sandbox(t)
	err := Extract(bytes.NewReader(mkTar(t,
		entry{name: "real/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "alias", link: "real", typ: tar.TypeSymlink},
		entry{name: "alias/f", typ: tar.TypeReg, body: "through an inside link"},
		entry{name: "f", typ: tar.TypeReg, body: "one"},
		entry{name: "f", typ: tar.TypeReg, body: "two"},
		entry{name: "./g", typ: tar.TypeReg, body: "dot"},
		entry{name: "noparents/a/b", typ: tar.TypeReg, body: "deep"},
		entry{name: "dev", typ: tar.TypeChar},
	)), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"real/f": "through an inside link", "f": "two", "g": "dot", "noparents/a/b": "deep"} {
		if b, _ := os.ReadFile(filepath.Join(dir, p)); string(b) != want {
			t.Errorf("%s: %q", p, b)
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "dev")); err == nil {
		t.Error("a device entry was created")
	}
	if extra := outside(t, parent); len(extra) > 0 {
		t.Errorf("escaped: %v", extra)
	}
	// A file cannot replace a directory; a directory replaces a file.
	err = Extract(bytes.NewReader(mkTar(t, entry{name: "real", typ: tar.TypeReg, body: "x"})), dir, Options{})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "directory") {
		t.Fatalf("file over a directory: %v", err)
	}
	if err := Extract(bytes.NewReader(mkTar(t, entry{name: "f/", typ: tar.TypeDir})), dir, Options{}); err != nil {
		t.Fatalf("directory over a file: %v", err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "f")); fi == nil || !fi.IsDir() {
		t.Fatal("f is not a directory")
	}
	// No temporary files stay behind.
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if strings.Contains(p, ".nook-tmp-") {
			t.Errorf("temporary file left: %s", p)
		}
		return nil
	})
}

func TestExtractBadStreams(t *testing.T) {
	_, dir := sandbox(t)
	good := mkTar(t, entry{name: "f", typ: tar.TypeReg, body: strings.Repeat("x", 10000)})
	for name, data := range map[string][]byte{
		"garbage":   bytes.Repeat([]byte("garbage!"), 200),
		"truncated": good[:1000],
	} {
		if err := Extract(bytes.NewReader(data), dir, Options{}); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := Extract(bytes.NewReader(nil), dir, Options{}); err != nil {
		t.Errorf("empty stream: %v", err)
	}
	// The source's own error is reported as such.
	srcErr := errors.New("client went away")
	r := &failingReader{data: good[:3000], err: srcErr}
	if err := Extract(r, dir, Options{}); !errors.Is(err, srcErr) {
		t.Errorf("source failure: %v", err)
	}
}

type failingReader struct {
	data []byte
	err  error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if len(f.data) == 0 {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

// FuzzExtract: whatever the archive, Extract does not panic, and after
// an extraction into a directory D inside a parent P nothing in P but D
// was created or changed: with no Top and with "." (D is the target
// directory), and with Top "D" (P is the target directory, as for `nook
// cp SANDBOX:/path DEST`; D already there or not).
func FuzzExtract(f *testing.F) {
	f.Add(mkTar(f, entry{name: "a/b", typ: tar.TypeReg, body: "x"}))
	f.Add(mkTar(f, entry{name: "link", link: "..", typ: tar.TypeSymlink}, entry{name: "link/x", typ: tar.TypeReg, body: "x"}))
	f.Add(mkTar(f, entry{name: "link", link: "/", typ: tar.TypeSymlink}, entry{name: "link/x/", typ: tar.TypeDir}))
	f.Add(mkTar(f, entry{name: "h", link: "../secret", typ: tar.TypeLink}))
	f.Add(mkTar(f, entry{name: "d/", typ: tar.TypeDir, mode: 0o000}, entry{name: "d/f", typ: tar.TypeReg, body: "x"}))
	f.Add(mkTar(f, entry{name: "x/", typ: tar.TypeDir}, entry{name: "x/../.bashrc", typ: tar.TypeReg, body: "x"}))
	f.Add(mkTar(f, entry{name: "x", link: ".", typ: tar.TypeSymlink}, entry{name: "x/.bashrc", typ: tar.TypeReg, body: "x"}))
	f.Add(mkTar(f, entry{name: "x/up", link: "..", typ: tar.TypeSymlink}, entry{name: "x/up/.bashrc", typ: tar.TypeReg, body: "x"}))
	f.Add(mkTar(f, entry{name: "x/f", typ: tar.TypeReg, body: "x"}, entry{name: "x/g", link: "x/f", typ: tar.TypeLink}))
	f.Add(mkTar(f, entry{name: "./", typ: tar.TypeDir, mode: 0o700}, entry{name: "up", link: "..", typ: tar.TypeSymlink}, entry{name: "up/", typ: tar.TypeDir}))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, tc := range []struct {
			top    string
			inD    bool // extract into D (else into P with Top D)
			makeD  bool
			dsName string
			owners bool
		}{
			{"", true, true, "target", false},
			{".", true, true, "target", false},
			{".", true, true, "target", true},
			{"target", false, true, "target", false},
			{"new", false, false, "new", false},
		} {
			parent := t.TempDir()
			os.WriteFile(filepath.Join(parent, "secret"), []byte("host secret"), 0o600)
			d := filepath.Join(parent, tc.dsName)
			if tc.makeD {
				os.Mkdir(d, 0o755)
			}
			dir := parent
			if tc.inD {
				dir = d
			}
			err := Extract(bytes.NewReader(data), dir, Options{Top: tc.top, NoSetID: true, Owners: tc.owners})
			if extra := beside(t, parent, tc.dsName); len(extra) > 0 {
				t.Fatalf("top %q: extraction escaped (%v): %v", tc.top, err, extra)
			}
			filepath.Walk(parent, func(p string, fi os.FileInfo, err error) error {
				if err == nil && fi.IsDir() {
					os.Chmod(p, 0o755) // let TempDir's cleanup remove it
				}
				return nil
			})
		}
	})
}

// A hard link may only point at a file the same archive brought: a link
// to a file already in the target (a secret) would let whoever sent the
// archive read it back later through the link.
func TestExtractRefusesLinksToExistingFiles(t *testing.T) {
	_, dir := sandbox(t)
	if err := os.WriteFile(filepath.Join(dir, "secret"), []byte("key"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Extract(bytes.NewReader(mkTar(t, entry{name: "planted", typ: tar.TypeLink, link: "secret"})), dir, Options{})
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("hard link to an existing file: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "planted")); err == nil {
		t.Fatal("the link was made")
	}
	// A link to a file earlier in the same archive is fine.
	err = Extract(bytes.NewReader(mkTar(t, entry{name: "a", typ: tar.TypeReg, body: "x"}, entry{name: "b", typ: tar.TypeLink, link: "a"})), dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEscapeTarDotDot: `nook cp SANDBOX:/path DEST` extracts what the
// sandbox sends with Top set to DEST's name, in DEST's parent. No entry
// may land beside DEST: not through "..", not through a symlink the
// archive made (DEST itself or one inside it), not through one already
// there.
func TestEscapeTarDotDot(t *testing.T) {
	cases := map[string]struct {
		top      string
		existing func(parent string) // host state before the copy
		entries  []entry
	}{
		"dotdot after the top": {top: "dest", entries: []entry{
			{name: "x/", typ: tar.TypeDir},
			{name: "x/../.bashrc", typ: tar.TypeReg, body: "pwned"},
		}},
		"dotdot deeper": {top: "dest", entries: []entry{
			{name: "x/a/../../.ssh/authorized_keys", typ: tar.TypeReg, body: "pwned"},
		}},
		"dotdot as a directory": {top: "dest", entries: []entry{
			{name: "x/../.git/", typ: tar.TypeDir},
		}},
		"dotdot symlink": {top: "dest", entries: []entry{
			{name: "x/../.bashrc", link: "/tmp/x", typ: tar.TypeSymlink},
		}},
		"dotdot into the contents": {top: ".", entries: []entry{
			{name: "x/../../.bashrc", typ: tar.TypeReg, body: "pwned"},
		}},
		"dotdot without a top": {top: "", entries: []entry{
			{name: "a/../../.bashrc", typ: tar.TypeReg, body: "pwned"},
		}},
		"absolute": {top: "dest", entries: []entry{
			{name: "/x/.bashrc", typ: tar.TypeReg, body: "pwned"},
		}},
		"the top is a symlink to its parent": {top: "dest", entries: []entry{
			{name: "x", link: ".", typ: tar.TypeSymlink},
			{name: "x/.bashrc", typ: tar.TypeReg, body: "pwned"},
		}},
		"the top is a symlink, then a directory through it": {top: "dest", entries: []entry{
			{name: "x", link: ".", typ: tar.TypeSymlink},
			{name: "x/.ssh/", typ: tar.TypeDir},
		}},
		"a symlink inside the top to its parent": {top: "dest", entries: []entry{
			{name: "x/", typ: tar.TypeDir},
			{name: "x/up", link: "..", typ: tar.TypeSymlink},
			{name: "x/up/.bashrc", typ: tar.TypeReg, body: "pwned"},
		}},
		"a symlink inside the top, then a symlink through it": {top: "dest", entries: []entry{
			{name: "x/up", link: "..", typ: tar.TypeSymlink},
			{name: "x/up/.bashrc", link: "/tmp/x", typ: tar.TypeSymlink},
		}},
		"a hard link through a symlink inside the top": {top: "dest", entries: []entry{
			{name: "x/f", typ: tar.TypeReg, body: "x"},
			{name: "x/up", link: "..", typ: tar.TypeSymlink},
			{name: "x/up/.bashrc", link: "x/f", typ: tar.TypeLink},
		}},
		"a hard link beside the top": {top: "dest", entries: []entry{
			{name: "x/f", typ: tar.TypeReg, body: "x"},
			{name: "x/../.bashrc", link: "x/f", typ: tar.TypeLink},
		}},
		"the destination is already a symlink to its parent": {top: "dest",
			existing: func(parent string) { os.Symlink(".", filepath.Join(parent, "dest")) },
			entries:  []entry{{name: "x/.bashrc", typ: tar.TypeReg, body: "pwned"}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			os.WriteFile(filepath.Join(parent, "secret"), []byte("host secret"), 0o600)
			dir := parent
			if tc.top == "" || tc.top == "." {
				// The contents go into DEST itself.
				dir = filepath.Join(parent, "dest")
				os.Mkdir(dir, 0o755)
			}
			if tc.existing != nil {
				tc.existing(parent)
			}
			err := Extract(bytes.NewReader(mkTar(t, tc.entries...)), dir, Options{Top: tc.top, NoSetID: true})
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v, want ErrInvalid", err)
			}
			if extra := beside(t, parent, "dest"); len(extra) > 0 {
				t.Errorf("written beside the destination: %v (error %v)", extra, err)
			}
		})
	}
}

// beside lists what is in parent besides dest and an unchanged secret.
func beside(t testing.TB, parent, dest string) []string {
	var extra []string
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if e.Name() != dest && e.Name() != "secret" {
			extra = append(extra, e.Name())
		}
	}
	if fi, err := os.Lstat(filepath.Join(parent, "secret")); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		extra = append(extra, "secret was replaced")
	} else if b, _ := os.ReadFile(filepath.Join(parent, "secret")); string(b) != "host secret" {
		extra = append(extra, "secret was modified")
	} else if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Getuid() || int(st.Gid) != os.Getgid() {
		extra = append(extra, "secret changed owner")
	}
	if fi, err := os.Lstat(parent); err == nil {
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Getuid() || fi.Mode().Perm() != 0o700 && fi.Mode().Perm() != 0o755 {
			extra = append(extra, "the parent changed owner or mode")
		}
	}
	return extra
}

// With Owners, entries get the owners the archive names, the target
// directory its owner and mode from the "." entry; a symlink keeps its
// own owner (it is not followed); an owner out of range is refused.
func TestExtractOwners(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("giving files owners needs root")
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o1770, Uid: 1000, Gid: 1001},
		{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 1002, Gid: 1003},
		{Name: "d/f", Typeflag: tar.TypeReg, Mode: 0o644, Uid: 1004, Gid: 1005},
		{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../secret", Uid: 1006, Gid: 1007},
	} {
		tw.WriteHeader(h)
	}
	tw.Close()
	parent, dir := sandbox(t)
	if err := Extract(bytes.NewReader(buf.Bytes()), dir, Options{Owners: true, NoSetID: true}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][3]uint32{".": {1000, 1001, 0o1770}, "d": {1002, 1003, 0o755}, "d/f": {1004, 1005, 0o644}, "l": {1006, 1007, 0o777}} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(dir, name), &st); err != nil {
			t.Fatal(err)
		}
		if got := [3]uint32{st.Uid, st.Gid, st.Mode & 0o7777}; got != want {
			t.Errorf("%s: owner and mode %o, want %o", name, got, want)
		}
	}
	if extra := outside(t, parent); len(extra) > 0 {
		t.Fatalf("beside the target: %v", extra)
	}
	for _, bad := range []int{-5, 1 << 31} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Uid: bad})
		tw.Close()
		_, dir := sandbox(t)
		if err := Extract(bytes.NewReader(buf.Bytes()), dir, Options{Owners: true}); !errors.Is(err, ErrInvalid) {
			t.Errorf("owner %d: %v", bad, err)
		}
	}
	// Without Owners, the extracting user owns everything, the target included.
	_, dir = sandbox(t)
	if err := Extract(bytes.NewReader(buf.Bytes()), dir, Options{}); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	syscall.Lstat(filepath.Join(dir, "d/f"), &st)
	if st.Uid != 0 {
		t.Errorf("without Owners d/f has owner %d", st.Uid)
	}
	syscall.Lstat(dir, &st)
	if st.Uid != 0 || st.Mode&0o7777 != 0o755 {
		t.Errorf("without Owners the target is %d %o", st.Uid, st.Mode&0o7777)
	}
}
