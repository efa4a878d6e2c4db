package layerstore

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/errdefs"
)

// ErrUnsafe marks a layer with an entry that would write outside the
// layer's directory or through a symlink (an invalid argument).
var ErrUnsafe error = &sentinel{"unsafe layer entry", errdefs.ErrInvalidArgument}

// ErrTooLarge marks a layer that makes more than Options.MaxBytes (an
// invalid argument).
var ErrTooLarge error = &sentinel{"layer too large", errdefs.ErrInvalidArgument}

// sentinel is an error of its own that is also of a category.
type sentinel struct {
	msg string
	cat error
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.cat }

// Options tune Unpack.
type Options struct {
	// Lowers are the directories of the layers below this one, topmost
	// first: hard links to files they hold are copied up, and parent
	// directories the tar leaves out take their metadata from them.
	Lowers []string
	// MaxBytes bounds the bytes of file data the layer may write
	// (0: no bound).
	MaxBytes int64
}

// Stats is what Unpack made.
type Stats struct {
	Entries       int   // tar entries applied
	Bytes         int64 // file data written
	Whiteouts     int   // whiteouts and opaque directories
	CopiedUp      int   // hard link targets copied from the lowers
	DroppedXattrs int   // extended attributes not kept
	HighIDs       int   // entries owned by a uid or gid >= 65536 (outside a sandbox's range)
	Skipped       int   // sockets and unknown extended headers
}

const (
	// MaxDepth is the most components an entry's name may have: real
	// images stay far below it, and it bounds the directories one entry
	// makes and the descriptors a removal holds.
	MaxDepth = 128
	// inodeCost is what each entry, and each directory made for one,
	// counts against Options.MaxBytes besides its data.
	inodeCost = 4096

	whPrefix = ".wh."
	whOpaque = ".wh..wh..opq"
	resolve  = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV
)

// Unpack applies the layer tar stream r to dst, an empty directory (see
// the package doc). On error dst is left as it is: the caller removes it.
func Unpack(ctx context.Context, r io.Reader, dst string, opt Options) (Stats, error) {
	root, err := unix.Open(dst, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("open layer directory: %w", err)
	}
	defer unix.Close(root)
	u := &unpacker{root: root, opt: opt, whiteouts: map[string]bool{}}
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return u.st, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return u.st, fmt.Errorf("read layer: %w", err)
		}
		if err := u.entry(hdr, tr); err != nil {
			return u.st, fmt.Errorf("layer entry %q: %w", hdr.Name, err)
		}
		u.st.Entries++
	}
	// Directories' times last: their entries changed them.
	for _, d := range u.dirTimes {
		if err := u.setTimes(d); err != nil {
			return u.st, fmt.Errorf("layer entry %q: %w", d.name, err)
		}
	}
	return u.st, nil
}

type unpacker struct {
	root      int
	opt       Options
	st        Stats
	charged   int64           // against MaxBytes: data, and inodeCost per entry and directory made
	whiteouts map[string]bool // names this layer whited out (a dir made over one is opaque)
	buf       []byte          // file data on its way to disk
	dirTimes  []dirTime
}

type dirTime struct {
	name         string
	ino          uint64 // the directory's inode when its entry was applied
	mtime, atime time.Time
}

