package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent/safetar"
)

// The file API. The agent runs inside the sandbox's mount namespace and
// root, so every path it resolves (including through symlinks and "..") is
// a path of the sandbox: the host is out of reach by construction. Paths
// must still be absolute and free of NUL bytes, and tar uploads are
// extracted by safetar, which keeps every entry inside the target
// directory.
//
// Streams: read and tar_get answer with a FrameJSON FileReply, then
// FrameStdout chunks and a final FrameEOF (or a FrameError). write and
// tar_put answer a FrameJSON FileReply (ready), take FrameStdin chunks and
// a FrameEOF from the client, and answer a final FileReply or FrameError;
// a stream that ends without the FrameEOF is an aborted upload and
// changes nothing (write) or stops where it was (tar_put). list answers
// the root's FileReply, then FileReply batches of entries, the last with
// Done set. watch answers the root's FileReply once the watches are set,
// then one FrameJSON api.FileEvent per event until the client closes the
// stream.

// FileRequest is the body of every file op.
type FileRequest struct {
	Path       string  `json:"path"`
	Dest       string  `json:"dest,omitempty"`        // move: the new path
	Recursive  bool    `json:"recursive,omitempty"`   // list, remove, watch
	Parents    bool    `json:"parents,omitempty"`     // write, mkdir, tar_put: create missing parent directories
	Overwrite  bool    `json:"overwrite,omitempty"`   // move: replace an existing destination
	Mode       *uint32 `json:"mode,omitempty"`        // write, mkdir, chmod: permission bits (at most 07777)
	Offset     int64   `json:"offset,omitempty"`      // read: where to start
	Length     int64   `json:"length,omitempty"`      // read: how many bytes; 0: to the end
	MaxEntries int     `json:"max_entries,omitempty"` // list: 0: DefaultListEntries
	Owners     bool    `json:"owners,omitempty"`      // tar_put: give entries (and dir, from a "." entry) the owners the archive names
	// User (write, mkdir) owns what the op creates, parent directories
	// included: a user name or uid of the sandbox, optionally :group.
	// "": root. A file written over keeps its owner.
	User string `json:"user,omitempty"`
	// Metadata (write) are user.* extended attributes the new file gets
	// (names without "user.").
	Metadata map[string]string `json:"metadata,omitempty"`
}

// FileReply answers a file op (and is each batch of a list).
type FileReply struct {
	File      *api.FileInfo  `json:"file,omitempty"`
	Entries   []api.FileInfo `json:"entries,omitempty"`
	Done      bool           `json:"done,omitempty"`      // list: the last frame
	Truncated bool           `json:"truncated,omitempty"` // list: more entries than max_entries
}

// File ops.
const (
	OpStat   = "stat"
	OpList   = "list"
	OpRead   = "read"
	OpWrite  = "write"
	OpMkdir  = "mkdir"
	OpRemove = "remove"
	OpMove   = "move"
	OpChmod  = "chmod"
	OpTarGet = "tar_get"
	OpTarPut = "tar_put"
	OpWatch  = "watch"
)

// CodeResourceExhausted reports a full disk or too many watches.
const CodeResourceExhausted = api.CodeResourceExhausted

// Limits of the file API.
const (
	MaxPathBytes       = 4096
	DefaultListEntries = 10000
	MaxListEntries     = 100000
	fileChunk          = 128 << 10
	listBatchBytes     = 256 << 10
	maxDirNames        = 1 << 20 // names of one directory read to sort a listing
	maxWatchesPerWatch = 4096    // inotify watches one watch stream may add
	maxWatchStreams    = 32      // concurrent watch streams per agent
)

// CheckPath validates a path of the file API: absolute, without NUL
// bytes, at most MaxPathBytes.
func CheckPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("no path given: give an absolute path in the sandbox, e.g. /root/file")
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("path contains a NUL byte")
	case len(p) > MaxPathBytes:
		return fmt.Errorf("path is longer than %d bytes", MaxPathBytes)
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is not absolute: paths in the sandbox start with /", p)
	}
	return nil
}

