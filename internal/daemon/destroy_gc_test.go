package daemon

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/nookhq/nook/api"
)

// TestDestroyFreesSnapshotFiles: the destroy of a sandbox that names no
// snapshot files skips the GC (which reads every sandbox's files) and
// frees nothing another sandbox uses; the destroy of one whose disk sits
// on a snapshot's layers, the snapshot's record long gone, frees them.
func TestDestroyFreesSnapshotFiles(t *testing.T) {
	m, _ := newManagerWith(t, func(c *Config) { c.ContainerPause = "freeze" })
	ctx := context.Background()
	for _, name := range []string{"plain", "rolled"} {
		if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: name}, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Destroy(ctx, name) })
	}
	snap, err := m.Snapshot(ctx, "rolled", "s1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Rollback(ctx, "rolled", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteSnapshot(ctx, "rolled", "s1"); err != nil {
		t.Fatal(err)
	}
	files := filepath.Join(m.cfg.DataDir, "container-snapshots", snap.ID)
	exists := func() bool { _, err := os.Stat(files); return err == nil }
	if !exists() {
		t.Fatalf("%s is gone while the rolled-back sandbox's disk sits on it", files)
	}
	plain, _ := m.Get(ctx, "plain")
	rolled, _ := m.Get(ctx, "rolled")
	if m.refersToSnapshots(ctx, plain) || !m.refersToSnapshots(ctx, rolled) {
		t.Fatalf("refers to snapshots: plain %v (want false), rolled %v (want true)", m.refersToSnapshots(ctx, plain), m.refersToSnapshots(ctx, rolled))
	}
	if err := m.Destroy(ctx, "plain"); err != nil {
		t.Fatal(err)
	}
	if !exists() {
		t.Fatal("destroying another sandbox removed the snapshot files in use")
	}
	if err := m.Destroy(ctx, "rolled"); err != nil {
		t.Fatal(err)
	}
	if exists() {
		t.Fatalf("%s outlived the last sandbox that used it", files)
	}
}