// clean returns an entry's name relative to the layer's root: "" for the
// root itself; ErrUnsafe if it climbs out.
func clean(name string) (string, error) {
	n := path.Clean("/" + name)[1:]
	if strings.Contains(name, "\x00") {
		return "", fmt.Errorf("%w: a NUL in the name", ErrUnsafe)
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", fmt.Errorf("%w: the name climbs out with \"..\"", ErrUnsafe)
		}
	}
	if strings.Count(n, "/") >= MaxDepth {
		return "", fmt.Errorf("%w: more than %d levels deep", ErrUnsafe, MaxDepth)
	}
	return n, nil
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader:
		u.st.Skipped++
		return nil
	}
	name, err := clean(hdr.Name)
	if err != nil {
		return err
	}
	if err := u.charge(inodeCost + int64(len(hdr.Linkname))); err != nil {
		return err
	}
	if name == "" { // the root: only its metadata
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("%w: the layer's root is not a directory", ErrUnsafe)
		}
		return u.meta(".", hdr, true)
	}
	dir, base := path.Split(name)
	dir = strings.TrimSuffix(dir, "/")
	if strings.Contains("/"+dir+"/", "/"+whPrefix+whPrefix) { // inside aufs' own (.wh..wh.plnk/)
		u.st.Skipped++
		return nil
	}
	if base == whOpaque {
		pfd, err := u.parent(name)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		u.st.Whiteouts++
		return setXattrAt(pfd, ".", "trusted.overlay.opaque", "y")
	}
	if strings.HasPrefix(base, whPrefix) {
		if strings.HasPrefix(base, whPrefix+whPrefix) { // aufs' own (.wh..wh.plnk, ...)
			u.st.Skipped++
			return nil
		}
		target := base[len(whPrefix):]
		if target == "" || target == "." || target == ".." {
			return fmt.Errorf("%w: a whiteout of %q", ErrUnsafe, target)
		}
		pfd, err := u.parent(name)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		var st unix.Stat_t
		if unix.Fstatat(pfd, target, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			// This layer has the entry: the whiteout is for the lowers
			// only, which a directory of this layer then hides.
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				u.st.Whiteouts++
				return setXattrAt(pfd, target, "trusted.overlay.opaque", "y")
			}
			return nil
		}
		u.st.Whiteouts++
		u.whiteouts[path.Join(dir, target)] = true
		return unix.Mknodat(pfd, target, unix.S_IFCHR, 0) // 0:0, mode 0
	}
	pfd, err := u.parent(name)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	if hdr.Uid >= 65536 || hdr.Gid >= 65536 {
		u.st.HighIDs++
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid >= 1<<31 || hdr.Gid >= 1<<31 {
		return fmt.Errorf("%w: owner %d:%d", ErrUnsafe, hdr.Uid, hdr.Gid)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := removeAt(pfd, base); err != nil {
				return err
			}
		}
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && err != unix.EEXIST {
			return err
		}
		if u.whiteouts[name] {
			if err := setXattrAt(pfd, base, "trusted.overlay.opaque", "y"); err != nil {
				return err
			}
		}
		return u.metaAt(pfd, base, name, hdr, true)
	case tar.TypeReg, tar.TypeGNUSparse:
		if err := replace(pfd, base); err != nil {
			return err
		}
		f, err := u.writeFile(pfd, base, r)
		if err != nil {
			return err
		}
		f.Close()
		return u.metaAt(pfd, base, name, hdr, false)
	case tar.TypeSymlink:
		if err := replace(pfd, base); err != nil {
			return err
		}
		if strings.Contains(hdr.Linkname, "\x00") || hdr.Linkname == "" {
			return fmt.Errorf("%w: symlink target %q", ErrUnsafe, hdr.Linkname)
		}
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return err
		}
		return u.metaAt(pfd, base, name, hdr, false)
	case tar.TypeLink:
		return u.link(pfd, base, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if err := replace(pfd, base); err != nil {
			return err
		}
		mode := uint32(unix.S_IFIFO)
		switch hdr.Typeflag {
		case tar.TypeChar:
			mode = unix.S_IFCHR
		case tar.TypeBlock:
			mode = unix.S_IFBLK
		}
		if err := unix.Mknodat(pfd, base, mode|0o600, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))); err != nil {
			return err
		}
		if mode == unix.S_IFCHR && hdr.Devmajor == 0 && hdr.Devminor == 0 {
			u.whiteouts[name] = true // overlay reads it as one
		}
		return u.metaAt(pfd, base, name, hdr, false)
	default:
		return fmt.Errorf("%w: entry type %q", ErrUnsafe, hdr.Typeflag)
	}
}