func (r *FileRequest) validate(op string) error {
	if err := CheckPath(r.Path); err != nil {
		return err
	}
	if op == OpMove {
		if err := CheckPath(r.Dest); err != nil {
			return fmt.Errorf("destination: %w", err)
		}
	}
	if r.Mode != nil && *r.Mode > 0o7777 {
		return fmt.Errorf("mode %o is not valid: give permission bits, at most 7777 in octal", *r.Mode)
	}
	if op == OpChmod && r.Mode == nil {
		return fmt.Errorf("chmod needs a mode")
	}
	if r.Offset < 0 || r.Length < 0 {
		return fmt.Errorf("offset and length must be at least 0")
	}
	if r.MaxEntries < 0 || r.MaxEntries > MaxListEntries {
		return fmt.Errorf("max entries must be between 0 and %d", MaxListEntries)
	}
	if len(r.User) > 256 || strings.ContainsAny(r.User, "\x00/\n") {
		return fmt.Errorf("user %q is not a user name or uid", r.User)
	}
	return checkMetadata(r.Metadata)
}

// owner is who owns what a write or mkdir creates: nil for root.
func owner(r *FileRequest) (*identity, *AgentError) {
	if r.User == "" {
		return nil, nil
	}
	id, err := lookupUser(r.User)
	if err != nil {
		return nil, fileErrorf(CodeInvalidArgument, "%v", err)
	}
	return id, nil
}

// mkdirAllOwned is os.MkdirAll(dir, 0755) that gives the directories it
// makes to id (nil: root's, as MkdirAll leaves them).
func mkdirAllOwned(dir string, id *identity) error {
	var made []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || d == filepath.Dir(d) {
			break
		}
		made = append(made, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if id == nil {
		return nil
	}
	for _, d := range made {
		if err := os.Lchown(d, int(id.cred.Uid), int(id.cred.Gid)); err != nil {
			return err
		}
	}
	return nil
}

// fileError turns a file system error into the AgentError the client sees.
func fileError(p string, err error) *AgentError {
	var ae *AgentError
	if errors.As(err, &ae) {
		return ae
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		if errors.Is(err, safetar.ErrInvalid) {
			return &AgentError{Code: CodeInvalidArgument, Message: err.Error()}
		}
		return &AgentError{Code: CodeInternal, Message: fmt.Sprintf("%s: %v", p, err)}
	}
	code := CodeInternal
	msg := errno.Error()
	switch errno {
	case syscall.ENOENT:
		code, msg = CodeNotFound, "no such file or directory"
	case syscall.EACCES, syscall.EPERM:
		code = CodePermissionDenied
	case syscall.EROFS:
		code, msg = CodePermissionDenied, "read-only file system"
	case syscall.EEXIST:
		code, msg = CodeAlreadyExists, "already exists"
	case syscall.ENOTEMPTY:
		code, msg = CodeInvalidArgument, "directory not empty (remove it recursively)"
	case syscall.EISDIR:
		code, msg = CodeInvalidArgument, "is a directory"
	case syscall.ENOTDIR:
		code, msg = CodeInvalidArgument, "not a directory"
	case syscall.ENOSPC, syscall.EDQUOT:
		code, msg = CodeResourceExhausted, "no space left on device"
	case syscall.ELOOP, syscall.ENAMETOOLONG, syscall.EINVAL, syscall.EBUSY, syscall.ETXTBSY, syscall.EXDEV, syscall.EMLINK:
		code = CodeInvalidArgument
	}
	return &AgentError{Code: code, Message: fmt.Sprintf("%s: %s", p, msg)}
}

func fileErrorf(code, format string, args ...any) *AgentError {
	return &AgentError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// FileInfoOf describes fi, found at p, with its user.* extended
// attributes (a regular file's or a directory's).
func FileInfoOf(p string, fi os.FileInfo) api.FileInfo {
	info := api.NewFileInfo(p, fi, func() (string, error) { return os.Readlink(p) })
	if fi.Mode().IsRegular() || fi.IsDir() {
		info.Metadata = userXattrs(p)
	}
	return info
}

// Bounds of a file's metadata (its user.* extended attributes), read or
// written.
const (
	maxMetadata      = 32
	maxMetadataKey   = 128
	maxMetadataValue = 1 << 10
)

// userXattrs reads p's user.* extended attributes (not following a
// symlink), at most maxMetadata of at most maxMetadataValue bytes each;
// nil if none or they cannot be read.
func userXattrs(p string) map[string]string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil || n == 0 {
		return nil
	}
	var out map[string]string
	val := make([]byte, maxMetadataValue)
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		key, ok := strings.CutPrefix(name, "user.")
		if !ok || key == "" || len(key) > maxMetadataKey {
			continue
		}
		if len(out) >= maxMetadata {
			break
		}
		m, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			continue // gone, or longer than maxMetadataValue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[key] = string(val[:m])
	}
	return out
}

