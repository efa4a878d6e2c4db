package container

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/fsutil"
)

// A container's disk is an overlay: the template's rootfs at the bottom,
// then the layers of the snapshots it was rolled back or forked to, then
// its own upper directory, where every write lands.
//
// A snapshot freezes the container and copies its upper directory, as it
// is (whiteouts and overlay xattrs included), into a new read-only layer.
// The host's filesystem has no reflinks, so the copy is made cheap the
// other way: a file unchanged since the sandbox's previous snapshot is a
// hard link to that snapshot's copy (layers never change once written, so
// sharing their inodes is safe). A chain of snapshots of a sandbox that
// changes 10 MB between each costs those 10 MB each, not a copy of
// everything so far.

// fileKey tells whether a file in the upper directory changed since a
// snapshot copied it. Every change to a file's data or metadata moves its
// ctime, which no process can set; a write through a shared mapping does
// too, on its first write to a page since that page was last written back,
// and every snapshot syncs the filesystem while the container is frozen,
// before it looks at a file (see Snapshot).
type fileKey struct {
	Ino   uint64 `json:"ino"`
	Ctime int64  `json:"ctime"`
	Size  int64  `json:"size"`
	Mode  uint32 `json:"mode"`
	UID   uint32 `json:"uid"`
	GID   uint32 `json:"gid"`
	// Recent: changed so close to the snapshot that a change after the
	// thaw could keep its ctime (the kernel's coarse clock); shared only
	// if its content and xattrs are still the same.
	Recent bool `json:"recent,omitempty"`
}

func (k fileKey) same(o fileKey) bool {
	return k.Ino == o.Ino && k.Ctime == o.Ctime && k.Size == o.Size && k.Mode == o.Mode && k.UID == o.UID && k.GID == o.GID
}

// manifest lists, by path in the upper directory, the files a snapshot
// copied and can share with the next snapshot of the same upper directory.
type manifest struct {
	Snapshot string             `json:"snapshot"`
	Files    map[string]fileKey `json:"files"`
}

// ctimeSlack: a file whose ctime is this close to the moment it was looked
// at could change again within the same tick of the kernel's coarse clock,
// keeping its ctime. Such a file is shared with the next snapshot only if
// its content compares equal (up to maxCompare; bigger ones are copied).
const (
	ctimeSlack = 50e6 // ns
	maxCompare = 256 << 20
)

// copyLayer copies the tree src into dst (which must not exist) with
// owners, modes, times, xattrs and device nodes (overlay whiteouts); files
// prev lists unchanged are hard-linked from prevLayer instead. It returns
// the new manifest. src must not change meanwhile (the container is
// frozen): the walk trusts that a directory it saw is still one.
// Symlinks are copied as links and never followed; sockets are skipped;
// hard links inside src stay links (one copy per inode). Owners in the
// uid range from base on (a user-namespaced sandbox's upper directory)
// are shifted down by base: a layer's owners are 0-based, for any
// sandbox's range to map (userns.go).
func copyLayer(src, dst string, prev *manifest, prevLayer string, base uint32) (*manifest, error) {
	c := &copier{src: src, dst: dst, prev: prev, prevLayer: prevLayer, base: base,
		next: &manifest{Files: map[string]fileKey{}}, inodes: map[uint64]string{}}
	if err := filepath.WalkDir(src, c.entry); err != nil {
		return nil, err
	}
	// Directory times last: creating their entries moved them.
	for i := len(c.dirs) - 1; i >= 0; i-- {
		if err := setTimes(c.dirs[i].path, c.dirs[i].st); err != nil {
			return nil, err
		}
	}
	return c.next, nil
}

type copier struct {
	src, dst, prevLayer string
	prev, next          *manifest
	base                uint32            // the upper's uid range, shifted to 0
	inodes              map[uint64]string // a multiply-linked file's first copy, by inode
	dirs                []dirTimes
}

type dirTimes struct {
	path string
	st   *syscall.Stat_t
}

