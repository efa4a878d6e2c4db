package sshd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pkg/sftp"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
)

// Limits. A session's memory stays bounded whatever the client sends:
// at most maxOpenFiles handles, each reader buffering at most about
// 2*readWindow, and all uploads together holding at most
// maxPendingWrites of out-of-order data.
const (
	// readWindow is how far ahead of its stream a read may land and
	// still be served from it (the skipped bytes are buffered), and how
	// much already-read data a reader keeps for reads that arrive late.
	// OpenSSH keeps up to 64 reads of 32 KiB in flight and the request
	// server answers them with several workers, so reads arrive slightly
	// out of order; 4 MiB covers that with room to spare.
	readWindow = 4 << 20
	// readChunk is how much a reader asks its stream for at a time.
	readChunk = 128 << 10
	// maxPendingWrites bounds the out-of-order upload data held for all
	// of a session's uploads, waiting for the bytes before it.
	maxPendingWrites = 16 << 20
	// maxOpenFiles bounds a session's open file handles.
	maxOpenFiles = 16
	// maxSymlinkHops is how many symlinks a stat follows, as ELOOP.
	maxSymlinkHops = 8

	defaultFileMode = 0o644
	defaultDirMode  = 0o755
	// createUmask is applied to the mode a client asks for when creating
	// a file or directory, as sshd's usual umask would: OpenSSH sends the
	// local file's mode, and a local 0666 file should not become
	// world-writable in the sandbox.
	createUmask = 0o022
)

// SFTP protocol numbers (draft-ietf-secsh-filexfer-02) that the attribute
// sniffer needs; pkg/sftp does not export them.
const (
	fxpOpen  = 3
	fxpMkdir = 14

	fxfWrite  = 0x02
	fxfAppend = 0x04
	fxfCreat  = 0x08
	fxfTrunc  = 0x10

	attrSize        = 0x01
	attrUIDGID      = 0x02
	attrPermissions = 0x04
	attrACModTime   = 0x08
)

// ServeSFTP serves the SFTP protocol on rw (an SSH channel of subsystem
// "sftp") over f until the client ends it or ctx is done. home is the
// login user's home directory: relative paths resolve against it (the
// request server's start directory).
//
// It closes rw when ctx is done (to stop the server) or on a protocol
// error, not when the client ends the session: then the caller closes it,
// after sending an exit status if it wants to. Uploads still open when
// the session ends are abandoned, not committed.
func ServeSFTP(ctx context.Context, rw io.ReadWriteCloser, f Files, home string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	home = cleanPathWithBase("/", home)
	sniffer := &attrSniffer{ReadWriteCloser: rw, home: home}
	s := &server{ctx: ctx, files: f, home: home, attrs: sniffer, writers: map[string]*fileWriter{}}
	rs := sftp.NewRequestServer(sniffer, sftp.Handlers{FileGet: s, FilePut: s, FileCmd: s, FileList: s},
		sftp.WithStartDirectory(home))

	// Closing the connection is the only way to stop Serve; it also
	// unblocks its read of rw.
	stop := context.AfterFunc(ctx, func() { _ = rs.Close() })
	defer stop()

	err := rs.Serve()
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if err == nil || errors.Is(err, io.EOF) {
		return nil // the client ended the session
	}
	return fmt.Errorf("sftp: %w", err)
}

// server answers one session's requests. pkg/sftp calls its handlers
// from several goroutines: what they share is guarded.
type server struct {
	ctx   context.Context // the session's: Files calls end with it
	files Files
	home  string
	attrs *attrSniffer

	// pending counts the out-of-order upload bytes held by the session's
	// writers (maxPendingWrites).
	pending atomic.Int64

	mu      sync.Mutex
	open    int                    // open file handles (maxOpenFiles)
	writers map[string]*fileWriter // uploads in progress, by the path they were opened by
}

// ---- errors ----

// statusError carries a daemon error to pkg/sftp: Error is the daemon's
// message unchanged, and the chain holds the os error Go callers test
// with errors.Is and the SFTP status pkg/sftp finds with errors.As (its
// os.IsNotExist test does not look through wrapping, errors.As does).
type statusError struct {
	err    error // the daemon's
	os     error // os.ErrNotExist, os.ErrPermission or os.ErrExist
	status error // an sftp.ErrSSHFx* code
}

