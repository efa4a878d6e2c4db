//go:build linux

// Package guestvol is a vm guest's side of its volumes: each is a FUSE
// file system (github.com/hanwen/go-fuse) that nook-agent serves by
// sending every operation to the daemon over the agent's volume stream
// (agent.VolLink; the wire format and why it survives pauses, snapshots
// and forks are in the agent package's volume.go). The nodes name files
// by their path in the volume; the host answers with the attributes of
// the real files, inode numbers included, so hard links stay one inode.
//
// Caching, as virtio-fs's default (cache=auto) and NFS's attribute
// cache: names and attributes are kept for a second, so that a path
// walk or a stat is not a call to the host each time (each is a round
// trip through the vm's agent, milliseconds under TCG); a name that was
// not there is asked again every time, so a file another sandbox or the
// host makes shows at once, and a file's cached pages are dropped at
// every open. What another writer changes in a file the guest looked at
// within the second shows within the second.
// Permission checks are the guest kernel's (default_permissions) against
// the owners and modes the host reports; allow_other lets every user of
// the guest in. READDIRPLUS is off: a listing is one call per page, not
// one per entry.
package guestvol

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/agent"
)

// Mounter mounts a vm's volumes (agent.VolumeMounter).
type Mounter struct {
	link    *agent.VolLink
	mu      sync.Mutex
	mounted map[string]int // path -> volume index
}

// New returns a Mounter with nothing mounted.
func New() *Mounter { return &Mounter{link: agent.NewVolLink(), mounted: map[string]int{}} }

// Link is the link its file systems call through.
func (m *Mounter) Link() *agent.VolLink { return m.link }

// Mount mounts the volumes of req not mounted yet (a vm restored from a
// snapshot has its mounts already).
func (m *Mounter) Mount(req *agent.VolumesRequest) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, v := range req.Mounts {
		if idx, ok := m.mounted[v.Path]; ok {
			if idx != i {
				return fmt.Errorf("%s is mounted as volume %d, not %d", v.Path, idx, i)
			}
			continue
		}
		if err := ensureFuseDevice(); err != nil {
			return err
		}
		// A mount an earlier agent served (systemd restarted this one)
		// has nobody behind it: it goes, and a new one takes its place.
		if _, err := os.Stat(v.Path); errors.Is(err, syscall.ENOTCONN) {
			unix.Unmount(v.Path, unix.MNT_DETACH)
		}
		if err := os.MkdirAll(v.Path, 0o755); err != nil {
			return err
		}
		zero, second := time.Duration(0), time.Second
		// As a container's volumes: nosuid and nodev, read-only if asked
		// (the host refuses changes to such a volume all the same).
		flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
		if v.ReadOnly {
			flags |= unix.MS_RDONLY
		}
		root := &node{v: &vol{link: m.link, index: i}}
		opts := &fs.Options{
			MountOptions: fuse.MountOptions{
				AllowOther: true, DirectMount: true, DirectMountStrict: true, DirectMountFlags: flags,
				FsName: "nook-volume:" + v.Name, Name: "nook",
				MaxWrite: agent.VolMaxIO, MaxReadAhead: agent.VolMaxIO, DisableReadDirPlus: true,
				Options: []string{"default_permissions"},
			},
			EntryTimeout: &second, AttrTimeout: &second, NegativeTimeout: &zero,
		}
		// fs.Mount would wait for the mount's first requests, which need
		// the volume stream this mount comes before: the server starts
		// here and that wait runs on its own.
		srv, err := fuse.NewServer(fs.NewNodeFS(root, opts), v.Path, &opts.MountOptions)
		if err != nil {
			return fmt.Errorf("mount volume %s at %s: %w", v.Name, v.Path, err)
		}
		go srv.Serve()
		go srv.WaitMount()
		m.mounted[v.Path] = i
	}
	return nil
}

// ensureFuseDevice makes /dev/fuse if the kernel has FUSE (the vm's
// initramfs loads the module) and the node is missing.
func ensureFuseDevice() error {
	if _, err := os.Stat("/dev/fuse"); err == nil {
		return nil
	}
	if err := unix.Mknod("/dev/fuse", unix.S_IFCHR|0o666, int(unix.Mkdev(10, 229))); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("/dev/fuse: %w", err)
	}
	return nil
}