// checkMetadata checks metadata to write as user.* extended attributes.
func checkMetadata(md map[string]string) error {
	if len(md) > maxMetadata {
		return fmt.Errorf("%d metadata entries: a file has at most %d", len(md), maxMetadata)
	}
	for k, v := range md {
		if k == "" || len(k) > maxMetadataKey || strings.ContainsRune(k, 0) {
			return fmt.Errorf("metadata key %q: give 1 to %d bytes without NUL", k, maxMetadataKey)
		}
		if len(v) > maxMetadataValue {
			return fmt.Errorf("metadata %q: its value is longer than %d bytes", k, maxMetadataValue)
		}
	}
	return nil
}

func lstatInfo(p string) (*api.FileInfo, *AgentError) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, fileError(p, err)
	}
	info := FileInfoOf(p, fi)
	return &info, nil
}

// files serves a file op.
func (s *Server) files(st net.Conn, fr *api.FrameReader, fw *frameWriter, op string, r *FileRequest) {
	p := filepath.Clean(r.Path) // "/../../x" is "/x": nothing is above the sandbox's root
	switch op {
	case OpStat:
		fw.replyInfo(lstatInfo(p))
	case OpList:
		s.fileList(st, fr, fw, p, r)
	case OpRead:
		s.fileRead(st, fr, fw, p, r)
	case OpWrite:
		s.fileWrite(fr, fw, p, r)
	case OpMkdir:
		fw.replyInfo(fileMkdir(p, r))
	case OpRemove:
		if err := fileRemove(p, r.Recursive); err != nil {
			fw.failWith(err)
			return
		}
		_ = fw.json(api.FrameJSON, FileReply{})
	case OpMove:
		fw.replyInfo(fileMove(p, filepath.Clean(r.Dest), r.Overwrite))
	case OpChmod:
		if err := os.Chmod(p, api.FileModeOf(*r.Mode)); err != nil {
			fw.failWith(fileError(p, err))
			return
		}
		fw.replyInfo(lstatInfo(p))
	case OpTarGet:
		s.tarGet(st, fr, fw, p)
	case OpTarPut:
		s.tarPut(fr, fw, p, r.Parents, r.Owners)
	case OpWatch:
		s.watch(fr, fw, p, r.Recursive)
	}
}

func (fw *frameWriter) replyInfo(info *api.FileInfo, err *AgentError) {
	if err != nil {
		fw.failWith(err)
		return
	}
	_ = fw.json(api.FrameJSON, FileReply{File: info})
}

// closeOnHangup closes st when the client ends its side of the stream, so
// that a write blocked on a client that went away fails at once.
func closeOnHangup(st net.Conn, fr *api.FrameReader) {
	go func() {
		for {
			if _, _, err := fr.Next(); err != nil {
				st.Close()
				return
			}
		}
	}()
}