func (e *statusError) Error() string   { return e.err.Error() }
func (e *statusError) Unwrap() []error { return []error{e.err, e.os, e.status} }

// mapErr maps the daemon's error categories to what SFTP can say:
// not found → SSH_FX_NO_SUCH_FILE, permission denied →
// SSH_FX_PERMISSION_DENIED, already exists → SSH_FX_FAILURE (SFTP v3 has
// no code for it; the message says it). Other errors pass unchanged and
// become SSH_FX_FAILURE with their message.
func mapErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errdefs.ErrNotFound):
		return &statusError{err: err, os: os.ErrNotExist, status: sftp.ErrSSHFxNoSuchFile}
	case errors.Is(err, errdefs.ErrPermissionDenied):
		return &statusError{err: err, os: os.ErrPermission, status: sftp.ErrSSHFxPermissionDenied}
	case errors.Is(err, errdefs.ErrAlreadyExists):
		return &statusError{err: err, os: os.ErrExist, status: sftp.ErrSSHFxFailure}
	}
	return err
}

// unsupported says why an operation cannot be done, with the
// SSH_FX_OP_UNSUPPORTED status.
func unsupported(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), sftp.ErrSSHFxOpUnsupported)
}

// ---- paths and stats ----

// cleanPathWithBase cleans p and makes it absolute against base, exactly
// as pkg/sftp does for request paths (the attribute sniffer must compute
// the same paths as the request server).
func cleanPathWithBase(base, p string) string {
	p = filepath.ToSlash(filepath.Clean(p))
	if !path.IsAbs(p) {
		return path.Join(base, p)
	}
	return p
}

// follow stats p, following symlinks as stat(2) does (at most
// maxSymlinkHops). It returns the path it ended at: the file's, or on a
// not-found error the path that was not found (a dangling link's target).
func (s *server) follow(p string) (string, *api.FileInfo, error) {
	orig := p
	for hops := 0; ; hops++ {
		fi, err := s.files.Stat(s.ctx, p)
		if err != nil {
			return p, nil, err
		}
		if fi.Type != api.FileTypeSymlink {
			return p, fi, nil
		}
		if hops == maxSymlinkHops {
			return p, nil, fmt.Errorf("%s: too many levels of symbolic links", orig)
		}
		if fi.LinkTarget == "" {
			return p, nil, fmt.Errorf("%s: symbolic link without a target", p)
		}
		p = cleanPathWithBase(path.Dir(p), fi.LinkTarget)
	}
}

// fileInfo is an api.FileInfo as pkg/sftp wants it. Sys and Uid/Gid give
// the owner: pkg/sftp takes the long name's owner (ls -l) from Sys and
// the attributes' (ls -n) from Uid/Gid.
type fileInfo struct {
	name string
	fi   api.FileInfo
}

var (
	_ os.FileInfo               = (*fileInfo)(nil)
	_ sftp.FileInfoUidGid       = (*fileInfo)(nil)
	_ sftp.ListerAt             = listerAt(nil)
	_ sftp.LstatFileLister      = (*server)(nil)
	_ sftp.ReadlinkFileLister   = (*server)(nil)
	_ sftp.RealPathFileLister   = (*server)(nil)
	_ sftp.PosixRenameFileCmder = (*server)(nil)
	_ sftp.FileReader           = (*server)(nil)
	_ sftp.FileWriter           = (*server)(nil)
	_ io.Closer                 = (*fileReader)(nil)
	_ io.Closer                 = (*fileWriter)(nil)
	_ sftp.TransferError        = (*fileWriter)(nil)
)

func newFileInfo(name string, fi *api.FileInfo) *fileInfo {
	return &fileInfo{name: name, fi: *fi}
}

// permBits parses the API's octal mode ("0644", "4755"); the setuid,
// setgid and sticky bits are kept. A bad mode reads as 0.
func (f *fileInfo) permBits() uint32 {
	m, err := strconv.ParseUint(f.fi.Mode, 8, 32)
	if err != nil {
		return 0
	}
	return uint32(m) & 0o7777
}

func (f *fileInfo) Name() string       { return f.name }
func (f *fileInfo) Size() int64        { return f.fi.Size }
func (f *fileInfo) ModTime() time.Time { return f.fi.ModTime }
func (f *fileInfo) IsDir() bool        { return f.fi.Type == api.FileTypeDir }
func (f *fileInfo) Uid() uint32        { return idBits(f.fi.UID) }
func (f *fileInfo) Gid() uint32        { return idBits(f.fi.GID) }

