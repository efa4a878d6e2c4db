package volume

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/agent"
)

// Remote carries out a vm's volume calls (agent.VolCall, see the agent
// package's volume.go) on the host, each volume through an os.Root on
// its files: the guest names paths, and no name, symlink or ".." leads
// the daemon outside the volume. The guest is untrusted: what it may do
// is what a container's root may do in a bind-mounted volume (any
// owner, any mode) and nothing more: no device or fifo is made, nothing
// but a regular file is opened for reading or writing (and never so
// that the open can block), and a read-only mount refuses every change
// here, whatever the guest's mount says. Permission checks are the
// guest kernel's (the mount has default_permissions).
type Remote struct {
	mounts []remoteMount
}

type remoteMount struct {
	root    *os.Root
	ro      bool
	hostDir bool
	dev     uint64
	cursors *cursors
}

// RemoteMount is a directory a vm mounts. HostDir: a directory of the
// host (not a volume), where no file may become setuid or setgid: host
// users run them.
type RemoteMount struct {
	Dir      string
	ReadOnly bool
	HostDir  bool
	Gone     bool // removed since the vm mounted it: every call fails (EIO)
}

// OpenRemote opens the directories of a vm's volumes, in the order its
// calls index them.
func OpenRemote(mounts []RemoteMount) (*Remote, error) {
	r := &Remote{}
	for _, m := range mounts {
		if m.Gone {
			r.mounts = append(r.mounts, remoteMount{})
			continue
		}
		rm, err := openRemoteMount(m)
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("%s: %w", m.Dir, err)
		}
		r.mounts = append(r.mounts, rm)
	}
	return r, nil
}

// openRemoteMount opens m.Dir through a private clone of its mount,
// nodev and nosuid (a host directory is reached through the host's own
// mounts, which may be neither): a device node there is never opened
// as one. The clone is detached (no one else sees it) and goes with the
// last file opened in it.
func openRemoteMount(m RemoteMount) (remoteMount, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, m.Dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return remoteMount{}, fmt.Errorf("clone the mount: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID}); err != nil {
		return remoteMount{}, fmt.Errorf("make the clone nodev and nosuid: %w", err)
	}
	root, err := os.OpenRoot(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return remoteMount{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		root.Close()
		return remoteMount{}, err
	}
	return remoteMount{root: root, ro: m.ReadOnly, hostDir: m.HostDir, dev: st.Dev, cursors: &cursors{}}, nil
}

// Close closes the directories.
func (r *Remote) Close() error {
	for _, m := range r.mounts {
		if m.root != nil {
			m.cursors.close()
			m.root.Close()
		}
	}
	r.mounts = nil
	return nil
}

// Handle carries out one call.
func (r *Remote) Handle(c *agent.VolCall, data []byte) (*agent.VolResult, []byte) {
	if c.Vol < 0 || c.Vol >= len(r.mounts) {
		return errResult(syscall.EINVAL), nil
	}
	m := &r.mounts[c.Vol]
	if m.root == nil {
		return errResult(syscall.EIO), nil // the volume is gone
	}
	name := c.Path
	if name == "" {
		name = "."
	}
	switch c.Op {
	case agent.VolOpLookup, agent.VolOpReadlink, agent.VolOpReaddir, agent.VolOpRead, agent.VolOpStatfs, agent.VolOpFsync:
	default:
		if m.ro {
			return errResult(syscall.EROFS), nil
		}
	}
	res, out, err := m.do(c, name, data)
	if err != nil {
		return errResult(errnoOf(err)), nil
	}
	return res, out
}

func errResult(e syscall.Errno) *agent.VolResult { return &agent.VolResult{Errno: int32(e)} }

// errnoOf is the errno the guest gets for err.
func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, fs.ErrExist):
		return syscall.EEXIST
	case errors.Is(err, fs.ErrPermission):
		return syscall.EACCES
	}
	// os.Root's "path escapes from parent": a symlink swapped in for a
	// directory of the path, leading out of the volume.
	return syscall.EACCES
}

// maxID is the highest owner a volume's file may have: the ids every
// sandbox sees as they are (a container's range is 65536 ids).
const maxID = 65535