// parent opens the directory that holds name, beneath the root and
// through no symlink, creating the missing ones.
func (u *unpacker) parent(name string) (int, error) {
	dir := path.Dir(name)
	if dir == "." {
		return unix.Dup(u.root)
	}
	fd, err := openBeneath(u.root, dir)
	if err == nil {
		return fd, nil
	}
	// Missing parents are made below; a whiteout of this layer in the
	// way (ENOTDIR) becomes a directory there.
	if err != unix.ENOENT && err != unix.ENOTDIR {
		return -1, unsafeResolve(dir, err)
	}
	// Create the missing parents one by one, each through the last.
	cur, err := unix.Dup(u.root)
	if err != nil {
		return -1, err
	}
	walked := ""
	for _, el := range strings.Split(dir, "/") {
		walked = path.Join(walked, el)
		made := false
		if u.whiteouts[walked] {
			// A whiteout of this layer is where a child goes: it becomes
			// the directory, opaque (it hides the lowers' as the whiteout did).
			var st unix.Stat_t
			if unix.Fstatat(cur, el, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
				if err := unix.Unlinkat(cur, el, 0); err != nil {
					unix.Close(cur)
					return -1, err
				}
			}
		}
		if err := u.charge(inodeCost); err != nil {
			unix.Close(cur)
			return -1, err
		}
		if err := unix.Mkdirat(cur, el, 0o755); err == nil {
			made = true
			if u.whiteouts[walked] {
				if err := setXattrAt(cur, el, "trusted.overlay.opaque", "y"); err != nil {
					unix.Close(cur)
					return -1, err
				}
			}
		} else if err != unix.EEXIST {
			unix.Close(cur)
			return -1, err
		}
		next, err := openBeneath(cur, el)
		unix.Close(cur)
		if err != nil {
			return -1, unsafeResolve(walked, err)
		}
		cur = next
		if made {
			u.inheritLower(cur, walked)
		}
	}
	return cur, nil
}

func unsafeResolve(name string, err error) error {
	if err == unix.ELOOP || err == unix.EXDEV || err == unix.ENOTDIR {
		return fmt.Errorf("%w: %s is reached through a symlink or is not a directory", ErrUnsafe, name)
	}
	return err
}

// inheritLower gives a directory the tar left out the owner, mode and
// times of the same directory in the topmost lower that has it.
func (u *unpacker) inheritLower(fd int, name string) {
	for _, l := range u.opt.Lowers {
		lr, err := unix.Open(l, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			continue
		}
		lfd, err := openBeneath(lr, name)
		unix.Close(lr)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		err = unix.Fstat(lfd, &st)
		unix.Close(lfd)
		if err != nil {
			continue
		}
		unix.Fchown(fd, int(st.Uid), int(st.Gid))
		unix.Fchmod(fd, st.Mode&0o7777)
		return
	}
}

// openBeneath opens directory name below dirfd, through no symlink.
func openBeneath(dirfd int, name string) (int, error) {
	return unix.Openat2(dirfd, name, &unix.OpenHow{Flags: unix.O_DIRECTORY | unix.O_RDONLY | unix.O_CLOEXEC, Resolve: resolve})
}

// link makes a hard link base (in pfd) to the layer's hdr.Linkname.
func (u *unpacker) link(pfd int, base string, hdr *tar.Header) error {
	target, err := clean(hdr.Linkname)
	if err != nil || target == "" {
		return fmt.Errorf("%w: hard link to %q", ErrUnsafe, hdr.Linkname)
	}
	tfd, err := u.parent(target)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	tbase := path.Base(target)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err != unix.ENOENT {
			return err
		}
		if err := u.copyUp(tfd, tbase, target); err != nil {
			return err
		}
		u.st.CopiedUp++
	} else if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("%w: hard link to the directory %q", ErrUnsafe, hdr.Linkname)
	}
	if err := replace(pfd, base); err != nil {
		return err
	}
	return unix.Linkat(tfd, tbase, pfd, base, 0)
}

// copyUp copies the regular file name from the lowers, as overlay shows
// it (lowerFile), to tbase in tfd, with its owner, mode and kept xattrs.
func (u *unpacker) copyUp(tfd int, tbase, name string) error {
	src, err := u.lowerFile(name)
	if err != nil {
		return err
	}
	defer src.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(src.Fd()), &st); err != nil {
		return err
	}
	df, err := u.writeFile(tfd, tbase, src)
	if err != nil {
		return err
	}
	defer df.Close()
	// The mode after the owner: a chown clears setuid and setgid.
	if err := unix.Fchown(int(df.Fd()), int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Fchmod(int(df.Fd()), st.Mode&0o7777); err != nil {
		return err
	}
	return copyXattrs(int(src.Fd()), int(df.Fd()))
}