func (s *Server) fileRead(st net.Conn, fr *api.FrameReader, fw *frameWriter, p string, r *FileRequest) {
	// O_NONBLOCK: opening a fifo must not wait for a writer.
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		fw.failWith(fileError(p, err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		fw.failWith(fileError(p, err))
		return
	}
	if fi.IsDir() {
		fw.fail(CodeInvalidArgument, "%s: is a directory, not a file (list it, or download it as an archive)", p)
		return
	}
	if !fi.Mode().IsRegular() {
		fw.fail(CodeInvalidArgument, "%s: not a regular file", p)
		return
	}
	info := FileInfoOf(p, fi)
	if err := fw.json(api.FrameJSON, FileReply{File: &info}); err != nil {
		return
	}
	closeOnHangup(st, fr)
	var src io.Reader = io.NewSectionReader(f, r.Offset, 1<<62)
	if r.Length > 0 {
		src = io.LimitReader(src, r.Length)
	}
	buf := make([]byte, fileChunk)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if werr := fw.write(api.FrameStdout, buf[:n]); werr != nil {
				return // the client went away
			}
		}
		if err == io.EOF {
			_ = fw.write(api.FrameEOF, nil)
			return
		}
		if err != nil {
			fw.failWith(fileError(p, err))
			return
		}
	}
}

// resolveTarget is where a write to p lands: through a symlink at p to
// what it points to (inside the sandbox), else p itself.
func resolveTarget(p string) string {
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if resolved, err := filepath.EvalSymlinks(p); err == nil {
			return resolved
		}
	}
	return p
}

// checkWritable refuses, with a clear error, to create files in a
// directory of a read-only mount (such as /proc/sys).
func checkWritable(dir string) *AgentError {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Flags&unix.ST_RDONLY != 0 {
		return fileErrorf(CodePermissionDenied, "%s: read-only file system", dir)
	}
	return nil
}

// createError is fileError for a failed create in a directory that
// exists: ENOENT there means a file system that cannot hold new files
// (procfs, sysfs).
func createError(p string, err error) *AgentError {
	if errors.Is(err, fs.ErrNotExist) {
		return fileErrorf(CodePermissionDenied, "%s: cannot create files in %s (a special file system)", p, filepath.Dir(p))
	}
	return fileError(p, err)
}

// ensureDir checks that dir is a directory, creating it (and its parents) if asked.
func ensureDir(dir string, create bool, id *identity) *AgentError {
	fi, err := os.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return nil
	case err == nil:
		return fileErrorf(CodeInvalidArgument, "%s: not a directory", dir)
	case errors.Is(err, fs.ErrNotExist) && create:
		if err := mkdirAllOwned(dir, id); err != nil {
			return fileError(dir, err)
		}
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fileErrorf(CodeNotFound, "%s: no such directory (create it first, or ask for parents)", dir)
	default:
		return fileError(dir, err)
	}
}