func (m *remoteMount) do(c *agent.VolCall, name string, data []byte) (*agent.VolResult, []byte, error) {
	root := m.root
	switch c.Op {
	case agent.VolOpCreate, agent.VolOpMkdir, agent.VolOpSymlink, agent.VolOpSetattr:
		if c.UID > maxID || c.GID > maxID {
			return nil, nil, syscall.EINVAL
		}
		if m.hostDir && c.Op != agent.VolOpMkdir {
			c.Mode &^= unix.S_ISUID | unix.S_ISGID
		}
	}
	switch c.Op {
	case agent.VolOpLookup:
		return m.attrResult(root.Lstat(name))
	case agent.VolOpReadlink:
		t, err := root.Readlink(name)
		return &agent.VolResult{Target: t}, nil, err
	case agent.VolOpReaddir:
		return m.readdir(name, int(min(c.Off, 1<<30)), c.Size)
	case agent.VolOpRead:
		f, err := openNoDevice(root, name, os.O_RDONLY, false, false)
		if err != nil {
			return nil, nil, err
		}
		defer f.Close()
		buf := make([]byte, c.Size)
		n, err := f.ReadAt(buf, c.Off)
		if err != nil && err != io.EOF {
			return nil, nil, err
		}
		return &agent.VolResult{}, buf[:n], nil
	case agent.VolOpWrite:
		f, err := openNoDevice(root, name, os.O_WRONLY, false, false)
		if err != nil {
			return nil, nil, err
		}
		defer f.Close()
		n, err := f.WriteAt(data, c.Off)
		if n == 0 && err != nil {
			return nil, nil, err
		}
		return &agent.VolResult{N: n}, nil, nil
	case agent.VolOpFsync:
		f, err := openNoDevice(root, name, os.O_RDONLY, false, true)
		if err != nil {
			return nil, nil, err
		}
		defer f.Close()
		return &agent.VolResult{}, nil, f.Sync()
	case agent.VolOpStatfs:
		f, err := root.Open(".")
		if err != nil {
			return nil, nil, err
		}
		defer f.Close()
		var st unix.Statfs_t
		if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
			return nil, nil, err
		}
		return &agent.VolResult{Statfs: &agent.VolStatfs{Blocks: st.Blocks, Bfree: st.Bfree, Bavail: st.Bavail,
			Files: st.Files, Ffree: st.Ffree, Bsize: uint32(st.Bsize), NameLen: uint32(st.Namelen)}}, nil, nil
	case agent.VolOpCreate:
		return m.create(c, name)
	case agent.VolOpMkdir:
		if err := root.Mkdir(name, 0o700); err != nil {
			return nil, nil, err
		}
		uid, gid, setgid := m.owner(name, c)
		mode := c.Mode & 0o7777
		if setgid {
			mode |= unix.S_ISGID // a directory in a setgid one is setgid too
		}
		if err := root.Lchown(name, int(uid), int(gid)); err != nil {
			return nil, nil, err
		}
		if err := root.Chmod(name, fileMode(mode)); err != nil {
			return nil, nil, err
		}
		return m.attrResult(root.Lstat(name))
	case agent.VolOpSymlink:
		if err := root.Symlink(c.Target, name); err != nil {
			return nil, nil, err
		}
		uid, gid, _ := m.owner(name, c)
		if err := root.Lchown(name, int(uid), int(gid)); err != nil {
			return nil, nil, err
		}
		return m.attrResult(root.Lstat(name))
	case agent.VolOpLink:
		if err := root.Link(c.To, name); err != nil {
			return nil, nil, err
		}
		return m.attrResult(root.Lstat(name))
	case agent.VolOpUnlink, agent.VolOpRmdir:
		fi, err := root.Lstat(name)
		if err != nil {
			return nil, nil, err
		}
		switch {
		case c.Op == agent.VolOpUnlink && fi.IsDir():
			return nil, nil, syscall.EISDIR
		case c.Op == agent.VolOpRmdir && !fi.IsDir():
			return nil, nil, syscall.ENOTDIR
		case name == ".":
			return nil, nil, syscall.EBUSY
		}
		return &agent.VolResult{}, nil, root.Remove(name)
	case agent.VolOpRename:
		if name == "." || c.To == "" {
			return nil, nil, syscall.EBUSY
		}
		if c.Flags&agent.VolNoReplace != 0 {
			return &agent.VolResult{}, nil, m.renameNoReplace(name, c.To)
		}
		return &agent.VolResult{}, nil, root.Rename(name, c.To)
	case agent.VolOpSetattr:
		return m.setattr(c, name)
	}
	return nil, nil, syscall.ENOSYS
}