type vol struct {
	link  *agent.VolLink
	index int
}

// node is a file of a volume, named by its path.
type node struct {
	fs.Inode
	v *vol
}

var (
	_ fs.NodeLookuper   = (*node)(nil)
	_ fs.NodeGetattrer  = (*node)(nil)
	_ fs.NodeSetattrer  = (*node)(nil)
	_ fs.NodeReaddirer  = (*node)(nil)
	_ fs.NodeOpener     = (*node)(nil)
	_ fs.NodeReader     = (*node)(nil)
	_ fs.NodeWriter     = (*node)(nil)
	_ fs.NodeFsyncer    = (*node)(nil)
	_ fs.NodeFlusher    = (*node)(nil)
	_ fs.NodeCreater    = (*node)(nil)
	_ fs.NodeMkdirer    = (*node)(nil)
	_ fs.NodeMknoder    = (*node)(nil)
	_ fs.NodeSymlinker  = (*node)(nil)
	_ fs.NodeLinker     = (*node)(nil)
	_ fs.NodeReadlinker = (*node)(nil)
	_ fs.NodeUnlinker   = (*node)(nil)
	_ fs.NodeRmdirer    = (*node)(nil)
	_ fs.NodeRenamer    = (*node)(nil)
	_ fs.NodeStatfser   = (*node)(nil)
)

// rel is the node's path in the volume; ok is false for a file no name
// leads to any more (removed while open): it has no path to call with.
func (n *node) rel() (string, bool) {
	var names []string
	p := &n.Inode
	for !p.IsRoot() {
		name, parent := p.Parent()
		if parent == nil {
			return "", false
		}
		names = append(names, name)
		p = parent
	}
	for i, j := 0, len(names)-1; i < j; i, j = i+1, j-1 {
		names[i], names[j] = names[j], names[i]
	}
	return path.Join(names...), true
}

func (n *node) child(name string) (string, bool) {
	p, ok := n.rel()
	return path.Join(p, name), ok
}

// call sends c for the node's volume, filling in the caller's ids.
func (n *node) call(ctx context.Context, c *agent.VolCall, data []byte) (*agent.VolResult, []byte, bool, syscall.Errno) {
	c.Vol = n.v.index
	if caller, ok := fuse.FromContext(ctx); ok {
		c.UID, c.GID = caller.Uid, caller.Gid
	}
	return n.v.link.CallErrno(ctx, c, data)
}

func fillAttr(a *agent.VolAttr, out *fuse.Attr) {
	out.Ino = a.Ino
	out.Mode = a.Mode
	out.Nlink = a.Nlink
	out.Uid, out.Gid = a.UID, a.GID
	out.Size = uint64(max(a.Size, 0))
	out.Blocks = uint64(max(a.Blocks, 0))
	out.Blksize = 4096
	set := func(ns int64, s *uint64, sub *uint32) {
		t := time.Unix(0, ns)
		*s, *sub = uint64(max(t.Unix(), 0)), uint32(t.Nanosecond())
	}
	set(a.Atime, &out.Atime, &out.Atimensec)
	set(a.Mtime, &out.Mtime, &out.Mtimensec)
	set(a.Ctime, &out.Ctime, &out.Ctimensec)
}

// entry makes (or finds) the inode of a child from its attributes.
func (n *node) entry(ctx context.Context, a *agent.VolAttr, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if a == nil {
		return nil, syscall.EIO
	}
	fillAttr(a, &out.Attr)
	ch := n.NewInode(ctx, &node{v: n.v}, fs.StableAttr{Mode: a.Mode & syscall.S_IFMT, Ino: a.Ino})
	return ch, 0
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	res, _, _, e := n.call(ctx, &agent.VolCall{Op: agent.VolOpLookup, Path: p}, nil)
	if e != 0 {
		return nil, e
	}
	return n.entry(ctx, res.Attr, out)
}

func (n *node) Getattr(ctx context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	p, ok := n.rel()
	if !ok {
		return syscall.ESTALE
	}
	res, _, _, e := n.call(ctx, &agent.VolCall{Op: agent.VolOpLookup, Path: p}, nil)
	return attrOut(res, e, out)
}

