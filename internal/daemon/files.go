package daemon

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

// The file API. Every operation goes to the sandbox's agent, which
// resolves paths inside the sandbox's own root: the daemon never touches a
// sandbox's files on the host, so no path or symlink can lead it there.
// Streams (reads, archives, listings, watches) are the agent's streams,
// closed when ctx ends or the caller closes them.

// ParseMode parses permission bits in octal ("644", "0755", "4755").
func ParseMode(s string) (uint32, error) {
	m, err := strconv.ParseUint(strings.TrimPrefix(s, "0o"), 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errdefs.Invalid("mode %q is not valid: give permission bits in octal, e.g. 644 or 0755", s)
	}
	return uint32(m), nil
}

// fileAgent validates paths, then returns the running sandbox and its agent.
func (m *Manager) fileAgent(ctx context.Context, name string, paths ...string) (*core.Sandbox, *agent.Client, error) {
	for _, p := range paths {
		if err := agent.CheckPath(p); err != nil {
			return nil, nil, errdefs.Invalid("%v", err)
		}
	}
	return m.runningAgent(ctx, name)
}

// uploadError maps an upload's error: a source that failed (the client
// went away mid-upload) is the client's doing, not the agent's.
func (m *Manager) uploadError(ctx context.Context, sb *core.Sandbox, err error) error {
	var se *agent.SourceError
	if errors.As(err, &se) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errdefs.Invalid("the upload was cut short: %v", se.Err)
	}
	return m.agentError(ctx, sb, err)
}

// StatFile describes a path in a sandbox.
func (m *Manager) StatFile(ctx context.Context, name, path string) (*api.FileInfo, error) {
	sb, c, err := m.fileAgent(ctx, name, path)
	if err != nil {
		return nil, err
	}
	info, err := c.Stat(ctx, path)
	if err != nil {
		return nil, m.agentError(ctx, sb, err)
	}
	return info, nil
}

// ListFiles lists a directory (recursive: its whole tree) or one file, at
// most maxEntries entries (0: agent.DefaultListEntries).
func (m *Manager) ListFiles(ctx context.Context, name, path string, recursive bool, maxEntries int) (*agent.FileListing, error) {
	if maxEntries < 0 || maxEntries > agent.MaxListEntries {
		return nil, errdefs.Invalid("max_entries must be between 1 and %d (0 or absent: the default)", agent.MaxListEntries)
	}
	sb, c, err := m.fileAgent(ctx, name, path)
	if err != nil {
		return nil, err
	}
	l, err := c.ListFiles(ctx, &agent.FileRequest{Path: path, Recursive: recursive, MaxEntries: maxEntries})
	if err != nil {
		return nil, m.agentError(ctx, sb, err)
	}
	return l, nil
}

// ReadFile opens a regular file, length bytes from offset (0: to the end).
func (m *Manager) ReadFile(ctx context.Context, name, path string, offset, length int64) (*api.FileInfo, io.ReadCloser, error) {
	if offset < 0 || length < 0 {
		return nil, nil, errdefs.Invalid("offset and length must be at least 0")
	}
	sb, c, err := m.fileAgent(ctx, name, path)
	if err != nil {
		return nil, nil, err
	}
	info, rc, err := c.ReadFile(ctx, path, offset, length)
	if err != nil {
		return nil, nil, m.agentError(ctx, sb, err)
	}
	return info, rc, nil
}

// WriteOptions say how WriteFile writes.
type WriteOptions struct {
	// Mode nil keeps an existing file's mode (0644 for a new one).
	Mode *uint32
	// Parents creates missing directories.
	Parents bool
	// Owner (a user of the sandbox, "" for root) owns a new file and the
	// directories made for it; a file written over keeps its owner.
	Owner string
	// Metadata are user.* extended attributes the file gets.
	Metadata map[string]string
}

// WriteFile replaces or creates a file with what r holds, atomically: a
// reader in the sandbox sees the old file or the new one.
func (m *Manager) WriteFile(ctx context.Context, name, path string, opt WriteOptions, r io.Reader) (*api.FileInfo, error) {
	sb, c, err := m.fileAgent(ctx, name, path)
	if err != nil {
		return nil, err
	}
	info, err := c.WriteFile(ctx, &agent.FileRequest{Path: path, Mode: opt.Mode, Parents: opt.Parents, User: opt.Owner, Metadata: opt.Metadata}, r)
	if err != nil {
		return nil, m.uploadError(ctx, sb, err)
	}
	return info, nil
}