func (s *Server) fileWrite(fr *api.FrameReader, fw *frameWriter, p string, r *FileRequest) {
	if p == "/" {
		fw.fail(CodeInvalidArgument, "/: is a directory")
		return
	}
	target := resolveTarget(p)
	existing, err := os.Stat(target)
	switch {
	case err == nil && existing.IsDir():
		fw.fail(CodeInvalidArgument, "%s: is a directory; give the path of a file", p)
		return
	case err == nil && !existing.Mode().IsRegular():
		fw.fail(CodeInvalidArgument, "%s: not a regular file", p)
		return
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		fw.failWith(fileError(p, err))
		return
	}
	id, aerr := owner(r)
	if aerr != nil {
		fw.failWith(aerr)
		return
	}
	if aerr := ensureDir(filepath.Dir(target), r.Parents, id); aerr != nil {
		fw.failWith(aerr)
		return
	}
	if aerr := checkWritable(filepath.Dir(target)); aerr != nil {
		fw.failWith(aerr)
		return
	}
	// Write beside the target and rename over it: readers see the old
	// file or the new one, never half of one.
	tmp, err := os.CreateTemp(filepath.Dir(target), ".nook-write-*")
	if err != nil {
		fw.failWith(createError(p, err))
		return
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	mode := os.FileMode(0o644)
	switch {
	case r.Mode != nil:
		mode = api.FileModeOf(*r.Mode)
	case existing != nil:
		mode = existing.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
	}
	if existing != nil {
		if st, ok := existing.Sys().(*syscall.Stat_t); ok {
			_ = tmp.Chown(int(st.Uid), int(st.Gid)) // an overwrite keeps the owner
		}
	} else if id != nil {
		if err := tmp.Chown(int(id.cred.Uid), int(id.cred.Gid)); err != nil {
			fw.failWith(fileError(p, err))
			return
		}
	}
	for k, v := range r.Metadata {
		if err := unix.Fsetxattr(int(tmp.Fd()), "user."+k, []byte(v), 0); err != nil {
			fw.fail(CodeInvalidArgument, "%s: metadata %q: %v (the file system may keep no user attributes)", p, k, err)
			return
		}
	}
	if err := fw.json(api.FrameJSON, FileReply{}); err != nil {
		return
	}
	for {
		kind, b, err := fr.Next()
		if err != nil {
			return // the client went away before the end: nothing changes
		}
		switch kind {
		case api.FrameStdin:
			if _, err := tmp.Write(b); err != nil {
				fw.failWith(fileError(p, err))
				return
			}
			continue
		case api.FrameEOF:
		default:
			fw.fail(CodeInvalidArgument, "unexpected frame %d in a file upload", kind)
			return
		}
		break
	}
	if err := tmp.Chmod(mode); err != nil {
		fw.failWith(fileError(p, err))
		return
	}
	if err := tmp.Close(); err != nil {
		fw.failWith(fileError(p, err))
		return
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		fw.failWith(fileError(p, err))
		return
	}
	committed = true
	fw.replyInfo(lstatInfo(target))
}

func fileMkdir(p string, r *FileRequest) (*api.FileInfo, *AgentError) {
	mode := os.FileMode(0o755)
	if r.Mode != nil {
		mode = api.FileModeOf(*r.Mode)
	}
	fi, err := os.Lstat(p)
	switch {
	case err == nil && r.Parents && fi.IsDir():
		return lstatInfo(p) // mkdir -p of an existing directory
	case err == nil && fi.IsDir():
		return nil, fileErrorf(CodeAlreadyExists, "%s: directory already exists", p)
	case err == nil:
		return nil, fileErrorf(CodeAlreadyExists, "%s: a file of that name exists", p)
	}
	id, aerr := owner(r)
	if aerr != nil {
		return nil, aerr
	}
	if r.Parents {
		err = mkdirAllOwned(p, id)
	} else {
		if aerr := checkWritable(filepath.Dir(p)); aerr != nil {
			return nil, aerr
		}
		if err = os.Mkdir(p, mode); err == nil && id != nil {
			err = os.Lchown(p, int(id.cred.Uid), int(id.cred.Gid))
		}
	}
	if err != nil {
		if _, perr := os.Stat(filepath.Dir(p)); errors.Is(perr, fs.ErrNotExist) {
			return nil, fileErrorf(CodeNotFound, "%s: the parent directory does not exist (ask for parents to create it)", p)
		}
		return nil, createError(p, err)
	}
	if err := os.Chmod(p, mode); err != nil { // exactly the mode asked for, whatever the umask
		return nil, fileError(p, err)
	}
	return lstatInfo(p)
}

func fileRemove(p string, recursive bool) *AgentError {
	if p == "/" {
		return fileErrorf(CodeInvalidArgument, "refusing to remove /")
	}
	if _, err := os.Lstat(p); err != nil {
		return fileError(p, err)
	}
	var err error
	if recursive {
		err = os.RemoveAll(p)
	} else {
		err = os.Remove(p)
	}
	if err != nil {
		return fileError(p, err)
	}
	return nil
}

func fileMove(src, dst string, overwrite bool) (*api.FileInfo, *AgentError) {
	if src == "/" || dst == "/" {
		return nil, fileErrorf(CodeInvalidArgument, "cannot move / or replace it")
	}
	if src == dst {
		return nil, fileErrorf(CodeInvalidArgument, "%s: source and destination are the same", src)
	}
	if strings.HasPrefix(dst, src+"/") {
		return nil, fileErrorf(CodeInvalidArgument, "cannot move %s into itself (%s)", src, dst)
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, fileError(src, err)
	}
	if aerr := ensureDir(filepath.Dir(dst), false, nil); aerr != nil {
		return nil, aerr
	}
	err := rename(src, dst, overwrite)
	if errors.Is(err, syscall.EXDEV) {
		// Another file system, or a directory of the template's lower
		// layer (overlayfs cannot rename those): copy, then remove.
		err = moveByCopy(src, dst, overwrite)
	}
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return nil, fileErrorf(CodeAlreadyExists, "%s: already exists (ask to overwrite it)", dst)
		}
		return nil, fileError(dst, err)
	}
	return lstatInfo(dst)
}

