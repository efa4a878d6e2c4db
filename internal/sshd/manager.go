package sshd

import (
	"context"
	"fmt"
	"io"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/daemon"
)

// sandboxFiles is Files over the daemon's file API, for one sandbox and
// login user.
type sandboxFiles struct {
	m    *daemon.Manager
	name string // the sandbox's
	user string // who owns what SFTP creates ("" root)
}

func (f *sandboxFiles) Stat(ctx context.Context, path string) (*api.FileInfo, error) {
	return f.m.StatFile(ctx, f.name, path)
}

func (f *sandboxFiles) List(ctx context.Context, dir string) ([]api.FileInfo, error) {
	l, err := f.m.ListFiles(ctx, f.name, dir, false, agent.MaxListEntries)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	var out []api.FileInfo
	for {
		batch, err := l.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, batch...)
	}
}

func (f *sandboxFiles) Open(ctx context.Context, path string, off int64) (io.ReadCloser, error) {
	_, rc, err := f.m.ReadFile(ctx, f.name, path, off, 0)
	return rc, err
}

func (f *sandboxFiles) Write(ctx context.Context, path string, mode uint32, r io.Reader) error {
	_, err := f.m.WriteFile(ctx, f.name, path, daemon.WriteOptions{Mode: newFileMode(ctx, f, path, mode), Owner: f.user}, r)
	return err
}

// newFileMode is the mode a write gives: mode for a new file, nil (keep
// it) for one that exists.
func newFileMode(ctx context.Context, f *sandboxFiles, path string, mode uint32) *uint32 {
	if _, err := f.m.StatFile(ctx, f.name, path); err == nil {
		return nil
	}
	return &mode
}

func (f *sandboxFiles) Mkdir(ctx context.Context, path string, mode uint32) error {
	_, err := f.m.Mkdir(ctx, f.name, f.user, api.MkdirRequest{Path: path, Mode: fmt.Sprintf("%04o", mode&0o7777)})
	return err
}

func (f *sandboxFiles) Remove(ctx context.Context, path string) error {
	return f.m.RemoveFile(ctx, f.name, path, false)
}

func (f *sandboxFiles) Rename(ctx context.Context, from, to string, overwrite bool) error {
	_, err := f.m.MoveFile(ctx, f.name, api.MoveRequest{From: from, To: to, Overwrite: overwrite})
	return err
}

func (f *sandboxFiles) Chmod(ctx context.Context, path string, mode uint32) error {
	_, err := f.m.ChmodFile(ctx, f.name, api.ChmodRequest{Path: path, Mode: fmt.Sprintf("%04o", mode&0o7777)})
	return err
}
