package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nookhq/nook/internal/core"
)

var _ core.Pauser = (*Backend)(nil)

// PauseKind implements core.Pauser.
func (b *Backend) PauseKind() string {
	return "frozen: processes stopped by the cgroup freezer, memory kept in RAM, no CPU"
}

// freezerState reads the sandbox's freezer cgroup: FROZEN, FREEZING or THAWED.
func (b *Backend) freezerState(id string) (string, error) {
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/freezer", b.cfg.CgroupParent, id, "freezer.state"), // cgroup v1
	} {
		st, err := os.ReadFile(p)
		if err == nil {
			return strings.TrimSpace(string(st)), nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
	}
	// cgroup v2: cgroup.freeze is what was asked (1 while freezing, too).
	fr, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", b.cfg.CgroupParent, id, "cgroup.freeze"))
	if err != nil {
		return "", fmt.Errorf("sandbox %s has no freezer cgroup: %w", id, err)
	}
	if bytes.Equal(bytes.TrimSpace(fr), []byte("1")) {
		return "FROZEN", nil
	}
	return "THAWED", nil
}

// thaw unfreezes a sandbox's cgroup directly, for when runc no longer
// knows the container (a kill of frozen processes waits for the thaw).
func (b *Backend) thaw(id string) {
	writeExisting(filepath.Join("/sys/fs/cgroup/freezer", b.cfg.CgroupParent, id, "freezer.state"), "THAWED")
	writeExisting(filepath.Join("/sys/fs/cgroup", b.cfg.CgroupParent, id, "cgroup.freeze"), "0")
}

// writeExisting writes to a cgroup file that exists; it never creates one
// (on a hybrid host /sys/fs/cgroup itself is a tmpfs).
func writeExisting(path, v string) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return
	}
	f.WriteString(v)
	f.Close()
}

// Paused implements core.Pauser.
func (b *Backend) Paused(ctx context.Context, id string) (bool, error) {
	st, err := b.freezerState(id)
	return st == "FROZEN" || st == "FREEZING", err
}

// Pause implements core.Pauser with `runc pause` (the cgroup freezer).
func (b *Backend) Pause(ctx context.Context, id string) error {
	if paused, err := b.Paused(ctx, id); err == nil && paused {
		return nil
	}
	return b.runcQuiet(ctx, "pause", id)
}

// Resume implements core.Pauser with `runc resume`.
func (b *Backend) Resume(ctx context.Context, id string) error {
	if paused, err := b.Paused(ctx, id); err == nil && !paused {
		return nil
	}
	return b.runcQuiet(ctx, "resume", id)
}

func (b *Backend) runcQuiet(ctx context.Context, verb, id string) error {
	out, err := exec.CommandContext(ctx, b.cfg.Runc, "--root", b.cfg.RuncRoot, verb, id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("runc %s %s: %w: %s", verb, id, err, bytes.TrimSpace(out))
	}
	return nil
}
