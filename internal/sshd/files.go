package sshd

import (
	"context"
	"io"

	"github.com/nookhq/nook/api"
)

// Files is what the SFTP server needs of one sandbox's file system. The
// daemon's file API answers it (through the sandbox's agent), acting for
// the SSH login user: what it creates that user owns. Paths are absolute
// paths in the sandbox. Errors are the daemon's (errdefs categories:
// errdefs.ErrNotFound, ErrPermissionDenied, ErrAlreadyExists,
// ErrInvalidArgument, ...).
type Files interface {
	// Stat describes a path without following a final symlink (its
	// LinkTarget says where it points).
	Stat(ctx context.Context, path string) (*api.FileInfo, error)
	// List lists a directory's entries (not recursive, without . and ..).
	List(ctx context.Context, dir string) ([]api.FileInfo, error)
	// Open reads a regular file from offset off to its end.
	Open(ctx context.Context, path string, off int64) (io.ReadCloser, error)
	// Write creates or replaces a regular file with what r holds, owned by
	// the login user; a file written over keeps its mode. A reader in the
	// sandbox sees the old file or the whole new one. mode is a new
	// file's permission bits.
	Write(ctx context.Context, path string, mode uint32, r io.Reader) error
	// Mkdir makes one directory (its parent must exist).
	Mkdir(ctx context.Context, path string, mode uint32) error
	// Remove removes a file, a symlink or an empty directory.
	Remove(ctx context.Context, path string) error
	// Rename moves from to to; overwrite replaces an existing file.
	Rename(ctx context.Context, from, to string, overwrite bool) error
	// Chmod sets a path's permission bits.
	Chmod(ctx context.Context, path string, mode uint32) error
}