// lowerFile opens, for reading, the file name is in the lowers' merged
// view: the entry of the topmost lower that has one, unless a higher one
// hides it (a whiteout of it or of a parent, a parent that is not a
// directory, an opaque parent). Only a regular file is opened: its type
// is checked on an O_PATH descriptor first, so no device or fifo of a
// lower is ever opened.
func (u *unpacker) lowerFile(name string) (*os.File, error) {
	comps := strings.Split(name, "/")
	for _, l := range u.opt.Lowers {
		fd, hidden, err := lookupLower(l, comps)
		if err != nil {
			return nil, err
		}
		if fd >= 0 {
			defer unix.Close(fd)
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil {
				return nil, err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFREG {
				return nil, fmt.Errorf("%w: hard link to %q, not a regular file below", ErrUnsafe, name)
			}
			rfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, err
			}
			return os.NewFile(uintptr(rfd), name), nil
		}
		if hidden {
			break
		}
	}
	return nil, fmt.Errorf("%w: hard link to %q, which neither this layer nor one below holds", ErrUnsafe, name)
}

// lookupLower walks comps in one lower directory without following a
// symlink: an O_PATH descriptor of the entry if the lower has one, else
// whether it hides what the lowers under it have there.
func lookupLower(lower string, comps []string) (fd int, hidden bool, err error) {
	cur, err := unix.Open(lower, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, false, nil
	}
	defer func() { unix.Close(cur) }()
	opaque := false
	for i, c := range comps {
		var st unix.Stat_t
		if err := unix.Fstatat(cur, c, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if err == unix.ENOENT {
				return -1, opaque, nil
			}
			return -1, false, err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
			return -1, true, nil // a whiteout
		}
		if i == len(comps)-1 {
			fd, err := unix.Openat(cur, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			return fd, false, err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return -1, true, nil
		}
		next, err := unix.Openat(cur, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, false, err
		}
		unix.Close(cur)
		cur = next
		buf := make([]byte, 1)
		if n, err := unix.Fgetxattr(cur, "trusted.overlay.opaque", buf); err == nil && n == 1 && buf[0] == 'y' {
			opaque = true
		}
	}
	return -1, opaque, nil
}

// copyXattrs copies the kept xattrs of a regular file.
func copyXattrs(src, dst int) error {
	buf := make([]byte, 64<<10)
	n, err := unix.Flistxattr(src, buf)
	if err != nil || n == 0 {
		return nil
	}
	val := make([]byte, 64<<10)
	for _, x := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if !keptXattr(x, tar.TypeReg) {
			continue
		}
		m, err := unix.Fgetxattr(src, x, val)
		if err != nil {
			continue
		}
		if err := unix.Fsetxattr(dst, x, val[:m], 0); err != nil {
			return fmt.Errorf("xattr %s: %w", x, err)
		}
	}
	return nil
}

// writebackFrom is the size from which a file's writeback starts as
// soon as it is written.
const writebackFrom = 256 << 10

// writeFile creates base in pfd (it must not exist) with r's data,
// within what MaxBytes leaves, and returns it open.
func (u *unpacker) writeFile(pfd int, base string, r io.Reader) (*os.File, error) {
	fd, err := unix.Openat(pfd, base, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), base)
	limit := int64(-1)
	if u.opt.MaxBytes > 0 {
		limit = u.opt.MaxBytes - u.charged
	}
	if u.buf == nil {
		u.buf = make([]byte, 1<<20)
	}
	n, err := copyLimited(f, r, limit, u.buf)
	u.st.Bytes += n
	u.charged += n
	if err != nil {
		f.Close()
		return nil, err
	}
	if n >= writebackFrom {
		// Start the file's writeback now, beside the rest of the unpack,
		// so that the store's sync before the layer is renamed into
		// place finds little left to write. Only a hint.
		unix.SyncFileRange(fd, 0, 0, unix.SYNC_FILE_RANGE_WRITE)
	}
	return f, nil
}

// charge counts n bytes of what the layer makes against MaxBytes.
func (u *unpacker) charge(n int64) error {
	u.charged += n
	if u.opt.MaxBytes > 0 && u.charged > u.opt.MaxBytes {
		return fmt.Errorf("%w: more than %d bytes of files, entries and directories", ErrTooLarge, u.opt.MaxBytes)
	}
	return nil
}

// replace removes whatever non-directory or directory tree is at base.
func replace(pfd int, base string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return nil
		}
		return err
	}
	return removeAt(pfd, base)
}

// removeAt removes base in pfd and, if it is a directory, what is under
// it, never following a symlink.
func removeAt(pfd int, base string) error {
	err := unix.Unlinkat(pfd, base, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return err
	}
	fd, err := unix.Openat(pfd, base, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), base)
	names, err := d.Readdirnames(-1)
	if err != nil {
		d.Close()
		return err
	}
	for _, n := range names {
		if err := removeAt(fd, n); err != nil {
			d.Close()
			return err
		}
	}
	d.Close()
	return unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR)
}

