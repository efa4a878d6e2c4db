package container

import (
	"context"
	"strings"
	"testing"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/core/conformance"
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
	if mounted, _ := isMountPoint(b.diskMount(s.ID)); mounted {
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