func idBits(id int) uint32 {
	if id < 0 || id > math.MaxUint32 {
		return 0
	}
	return uint32(id)
}

func (f *fileInfo) Mode() os.FileMode {
	m := api.FileModeOf(f.permBits())
	switch f.fi.Type {
	case api.FileTypeFile:
	case api.FileTypeDir:
		m |= os.ModeDir
	case api.FileTypeSymlink:
		m |= os.ModeSymlink
	default:
		// A fifo, socket or device: the API does not say which.
		m |= os.ModeIrregular
	}
	return m
}

// Sys returns the stat as SFTP carries it (POSIX mode with its type bits).
func (f *fileInfo) Sys() any {
	mode := f.permBits()
	switch f.fi.Type {
	case api.FileTypeFile:
		mode |= 0o100000
	case api.FileTypeDir:
		mode |= 0o040000
	case api.FileTypeSymlink:
		mode |= 0o120000
	}
	mtime := uint32(max(0, min(f.fi.ModTime.Unix(), math.MaxUint32)))
	return &sftp.FileStat{
		Size: uint64(max(f.fi.Size, 0)), Mode: mode, Mtime: mtime, Atime: mtime,
		UID: f.Uid(), GID: f.Gid(),
	}
}

// listerAt serves a list of file infos to pkg/sftp, a page at a time.
type listerAt []os.FileInfo

func (l listerAt) ListAt(ls []os.FileInfo, off int64) (int, error) {
	if off < 0 || off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(ls, l[off:])
	if n < len(ls) {
		return n, io.EOF
	}
	return n, nil
}

// ---- listing and stat (sftp.FileLister and its optional interfaces) ----

// Filelist answers opendir (List), stat (Stat, following symlinks) and,
// were Readlink not implemented, readlink.
func (s *server) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	switch r.Method {
	case "List":
		p, fi, err := s.follow(r.Filepath)
		if err != nil {
			return nil, mapErr(err)
		}
		if fi.Type != api.FileTypeDir {
			// Listing a file lists that file, as ls does.
			return listerAt{newFileInfo(path.Base(r.Filepath), fi)}, nil
		}
		entries, err := s.files.List(s.ctx, p)
		if err != nil {
			return nil, mapErr(err)
		}
		l := make(listerAt, len(entries))
		for i := range entries {
			l[i] = newFileInfo(entries[i].Name, &entries[i])
		}
		return l, nil
	case "Stat":
		_, fi, err := s.follow(r.Filepath)
		if err != nil {
			return nil, mapErr(err)
		}
		return listerAt{newFileInfo(path.Base(r.Filepath), fi)}, nil
	case "Readlink":
		target, err := s.Readlink(r.Filepath)
		if err != nil {
			return nil, err
		}
		// pkg/sftp answers with the info's name.
		return listerAt{&fileInfo{name: target}}, nil
	}
	return nil, unsupported("%s is not supported", r.Method)
}

// Lstat describes a path without following a final symlink.
func (s *server) Lstat(r *sftp.Request) (sftp.ListerAt, error) {
	fi, err := s.files.Stat(s.ctx, r.Filepath)
	if err != nil {
		return nil, mapErr(err)
	}
	return listerAt{newFileInfo(path.Base(r.Filepath), fi)}, nil
}

// Readlink returns a symlink's target as stored (possibly relative).
// p is already absolute and clean.
func (s *server) Readlink(p string) (string, error) {
	fi, err := s.files.Stat(s.ctx, p)
	if err != nil {
		return "", mapErr(err)
	}
	if fi.Type != api.FileTypeSymlink {
		return "", fmt.Errorf("%s is not a symbolic link", p)
	}
	return fi.LinkTarget, nil
}

// RealPath makes p absolute (relative paths are against home) and clean.
// Symlinks are left as they are: clients only use it to learn the home
// directory and to canonicalize paths they then stat.
func (s *server) RealPath(p string) (string, error) {
	return cleanPathWithBase(s.home, p), nil
}

// ---- commands (sftp.FileCmder) ----