// meta sets the root's metadata.
func (u *unpacker) meta(name string, hdr *tar.Header, dir bool) error {
	return u.metaAt(u.root, name, "", hdr, dir)
}

// metaAt sets an entry's owner, mode, kept xattrs and times.
func (u *unpacker) metaAt(pfd int, base, name string, hdr *tar.Header, dir bool) error {
	if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeSymlink {
		return unix.UtimesNanoAt(pfd, base, times(hdr), unix.AT_SYMLINK_NOFOLLOW)
	}
	// The mode after the owner: a chown clears setuid and setgid.
	if err := unix.Fchmodat(pfd, base, uint32(hdr.Mode)&0o7777, 0); err != nil {
		return err
	}
	keys := make([]string, 0, len(hdr.PAXRecords))
	for k := range hdr.PAXRecords {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		x, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if !keptXattr(x, hdr.Typeflag) {
			u.st.DroppedXattrs++
			continue
		}
		if err := u.charge(int64(len(x) + len(hdr.PAXRecords[k]))); err != nil {
			return err
		}
		if err := setXattrAt(pfd, base, x, hdr.PAXRecords[k]); err != nil {
			return fmt.Errorf("xattr %s: %w", x, err)
		}
	}
	if dir {
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		u.dirTimes = append(u.dirTimes, dirTime{name: name, ino: st.Ino, mtime: hdr.ModTime, atime: hdr.AccessTime})
		return nil
	}
	return unix.UtimesNanoAt(pfd, base, times(hdr), unix.AT_SYMLINK_NOFOLLOW)
}

// keptXattr: on regular files and directories only (setting one opens
// the entry, and opening a device node is not harmless), user.*, file
// capabilities and POSIX ACLs; never overlay's own.
func keptXattr(x string, typ byte) bool {
	if typ == tar.TypeGNUSparse {
		typ = tar.TypeReg
	}
	if typ != tar.TypeReg && typ != tar.TypeDir {
		return false
	}
	switch {
	case strings.HasPrefix(x, "user.") && !strings.HasPrefix(x, "user.overlay."):
		return true
	case x == "security.capability":
		return typ == tar.TypeReg
	case x == "system.posix_acl_access", x == "system.posix_acl_default":
		return true
	}
	return false
}

// setXattrAt sets an xattr on base in pfd (a file or directory, opened
// without following a symlink).
func setXattrAt(pfd int, base, key, value string) error {
	fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Fsetxattr(fd, key, []byte(value), 0)
}

// setTimes sets a directory's times at the end, through a descriptor,
// if the directory its entry made is still there (a later entry may have
// replaced it).
func (u *unpacker) setTimes(d dirTime) error {
	var fd int
	var err error
	if d.name == "" {
		fd, err = unix.Dup(u.root)
	} else {
		fd, err = openBeneath(u.root, d.name)
	}
	if err == unix.ENOENT || err == unix.ENOTDIR || err == unix.ELOOP {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Ino != d.ino {
		return err
	}
	return unix.UtimesNanoAt(fd, ".", []unix.Timespec{ts(d.atime, d.mtime), ts(d.mtime, d.mtime)}, 0)
}

func times(hdr *tar.Header) []unix.Timespec {
	return []unix.Timespec{ts(hdr.AccessTime, hdr.ModTime), ts(hdr.ModTime, hdr.ModTime)}
}

// ts is t as a Timespec, or fallback when t is unset.
func ts(t, fallback time.Time) unix.Timespec {
	if t.IsZero() {
		t = fallback
	}
	if t.IsZero() {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.NsecToTimespec(t.UnixNano())
}

// copyLimited copies r to w through buf, failing with ErrTooLarge past
// limit bytes (limit < 0: no bound).
func copyLimited(w io.Writer, r io.Reader, limit int64, buf []byte) (int64, error) {
	w = struct{ io.Writer }{w} // buf's size, not a ReadFrom's 32 KiB
	if limit < 0 {
		return io.CopyBuffer(w, r, buf)
	}
	n, err := io.CopyBuffer(w, io.LimitReader(r, limit+1), buf)
	if n > limit {
		return n, ErrTooLarge
	}
	return n, err
}
