// Package safetar writes and extracts the tar streams of nook's file API
// (directory uploads and downloads, `nook cp`). Extraction is the
// dangerous half: the archive comes from the other side of a trust
// boundary (a client uploading into a sandbox, or a sandbox sending files
// to the host), so every entry is created through an os.Root: no entry
// name, hard link or symlink created earlier in the same archive can make
// a write land outside the target directory, and names that try (any ".."
// element, absolute names) are refused. Names are checked as the archive
// has them, before Options.Top renames their first element; with a Top,
// everything below it is created through an os.Root opened on Top itself,
// so the archive can place nothing beside Top (`nook cp SANDBOX:/path
// DEST` writes DEST and what is under it, nothing else).
//
// The agent uses both halves inside the sandbox; the CLI uses them on the
// host. The package depends only on the standard library.
package safetar

import (
	"archive/tar"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/nookhq/nook/api"
)

// ErrInvalid marks an archive that is malformed or has an entry that is
// not allowed (an unsafe name, a link escaping the target, a file where a
// directory is). Other errors from Extract are the file system's.
var ErrInvalid = errors.New("invalid archive")

type invalidError struct{ msg string }

func (e *invalidError) Error() string { return e.msg }
func (e *invalidError) Unwrap() error { return ErrInvalid }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// Options tune Extract.
type Options struct {
	// Top, if set, replaces the first component of every entry name (and
	// of every hard link target): the top of the copied tree lands under
	// this name, a single file name in the directory. Everything else the
	// archive holds then goes inside Top: nothing is created beside it,
	// and nothing is written through a symlink at Top (one the archive
	// made or one already there). "." puts the tree's contents directly in
	// the directory.
	Top string
	// NoSetID clears setuid and setgid bits, for extracting on the host
	// what a sandbox sent.
	NoSetID bool
	// Owners gives each entry the owner the archive names (the target
	// directory itself its owner and mode too, from a "." entry), as root
	// only can: for a build cache a sandbox's users write. Otherwise
	// entries belong to the extracting user and the target is left as
	// it is.
	Owners bool
}

// maxDeferredDirs bounds the directories whose restrictive modes are
// applied at the end of an extraction (so that their entries can be
// created first); past it, modes are applied at once.
const maxDeferredDirs = 10000

// Extract reads a tar stream from r and creates its entries in dir, which
// must exist. Regular files are written to a temporary name and renamed
// into place, so a reader never sees half a file. Directories, regular
// files, symlinks and hard links are extracted; devices, fifos and other
// special entries are skipped. Owners are restored only with
// Options.Owners: otherwise entries belong to the extracting user. An
// entry named with "..", an absolute name, or one that would be written through a symlink leading out of the target (dir,
// or dir/Top with Options.Top) stops the extraction with ErrInvalid.
func Extract(r io.Reader, dir string, opt Options) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	return ExtractRoot(r, root, opt)
}

