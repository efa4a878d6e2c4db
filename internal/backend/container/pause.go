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
	// cgroup v2
	ev, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", b.cfg.CgroupParent, id, "cgroup.events"))
	if err != nil {
		return "", fmt.Errorf("sandbox %s has no freezer cgroup: %w", id, err)
	}
	if bytes.Contains(ev, []byte("frozen 1")) {
		return "FROZEN", nil
	}
	return "THAWED", nil
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