// rename renames src to dst; unless overwrite, an existing dst is EEXIST.
func rename(src, dst string, overwrite bool) error {
	if overwrite {
		return os.Rename(src, dst)
	}
	err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSYS) {
		// A file system without RENAME_NOREPLACE.
		if _, serr := os.Lstat(dst); serr == nil {
			return syscall.EEXIST
		}
		return os.Rename(src, dst)
	}
	return err
}

func moveByCopy(src, dst string, overwrite bool) error {
	tmp := filepath.Join(filepath.Dir(dst), fmt.Sprintf(".nook-move-%d", time.Now().UnixNano()))
	if err := copyTree(src, tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := rename(tmp, dst, overwrite); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return os.RemoveAll(src)
}

// copyTree copies src to dst (which must not exist), keeping modes,
// owners, times and symlinks.
func copyTree(src, dst string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.IsDir():
		if err := os.Mkdir(dst, 0o700); err != nil {
			return err
		}
		d, err := os.Open(src)
		if err != nil {
			return err
		}
		names, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			return err
		}
		for _, n := range names {
			if err := copyTree(filepath.Join(src, n), filepath.Join(dst, n)); err != nil {
				return err
			}
		}
	case fi.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
		if st != nil {
			_ = os.Lchown(dst, int(st.Uid), int(st.Gid))
		}
		return nil
	case fi.Mode().IsRegular():
		in, err := os.Open(src)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		if err := out.Close(); err != nil {
			return err
		}
	default:
		if st == nil {
			return syscall.EINVAL
		}
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return err
		}
	}
	if st != nil {
		_ = os.Lchown(dst, int(st.Uid), int(st.Gid))
	}
	if err := os.Chmod(dst, fi.Mode()&(os.ModePerm|os.ModeSetuid|os.ModeSetgid|os.ModeSticky)); err != nil {
		return err
	}
	return os.Chtimes(dst, fi.ModTime(), fi.ModTime())
}

// listWriter sends list entries in batches of bounded size.
type listWriter struct {
	fw        *frameWriter
	batch     []api.FileInfo
	bytes     int
	count     int
	max       int
	truncated bool // an entry was left out for the cap
	err       error
}

// add queues an entry; false means stop (the cap is reached or the client went away).
func (lw *listWriter) add(info api.FileInfo) bool {
	if lw.err != nil {
		return false
	}
	if lw.count >= lw.max {
		lw.truncated = true
		return false
	}
	lw.batch = append(lw.batch, info)
	lw.count++
	lw.bytes += 256 + len(info.Path) + len(info.Name) + len(info.LinkTarget)
	for k, v := range info.Metadata {
		lw.bytes += 16 + len(k) + len(v)
	}
	if lw.bytes >= listBatchBytes {
		lw.flush()
	}
	return lw.err == nil
}

func (lw *listWriter) flush() {
	if len(lw.batch) == 0 || lw.err != nil {
		return
	}
	lw.err = lw.fw.json(api.FrameJSON, FileReply{Entries: lw.batch})
	lw.batch, lw.bytes = lw.batch[:0], 0
}