// ExtractRoot is Extract into the directory root is opened on (a
// directory the caller resolved inside a tree of its own).
func ExtractRoot(r io.Reader, root *os.Root, opt Options) error {
	if opt.Top != "" && opt.Top != "." && (strings.ContainsRune(opt.Top, '/') || !filepath.IsLocal(opt.Top)) {
		return fmt.Errorf("safetar: top %q is not a single file name", opt.Top)
	}
	x := &extraction{outer: root, top: opt.Top}
	defer x.close()
	src := &trackingReader{r: r}
	tr := tar.NewReader(src)
	type dirMode struct {
		root *os.Root
		name string
		mode os.FileMode
	}
	var deferred []dirMode
	applyDeferred := func() error {
		for i := len(deferred) - 1; i >= 0; i-- {
			if err := deferred[i].root.Chmod(deferred[i].name, deferred[i].mode); err != nil {
				return err
			}
		}
		return nil
	}
	extracted := map[string]bool{} // regular files this archive created, in the inner root
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return applyDeferred()
		}
		if err != nil {
			if src.err != nil {
				return src.err
			}
			return invalidf("not a valid tar stream: %v", err)
		}
		root, name, err := x.resolve(hdr.Name)
		if err != nil {
			return err
		}
		mode := fileMode(hdr.Mode, opt.NoSetID)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name == "." {
				if opt.Owners {
					if err := root.Chmod(name, mode); err != nil {
						return err
					}
					if err := chown(root, name, hdr); err != nil {
						return err
					}
				}
				continue // the target directory itself: otherwise left as it is
			}
			if err := mkdirEntry(root, name); err != nil {
				return err
			}
			if mode.Perm()&0o700 != 0o700 && len(deferred) < maxDeferredDirs {
				deferred = append(deferred, dirMode{root, name, mode})
				mode |= 0o700
			}
			if err := root.Chmod(name, mode); err != nil {
				return err
			}
		case tar.TypeGNUSparse:
			return invalidf("tar entry %q: sparse files are not supported", hdr.Name)
		case tar.TypeReg:
			if isSparse(hdr) {
				// A few bytes could stand for terabytes of holes.
				return invalidf("tar entry %q: sparse files are not supported", hdr.Name)
			}
			if err := fileEntry(root, name, hdr, mode, tr, src); err != nil {
				return err
			}
			if root != x.outer || x.top == "" || x.top == "." {
				extracted[name] = true
			}
		case tar.TypeSymlink:
			if err := replaceable(root, name); err != nil {
				return err
			}
			if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
				return invalidf("tar entry %q: symlink without a valid target", hdr.Name)
			}
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return escapes(hdr.Name, err)
			}
		case tar.TypeLink:
			// Only to a file this archive brought: a link to a file that was
			// already in the target directory would let the archive's sender
			// read it back later through the link. Both ends are inside the
			// target (inside Top when set, never Top itself).
			troot, target, err := x.resolve(hdr.Linkname)
			if err != nil || troot != root || (root == x.outer && x.top != "" && x.top != ".") || !extracted[target] {
				return invalidf("tar entry %q: hard link target %q is not a file earlier in the archive", hdr.Name, hdr.Linkname)
			}
			if err := replaceable(root, name); err != nil {
				return err
			}
			if fi, err := root.Lstat(target); err == nil && fi.IsDir() {
				return invalidf("tar entry %q: hard link to a directory", hdr.Name)
			}
			if err := root.Link(target, name); err != nil {
				return escapes(hdr.Name, err)
			}
			extracted[name] = true
		default:
			// Devices, fifos and other special files are not carried.
			continue
		}
		if opt.Owners && hdr.Typeflag != tar.TypeLink {
			if err := chown(root, name, hdr); err != nil {
				return err
			}
		}
	}
}

// chown gives name the owner hdr names.
func chown(root *os.Root, name string, hdr *tar.Header) error {
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid >= 1<<31 || hdr.Gid >= 1<<31 {
		return invalidf("tar entry %q: owner %d:%d is not valid", hdr.Name, hdr.Uid, hdr.Gid)
	}
	return root.Lchown(name, hdr.Uid, hdr.Gid)
}

// extraction maps entry names to the root they are created in. Without a
// Top (or with "."), that is the target directory's root. With a Top, the
// top entry itself is created in the target directory and everything
// under it in a root opened on Top, so that no name, symlink or hard link
// can reach beside Top.
type extraction struct {
	outer *os.Root
	top   string
	inner *os.Root // opened on top at the first entry under it
}

func (x *extraction) close() {
	if x.inner != nil {
		x.inner.Close()
	}
}