func (c *copier) entry(path string, d fs.DirEntry, err error) error {
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(c.src, path)
	if err != nil {
		return err
	}
	target := filepath.Join(c.dst, rel)
	// A change after this moment moves the file's ctime past any ctime
	// older than now-ctimeSlack: newer ones are marked Recent.
	now := time.Now().UnixNano()
	fi, err := d.Info()
	if err != nil {
		return err
	}
	up, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s: no stat", path)
	}
	// st is the file as the layer records it (0-based owners); up as the
	// upper directory has it.
	st := new(syscall.Stat_t)
	*st = *up
	st.Uid, st.Gid = shiftedID(up.Uid, c.base), shiftedID(up.Gid, c.base)
	mode := fi.Mode()
	switch {
	case mode.IsDir():
		if err := os.Mkdir(target, 0o700); err != nil {
			return err
		}
		if err := copyMeta(path, target, st, true, c.base); err != nil {
			return err
		}
		c.dirs = append(c.dirs, dirTimes{target, st})
		return nil
	case mode.IsRegular():
		if st.Nlink > 1 {
			// Hard links stay links: one copy per inode, however many names.
			if first, ok := c.inodes[st.Ino]; ok {
				return os.Link(first, target)
			}
			c.inodes[st.Ino] = target
		}
		key := fileKey{Ino: up.Ino, Ctime: up.Ctim.Nano(), Size: up.Size, Mode: up.Mode, UID: up.Uid, GID: up.Gid}
		shared := false
		if c.prev != nil && c.prevLayer != "" {
			from := filepath.Join(c.prevLayer, rel)
			if was, ok := c.prev.Files[rel]; ok && was.same(key) &&
				(!was.Recent || key.Size <= maxCompare && sameContent(path, from) && sameXattrs(path, from)) {
				shared = linkUnchanged(from, target, key.Size)
			}
		}
		if !shared {
			if err := copyFileShifted(path, target, st, c.base); err != nil {
				return err
			}
		}
		key.Recent = key.Ctime >= now-ctimeSlack
		c.next.Files[rel] = key
		return nil
	case mode&fs.ModeSymlink != 0:
		link, err := os.Readlink(path)
		if err != nil {
			return err
		}
		if err := os.Symlink(link, target); err != nil {
			return err
		}
		return copyMeta(path, target, st, false, c.base)
	case mode&fs.ModeSocket != 0:
		return nil // a socket is nothing without its process
	default: // devices (whiteouts are 0:0 character devices) and fifos
		if err := unix.Mknod(target, st.Mode, int(st.Rdev)); err != nil {
			return fmt.Errorf("mknod %s: %w", target, err)
		}
		return copyMeta(path, target, st, true, c.base)
	}
}

// linkUnchanged hard-links a previous layer's copy of an unchanged file.
// The previous layer is nook's own and immutable, but it is checked anyway:
// the path must lead to a regular file of the expected size without
// passing through a symlink.
func linkUnchanged(from, to string, size int64) bool {
	if real, err := filepath.EvalSymlinks(from); err != nil || real != from {
		return false
	}
	fi, err := os.Lstat(from)
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != size {
		return false
	}
	return os.Link(from, to) == nil
}

// sameContent reports whether two files hold the same bytes. Neither is
// followed if it is a symlink.
func sameContent(a, b string) bool {
	fa, err := os.OpenFile(a, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer fa.Close()
	fb, err := os.OpenFile(b, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<16), make([]byte, 1<<16)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false
		}
		if ea != nil || eb != nil {
			return (ea == io.EOF || ea == io.ErrUnexpectedEOF) && (eb == io.EOF || eb == io.ErrUnexpectedEOF)
		}
	}
}

func copyFile(src, dst string, st *syscall.Stat_t) error {
	return copyFileShifted(src, dst, st, 0)
}

