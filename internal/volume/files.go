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
	case errors.Is(err, fs.ErrNotExist):
		return errdefs.NotFound("%s: no such file in the volume", p)
	case errors.Is(err, fs.ErrExist):
		return errdefs.Exists("%s: already exists", p)
	case strings.Contains(err.Error(), "path escapes from parent"):
		return errdefs.Denied("%s: leads out of the volume (through a symlink)", p)
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR):
		return errdefs.Invalid("%s: %v", p, err)
	case errors.Is(err, syscall.ENOSPC):
		return errdefs.Invalid("%s: the volume is full (ENOSPC)", p)
	}
	return fmt.Errorf("%s: %w", p, err)
}

// info describes name (found in root at p) without following it.
func info(root *os.Root, p, name string, fi fs.FileInfo) api.FileInfo {
	out := api.FileInfo{Path: p, Name: path.Base(p), Size: fi.Size(), Mode: fmt.Sprintf("%04o", api.ModeBits(fi.Mode())), ModTime: fi.ModTime().UTC()}
	switch {
	case fi.Mode().IsRegular():
		out.Type = api.FileTypeFile
	case fi.IsDir():
		out.Type = api.FileTypeDir
	case fi.Mode()&fs.ModeSymlink != 0:
		out.Type = api.FileTypeSymlink
		out.LinkTarget, _ = root.Readlink(name)
	default:
		out.Type = api.FileTypeOther
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		out.UID, out.GID = int(st.Uid), int(st.Gid)
	}
	return out
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

// List lists directory p (the whole tree below it with recursive), at
// most max entries (truncated says there were more).
func List(root *os.Root, p string, recursive bool, max int) (entries []api.FileInfo, truncated bool, err error) {
	name, err := rel(p)
	if err != nil {
		return nil, false, err
	}
	if max <= 0 || max > MaxListEntries {
		max = MaxListEntries
	}
	fi, err := root.Stat(name)
	if err != nil {
		return nil, false, fileError(p, err)
	}
	if !fi.IsDir() {
		return []api.FileInfo{info(root, path.Clean("/"+p), name, fi)}, false, nil
	}
	stop := errors.New("enough")
	err = fs.WalkDir(root.FS(), name, func(n string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n == name {
			return nil
		}
		if len(entries) == max {
			truncated = true
			return stop
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		entries = append(entries, info(root, "/"+n, n, fi))
		if d.IsDir() && !recursive {
			return fs.SkipDir
		}
		return nil
	})
	if err != nil && err != stop {
		return nil, false, fileError(p, err)
	}
	return entries, truncated, nil
}

// OpenFile opens file p for reading (symlinks followed inside the volume).
func OpenFile(root *os.Root, p string) (*os.File, error) {
	name, err := rel(p)
	if err != nil {
		return nil, err
	}
	return openRegular(root, name, p)
}

// openRegular opens name for reading if it is a regular file. The open
// does not block (a fifo a sandbox put there, or swapped in after a
// check, would wait for a writer for ever); what is not a regular file
// is refused after the open, on the file opened.
func openRegular(root *os.Root, name, p string) (*os.File, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fileError(p, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, errdefs.Invalid("%s: not a regular file", p)
	}
	return f, nil
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
// p's base name ("." for the volume's top): symlinks as symlinks, owners
// and modes as they are, no host account names.
func WriteTar(root *os.Root, p string, w io.Writer) error {
	name, err := rel(p)
	if err != nil {
		return err
	}
	if _, err := root.Lstat(name); err != nil {
		return fileError(p, err)
	}
	tw := tar.NewWriter(w)
	top := path.Base(name)
	n := 0
	err = fs.WalkDir(root.FS(), name, func(cur string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if n++; n > maxTarEntries {
			return fmt.Errorf("more than %d entries", maxTarEntries)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = root.Readlink(cur); err != nil {
				return err
			}
		} else if !fi.Mode().IsRegular() && !fi.IsDir() {
			return nil // devices, fifos, sockets: not carried
		}
		h, err := tar.FileInfoHeader(nameless{fi}, link)
		if err != nil {
			return err
		}
		h.Name = top
		if cur != name {
			h.Name = path.Join(top, strings.TrimPrefix(cur, name+"/"))
			if name == "." {
				h.Name = path.Join(top, cur)
			}
		}
		if fi.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := openRegular(root, cur, cur)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, h.Size)
		return err
	})
	if err != nil {
		return fileError(p, err)
	}
	return tw.Close()
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