func (s *Server) fileList(st net.Conn, fr *api.FrameReader, fw *frameWriter, p string, r *FileRequest) {
	fi, err := os.Stat(p) // a symlink to a directory lists the directory
	if err != nil {
		if lfi, lerr := os.Lstat(p); lerr == nil { // a dangling symlink lists itself
			fi, err = lfi, nil
		}
	}
	if err != nil {
		fw.failWith(fileError(p, err))
		return
	}
	info := FileInfoOf(p, fi)
	if err := fw.json(api.FrameJSON, FileReply{File: &info}); err != nil {
		return
	}
	closeOnHangup(st, fr)
	max := r.MaxEntries
	if max == 0 {
		max = DefaultListEntries
	}
	lw := &listWriter{fw: fw, max: max}
	if !fi.IsDir() {
		lw.add(info)
	} else {
		listDir(lw, p, r.Recursive)
	}
	lw.flush()
	if lw.err == nil {
		_ = fw.json(api.FrameJSON, FileReply{Done: true, Truncated: lw.truncated})
	}
}

// listDir lists dir's entries, sorted by name, and with recursive those of
// its subdirectories (depth first, like find; symlinks are not followed).
// Unreadable subdirectories are skipped.
func listDir(lw *listWriter, dir string, recursive bool) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	// Sorted, so that a listing cut by the cap holds the first names; a
	// directory of more than maxDirNames entries is cut in readdir order.
	names, err := d.Readdirnames(maxDirNames)
	d.Close()
	if err != nil && err != io.EOF {
		return
	}
	sort.Strings(names)
	if room := lw.max - lw.count; len(names) > room {
		names, lw.truncated = names[:room], true
	}
	for i, n := range names {
		p := filepath.Join(dir, n)
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if !lw.add(FileInfoOf(p, fi)) {
			return
		}
		if recursive && fi.IsDir() {
			listDir(lw, p, true)
			if lw.err != nil {
				return
			}
			if lw.count >= lw.max {
				if i < len(names)-1 {
					lw.truncated = true
				}
				return
			}
		}
	}
}

// frameWriterStream is an io.Writer of FrameStdout frames.
type frameWriterStream struct{ fw *frameWriter }