// attrOut fills out with the attributes a call answered.
func attrOut(res *agent.VolResult, e syscall.Errno, out *fuse.AttrOut) syscall.Errno {
	if e != 0 {
		return e
	}
	if res.Attr == nil {
		return syscall.EIO
	}
	fillAttr(res.Attr, &out.Attr)
	return 0
}

func (n *node) Setattr(ctx context.Context, _ fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	p, ok := n.rel()
	if !ok {
		return syscall.ESTALE
	}
	c := &agent.VolCall{Op: agent.VolOpSetattr, Path: p}
	// The ids the call carries are the caller's: the new owner goes in
	// the same fields, after call fills them, so it is set here.
	uid, setUID := in.GetUID()
	gid, setGID := in.GetGID()
	if m, ok := in.GetMode(); ok {
		c.Set |= agent.VolSetMode
		c.Mode = m
	}
	if sz, ok := in.GetSize(); ok {
		c.Set |= agent.VolSetSize
		c.Off = int64(sz)
	}
	if t, ok := in.GetATime(); ok {
		c.Set |= agent.VolSetAtime
		c.Atime = t.UnixNano()
	}
	if t, ok := in.GetMTime(); ok {
		c.Set |= agent.VolSetMtime
		c.Mtime = t.UnixNano()
	}
	c.Vol = n.v.index
	if setUID {
		c.Set |= agent.VolSetUID
		c.UID = uid
	}
	if setGID {
		c.Set |= agent.VolSetGID
		c.GID = gid
	}
	res, _, _, e := n.v.link.CallErrno(ctx, c, nil)
	return attrOut(res, e, out)
}

func (n *node) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	p, ok := n.rel()
	if !ok {
		return nil, syscall.ESTALE
	}
	var list []fuse.DirEntry
	for off := 0; ; {
		res, _, _, e := n.call(ctx, &agent.VolCall{Op: agent.VolOpReaddir, Path: p, Off: int64(off), Size: agent.VolMaxEntries}, nil)
		if e != 0 {
			return nil, e
		}
		for _, d := range res.Entries {
			list = append(list, fuse.DirEntry{Name: d.Name, Mode: d.Mode, Ino: d.Ino})
		}
		off += len(res.Entries)
		if res.EOF || len(res.Entries) == 0 {
			break
		}
	}
	return fs.NewListDirStream(list), 0
}

// Open keeps no handle: reads and writes name the file. FOPEN_KEEP_CACHE
// is not set, so the guest drops the file's cached pages at every open.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if _, ok := n.rel(); !ok {
		return nil, 0, syscall.ESTALE
	}
	return nil, 0, 0
}

func (n *node) Read(ctx context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	p, ok := n.rel()
	if !ok {
		return nil, syscall.ESTALE
	}
	_, data, _, e := n.call(ctx, &agent.VolCall{Op: agent.VolOpRead, Path: p, Off: off, Size: min(len(dest), agent.VolMaxIO)}, nil)
	if e != 0 {
		return nil, e
	}
	return fuse.ReadResultData(data), 0
}

func (n *node) Write(ctx context.Context, _ fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	p, ok := n.rel()
	if !ok {
		return 0, syscall.ESTALE
	}
	var written uint32
	for len(data) > 0 {
		chunk := data[:min(len(data), agent.VolMaxIO)]
		res, _, _, e := n.call(ctx, &agent.VolCall{Op: agent.VolOpWrite, Path: p, Off: off}, chunk)
		if e != 0 {
			if written > 0 {
				return written, 0
			}
			return 0, e
		}
		written += uint32(res.N)
		off += int64(res.N)
		if res.N < len(chunk) {
			break
		}
		data = data[len(chunk):]
	}
	return written, 0
}

func (n *node) Fsync(ctx context.Context, _ fs.FileHandle, _ uint32) syscall.Errno {
	p, ok := n.rel()
	if !ok {
		return 0
	}
	_, _, _, e := n.call(ctx, &agent.VolCall{Op: agent.VolOpFsync, Path: p}, nil)
	return e
}

func (n *node) Flush(context.Context, fs.FileHandle) syscall.Errno { return 0 }