// resolve checks an entry name as the archive has it (before any
// renaming) and returns the root to create it in and its name there.
func (x *extraction) resolve(raw string) (*os.Root, string, error) {
	if raw == "" || strings.IndexByte(raw, 0) >= 0 {
		return nil, "", invalidf("tar entry with an empty or invalid name")
	}
	if strings.HasPrefix(raw, "/") {
		return nil, "", invalidf("tar entry %q: absolute names are not allowed", raw)
	}
	for _, el := range strings.Split(raw, "/") {
		if el == ".." {
			return nil, "", invalidf("tar entry %q: the name leaves the target directory (\"..\" is not allowed in names)", raw)
		}
	}
	if x.top == "" {
		return x.outer, path.Clean(raw), nil
	}
	_, rest, _ := strings.Cut(raw, "/")
	rest = path.Clean("./" + rest)
	if x.top == "." {
		return x.outer, rest, nil
	}
	if rest == "." {
		return x.outer, x.top, nil // the top entry itself
	}
	inner, err := x.openInner(raw)
	if err != nil {
		return nil, "", err
	}
	return inner, rest, nil
}

// openInner opens the root under which every entry below the top goes,
// creating the top directory if the archive did not start with it. A top
// that is a symlink (made by the archive or already there) is refused:
// nothing is written through it.
func (x *extraction) openInner(entry string) (*os.Root, error) {
	if x.inner != nil {
		return x.inner, nil
	}
	fi, err := x.outer.Lstat(x.top)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := x.outer.Mkdir(x.top, 0o755); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	case fi.Mode()&fs.ModeSymlink != 0:
		return nil, invalidf("tar entry %q: %s is a symlink: nothing is written through it", entry, x.top)
	case !fi.IsDir():
		return nil, invalidf("tar entry %q: %s is not a directory", entry, x.top)
	}
	inner, err := x.outer.OpenRoot(x.top)
	if err != nil {
		return nil, err
	}
	// The directory opened must be the one at top, not one a symlink swapped in leads to.
	ifi, err := inner.Stat(".")
	if err == nil {
		fi, err = x.outer.Lstat(x.top)
	}
	if err != nil || !fi.IsDir() || !os.SameFile(fi, ifi) {
		inner.Close()
		return nil, invalidf("tar entry %q: %s changed while it was opened", entry, x.top)
	}
	x.inner = inner
	return inner, nil
}

func isSparse(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

func fileMode(m int64, noSetID bool) os.FileMode {
	bits := uint32(m) & 0o7777
	if noSetID {
		bits &^= 0o6000
	}
	return api.FileModeOf(bits)
}

// escapes turns os.Root's refusal to leave the target into ErrInvalid.
func escapes(entry string, err error) error {
	if err != nil && strings.Contains(err.Error(), "escapes") {
		return invalidf("tar entry %q: the path leaves the target directory through a symlink", entry)
	}
	return err
}

// parents creates the missing parent directories of name.
func parents(root *os.Root, name string) error {
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return escapes(name, err)
		}
	}
	return nil
}

// replaceable makes room for a non-directory entry: missing parents are
// created and an existing non-directory is removed; a directory stays and
// is an error.
func replaceable(root *os.Root, name string) error {
	if err := parents(root, name); err != nil {
		return err
	}
	fi, err := root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return escapes(name, err)
	case fi.IsDir():
		return invalidf("tar entry %q: cannot overwrite a directory with a non-directory", name)
	}
	return escapes(name, root.Remove(name))
}

func mkdirEntry(root *os.Root, name string) error {
	if err := parents(root, name); err != nil {
		return err
	}
	fi, err := root.Lstat(name)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		if err := root.Remove(name); err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return escapes(name, err)
	}
	return escapes(name, root.Mkdir(name, 0o700))
}

func fileEntry(root *os.Root, name string, hdr *tar.Header, mode os.FileMode, r io.Reader, src *trackingReader) error {
	if name == "." {
		return invalidf("tar entry %q: a file cannot replace the target directory", hdr.Name)
	}
	if err := parents(root, name); err != nil {
		return err
	}
	if fi, err := root.Lstat(name); err == nil && fi.IsDir() {
		return invalidf("tar entry %q: cannot overwrite a directory with a file", hdr.Name)
	}
	tmp := path.Join(path.Dir(name), tempName())
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return escapes(hdr.Name, err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			root.Remove(tmp)
		}
	}()
	if _, err := io.Copy(f, r); err != nil {
		if src.err != nil {
			return src.err
		}
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return err // a write error of ours (no space, ...)
		}
		return invalidf("tar entry %q: %v", hdr.Name, err)
	}
	if err := f.Chmod(mode); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if !hdr.ModTime.IsZero() {
		_ = root.Chtimes(tmp, time.Now(), hdr.ModTime)
	}
	if err := root.Rename(tmp, name); err != nil {
		return escapes(hdr.Name, err)
	}
	ok = true
	return nil
}