// Mkdir creates a directory (owned by owner, a user of the sandbox, ""
// for root, as are the parents it makes).
func (m *Manager) Mkdir(ctx context.Context, name, owner string, req api.MkdirRequest) (*api.FileInfo, error) {
	areq := &agent.FileRequest{Path: req.Path, Parents: req.Parents, User: owner}
	if req.Mode != "" {
		mode, err := ParseMode(req.Mode)
		if err != nil {
			return nil, err
		}
		areq.Mode = &mode
	}
	sb, c, err := m.fileAgent(ctx, name, req.Path)
	if err != nil {
		return nil, err
	}
	info, err := c.Mkdir(ctx, areq)
	if err != nil {
		return nil, m.agentError(ctx, sb, err)
	}
	return info, nil
}

// RemoveFile removes a file or an empty directory, or with recursive a tree.
func (m *Manager) RemoveFile(ctx context.Context, name, path string, recursive bool) error {
	sb, c, err := m.fileAgent(ctx, name, path)
	if err != nil {
		return err
	}
	if err := c.Remove(ctx, path, recursive); err != nil {
		return m.agentError(ctx, sb, err)
	}
	return nil
}

// MoveFile renames a file or directory inside a sandbox.
func (m *Manager) MoveFile(ctx context.Context, name string, req api.MoveRequest) (*api.FileInfo, error) {
	sb, c, err := m.fileAgent(ctx, name, req.From, req.To)
	if err != nil {
		return nil, err
	}
	info, err := c.Move(ctx, req.From, req.To, req.Overwrite)
	if err != nil {
		return nil, m.agentError(ctx, sb, err)
	}
	return info, nil
}

// ChmodFile sets a path's permission bits.
func (m *Manager) ChmodFile(ctx context.Context, name string, req api.ChmodRequest) (*api.FileInfo, error) {
	if req.Mode == "" {
		return nil, errdefs.Invalid("no mode given: give permission bits in octal, e.g. 0755")
	}
	mode, err := ParseMode(req.Mode)
	if err != nil {
		return nil, err
	}
	sb, c, err := m.fileAgent(ctx, name, req.Path)
	if err != nil {
		return nil, err
	}
	info, err := c.Chmod(ctx, req.Path, mode)
	if err != nil {
		return nil, m.agentError(ctx, sb, err)
	}
	return info, nil
}

// DownloadArchive streams a tar of a file or directory tree in a sandbox.
func (m *Manager) DownloadArchive(ctx context.Context, name, path string) (*api.FileInfo, io.ReadCloser, error) {
	sb, c, err := m.fileAgent(ctx, name, path)
	if err != nil {
		return nil, nil, err
	}
	info, rc, err := c.DownloadTar(ctx, path)
	if err != nil {
		return nil, nil, m.agentError(ctx, sb, err)
	}
	return info, rc, nil
}

// UploadArchive extracts a tar stream into a directory of a sandbox
// (created with parents). Entries cannot land outside the directory.
func (m *Manager) UploadArchive(ctx context.Context, name, dir string, parents bool, r io.Reader) (*api.FileInfo, error) {
	sb, c, err := m.fileAgent(ctx, name, dir)
	if err != nil {
		return nil, err
	}
	info, err := c.UploadTar(ctx, dir, parents, r)
	if err != nil {
		return nil, m.uploadError(ctx, sb, err)
	}
	return info, nil
}

// WatchFiles watches a path for changes (recursive: its whole tree).
func (m *Manager) WatchFiles(ctx context.Context, name, path string, recursive bool) (*agent.FileWatch, error) {
	sb, c, err := m.fileAgent(ctx, name, path)
	if err != nil {
		return nil, err
	}
	w, err := c.Watch(ctx, path, recursive)
	if err != nil {
		return nil, m.agentError(ctx, sb, err)
	}
	return w, nil
}
