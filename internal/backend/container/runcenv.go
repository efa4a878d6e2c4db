package container

import (
	"os"
	"path/filepath"

	"github.com/nookhq/nook/internal/runcbin"
)

// runcEnv is the environment of the runc commands that may checkpoint or
// restore: CRIU's directory first in PATH (runcbin.EnvWithCRIU; runc
// from 1.4 on has no --criu flag). nil (the daemon's own environment)
// without CRIU.
func (b *Backend) runcEnv() []string {
	if b.cfg.CRIU == "" {
		return nil
	}
	dir := filepath.Dir(b.cfg.CRIU)
	if filepath.Base(b.cfg.CRIU) != "criu" {
		// A CRIU under another name (--criu /opt/criu-4.2): runc looks
		// for "criu", so a link of that name in a directory of its own.
		dir = filepath.Join(filepath.Dir(b.cfg.StateDir), "criu-path")
		link := filepath.Join(dir, "criu")
		if cur, err := os.Readlink(link); err != nil || cur != b.cfg.CRIU {
			os.MkdirAll(dir, 0o700)
			os.Remove(link)
			os.Symlink(b.cfg.CRIU, link)
		}
	}
	return runcbin.EnvWithCRIU(dir)
}
