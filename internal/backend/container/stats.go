package container

import (
	"errors"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/core"
)

var _ core.StatsReader = (*Backend)(nil)

// ReadStats reads what container sb uses: CPU time, memory and tasks
// from its cgroups, and the space in use on its disk image's filesystem
// (statfs of its mount). A container with nothing running has no cgroups:
// zeros, and its disk if mounted.
func (b *Backend) ReadStats(sb *core.Sandbox) (core.Stats, error) {
	var st core.Stats
	if cpu, err := cgroups.CPUUsage(b.cfg.CgroupParent, sb.ID); err == nil {
		st.CPU = cpu
		st.MemoryBytes = cgroups.MemoryUsage(b.cfg.CgroupParent, sb.ID)
		if v, err := cgroups.Read(b.cfg.CgroupParent, sb.ID, "pids.current"); err == nil {
			st.Pids, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if _, err := os.Stat(b.diskImage(sb.ID)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return st, nil // a container of an earlier nook: no disk of its own
		}
		return st, err
	}
	// Only a mounted disk: an empty mount point is on the host's filesystem.
	var mnt, dir unix.Stat_t
	if err := unix.Stat(b.diskMount(sb.ID), &mnt); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return st, nil
		}
		return st, err
	}
	if err := unix.Stat(b.dir(sb.ID), &dir); err != nil || mnt.Dev == dir.Dev {
		return st, err
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(b.diskMount(sb.ID), &fs); err != nil {
		return st, err
	}
	st.DiskLimit = int64(fs.Blocks) * fs.Bsize
	st.DiskBytes = int64(fs.Blocks-fs.Bfree) * fs.Bsize
	return st, nil
}
