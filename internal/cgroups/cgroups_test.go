package cgroups_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/testutil"
)

// TestRenew: a sandbox's cgroups that a process is still in stay; once
// it is killed they go (Renew waits for it to leave them), so that the
// next Create makes them afresh, with nothing charged to them.
func TestRenew(t *testing.T) {
	testutil.RequireRoot(t)
	parent, id := testutil.RandomName("nook-test-"), "renew"
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			cmd.Wait()
		}
		cgroups.Remove(parent, id, nil)
		for _, d := range cgroups.Dirs(parent, "") {
			os.Remove(d)
		}
	})
	if err := cgroups.Create(parent, id, cgroups.Limits{CPUs: 1, MemoryBytes: 64 << 20, Pids: 16}, cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	before := cgroups.Dirs(parent, id)
	if len(before) == 0 {
		t.Fatal("Create made no cgroup")
	}
	cgroups.Renew(parent, id)
	if got := cgroups.Dirs(parent, id); len(got) != len(before) {
		t.Fatalf("Renew removed cgroups a process is in: %v left of %v", got, before)
	}
	cmd.Process.Kill()
	cmd.Wait()
	exited = true
	cgroups.Renew(parent, id)
	if got := cgroups.Dirs(parent, id); len(got) != 0 {
		t.Fatalf("Renew left the empty cgroups %v", got)
	}
}