// Filecmd answers setstat, rename, remove, rmdir and mkdir.
func (s *server) Filecmd(r *sftp.Request) error {
	p := r.Filepath
	switch r.Method {
	case "Setstat":
		return s.setstat(r)
	case "Rename":
		// SFTP v3 rename fails when the target exists; clients that want
		// to replace use posix-rename@openssh.com (PosixRename).
		return mapErr(s.files.Rename(s.ctx, p, r.Target, false))
	case "Remove":
		// SSH_FXP_REMOVE removes files only (unlink(2)); Files.Remove
		// would also remove an empty directory.
		fi, err := s.files.Stat(s.ctx, p)
		if err != nil {
			return mapErr(err)
		}
		if fi.Type == api.FileTypeDir {
			return fmt.Errorf("%s is a directory (use rmdir)", p)
		}
		return mapErr(s.files.Remove(s.ctx, p))
	case "Rmdir":
		fi, err := s.files.Stat(s.ctx, p)
		if err != nil {
			return mapErr(err)
		}
		if fi.Type != api.FileTypeDir {
			return fmt.Errorf("%s is not a directory", p)
		}
		return mapErr(s.files.Remove(s.ctx, p))
	case "Mkdir":
		mode := uint32(defaultDirMode)
		if m, ok := s.attrs.take(fxpMkdir, p); ok {
			mode = m & 0o7777 &^ createUmask
		}
		return mapErr(s.files.Mkdir(s.ctx, p, mode))
	case "Symlink", "Link":
		return unsupported("creating links is not supported")
	}
	return unsupported("%s is not supported", r.Method)
}

// PosixRename answers posix-rename@openssh.com: rename, replacing an
// existing target (OpenSSH's sftp uses it for rename when offered).
func (s *server) PosixRename(r *sftp.Request) error {
	return mapErr(s.files.Rename(s.ctx, r.Filepath, r.Target, true))
}

// setstat answers setstat and fsetstat. Only permission bits can be set:
// the file API cannot truncate, change owners or set times. A request
// with size or owner is refused whole. One with times is refused too,
// after its permission bits (if any) are applied: OpenSSH's put -p and
// scp -p send permissions and times together and go on after a failed
// fsetstat, so the mode is kept and the client reports that the times
// could not be set.
func (s *server) setstat(r *sftp.Request) error {
	const known = attrSize | attrUIDGID | attrPermissions | attrACModTime
	if r.Flags&(attrSize|attrUIDGID) != 0 {
		return unsupported("changing a file's size or owner is not supported")
	}
	if r.Flags&^known != 0 {
		return unsupported("setting extended attributes is not supported")
	}
	if r.Flags&attrPermissions != 0 {
		attrs := r.Attributes()
		if attrs == nil {
			return fmt.Errorf("%s: malformed attributes: %w", r.Filepath, sftp.ErrSSHFxBadMessage)
		}
		if err := s.chmod(r.Filepath, attrs.Mode&0o7777); err != nil {
			return err
		}
	}
	if r.Flags&attrACModTime != 0 {
		return unsupported("setting file times is not supported")
	}
	return nil
}

// chmod sets p's permission bits. A file being uploaded does not exist
// yet (it appears when its handle is closed), so a chmod of it (OpenSSH's
// fsetstat before closing) is applied once it is written.
func (s *server) chmod(p string, mode uint32) error {
	s.mu.Lock()
	w := s.writers[p]
	s.mu.Unlock()
	if w != nil && w.deferChmod(mode) {
		return nil
	}
	return mapErr(s.files.Chmod(s.ctx, p, mode))
}

// acquireHandle counts an open file handle, refusing one over maxOpenFiles.
func (s *server) acquireHandle() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open >= maxOpenFiles {
		return fmt.Errorf("too many open files (at most %d per session)", maxOpenFiles)
	}
	s.open++
	return nil
}

func (s *server) releaseHandle() {
	s.mu.Lock()
	s.open--
	s.mu.Unlock()
}

// ---- reads (sftp.FileReader) ----

// Fileread opens a regular file for reading (following symlinks).
func (s *server) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	p, fi, err := s.follow(r.Filepath)
	if err != nil {
		return nil, mapErr(err)
	}
	switch fi.Type {
	case api.FileTypeFile:
	case api.FileTypeDir:
		return nil, fmt.Errorf("%s is a directory", r.Filepath)
	default:
		return nil, fmt.Errorf("%s is not a regular file", r.Filepath)
	}
	if err := s.acquireHandle(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(s.ctx)
	return &fileReader{s: s, ctx: ctx, cancel: cancel, path: p}, nil
}