// made finishes a call that makes a name: sent again after its stream
// ended, it may have been made the first time, which EEXIST then means.
func (n *node) made(ctx context.Context, p string, res *agent.VolResult, retried bool, e syscall.Errno, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if e == syscall.EEXIST && retried {
		res, _, _, e = n.call(ctx, &agent.VolCall{Op: agent.VolOpLookup, Path: p}, nil)
	}
	if e != 0 {
		return nil, e
	}
	return n.entry(ctx, res.Attr, out)
}

func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, nil, 0, syscall.ENOENT
	}
	c := &agent.VolCall{Op: agent.VolOpCreate, Path: p, Mode: mode &^ syscall.S_IFMT}
	if flags&syscall.O_EXCL != 0 {
		c.Flags = agent.VolExcl
	}
	res, _, retried, e := n.call(ctx, c, nil)
	ch, e := n.made(ctx, p, res, retried, e, out)
	return ch, nil, 0, e
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	res, _, retried, e := n.call(ctx, &agent.VolCall{Op: agent.VolOpMkdir, Path: p, Mode: mode &^ syscall.S_IFMT}, nil)
	return n.made(ctx, p, res, retried, e, out)
}

// Mknod: no device, fifo or socket is made in a volume.
func (n *node) Mknod(context.Context, string, uint32, uint32, *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p, ok := n.child(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	res, _, retried, e := n.call(ctx, &agent.VolCall{Op: agent.VolOpSymlink, Path: p, Target: target}, nil)
	return n.made(ctx, p, res, retried, e, out)
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	to, ok1 := t.rel()
	p, ok2 := n.child(name)
	if !ok1 || !ok2 {
		return nil, syscall.ENOENT
	}
	res, _, retried, e := n.call(ctx, &agent.VolCall{Op: agent.VolOpLink, Path: p, To: to}, nil)
	return n.made(ctx, p, res, retried, e, out)
}

func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	p, ok := n.rel()
	if !ok {
		return nil, syscall.ESTALE
	}
	res, _, _, e := n.call(ctx, &agent.VolCall{Op: agent.VolOpReadlink, Path: p}, nil)
	if e != 0 {
		return nil, e
	}
	return []byte(res.Target), 0
}

// removed finishes a call that removes a name: sent again, ENOENT means
// the first one did it.
func removed(retried bool, e syscall.Errno) syscall.Errno {
	if e == syscall.ENOENT && retried {
		return 0
	}
	return e
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, agent.VolOpUnlink, name)
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	return n.remove(ctx, agent.VolOpRmdir, name)
}

// remove removes child name (op: unlink or rmdir).
func (n *node) remove(ctx context.Context, op, name string) syscall.Errno {
	p, ok := n.child(name)
	if !ok {
		return syscall.ENOENT
	}
	_, _, retried, e := n.call(ctx, &agent.VolCall{Op: op, Path: p}, nil)
	return removed(retried, e)
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	np, ok := newParent.(*node)
	if !ok || np.v != n.v {
		return syscall.EXDEV
	}
	if flags&^unix.RENAME_NOREPLACE != 0 {
		return syscall.EINVAL // RENAME_EXCHANGE, RENAME_WHITEOUT
	}
	from, ok1 := n.child(name)
	to, ok2 := np.child(newName)
	if !ok1 || !ok2 {
		return syscall.ENOENT
	}
	c := &agent.VolCall{Op: agent.VolOpRename, Path: from, To: to}
	if flags&unix.RENAME_NOREPLACE != 0 {
		c.Flags = agent.VolNoReplace
	}
	_, _, retried, e := n.call(ctx, c, nil)
	return removed(retried, e)
}

func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	res, _, _, e := n.call(ctx, &agent.VolCall{Op: agent.VolOpStatfs}, nil)
	if e != 0 {
		return e
	}
	if s := res.Statfs; s != nil {
		out.Blocks, out.Bfree, out.Bavail, out.Files, out.Ffree = s.Blocks, s.Bfree, s.Bavail, s.Files, s.Ffree
		out.Bsize, out.NameLen, out.Frsize = s.Bsize, s.NameLen, s.Bsize
	}
	return 0
}