// renameNoReplace renames from to to unless to exists, in one step
// (renameat2 on the parents, opened through the root).
func (m *remoteMount) renameNoReplace(from, to string) error {
	fd, err := openNoDevice(m.root, path.Dir(from), os.O_RDONLY|unix.O_DIRECTORY, false, true)
	if err != nil {
		return err
	}
	defer fd.Close()
	td, err := openNoDevice(m.root, path.Dir(to), os.O_RDONLY|unix.O_DIRECTORY, false, true)
	if err != nil {
		return err
	}
	defer td.Close()
	return unix.Renameat2(int(fd.Fd()), path.Base(from), int(td.Fd()), path.Base(to), unix.RENAME_NOREPLACE)
}

// owner is who owns a new file: the caller, with the group of a setgid
// parent directory (as the kernel does).
func (m *remoteMount) owner(name string, c *agent.VolCall) (uid, gid uint32, setgid bool) {
	uid, gid = c.UID, c.GID
	if fi, err := m.root.Lstat(path.Dir(name)); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Mode&unix.S_ISGID != 0 {
			return uid, st.Gid, true
		}
	}
	return uid, gid, false
}

func (m *remoteMount) create(c *agent.VolCall, name string) (*agent.VolResult, []byte, error) {
	f, err := m.root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_NOFOLLOW, 0o600)
	created := err == nil
	if errors.Is(err, fs.ErrExist) && c.Flags&agent.VolExcl == 0 {
		f, err = openNoDevice(m.root, name, os.O_WRONLY, false, false)
	}
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	if created {
		uid, gid, _ := m.owner(name, c)
		if err := f.Chown(int(uid), int(gid)); err != nil {
			return nil, nil, err
		}
		if err := f.Chmod(fileMode(c.Mode & 0o7777)); err != nil {
			return nil, nil, err
		}
	}
	return m.attrResult(f.Stat())
}

func (m *remoteMount) setattr(c *agent.VolCall, name string) (*agent.VolResult, []byte, error) {
	root := m.root
	fi, err := root.Lstat(name)
	if err != nil {
		return nil, nil, err
	}
	link := fi.Mode()&fs.ModeSymlink != 0
	if c.Set&(agent.VolSetUID|agent.VolSetGID) != 0 {
		uid, gid := -1, -1
		if c.Set&agent.VolSetUID != 0 {
			uid = int(c.UID)
		}
		if c.Set&agent.VolSetGID != 0 {
			gid = int(c.GID)
		}
		if err := root.Lchown(name, uid, gid); err != nil {
			return nil, nil, err
		}
	}
	if c.Set&agent.VolSetMode != 0 && !link {
		if err := root.Chmod(name, fileMode(c.Mode&0o7777)); err != nil {
			return nil, nil, err
		}
	}
	if c.Set&agent.VolSetSize != 0 {
		f, err := openNoDevice(root, name, os.O_WRONLY, false, false)
		if err != nil {
			return nil, nil, err
		}
		err = f.Truncate(c.Off)
		f.Close()
		if err != nil {
			return nil, nil, err
		}
	}
	if c.Set&(agent.VolSetAtime|agent.VolSetMtime) != 0 && !link {
		st := fi.Sys().(*syscall.Stat_t)
		at, mt := time.Unix(st.Atim.Unix()), time.Unix(st.Mtim.Unix())
		if c.Set&agent.VolSetAtime != 0 {
			at = time.Unix(0, c.Atime)
		}
		if c.Set&agent.VolSetMtime != 0 {
			mt = time.Unix(0, c.Mtime)
		}
		if err := root.Chtimes(name, at, mt); err != nil {
			return nil, nil, err
		}
	}
	return m.attrResult(root.Lstat(name))
}

