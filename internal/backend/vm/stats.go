package vm

import (
	"os"
	"path/filepath"
	"syscall"

	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/core"
)

var _ core.StatsReader = (*Backend)(nil)

// ReadStats reads what vm sb uses on the host: its QEMU's CPU time and
// memory from the QEMU's cgroups (the guest's RAM as far as it touched
// it, plus QEMU's own), and the host space its top disk layer takes (the
// guest's writes since its template or last snapshot; the layers below
// are shared). The guest's processes are not counted: Pids stays 0.
func (b *Backend) ReadStats(sb *core.Sandbox) (core.Stats, error) {
	st := core.Stats{DiskLimit: sb.DiskBytes}
	if cpu, err := cgroups.CPUUsage(b.cfg.CgroupParent, sb.ID); err == nil {
		st.CPU = cpu
		st.MemoryBytes = cgroups.MemoryUsage(b.cfg.CgroupParent, sb.ID)
	}
	fi, err := os.Stat(filepath.Join(b.dir(sb.ID), b.readHead(sb.ID).Disk))
	if err != nil {
		if os.IsNotExist(err) {
			return st, nil
		}
		return st, err
	}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.DiskBytes = sys.Blocks * 512
	}
	return st, nil
}