func tempName() string {
	b := make([]byte, 8)
	rand.Read(b)
	return ".nook-tmp-" + hex.EncodeToString(b)
}

// trackingReader remembers the source's own error, so that a stream cut
// by the sender is not reported as a malformed archive.
type trackingReader struct {
	r   io.Reader
	err error
}

func (t *trackingReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF {
		t.err = err
	}
	return n, err
}

// maxHardlinks bounds the inodes remembered to store hard links once.
const maxHardlinks = 100000

// Write writes a tar of the file or directory at p to w. Entry names
// start with name (the top of the tree); symlinks are stored as links,
// hard links within the tree once, and the walk does not descend into
// other file systems (mount points appear as empty directories). Sockets
// are skipped. A file that shrinks while it is read is padded with zeros
// so that the archive stays well formed.
func Write(w io.Writer, p, name string) error {
	tw := tar.NewWriter(w)
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	wr := &writer{tw: tw, dev: devOf(fi), links: map[inode]string{}, buf: make([]byte, 128<<10)}
	if err := wr.entry(p, name, fi); err != nil {
		return err
	}
	return tw.Close()
}

type inode struct{ dev, ino uint64 }

type writer struct {
	tw    *tar.Writer
	dev   uint64
	links map[inode]string
	buf   []byte
}

func devOf(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev)
	}
	return 0
}

func (wr *writer) entry(p, name string, fi os.FileInfo) error {
	if fi.Mode()&os.ModeSocket != 0 {
		return nil
	}
	var link string
	if fi.Mode()&os.ModeSymlink != 0 {
		var err error
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	hdr.Name = name
	hdr.ModTime = hdr.ModTime.Truncate(time.Second)
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	if fi.IsDir() {
		hdr.Name += "/"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
		key := inode{uint64(st.Dev), uint64(st.Ino)}
		if first, seen := wr.links[key]; seen {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			return wr.tw.WriteHeader(hdr)
		}
		if len(wr.links) < maxHardlinks {
			wr.links[key] = name
		}
	}
	switch {
	case fi.Mode().IsRegular():
		// O_NONBLOCK: a file swapped for a fifo since the lstat must not block the walk.
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := wr.tw.WriteHeader(hdr); err != nil {
			return err
		}
		n, err := io.CopyBuffer(wr.tw, io.LimitReader(onlyReader{f}, hdr.Size), wr.buf)
		if err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		for n < hdr.Size { // the file shrank: keep the archive well formed
			k := min(int64(len(wr.buf)), hdr.Size-n)
			clear(wr.buf[:k])
			if _, err := wr.tw.Write(wr.buf[:k]); err != nil {
				return err
			}
			n += k
		}
		return nil
	case fi.IsDir():
		if err := wr.tw.WriteHeader(hdr); err != nil {
			return err
		}
		if devOf(fi) != wr.dev {
			return nil // a mount point: not descended
		}
		d, err := os.Open(p)
		if err != nil {
			return err
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return fmt.Errorf("read directory %s: %w", p, err)
		}
		sort.Strings(names)
		for _, n := range names {
			cp := filepath.Join(p, n)
			cfi, err := os.Lstat(cp)
			if errors.Is(err, fs.ErrNotExist) {
				continue // removed while we walk
			}
			if err != nil {
				return err
			}
			if err := wr.entry(cp, name+"/"+n, cfi); err != nil {
				return err
			}
		}
		return nil
	default:
		return wr.tw.WriteHeader(hdr)
	}
}

// onlyReader hides a file's WriteTo so the copy goes through our buffer.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }
