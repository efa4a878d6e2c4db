package layerstore

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Merge makes dst (an empty directory) the merged view of layers (their
// directories, bottom first), as an overlay mount of them would show
// it: whiteouts remove what is below them, opaque directories hide the
// lower ones' contents, a directory's metadata is its topmost layer's.
// Every file, symlink and node is a hard link to the layer's own inode
// (layers never change once stored, and neither does what Merge makes),
// so a merged root costs its directories and no file data; where the
// kernel refuses a link (another filesystem, too many links) the file
// is copied.
//
// The layers are the store's, made by Unpack; dst is written through
// descriptors opened below it without following symlinks (RESOLVE_BENEATH
// | RESOLVE_NO_SYMLINKS), so that a symlink one layer left where a later
// layer has a directory is replaced by that directory, as overlay shows
// it, and never followed.
func Merge(dst string, layers []string) error {
	root, err := unix.Open(dst, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("merge layers: %w", err)
	}
	defer unix.Close(root)
	m := &merger{root: root}
	defer m.closeFDs()
	for _, l := range layers {
		if err := filepath.WalkDir(l, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(l, p)
			if err != nil {
				return err
			}
			return m.entry(p, rel, d)
		}); err != nil {
			return fmt.Errorf("merge layer %s: %w", l, err)
		}
	}
	// Directory times last: their entries moved them. The topmost
	// layer's times win, as its metadata does.
	for rel, src := range m.dirs {
		if err := m.copyTimes(rel, src); err != nil {
			return fmt.Errorf("merge layers: times of %s: %w", rel, err)
		}
	}
	return nil
}

type merger struct {
	root int
	dirs map[string]string // merged directory -> the layer directory whose metadata it has
	// fds caches descriptors of merged directories by path (a walk
	// visits a directory's entries together): opening each entry's
	// parent anew cost most of a merge. A removal drops what it removed.
	fds map[string]int
}

// maxCachedFDs bounds the descriptors a merge keeps open.
const maxCachedFDs = 256

// parent returns a descriptor of the merged directory dir, opened below
// the root through no symlink; the merger owns it.
func (m *merger) parent(dir string) (int, error) {
	if fd, ok := m.fds[dir]; ok {
		return fd, nil
	}
	fd, err := openBeneath(m.root, dir)
	if err != nil {
		return -1, err
	}
	if m.fds == nil || len(m.fds) >= maxCachedFDs {
		m.closeFDs()
		m.fds = map[string]int{}
	}
	m.fds[dir] = fd
	return fd, nil
}

// forgetFDs closes the cached descriptors of rel and what is below it
// (about to be removed or replaced).
func (m *merger) forgetFDs(rel string) {
	for k, fd := range m.fds {
		if k == rel || strings.HasPrefix(k, rel+"/") {
			unix.Close(fd)
			delete(m.fds, k)
		}
	}
}

func (m *merger) closeFDs() {
	for _, fd := range m.fds {
		unix.Close(fd)
	}
	m.fds = nil
}

// entry applies one entry of a layer (at path src, rel below the layer).
func (m *merger) entry(src, rel string, d fs.DirEntry) error {
	if m.dirs == nil {
		m.dirs = map[string]string{}
	}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	if rel == "." {
		m.dirs["."] = src
		return copyMeta(src, m.root, "", &st, true, false)
	}
	pfd, err := m.parent(filepath.Dir(rel))
	if err != nil {
		return fmt.Errorf("%s: parent: %w", rel, err)
	}
	base := filepath.Base(rel)
	isWhiteout := st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
	var cur unix.Stat_t
	exists := unix.Fstatat(pfd, base, &cur, unix.AT_SYMLINK_NOFOLLOW) == nil
	switch {
	case isWhiteout:
		delete(m.dirs, rel)
		if exists && cur.Mode&unix.S_IFMT == unix.S_IFDIR {
			m.forgetFDs(rel)
		}
		return removeAt(pfd, base)
	case d.IsDir():
		opaque := false
		buf := make([]byte, 1)
		if n, err := unix.Lgetxattr(src, "trusted.overlay.opaque", buf); err == nil && n == 1 && buf[0] == 'y' {
			opaque = true
		}
		if exists && (cur.Mode&unix.S_IFMT != unix.S_IFDIR || opaque) {
			m.forgetFDs(rel)
			if err := removeAt(pfd, base); err != nil {
				return err
			}
			exists = false
		}
		if !exists {
			if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
				return err
			}
		}
		m.dirs[rel] = src
		return copyMeta(src, pfd, base, &st, true, !exists)
	}
	if exists {
		delete(m.dirs, rel)
		if cur.Mode&unix.S_IFMT == unix.S_IFDIR {
			m.forgetFDs(rel)
		}
		if err := removeAt(pfd, base); err != nil {
			return err
		}
	}
	err = unix.Linkat(unix.AT_FDCWD, src, pfd, base, 0)
	if err == unix.EXDEV || err == unix.EMLINK {
		return copyEntry(src, pfd, base, &st)
	}
	return err
}

// copyTimes gives the merged directory rel the times of src, the layer
// directory whose metadata it has. One a later layer removed (a
// whiteout, an opaque or non-directory replacement of a parent) is
// skipped: dirs keeps the entries below a removed directory, and looking
// them up here costs less than forgetting them at each removal.
func (m *merger) copyTimes(rel, src string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	var fd int
	var err error
	if rel == "." {
		fd, err = unix.Dup(m.root)
	} else {
		fd, err = openBeneath(m.root, rel)
	}
	if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.UtimesNanoAt(fd, ".", []unix.Timespec{st.Atim, st.Mtim}, 0)
}

// copyMeta gives base in pfd (base "": pfd itself) src's owner, mode and
// kept xattrs.
func copyMeta(src string, pfd int, base string, st *unix.Stat_t, dir, fresh bool) error {
	fd := pfd
	if base != "" {
		var err error
		if fd, err = unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0); err != nil {
			return err
		}
		defer unix.Close(fd)
	}
	if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, st.Mode&0o7777); err != nil {
		return err
	}
	typ := byte(tar.TypeReg)
	if dir {
		typ = tar.TypeDir
	}
	return copyKeptXattrs(src, fd, typ, fresh)
}

// copyKeptXattrs makes the xattrs Unpack keeps (never overlay's own)
// on the descriptor dst those of the path src: copied, and the kept
// ones src lacks removed (a directory a lower layer made first shows
// only the upper layer's, as overlay shows them).
func copyKeptXattrs(src string, dst int, typ byte, fresh bool) error {
	want := map[string][]byte{}
	names, err := listXattrs(func(b []byte) (int, error) { return unix.Llistxattr(src, b) })
	if err != nil {
		return fmt.Errorf("list xattrs: %w", err)
	}
	for _, x := range names {
		if !keptXattr(x, typ) {
			continue
		}
		v, err := lgetxattrAll(src, x)
		if err != nil {
			return fmt.Errorf("xattr %s: %w", x, err)
		}
		want[x] = v
	}
	var have []string
	if !fresh { // a directory just made has none of its own
		if have, err = listXattrs(func(b []byte) (int, error) { return unix.Flistxattr(dst, b) }); err != nil {
			return fmt.Errorf("list xattrs: %w", err)
		}
	}
	for _, x := range have {
		if _, ok := want[x]; !ok && keptXattr(x, typ) {
			if err := unix.Fremovexattr(dst, x); err != nil && err != unix.ENODATA {
				return fmt.Errorf("xattr %s: %w", x, err)
			}
		}
	}
	for x, v := range want {
		if err := unix.Fsetxattr(dst, x, v, 0); err != nil {
			return fmt.Errorf("xattr %s: %w", x, err)
		}
	}
	return nil
}

// listXattrs lists names through list, sized by a first call.
func listXattrs(list func([]byte) (int, error)) ([]string, error) {
	for range 4 {
		n, err := list(nil)
		if err != nil || n == 0 {
			if err == unix.ENOTSUP {
				return nil, nil
			}
			return nil, err
		}
		buf := make([]byte, n)
		n, err = list(buf)
		if err == unix.ERANGE {
			continue // grew meanwhile
		}
		if err != nil {
			return nil, err
		}
		var out []string
		for _, x := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
			if x != "" {
				out = append(out, x)
			}
		}
		return out, nil
	}
	return nil, unix.ERANGE
}

// lgetxattrAll reads an xattr of the path p, whatever its size.
func lgetxattrAll(p, x string) ([]byte, error) {
	for range 4 {
		n, err := unix.Lgetxattr(p, x, nil)
		if err != nil {
			return nil, err
		}
		buf := make([]byte, n)
		n, err = unix.Lgetxattr(p, x, buf)
		if err == unix.ERANGE {
			continue
		}
		return buf[:n], err
	}
	return nil, unix.ERANGE
}

// copyEntry copies a non-directory src to base in pfd, where a hard link
// cannot be made.
func copyEntry(src string, pfd int, base string, st *unix.Stat_t) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(target, pfd, base); err != nil {
			return err
		}
		if err := unix.Fchownat(pfd, base, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return unix.UtimesNanoAt(pfd, base, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
	case unix.S_IFREG:
	default: // devices and fifos: made, never opened
		if err := unix.Mknodat(pfd, base, st.Mode, int(st.Rdev)); err != nil {
			return err
		}
		if err := unix.Fchownat(pfd, base, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		if err := unix.Fchmodat(pfd, base, st.Mode&0o7777, 0); err != nil { // mknod applied the umask
			return err
		}
		return unix.UtimesNanoAt(pfd, base, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
	}
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	fd, err := unix.Openat(pfd, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(fd), base)
	defer out.Close()
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	if err := copyMeta(src, fd, "", st, false, true); err != nil {
		return err
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), []unix.Timespec{st.Atim, st.Mtim}, 0)
}