func (m *remoteMount) readdir(name string, skip, count int) (*agent.VolResult, []byte, error) {
	if count <= 0 {
		count = agent.VolMaxEntries
	}
	// The guest reads a listing page by page, each from where the last
	// stopped: the directory stays open for the next page (a cursor), and
	// without one the entries before skip are read and dropped, a batch
	// at a time, so that a huge directory costs no memory here.
	f := m.cursors.take(name, skip)
	if f == nil {
		var err error
		if f, err = openNoDevice(m.root, name, os.O_RDONLY, false, true); err != nil {
			return nil, nil, err
		}
		for left := skip; left > 0; {
			ents, err := f.ReadDir(min(left, 1024))
			left -= len(ents)
			if err != nil || len(ents) == 0 {
				f.Close()
				if err != nil && err != io.EOF {
					return nil, nil, err
				}
				return &agent.VolResult{EOF: true}, nil, nil
			}
		}
	}
	ents, err := f.ReadDir(count)
	if err != nil && err != io.EOF {
		f.Close()
		return nil, nil, err
	}
	res := &agent.VolResult{EOF: len(ents) < count}
	for _, e := range ents {
		res.Entries = append(res.Entries, agent.VolEntry{Name: e.Name(), Mode: typeBits(e.Type())})
	}
	if res.EOF {
		f.Close()
	} else {
		m.cursors.put(name, skip+len(ents), f)
	}
	return res, nil, nil
}

// cursors are open directories a listing goes on from, by path and offset.
type cursors struct {
	mu   sync.Mutex
	open []cursor // oldest first
}

type cursor struct {
	name string
	off  int
	f    *os.File
}

const maxCursors = 16

func (cs *cursors) take(name string, off int) *os.File {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for i, c := range cs.open {
		if c.name == name && c.off == off {
			cs.open = append(cs.open[:i], cs.open[i+1:]...)
			return c.f
		}
	}
	return nil
}

func (cs *cursors) put(name string, off int, f *os.File) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if len(cs.open) == maxCursors {
		cs.open[0].f.Close()
		cs.open = cs.open[1:]
	}
	cs.open = append(cs.open, cursor{name, off, f})
}

func (cs *cursors) close() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, c := range cs.open {
		c.f.Close()
	}
	cs.open = nil
}

func (m *remoteMount) attrResult(fi fs.FileInfo, err error) (*agent.VolResult, []byte, error) {
	if err != nil {
		return nil, nil, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, nil, syscall.EIO
	}
	ino := st.Ino
	if st.Dev != m.dev {
		ino ^= st.Dev << 40 // another file system under a host directory: keep inode numbers apart
	}
	return &agent.VolResult{Attr: &agent.VolAttr{
		Ino: ino, Mode: st.Mode, Nlink: uint32(st.Nlink), UID: st.Uid, GID: st.Gid,
		Size: st.Size, Blocks: st.Blocks,
		Atime: st.Atim.Nano(), Mtime: st.Mtim.Nano(), Ctime: st.Ctim.Nano(),
	}}, nil, nil
}

// fileMode is a mode's permission bits (with setuid, setgid, sticky) as an os.FileMode.
func fileMode(m uint32) os.FileMode {
	fm := os.FileMode(m & 0o777)
	if m&unix.S_ISUID != 0 {
		fm |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		fm |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		fm |= os.ModeSticky
	}
	return fm
}

// typeBits is a directory entry's type as st_mode bits.
func typeBits(t fs.FileMode) uint32 {
	switch {
	case t.IsDir():
		return unix.S_IFDIR
	case t&fs.ModeSymlink != 0:
		return unix.S_IFLNK
	case t&fs.ModeNamedPipe != 0:
		return unix.S_IFIFO
	case t&fs.ModeSocket != 0:
		return unix.S_IFSOCK
	case t&fs.ModeCharDevice != 0:
		return unix.S_IFCHR
	case t&fs.ModeDevice != 0:
		return unix.S_IFBLK
	}
	return unix.S_IFREG
}
