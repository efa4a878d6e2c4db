package volume

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent/safetar"
	"github.com/nookhq/nook/internal/errdefs"
)

// Files of a volume without a sandbox: every operation goes through an
// os.Root opened on the volume's files, so no name, symlink or ".."
// a sandbox left in the volume leads the daemon outside it (a symlink
// out of the volume is an error, one inside it is followed inside it).

// Bounds of what one call gives back.
const (
	MaxListEntries = 100000
	maxTarEntries  = 1 << 20
)

// rel is p (a path in the volume, "/" its top) as a name relative to the root.
func rel(p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", errdefs.Invalid("path %q has a NUL", p)
	}
	r := strings.TrimPrefix(path.Clean("/"+p), "/")
	if r == "" {
		r = "."
	}
	return r, nil
}

// fileError maps an error of the root to a category.
func fileError(p string, err error) error {
	switch {
	case isCategorized(err):
		return err
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.NotFound("%s: no such file in the volume", p)
	case errors.Is(err, fs.ErrExist):
		return errdefs.Exists("%s: already exists", p)
	case strings.Contains(err.Error(), "path escapes from parent"):
		return errdefs.Denied("%s: leads out of the volume (through a symlink)", p)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.ENAMETOOLONG):
		return errdefs.Invalid("%s: %v", p, err)
	case errors.Is(err, syscall.ENOSPC):
		return errdefs.Invalid("%s: the volume is full (ENOSPC)", p)
	}
	return fmt.Errorf("%s: %w", p, err)
}

// isCategorized reports whether err already says its category.
func isCategorized(err error) bool {
	for _, c := range []error{errdefs.ErrInvalidArgument, errdefs.ErrNotFound, errdefs.ErrAlreadyExists, errdefs.ErrPermissionDenied} {
		if errors.Is(err, c) {
			return true
		}
	}
	return false
}

// info describes name (found in dir at p) without following it.
func info(dir *os.Root, p, name string, fi fs.FileInfo) api.FileInfo {
	return api.NewFileInfo(p, fi, func() (string, error) { return dir.Readlink(name) })
}

// Stat describes p in the volume, not following a final symlink.
func Stat(root *os.Root, p string) (api.FileInfo, error) {
	name, err := rel(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	fi, err := root.Lstat(name)
	if err != nil {
		return api.FileInfo{}, fileError(p, err)
	}
	return info(root, path.Clean("/"+p), name, fi), nil
}

// List gives emit directory p's entries (the whole tree below it with
// recursive; p itself if it is not a directory), at most max of them
// (truncated says there were more), as it reads them: a listing is never
// held whole.
func List(root *os.Root, p string, recursive bool, max int, emit func(api.FileInfo) error) (truncated bool, err error) {
	name, err := rel(p)
	if err != nil {
		return false, err
	}
	if max <= 0 || max > MaxListEntries {
		max = MaxListEntries
	}
	top := path.Clean("/" + p)
	fi, err := root.Stat(name)
	if err != nil {
		return false, fileError(p, err)
	}
	if !fi.IsDir() {
		return false, emit(info(root, top, name, fi))
	}
	sub, err := root.OpenRoot(name)
	if err != nil {
		return false, fileError(p, err)
	}
	defer sub.Close()
	n := 0
	err = walkTree(sub, top, 0, func(p string, dir *os.Root, name string, fi fs.FileInfo) (bool, error) {
		if n == max {
			truncated = true
			return false, errStop
		}
		n++
		return recursive, emit(info(dir, p, name, fi))
	})
	if err != nil && err != errStop {
		return false, fileError(p, err)
	}
	return truncated, nil
}

var errStop = errors.New("enough")

// maxDepth bounds how deep a walk of a volume goes.
const maxDepth = 256

// walkTree calls fn for every entry below directory dir (top is its
// path, in the volume or in a tar), depth first, each directory's
// entries in the order it gives them (never read whole, never sorted:
// a sandbox can make a directory of millions of links). A directory is
// entered as an os.Root of its own, so each step costs the same however
// deep it is, only if fn asks and Lstat says it is one, and only if the
// directory opened is that one (not one a sandbox swapped in since).
// Entries gone since they were listed are skipped.
func walkTree(dir *os.Root, top string, depth int, fn func(p string, dir *os.Root, name string, fi fs.FileInfo) (descend bool, err error)) error {
	if depth > maxDepth {
		return errdefs.Invalid("%s: more than %d directories deep", top, maxDepth)
	}
	d, err := dir.Open(".")
	if err != nil {
		return err
	}
	defer d.Close()
	for {
		ents, rerr := d.ReadDir(1024)
		for _, e := range ents {
			name := e.Name()
			fi, err := dir.Lstat(name)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			p := path.Join(top, name)
			descend, err := fn(p, dir, name, fi)
			if err != nil {
				return err
			}
			if !descend || !fi.IsDir() {
				continue
			}
			sub, err := dir.OpenRoot(name)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			if sfi, err := sub.Lstat("."); err != nil || !os.SameFile(fi, sfi) {
				sub.Close()
				continue
			}
			err = walkTree(sub, p, depth+1, fn)
			sub.Close()
			if err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// OpenFile opens file p for reading (symlinks followed inside the volume).
func OpenFile(root *os.Root, p string) (*os.File, error) {
	name, err := rel(p)
	if err != nil {
		return nil, err
	}
	return openRegular(root, name, p)
}

// openRegular opens name for reading if it is a regular file, symlinks
// followed inside the volume (openNoDevice).
func openRegular(root *os.Root, name, p string) (*os.File, error) {
	f, err := openNoDevice(root, name, os.O_RDONLY, true, false)
	switch {
	case errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.EISDIR):
		return nil, errdefs.Invalid("%s: not a regular file", p)
	case err != nil:
		return nil, fileError(p, err)
	}
	return f, nil
}

// openNoDevice opens name if it is a regular file (or, with dirs, a
// directory): never a device, whose open alone may do something on the
// host, nor a fifo, whose open could block (EISDIR or EINVAL instead).
// follow: a final symlink is followed inside the root; otherwise it is
// refused (a vm's kernel follows the volume's symlinks itself). The file
// is first opened O_PATH (which opens nothing but a reference), its type
// checked on that, and then that very file opened for real through
// /proc/self/fd: no name is looked up twice, so nothing a sandbox swaps
// in between is opened.
func openNoDevice(root *os.Root, name string, flag int, follow, dirs bool) (*os.File, error) {
	pathFlag := unix.O_PATH
	if !follow {
		pathFlag |= unix.O_NOFOLLOW
	}
	pf, err := root.OpenFile(name, pathFlag, 0)
	if err != nil {
		return nil, err
	}
	defer pf.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(pf.Fd()), &st); err != nil {
		return nil, err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		if !dirs {
			return nil, syscall.EISDIR
		}
	default:
		return nil, syscall.EINVAL
	}
	return os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", pf.Fd()), flag|syscall.O_NONBLOCK, 0)
}

// Write replaces file p with r's bytes (mode 0644 for a new file), written
// to a temporary name and renamed; parents makes missing directories.
func Write(root *os.Root, p string, r io.Reader, parents bool) (api.FileInfo, error) {
	name, err := rel(p)
	if err != nil {
		return api.FileInfo{}, err
	}
	if name == "." {
		return api.FileInfo{}, errdefs.Invalid("%s: the volume's top is a directory", p)
	}
	if parents {
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return api.FileInfo{}, fileError(p, err)
		}
	}
	tmp := path.Join(path.Dir(name), ".nook-tmp-"+random())
	f, err := root.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return api.FileInfo{}, fileError(p, err)
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		root.Remove(tmp)
		return api.FileInfo{}, fileError(p, err)
	}
	return Stat(root, p)
}

