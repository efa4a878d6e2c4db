package container

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/core/conformance"
	"github.com/nookhq/nook/internal/fsutil"
)

// A sandbox paused to disk across a host reboot (its disk no longer
// mounted): a snapshot and the resume mount the disk again, and the
// sandbox's files are there.
func TestDiskAcrossReboot(t *testing.T) {
	b, h := newCheckpointBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "reboot")
	s.Sh(t, "echo kept > /root/f")
	s.Agent.Close()
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if !b.checkpointed(s.ID) {
		t.Skip("the pause did not checkpoint (CRIU could not save the sandbox)")
	}
	// The reboot: nothing is mounted any more.
	if err := b.unmountDisk(s.ID); err != nil {
		t.Fatal(err)
	}
	if mounted, _ := fsutil.IsMountPoint(b.diskMount(s.ID)); mounted {
		t.Fatal("the disk is still mounted")
	}
	b2 := twin(b)
	if _, err := b2.Snapshot(ctx, s.Sandbox, "after-reboot", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b2.unmountDisk(s.ID); err != nil {
		t.Fatal(err)
	}
	if err := b2.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(strings.Fields(s.Sh(t, "cat /root/f; df -B1G --output=size / | tail -1")), " "); got != "kept 10" {
		t.Fatalf("after the resume: %q", got)
	}
	if err := b2.GC(ctx, nil); err != nil {
		t.Fatal(err)
	}
}

// Destroy never removes files through a mount left under the sandbox's
// directory (a leaked bind of a template would lose the template): it
// refuses until the mount is gone.
func TestDestroyKeepsMountedFiles(t *testing.T) {
	b, h := newTestBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "mounted")
	precious := t.TempDir()
	if err := os.WriteFile(filepath.Join(precious, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(b.dir(s.ID), "a bind")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(precious, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	err := b.Destroy(ctx, s.ID)
	if err == nil || !strings.Contains(err.Error(), "still mounted") {
		t.Errorf("destroy with a mount under the sandbox: %v", err)
	}
	if _, serr := os.Stat(filepath.Join(precious, "keep")); serr != nil {
		t.Fatalf("destroy removed a file through a mount: %v", serr)
	}
	if err := unix.Unmount(target, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Destroy(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// Warm containers have the default disk: a create that asks for another
// size is made afresh with it, and a fork gets its source's size.
func TestDiskSizeWarmAndFork(t *testing.T) {
	b, h := newTestBackendPool(t, 1)
	ctx := context.Background()
	b.Prewarm(&core.Sandbox{TemplateID: h.TemplateID})
	waitWarm(t, b, h.TemplateID, 1)
	sb := conformance.NewSandbox("sized", h.TemplateID)
	sb.DiskBytes = 200 << 20
	if id, ok := b.TakeWarm(sb); ok {
		t.Fatalf("a create with a 200M disk took warm container %s (of the default size)", id)
	}
	if err := b.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	s := conformance.Adopt(t, h, sb)
	size := func(s *conformance.Sandbox) int {
		n, err := strconv.Atoi(strings.TrimSpace(s.Sh(t, "df -B1M --output=size / | tail -1")))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := size(s); got < 180 || got > 200 {
		t.Errorf("a 200M sandbox's / is %d MiB", got)
	}
	if _, err := b.Snapshot(ctx, s.Sandbox, "sized-1", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	fsb := conformance.NewSandbox("sized-fork", h.TemplateID)
	fsb.DiskBytes = sb.DiskBytes // as the daemon does
	if err := b.Fork(ctx, fsb, "sized-1"); err != nil {
		t.Fatal(err)
	}
	f := conformance.Adopt(t, h, fsb)
	if got, want := size(f), size(s); got != want {
		t.Errorf("the fork's / is %d MiB, its source's %d", got, want)
	}
	// The default size still comes warm.
	def := conformance.Create(t, h, "default")
	if got := size(def); got < 9000 || got > 10240 {
		t.Errorf("a default sandbox's / is %d MiB", got)
	}
	f.Destroy(t)
	s.Destroy(t)
	if err := b.GC(ctx, nil); err != nil {
		t.Fatal(err)
	}
}
