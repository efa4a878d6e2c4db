package diskimg

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/testutil"
)

// TestUnmountedRemovesLoopDevice: once an image's mount is gone, so is
// the loop device it was mounted through (the kernel would keep it, one
// per disk ever mounted at once). Another attach may make a device of
// the same number meanwhile: that one is a new device (another sysfs
// node), not the one kept.
func TestUnmountedRemovesLoopDevice(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no /dev/loop-control (modprobe loop): loop devices are absent")
	}
	testutil.RequireCommand(t, "mkfs.ext4", "e2fsprogs")
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "disk.img"), filepath.Join(dir, "mnt")
	if err := Make(context.Background(), img, 64<<20, "the test's disk"); err != nil {
		t.Fatal(err)
	}
	if err := Mount(img, mnt, "the test's disk"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unmount(mnt) })
	var st unix.Stat_t
	if err := unix.Stat(mnt, &st); err != nil {
		t.Fatal(err)
	}
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		t.Fatal(err)
	}
	node := "/sys/block/" + filepath.Base(link)
	var before unix.Stat_t
	if err := unix.Stat(node, &before); err != nil {
		t.Fatal(err)
	}
	attached, err := Unmounted(mnt, img)
	if err != nil || attached {
		t.Fatalf("unmounted: still attached %v, %v", attached, err)
	}
	if !Settle(10 * time.Second) {
		t.Fatal("the loop device's removal still runs after 10s")
	}
	var after unix.Stat_t
	if err := unix.Stat(node, &after); err == nil && after.Ino == before.Ino {
		t.Fatalf("%s is still there after its image's mount went", node)
	}
}

// TestSettleWhileRemoving: removals that start while Settle waits (a
// destroy still running as the daemon stops) neither panic, as a
// WaitGroup reused during its Wait does, nor keep Settle from returning
// once none is left.
func TestSettleWhileRemoving(t *testing.T) {
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				removeLoopLater("/dev/loop-not-a-number") // returns at once, touching nothing
			}
		}()
	}
	for range 50 {
		if !Settle(10 * time.Second) {
			t.Fatal("Settle waited 10s for removals that return at once")
		}
	}
	wg.Wait()
	if !Settle(10 * time.Second) {
		t.Fatal("Settle waited 10s after the last removal")
	}
	removing.Lock()
	defer removing.Unlock()
	if removing.n != 0 || removing.idle != nil {
		t.Fatalf("%d removals counted after all ended", removing.n)
	}
}