// WriteTar writes p (a file or a tree) to w as a tar whose top entry is
// p's base name ("." for the volume's top): a symlink (the top too) as a
// symlink, owners and modes as they are, no host account names, no
// fifo or device.
func WriteTar(root *os.Root, p string, w io.Writer) error {
	name, err := rel(p)
	if err != nil {
		return err
	}
	fi, err := root.Lstat(name)
	if err != nil {
		return fileError(p, err)
	}
	tw := tar.NewWriter(w)
	top := path.Base(name)
	if err := tarEntry(tw, root, name, top, fi); err != nil {
		return fileError(p, err)
	}
	if fi.IsDir() {
		sub, err := root.OpenRoot(name)
		if err != nil {
			return fileError(p, err)
		}
		defer sub.Close()
		n := 0
		err = walkTree(sub, top, 0, func(tp string, dir *os.Root, name string, fi fs.FileInfo) (bool, error) {
			if n++; n > maxTarEntries {
				return false, errdefs.Invalid("%s: more than %d entries", p, maxTarEntries)
			}
			return true, tarEntry(tw, dir, name, tp, fi)
		})
		if err != nil {
			return fileError(p, err)
		}
	}
	return tw.Close()
}

// tarEntry writes name (in dir, Lstat fi) to tw as tp.
func tarEntry(tw *tar.Writer, dir *os.Root, name, tp string, fi fs.FileInfo) error {
	link := ""
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		var err error
		if link, err = dir.Readlink(name); err != nil {
			return err
		}
	case fi.IsDir(), fi.Mode().IsRegular():
	default:
		return nil // fifos, devices, sockets: not carried
	}
	h, err := tar.FileInfoHeader(nameless{fi}, link)
	if err != nil {
		return err
	}
	h.Name = tp
	if fi.IsDir() {
		h.Name += "/"
	}
	if !fi.Mode().IsRegular() {
		return tw.WriteHeader(h)
	}
	f, err := openRegular(dir, name, tp)
	if err != nil {
		return err
	}
	defer f.Close()
	if ofi, err := f.Stat(); err != nil || !os.SameFile(fi, ofi) {
		return errdefs.Invalid("%s changed while it was read", tp)
	}
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err = io.CopyN(tw, f, h.Size)
	return err
}

// nameless is a file's info with no owner names (tar.FileInfoNames).
type nameless struct{ fs.FileInfo }

func (nameless) Uname() (string, error) { return "", nil }
func (nameless) Gname() (string, error) { return "", nil }

// ReadTar extracts a tar from r into directory dir of the volume (made,
// with its parents, if parents): nothing lands outside dir, setuid and
// setgid bits are dropped, files belong to root (the volume's root in a
// sandbox).
func ReadTar(root *os.Root, dir string, r io.Reader, parents bool) (api.FileInfo, error) {
	name, err := rel(dir)
	if err != nil {
		return api.FileInfo{}, err
	}
	if parents {
		if err := root.MkdirAll(name, 0o755); err != nil {
			return api.FileInfo{}, fileError(dir, err)
		}
	}
	sub, err := root.OpenRoot(name)
	if err != nil {
		return api.FileInfo{}, fileError(dir, err)
	}
	defer sub.Close()
	if err := safetar.ExtractRoot(r, sub, safetar.Options{NoSetID: true}); err != nil {
		if errors.Is(err, safetar.ErrInvalid) {
			return api.FileInfo{}, errdefs.Invalid("%v", err)
		}
		return api.FileInfo{}, fileError(dir, err)
	}
	return Stat(root, dir)
}