// fileReader serves ReadAt from one sequential Files.Open stream: the
// daemon streams files, and opening one stream per 32 KiB read would cost
// a round trip through the sandbox's agent each. Reads come concurrently
// and slightly out of order; those at or a little ahead of the stream
// are served from it (buffering what they skip), those a little behind
// from the bytes it already gave. Only a real seek reopens the stream.
type fileReader struct {
	s      *server
	ctx    context.Context // the handle's: canceled on Close
	cancel context.CancelFunc
	path   string

	mu     sync.Mutex
	rc     io.ReadCloser // the stream, at pos; nil before the first read, at EOF or after an error
	pos    int64         // the file offset of the stream's next byte
	buf    []byte        // the bytes just before pos: [pos-len(buf), pos)
	eof    bool          // the stream ended at pos
	closed bool
}

func (fr *fileReader) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read %s: negative offset %d", fr.path, off)
	}
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fr.closed {
		return 0, os.ErrClosed
	}
	if len(p) == 0 {
		return 0, nil
	}
	end := off + int64(len(p))
	if end < off { // overflow: the file cannot be that long anyway
		end = math.MaxInt64
	}

	start := fr.pos - int64(len(fr.buf))
	seek := off < start || off > fr.pos+readWindow || (fr.rc == nil && !fr.eof)
	if fr.eof && off >= fr.pos && off <= fr.pos+readWindow {
		// The file ended before off: OpenSSH reads past the end a
		// window's worth; no need to reopen for that.
		seek = false
	}
	if seek {
		if err := fr.reopen(off); err != nil {
			return 0, err
		}
		start = off
	}

	for empty := 0; fr.pos < end && !fr.eof; {
		n, err := fr.fill()
		if err != nil {
			return 0, err
		}
		if n > 0 {
			empty = 0
			continue
		}
		// A stream that keeps returning nothing is broken.
		if empty++; empty == 100 {
			fr.stop()
			fr.buf = fr.buf[:0]
			return 0, fmt.Errorf("read %s: %w", fr.path, io.ErrNoProgress)
		}
	}

	start = fr.pos - int64(len(fr.buf))
	var n int
	if off < fr.pos {
		n = copy(p, fr.buf[off-start:])
	}
	// Keep at most readWindow bytes behind the stream for late reads.
	if len(fr.buf) > readWindow {
		fr.buf = fr.buf[len(fr.buf)-readWindow:]
	}
	if n < len(p) {
		return n, io.EOF // the loop only stops short at the end of the file
	}
	return n, nil
}

// reopen starts a new stream at off.
func (fr *fileReader) reopen(off int64) error {
	fr.stop()
	rc, err := fr.s.files.Open(fr.ctx, fr.path, off)
	if err != nil {
		return mapErr(err)
	}
	fr.rc, fr.pos, fr.buf, fr.eof = rc, off, fr.buf[:0], false
	return nil
}

// fill reads the next chunk of the stream into buf.
func (fr *fileReader) fill() (int, error) {
	fr.buf = slices.Grow(fr.buf, readChunk)
	n, err := fr.rc.Read(fr.buf[len(fr.buf) : len(fr.buf)+readChunk])
	fr.buf = fr.buf[:len(fr.buf)+n]
	fr.pos += int64(n)
	switch {
	case errors.Is(err, io.EOF):
		fr.stop()
		fr.eof = true
	case err != nil:
		// Drop the stream: the next read reopens it.
		fr.stop()
		fr.buf = fr.buf[:0]
		return 0, fmt.Errorf("read %s: %w", fr.path, mapErr(err))
	}
	return n, nil
}

// stop closes the stream, if any.
func (fr *fileReader) stop() {
	if fr.rc != nil {
		_ = fr.rc.Close()
		fr.rc = nil
	}
}

// Close ends the handle. pkg/sftp calls it once no read is running.
func (fr *fileReader) Close() error {
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fr.closed {
		return nil
	}
	fr.closed = true
	fr.stop()
	fr.buf = nil
	fr.cancel()
	fr.s.releaseHandle()
	return nil
}

// ---- writes (sftp.FileWriter) ----

