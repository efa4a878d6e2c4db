// Package fsutil holds the small file operations several packages need
// to be crash-safe and to share a directory across processes.
package fsutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/poll"
)

// Flock takes an exclusive lock on path (created if missing) across
// processes, waiting until ctx ends. The returned function releases it.
func Flock(ctx context.Context, path string) (func(), error) {
	return flock(ctx, path, unix.LOCK_EX)
}

// FlockShared takes a shared lock on path (created if missing), which
// any number of holders share and an exclusive lock excludes, waiting
// until ctx ends. The returned function releases it.
func FlockShared(ctx context.Context, path string) (func(), error) {
	return flock(ctx, path, unix.LOCK_SH)
}

// TryFlock takes an exclusive lock on path (created if missing) if no
// one holds it, shared or not: ok false, and no error, if someone does.
func TryFlock(path string) (unlock func(), ok bool, err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, false, err
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		f.Close()
		return nil, false, nil
	}
	if err != nil {
		f.Close()
		return nil, false, err
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, true, nil
}

func flock(ctx context.Context, path string, how int) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	err = poll.Until(ctx, poll.Options{Min: 5 * time.Millisecond, Max: 50 * time.Millisecond}, func() (bool, error) {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); f.Close() }, nil
}

// WriteFileSync writes b to path and syncs it to disk.
func WriteFileSync(path string, b []byte) error {
	return writeFileSync(path, b, 0o666)
}

func writeFileSync(path string, b []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// WriteFileAtomic replaces path with b: a synced temporary file renamed
// over it, then the directory synced, so a crash leaves the old or the
// new content.
func WriteFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	os.Remove(tmp) // a leftover keeps its mode: made afresh, it is owner-only from the start
	if err := writeFileSync(tmp, b, 0o600); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	SyncDir(filepath.Dir(path))
	return nil
}

// SyncDir syncs a directory, so that renames in it are durable.
func SyncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// Tail returns the last max bytes of a file that someone untrusted may
// write (a sandbox's log or console), as text safe to show: invalid UTF-8
// and control characters (terminal escapes) become '?', carriage returns
// are dropped.
func Tail(path string, max int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	return TailFile(f, max)
}

// TailFile is Tail of an open file.
func TailFile(f *os.File, max int64) string {
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		f.Seek(fi.Size()-max, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, max))
	return strings.Map(func(r rune) rune {
		if r == '\r' {
			return -1
		}
		if r != '\n' && r != '\t' && (r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0)) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(string(b), "?"))
}

// RemoveUnused removes every entry of dir whose name used does not hold
// (a missing dir has none).
func RemoveUnused(dir string, used map[string]bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range entries {
		if !used[e.Name()] {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// ReadJSON reads path and decodes its JSON into v. A missing file's error
// is the os error (errors.Is(err, os.ErrNotExist)).
func ReadJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// WriteJSONAtomic writes v as JSON to path, crash-safely (WriteFileAtomic).
func WriteJSONAtomic(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, data)
}

// Syncfs flushes the filesystem that holds dir.
func Syncfs(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// IsMountPoint reports whether path is the root of a mount: a
// filesystem, or a bind mount (of a directory of the same filesystem
// too, where the kernel says so; before 5.8, only one on another
// filesystem than its parent directory).
func IsMountPoint(path string) (bool, error) {
	// The kernel says (5.8+): a bind mount of a directory of the same
	// filesystem as its parent is one too, which the devices' numbers
	// cannot tell.
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, 0, &stx); err != nil {
		return false, err
	}
	if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 {
		return stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0, nil
	}
	var st, parent unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(path), &parent); err != nil {
		return false, err
	}
	return st.Dev != parent.Dev, nil
}

// fsTopdirFL is FS_TOPDIR_FL (linux/fs.h): ext4's Orlov allocator
// spreads the subdirectories of a directory so marked over the
// filesystem's block groups, as it does those of the root.
const fsTopdirFL = 0x00020000

// MarkTopDir marks dir as the top of directory hierarchies (chattr +T),
// where the filesystem knows the flag (ext2/3/4); elsewhere it does
// nothing. Each subdirectory made in dir then starts in a block group of
// its own choosing, with free inodes and blocks above the average,
// rather than beside dir's: its files are not allocated among the
// inodes other hierarchies freed recently (which ext4 without a journal
// steps over one by one while they are recent, see BENCHMARKS.md).
func MarkTopDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetInt(fd, unix.FS_IOC_GETFLAGS)
	if err != nil {
		return nil // not a filesystem with inode flags
	}
	if uint32(flags)&fsTopdirFL != 0 {
		return nil
	}
	if err := unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, int(uint32(flags)|fsTopdirFL)); err != nil && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("mark %s a top directory: %w", dir, err)
	}
	return nil
}
