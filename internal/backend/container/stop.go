package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/fsutil"
)

var _ core.Stopper = (*Backend)(nil)

// A stopped container has no process, no cgroup and no mount: its files
// stay on its disk image, its network namespace (its address) stays, and
// a start runs its init afresh over them. The file "stopped" in its
// directory records the stop, so that it reads as stopped (not crashed)
// across daemon restarts.

func (b *Backend) stoppedFile(id string) string { return filepath.Join(b.dir(id), "stopped") }

// Stop implements core.Stopper: the container's processes are killed, a
// pause's checkpoint dropped, its root and disk unmounted.
func (b *Backend) Stop(ctx context.Context, id string) error {
	release, err := b.exclusive(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	if _, err := os.Stat(b.dir(id)); err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	// Recorded first: a crash from here leaves it stopped.
	if err := fsutil.WriteFileAtomic(b.stoppedFile(id), nil); err != nil {
		return err
	}
	if err := b.stop(ctx, id); err != nil {
		return err
	}
	if err := b.dropCheckpoint(id); err != nil {
		return err
	}
	return b.unmountDisk(id)
}

// Start implements core.Stopper: the container's init starts afresh on
// its files.
func (b *Backend) Start(ctx context.Context, sb *core.Sandbox) error {
	unlock := b.rollbacks.Lock(sb.ID)
	defer unlock()
	c, err := b.sandboxChain(sb.ID)
	if errors.Is(err, os.ErrNotExist) {
		c, err = chain{Template: sb.TemplateID}, nil // made by a nook without snapshots
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	if err := b.stop(ctx, sb.ID); err != nil { // what a start a crash cut short left
		return err
	}
	if err := b.start(ctx, sb, c, false, nil); err != nil {
		return err
	}
	if err := os.Remove(b.stoppedFile(sb.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}