// Filewrite opens a file for writing. The file API replaces whole files
// (Files.Write), so only opens that replace a file's content stream:
// truncating, creating a new file, or an existing empty one. An open that
// would keep existing content — append, resume (reput), in-place random
// access — cannot be honored and is refused with SSH_FX_OP_UNSUPPORTED.
//
// The file appears (or is replaced) when the handle is closed.
func (s *server) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	// pkg/sftp drops the open's attribute flags (Request.Flags holds the
	// open flags, so r.Attributes() would misread them): the mode comes
	// from the sniffer. Take it first, so every open consumes its own.
	mode := uint32(defaultFileMode)
	if m, ok := s.attrs.take(fxpOpen, r.Filepath); ok {
		mode = m & 0o7777 &^ createUmask
	}
	flags := r.Pflags()

	if flags.Excl {
		// As open(2) with O_EXCL: anything there, even a dangling
		// symlink, makes it fail.
		_, err := s.files.Stat(s.ctx, r.Filepath)
		if err == nil {
			return nil, mapErr(errdefs.Exists("%s already exists", r.Filepath))
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, mapErr(err)
		}
	}

	// Write where the path leads: through symlinks, as open(2) does.
	p, fi, err := s.follow(r.Filepath)
	switch {
	case err == nil:
		switch fi.Type {
		case api.FileTypeFile:
		case api.FileTypeDir:
			return nil, fmt.Errorf("%s is a directory", r.Filepath)
		default:
			return nil, fmt.Errorf("%s is not a regular file", r.Filepath)
		}
		if !flags.Trunc && fi.Size > 0 {
			return nil, unsupported("%s: cannot modify an existing file in place (append, resume or "+
				"random access); only replacing it whole is supported", r.Filepath)
		}
	case errors.Is(err, errdefs.ErrNotFound):
		if !flags.Creat {
			return nil, mapErr(err)
		}
		// Fail the open, not the close, when the file cannot be created.
		dir := path.Dir(p)
		_, dfi, derr := s.follow(dir)
		if derr != nil {
			return nil, mapErr(derr)
		}
		if dfi.Type != api.FileTypeDir {
			return nil, fmt.Errorf("%s is not a directory", dir)
		}
	default:
		return nil, mapErr(err)
	}

	if err := s.acquireHandle(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(s.ctx)
	pr, pw := io.Pipe()
	w := &fileWriter{
		s: s, path: p, reqPath: r.Filepath, cancel: cancel, pw: pw, done: make(chan error, 1),
		pending: map[int64][]byte{},
	}
	go func() {
		err := s.files.Write(ctx, p, mode, pr)
		// Unblock a WriteAt blocked on the pipe if Write gave up early.
		if err != nil {
			pr.CloseWithError(err)
		} else {
			pr.CloseWithError(errors.New("the file was written before all data was received"))
		}
		w.done <- err
	}()
	s.mu.Lock()
	s.writers[r.Filepath] = w
	s.mu.Unlock()
	return w, nil
}

// fileWriter turns WriteAt calls (concurrent, in any order) into the one
// sequential stream Files.Write reads. A chunk at the stream's offset is
// written through, then any pending chunks it makes contiguous; a chunk
// further on waits in pending (bounded by maxPendingWrites for the
// session); a chunk before the offset would rewrite streamed data and is
// refused. Any refused chunk fails the upload: the file is not replaced.
type fileWriter struct {
	s       *server
	path    string // where the file is written (symlinks followed)
	reqPath string // the path it was opened by, which fsetstat names
	cancel  context.CancelFunc
	pw      *io.PipeWriter
	done    chan error // Files.Write's result

	mu           sync.Mutex
	off          int64            // bytes streamed: the next in-order offset
	pending      map[int64][]byte // out-of-order chunks by offset
	pendingBytes int64
	failed       error   // why the upload will not be committed
	chmod        *uint32 // a chmod received while open, for after the write
	closed       bool

	closeOnce sync.Once
	closeErr  error
}