func (w frameWriterStream) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += fileChunk {
		end := min(off+fileChunk, len(p))
		if err := w.fw.write(api.FrameStdout, p[off:end]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// bufferedFrames batches small tar writes into chunk-sized frames.
type bufferedFrames struct {
	w   frameWriterStream
	buf []byte
}

func (b *bufferedFrames) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := copy(b.buf[len(b.buf):cap(b.buf)], p)
		b.buf = b.buf[:len(b.buf)+k]
		p = p[k:]
		if len(b.buf) == cap(b.buf) {
			if err := b.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (b *bufferedFrames) flush() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.w.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

func (s *Server) tarGet(st net.Conn, fr *api.FrameReader, fw *frameWriter, p string) {
	info, aerr := lstatInfo(p)
	if aerr != nil {
		fw.failWith(aerr)
		return
	}
	if err := fw.json(api.FrameJSON, FileReply{File: info}); err != nil {
		return
	}
	closeOnHangup(st, fr)
	name := filepath.Base(p)
	if p == "/" {
		name = "."
	}
	bw := &bufferedFrames{w: frameWriterStream{fw}, buf: make([]byte, 0, fileChunk)}
	if err := safetar.Write(bw, p, name); err != nil {
		fw.failWith(fileError(p, err))
		return
	}
	if err := bw.flush(); err != nil {
		return
	}
	_ = fw.write(api.FrameEOF, nil)
}

// errUploadAborted is what an upload reads when the client leaves before its FrameEOF.
var errUploadAborted = errors.New("the upload ended before its end marker")

// uploadReader reads the FrameStdin payloads of an upload up to its FrameEOF.
type uploadReader struct {
	fr   *api.FrameReader
	buf  []byte
	done bool
	err  error
}

func (u *uploadReader) Read(p []byte) (int, error) {
	for len(u.buf) == 0 {
		if u.done {
			return 0, io.EOF
		}
		if u.err != nil {
			return 0, u.err
		}
		kind, b, err := u.fr.Next()
		switch {
		case err != nil:
			u.err = errUploadAborted
		case kind == api.FrameStdin:
			u.buf = b
		case kind == api.FrameEOF:
			u.done = true
		default:
			u.err = fileErrorf(CodeInvalidArgument, "unexpected frame %d in an upload", kind)
		}
	}
	n := copy(p, u.buf)
	u.buf = u.buf[n:]
	return n, nil
}

func (s *Server) tarPut(fr *api.FrameReader, fw *frameWriter, dir string, parents, owners bool) {
	if aerr := ensureDir(dir, parents, nil); aerr != nil {
		fw.failWith(aerr)
		return
	}
	if aerr := checkWritable(dir); aerr != nil {
		fw.failWith(aerr)
		return
	}
	if err := fw.json(api.FrameJSON, FileReply{}); err != nil {
		return
	}
	u := &uploadReader{fr: fr}
	err := safetar.Extract(u, dir, safetar.Options{Owners: owners})
	if err == nil {
		// Whatever follows the archive's end (record padding) up to the end marker.
		_, err = io.Copy(io.Discard, u)
	}
	switch {
	case errors.Is(err, errUploadAborted):
		return
	case err != nil:
		fw.failWith(fileError(dir, err))
		return
	}
	fw.replyInfo(lstatInfo(dir))
}

var watchStreams atomic.Int32

// fileEventTypes maps fsnotify ops to event types.
var fileEventTypes = []struct {
	op  fsnotify.Op
	typ string
}{
	{fsnotify.Create, api.FileEventCreate},
	{fsnotify.Write, api.FileEventWrite},
	{fsnotify.Remove, api.FileEventRemove},
	{fsnotify.Rename, api.FileEventRename},
	{fsnotify.Chmod, api.FileEventChmod},
}

// watcher adds inotify watches up to a cap.
type watcher struct {
	w     *fsnotify.Watcher
	added int
}

// addTree watches dir and its subdirectories (not through symlinks), and
// calls found for each entry it meets below dir.
func (wt *watcher) addTree(dir string, found func(p string)) {
	if wt.added >= maxWatchesPerWatch {
		return
	}
	if err := wt.w.Add(dir); err != nil {
		return
	}
	wt.added++
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	names, _ := d.Readdirnames(maxDirNames)
	d.Close()
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(dir, n)
		if found != nil {
			found(p)
		}
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			wt.addTree(p, found)
		}
	}
}

func (s *Server) watch(fr *api.FrameReader, fw *frameWriter, p string, recursive bool) {
	fi, err := os.Stat(p)
	if err != nil {
		fw.failWith(fileError(p, err))
		return
	}
	if watchStreams.Add(1) > maxWatchStreams {
		watchStreams.Add(-1)
		fw.fail(CodeResourceExhausted, "too many watches in this sandbox (at most %d at once): close some", maxWatchStreams)
		return
	}
	defer watchStreams.Add(-1)
	w, err := fsnotify.NewBufferedWatcher(1024)
	if err != nil {
		fw.failWith(fileError(p, err))
		return
	}
	defer w.Close()
	wt := &watcher{w: w}
	if recursive && fi.IsDir() {
		wt.addTree(p, nil)
	}
	if wt.added == 0 {
		if err := w.Add(p); err != nil {
			fw.failWith(fileError(p, err))
			return
		}
	}
	info := FileInfoOf(p, fi)
	if err := fw.json(api.FrameJSON, FileReply{File: &info}); err != nil {
		return
	}
	hangup := make(chan struct{})
	go func() {
		for {
			if _, _, err := fr.Next(); err != nil {
				close(hangup)
				return
			}
		}
	}()
	send := func(typ, path string) bool {
		return fw.json(api.FrameJSON, api.FileEvent{Type: typ, Path: path, Time: time.Now().UTC()}) == nil
	}
	for {
		select {
		case <-hangup:
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			for _, t := range fileEventTypes {
				if ev.Has(t.op) && !send(t.typ, ev.Name) {
					return
				}
			}
			if recursive && ev.Has(fsnotify.Create) {
				if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
					// Watch the new directory; what was created in it
					// before the watch took hold is reported as created.
					ok := true
					wt.addTree(ev.Name, func(p string) { ok = ok && send(api.FileEventCreate, p) })
					if !ok {
						return
					}
				}
			}
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) && !send(api.FileEventOverflow, p) {
				return
			}
		}
	}
}