// copyFileShifted is copyFile with the uids in xattrs shifted down by base.
func copyFileShifted(src, dst string, st *syscall.Stat_t, base uint32) error {
	in, err := os.OpenFile(src, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	if fi, err := in.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Sys().(*syscall.Stat_t).Ino != st.Ino {
		return fmt.Errorf("copy %s: it changed while being copied", src)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := copySparse(out, in, st.Size); err != nil {
		out.Close()
		return fmt.Errorf("copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		return err
	}
	return copyMeta(src, dst, st, true, base)
}

// copySparse copies a file's data extents only and keeps its holes: a
// sandbox's 1 TB sparse file must not become 1 TB of zeros on the host.
func copySparse(out, in *os.File, size int64) error {
	for off := int64(0); off < size; {
		data, err := in.Seek(off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := in.Seek(data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := in.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyN(out, in, hole-data); err != nil { // copy_file_range where it can
			return err
		}
		off = hole
	}
	return out.Truncate(size)
}

// copyMeta gives dst src's owner, mode (after the owner: chown clears
// setuid bits), xattrs (the uids in them shifted down by base) and times.
// chmod is skipped for symlinks.
func copyMeta(src, dst string, st *syscall.Stat_t, chmod bool, base uint32) error {
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if chmod {
		if err := unix.Fchmodat(unix.AT_FDCWD, dst, st.Mode&07777, 0); err != nil {
			return fmt.Errorf("chmod %s: %w", dst, err)
		}
	}
	if err := copyXattrs(src, dst, base); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil // set once the directory is complete
	}
	return setTimes(dst, st)
}

func setTimes(path string, st *syscall.Stat_t) error {
	ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", path, err)
	}
	return nil
}

// copyXattrs copies every extended attribute, the overlay's own
// (trusted.overlay.opaque, ...) and file capabilities included, the uids
// in ACLs and capabilities shifted down by base (shiftXattr).
func copyXattrs(src, dst string, base uint32) error {
	xs, err := readXattrs(src)
	if err != nil {
		return err
	}
	for name, val := range xs {
		if err := unix.Lsetxattr(dst, name, shiftXattr(name, val, base), 0); err != nil {
			return fmt.Errorf("write xattr %s of %s: %w", name, dst, err)
		}
	}
	return nil
}

// shiftXattr returns the value of xattr name with the host uids and gids
// it holds (named entries of a POSIX ACL, the root of a namespaced file
// capability) shifted down by base, as owners are (shiftedID), so that
// they keep their meaning through another range's idmap. Any other
// value, or one not in the form the kernel writes, is returned as is.
// The value is the sandbox's to choose: it is read, never trusted.
func shiftXattr(name string, val []byte, base uint32) []byte {
	if base == 0 {
		return val
	}
	le := binary.LittleEndian
	switch name {
	case "system.posix_acl_access", "system.posix_acl_default":
		// u32 version 2, then entries of u16 tag, u16 perm, u32 id.
		const aclUser, aclGroup = 0x02, 0x08
		if len(val) < 4 || (len(val)-4)%8 != 0 || le.Uint32(val) != 2 {
			return val
		}
		out := bytes.Clone(val)
		for off := 4; off < len(out); off += 8 {
			if tag := le.Uint16(out[off:]); tag == aclUser || tag == aclGroup {
				le.PutUint32(out[off+4:], shiftedID(le.Uint32(out[off+4:]), base))
			}
		}
		return out
	case "security.capability":
		// VFS_CAP_REVISION_3: magic_etc, two (permitted, inheritable)
		// pairs, then the root uid of the namespace it was set in.
		const rev3, revMask, size3 = 0x03000000, 0xFF000000, 24
		if len(val) != size3 || le.Uint32(val)&revMask != rev3 {
			return val
		}
		out := bytes.Clone(val)
		le.PutUint32(out[20:], shiftedID(le.Uint32(out[20:]), base))
		return out
	}
	return val
}

// readXattrs reads every extended attribute of path (not followed).
func readXattrs(path string) (map[string][]byte, error) {
	size, err := unix.Llistxattr(path, nil)
	if err != nil || size == 0 {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, err
	}
	buf := make([]byte, size)
	size, err = unix.Llistxattr(path, buf)
	if err != nil {
		return nil, err
	}
	xs := map[string][]byte{}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:size]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		n, err := unix.Lgetxattr(path, name, nil)
		if err != nil {
			return nil, fmt.Errorf("read xattr %s of %s: %w", name, path, err)
		}
		val := make([]byte, n)
		if n, err = unix.Lgetxattr(path, name, val); err != nil {
			return nil, fmt.Errorf("read xattr %s of %s: %w", name, path, err)
		}
		xs[name] = val[:n]
	}
	return xs, nil
}

// sameXattrs reports whether two files have the same extended attributes.
func sameXattrs(a, b string) bool {
	xa, err := readXattrs(a)
	if err != nil {
		return false
	}
	xb, err := readXattrs(b)
	if err != nil || len(xa) != len(xb) {
		return false
	}
	for k, v := range xa {
		if w, ok := xb[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// layerUsage is the disk a layer's files take, a file shared by hard links
// counted in equal parts by every link: summed over all layers, it is
// what they really use together.
func layerUsage(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 0 {
			if d.IsDir() {
				n += st.Blocks * 512
			} else {
				n += st.Blocks * 512 / int64(st.Nlink)
			}
		}
		return nil
	})
	return n
}

// overlayPinned are the overlay features an upper directory must not
// use, whatever the host's defaults (module parameters, kernel config):
// a build step's upper is read back as a layer (ExportChanges), which a
// metacopy file (no data) or a redirected directory would break, and a
// sandbox's upper must read the same on any host it moves to.
var overlayPinned = [][2]string{{"redirect_dir", "off"}, {"metacopy", "off"}, {"index", "off"}}

// mountOverlay mounts an overlay of lowers (topmost first) under upper at
// target. A chain too long for mount(2)'s one page of options is mounted
// through the new mount API, one lower layer at a time.
func mountOverlay(lowers []string, upper, work, target string) error {
	for _, l := range lowers {
		if strings.ContainsAny(l, ",:") {
			return fmt.Errorf("overlay layer path %q has a comma or colon", l)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", strings.Join(lowers, ":"), upper, work)
	for _, kv := range overlayPinned {
		opts += "," + kv[0] + "=" + kv[1]
	}
	if len(opts) < 4000 {
		if err := unix.Mount("overlay", target, "overlay", unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mount overlay rootfs: %w", err)
		}
		return nil
	}
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("mount overlay rootfs of %d layers: %w", len(lowers), err)
	}
	defer unix.Close(fd)
	set := func(key, val string) error {
		if err := unix.FsconfigSetString(fd, key, val); err != nil {
			return fmt.Errorf("mount overlay rootfs of %d layers: %s=%s: %w", len(lowers), key, val, err)
		}
		return nil
	}
	for _, l := range lowers {
		if err := set("lowerdir+", l); err != nil {
			return err
		}
	}
	if err := set("upperdir", upper); err != nil {
		return err
	}
	if err := set("workdir", work); err != nil {
		return err
	}
	for _, kv := range overlayPinned {
		if err := set(kv[0], kv[1]); err != nil {
			return err
		}
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("mount overlay rootfs of %d layers: %w", len(lowers), err)
	}
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fmt.Errorf("mount overlay rootfs of %d layers: %w", len(lowers), err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount overlay rootfs of %d layers: %w", len(lowers), err)
	}
	return nil
}

// ExportChanges implements core.ChangesExporter: the sandbox's processes
// end (a template build's step is over) and its upper directory is
// copied to dst with its owners shifted back to 0-based.
func (b *Backend) ExportChanges(ctx context.Context, id, dst string) error {
	release, err := b.exclusive(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	if err := b.stop(ctx, id); err != nil {
		return err
	}
	if _, err := os.Stat(b.diskImage(id)); err == nil {
		if err := b.mountDisk(id); err != nil {
			return err
		}
	}
	m, err := b.readIDMap(id)
	if err != nil {
		return err
	}
	upper := filepath.Join(b.upperBase(id), "upper")
	if err := fsutil.Syncfs(upper); err != nil {
		return err
	}
	if _, err := copyLayer(upper, dst, nil, "", m.Base); err != nil {
		return fmt.Errorf("copy the changes of sandbox %s: %w", id, err)
	}
	return nil
}

var _ core.ChangesExporter = (*Backend)(nil)