func (w *fileWriter) WriteAt(p []byte, off int64) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, os.ErrClosed
	}
	if w.failed != nil {
		return 0, w.failed
	}
	if off < 0 || off > math.MaxInt64-int64(len(p)) {
		return 0, w.fail(fmt.Errorf("write %s: invalid offset %d", w.path, off))
	}
	if len(p) == 0 {
		return 0, nil
	}
	switch {
	case off == w.off:
		if err := w.stream(p); err != nil {
			return 0, err
		}
		// The chunk may have closed the gap before pending ones.
		for {
			c, ok := w.pending[w.off]
			if !ok {
				break
			}
			delete(w.pending, w.off)
			w.pendingBytes -= int64(len(c))
			w.s.pending.Add(-int64(len(c)))
			if err := w.stream(c); err != nil {
				return 0, err
			}
		}
	case off < w.off:
		return 0, w.fail(unsupported("write %s at offset %d: rewriting data already written (up to offset %d) "+
			"is not supported", w.path, off, w.off))
	default:
		if _, dup := w.pending[off]; dup {
			return 0, w.fail(unsupported("write %s at offset %d: rewriting data already written is not supported",
				w.path, off))
		}
		if w.s.pending.Add(int64(len(p))) > maxPendingWrites {
			w.s.pending.Add(-int64(len(p)))
			return 0, w.fail(fmt.Errorf("write %s at offset %d: too much out-of-order data (more than %d MiB "+
				"waiting for earlier writes)", w.path, off, maxPendingWrites>>20))
		}
		// p is the request's buffer: keep a copy.
		w.pending[off] = bytes.Clone(p)
		w.pendingBytes += int64(len(p))
	}
	return len(p), nil
}

// stream writes p to Files.Write; it blocks until Write has read it.
func (w *fileWriter) stream(p []byte) error {
	if _, err := w.pw.Write(p); err != nil {
		return w.fail(fmt.Errorf("write %s: %w", w.path, mapErr(err)))
	}
	w.off += int64(len(p))
	return nil
}

// fail records why the upload fails, drops pending data and aborts
// Files.Write so that it does not replace the file. It returns err.
func (w *fileWriter) fail(err error) error {
	if w.failed == nil {
		w.failed = err
	}
	w.dropPending()
	w.pw.CloseWithError(w.failed)
	return err
}

func (w *fileWriter) dropPending() {
	w.s.pending.Add(-w.pendingBytes)
	w.pending, w.pendingBytes = nil, 0
}

// deferChmod records a chmod for after the write; false once the handle
// is closed (then the file exists and can be chmodded directly).
func (w *fileWriter) deferChmod(mode uint32) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.chmod = &mode
	return true
}

// TransferError is pkg/sftp telling that the session ended with the
// handle open: the upload is incomplete, Close must not commit it.
func (w *fileWriter) TransferError(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed == nil {
		w.failed = fmt.Errorf("upload of %s interrupted: %w", w.path, err)
	}
}

// Close ends the stream and waits for Files.Write: the close's status is
// the upload's (so put reports a failure). pkg/sftp calls it once no
// write is running.
func (w *fileWriter) Close() error {
	w.closeOnce.Do(func() { w.closeErr = w.close() })
	return w.closeErr
}

func (w *fileWriter) close() error {
	w.mu.Lock()
	w.closed = true
	abort := w.failed
	if abort == nil && len(w.pending) > 0 {
		abort = fmt.Errorf("upload of %s incomplete: no data at offset %d", w.path, w.off)
	}
	w.dropPending()
	chmod := w.chmod
	w.mu.Unlock()

	if abort != nil {
		w.pw.CloseWithError(abort)
	} else {
		_ = w.pw.Close()
	}
	err := <-w.done
	w.cancel()

	w.s.mu.Lock()
	if w.s.writers[w.reqPath] == w {
		delete(w.s.writers, w.reqPath)
	}
	w.s.mu.Unlock()
	w.s.releaseHandle()

	switch {
	case abort != nil:
		return abort
	case err != nil:
		return mapErr(err)
	case chmod != nil:
		return mapErr(w.s.files.Chmod(w.s.ctx, w.path, *chmod))
	}
	return nil
}

// ---- attribute sniffing ----

// attrSniffer passes the client's bytes to the request server and reads
// them on the way to recover the permissions requested by SSH_FXP_OPEN
// and SSH_FXP_MKDIR, which pkg/sftp v1.13.12's request server drops: an
// open's attribute flags are lost (Request.Flags holds the open flags,
// and Attributes() would parse the attributes with those) and a mkdir's
// attributes are not passed at all. It follows the packet framing
// (uint32 length, then the body) and keeps only the bodies of those two
// packet types, when small. The requested modes wait, by packet type and
// path, for the handler of the same request to take them; the request
// server reads a packet whole before it dispatches it, so the mode is
// there first.
type attrSniffer struct {
	io.ReadWriteCloser
	home string // the request server's start directory

	// The parser's state: only the request server's reading goroutine
	// touches it.
	hdr     [4]byte
	hdrN    int
	left    uint32 // body bytes of the current packet still to come
	started bool   // the current body's type byte was seen
	keep    bool
	body    []byte

	mu    sync.Mutex
	modes map[sniffKey][]sniffedMode
	n     int
}

type sniffKey struct {
	typ  byte
	path string // as the request server computes it
}

type sniffedMode struct {
	mode uint32
	ok   bool // the request carried permissions
}

const (
	maxSniffedPacket = 16 << 10 // longer opens (huge paths) get the default mode
	maxSniffedModes  = 64       // entries waiting for their handler
)

func (a *attrSniffer) Read(p []byte) (int, error) {
	n, err := a.ReadWriteCloser.Read(p)
	a.scan(p[:n])
	return n, err
}

// scan follows the packet framing over b.
func (a *attrSniffer) scan(b []byte) {
	for len(b) > 0 {
		if a.left == 0 { // in a length header
			k := copy(a.hdr[a.hdrN:], b)
			a.hdrN += k
			b = b[k:]
			if a.hdrN == len(a.hdr) {
				a.hdrN = 0
				a.left = binary.BigEndian.Uint32(a.hdr[:])
				a.started, a.keep, a.body = false, false, a.body[:0]
			}
			continue
		}
		if !a.started {
			a.started = true
			a.keep = (b[0] == fxpOpen || b[0] == fxpMkdir) && a.left <= maxSniffedPacket
		}
		k := int(min(uint32(len(b)), a.left))
		if a.keep {
			a.body = append(a.body, b[:k]...)
		}
		a.left -= uint32(k)
		b = b[k:]
		if a.left == 0 && a.keep {
			a.record(a.body)
		}
	}
}

// record notes the mode an open-for-writing or a mkdir asks for.
func (a *attrSniffer) record(body []byte) {
	typ, b := body[0], body[1:]
	var ok bool
	if _, b, ok = sniffUint32(b); !ok { // request id
		return
	}
	var p string
	if p, b, ok = sniffString(b); !ok {
		return
	}
	if typ == fxpOpen {
		var pflags uint32
		if pflags, b, ok = sniffUint32(b); !ok {
			return
		}
		// Only these reach Filewrite, which takes the mode; a
		// read-only open would leave its entry behind.
		if pflags&(fxfWrite|fxfAppend|fxfCreat|fxfTrunc) == 0 {
			return
		}
	}
	var flags uint32
	if flags, b, ok = sniffUint32(b); !ok {
		return
	}
	var m sniffedMode
	if flags&attrSize != 0 {
		if len(b) < 8 {
			return
		}
		b = b[8:]
	}
	if flags&attrUIDGID != 0 {
		if len(b) < 8 {
			return
		}
		b = b[8:]
	}
	if flags&attrPermissions != 0 {
		if m.mode, _, ok = sniffUint32(b); !ok {
			return
		}
		m.ok = true
	}

	key := sniffKey{typ: typ, path: cleanPathWithBase(a.home, p)}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.n >= maxSniffedModes {
		return // should not happen: each entry is taken by its handler
	}
	if a.modes == nil {
		a.modes = map[sniffKey][]sniffedMode{}
	}
	a.modes[key] = append(a.modes[key], m)
	a.n++
}

// take returns the mode the oldest waiting request of type typ on p asked
// for, if it asked for one.
func (a *attrSniffer) take(typ byte, p string) (uint32, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := sniffKey{typ: typ, path: p}
	q := a.modes[key]
	if len(q) == 0 {
		return 0, false
	}
	m := q[0]
	if len(q) == 1 {
		delete(a.modes, key)
	} else {
		a.modes[key] = q[1:]
	}
	a.n--
	return m.mode, m.ok
}

func sniffUint32(b []byte) (uint32, []byte, bool) {
	if len(b) < 4 {
		return 0, b, false
	}
	return binary.BigEndian.Uint32(b), b[4:], true
}

func sniffString(b []byte) (string, []byte, bool) {
	n, b, ok := sniffUint32(b)
	if !ok || uint64(n) > uint64(len(b)) {
		return "", b, false
	}
	return string(b[:n]), b[n:], true
}
