package container

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/core/conformance"
	"github.com/nookhq/nook/internal/errdefs"
)

// snapshotFiles lists, for comparison, what a sandbox's interesting paths hold.
const snapshotFiles = `cd /root && for f in a big dir/x link fifo; do printf '%s: ' $f; if [ -p $f ]; then echo fifo; elif [ -L $f ]; then readlink $f; elif [ -f $f ]; then md5sum < $f | cut -c1-8; else echo missing; fi; done;
stat -c '%a %u' /root/a; ls -A /etc/skel | wc -l; ls /root/dir; test -e /etc/motd && echo motd || echo no-motd`

// TestSnapshotRollbackFork: a container's snapshots keep its files exactly
// (whiteouts, opaque directories, links, modes), roll back and fork over
// chains of layers, share unchanged files between snapshots, and GC
// removes exactly the layers nothing uses.
func TestSnapshotRollbackFork(t *testing.T) {
	b, h := newTestBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "snapper")
	s.Sh(t, `cd /root && echo one > a && chmod 640 a && chown 1000 a && head -c 4000000 /dev/urandom > big &&
		mkdir dir && echo x > dir/x && ln -s a link && mkfifo fifo && truncate -s 100G sparse && echo end >> sparse &&
		ln -s / hostroot && ln -s /etc/shadow shadow &&
		rm /etc/motd && rm -rf /etc/skel && mkdir /etc/skel && echo only > /etc/skel/new`)
	// Files changed within ctimeSlack of a snapshot are shared only after a
	// byte compare: let the clock move on, so that this one is shared by its key.
	time.Sleep(100 * time.Millisecond)
	at1 := s.Sh(t, snapshotFiles)
	info1, err := b.Snapshot(ctx, s.Sandbox, "snap-1", core.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if info1.Memory || info1.SizeBytes < 4000000 || info1.SizeBytes > 5000000 {
		t.Fatalf("snapshot 1 (4 MB of data and a 100 GB sparse file): %+v", info1)
	}
	if fi, err := os.Stat(filepath.Join(b.layerDir("snap-1"), "layer/root/sparse")); err != nil || fi.Size() != 100<<30+4 {
		t.Fatalf("sparse file in the layer: %v", err)
	}
	// Symlinks out of the sandbox are copied as links, never followed.
	for _, l := range []string{"hostroot", "shadow"} {
		if fi, err := os.Lstat(filepath.Join(b.layerDir("snap-1"), "layer/root", l)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Fatalf("%s in the layer is not a symlink: %v", l, err)
		}
	}
	if got := s.Sh(t, "cat /root/a"); got != "one\n" {
		t.Fatalf("sandbox after snapshot: %q", got)
	}
	// Change a little, keep the big file.
	s.Sh(t, `cd /root && echo two > a && rm -r dir && rm link && echo back > /etc/motd && echo y > c`)
	at2 := s.Sh(t, snapshotFiles)
	info2, err := b.Snapshot(ctx, s.Sandbox, "snap-2", core.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if info2.SizeBytes > 2500000 {
		t.Fatalf("snapshot 2 uses %d bytes: the unchanged 4 MB file was not shared", info2.SizeBytes)
	}
	var st1, st2 syscall.Stat_t
	syscall.Stat(filepath.Join(b.layerDir("snap-1"), "layer/root/big"), &st1)
	syscall.Stat(filepath.Join(b.layerDir("snap-2"), "layer/root/big"), &st2)
	if st1.Ino == 0 || st1.Ino != st2.Ino {
		t.Fatalf("the unchanged file is not one inode in both layers: %d, %d", st1.Ino, st2.Ino)
	}
	if u1, u2 := b.SnapshotUsage("snap-1"), b.SnapshotUsage("snap-2"); u1+u2 > 4000000+2500000 || u1+u2 < 4000000 {
		t.Fatalf("usage %d + %d: shared file not split between the layers", u1, u2)
	}

	// A background process dies with a rollback: a container's snapshot has no memory.
	s.Sh(t, "setsid sleep 600 >/dev/null 2>&1 < /dev/null &")
	s.Agent.Close()
	if err := b.Rollback(ctx, s.Sandbox, "snap-1"); err != nil {
		t.Fatal(err)
	}
	if got := s.Sh(t, snapshotFiles); got != at1 {
		t.Fatalf("after rollback to snap-1:\n%s\nwant:\n%s", got, at1)
	}
	if got := s.Sh(t, "hostname; cat /proc/[0-9]*/comm | grep -c '^sleep$' || true"); got != "snapper\n0\n" {
		t.Fatalf("after rollback: hostname and sleeps %q", got)
	}
	if st, err := b.Status(ctx, s.Sandbox); err != nil || st.State != core.RuntimeRunning {
		t.Fatalf("status after rollback: %+v %v", st, err)
	}
	// A snapshot over the rolled-back chain, then back and forth.
	s.Sh(t, "echo three > /root/a")
	at3 := s.Sh(t, snapshotFiles)
	if _, err := b.Snapshot(ctx, s.Sandbox, "snap-3", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	if c, _ := b.snapshotChain("snap-3"); strings.Join(c.Layers, ",") != "snap-3,snap-1" {
		t.Fatalf("chain of snap-3: %v", c.Layers)
	}
	s.Sh(t, "rm -rf /root/*")
	s.Agent.Close()
	if err := b.Rollback(ctx, s.Sandbox, "snap-2"); err != nil {
		t.Fatal(err)
	}
	if got := s.Sh(t, snapshotFiles); got != at2 {
		t.Fatalf("after rollback to snap-2:\n%s\nwant:\n%s", got, at2)
	}
	s.Agent.Close()
	if err := b.Rollback(ctx, s.Sandbox, "snap-3"); err != nil {
		t.Fatal(err)
	}
	if got := s.Sh(t, snapshotFiles); got != at3 {
		t.Fatalf("after rollback to snap-3:\n%s\nwant:\n%s", got, at3)
	}

	// A paused sandbox stays paused through a snapshot.
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Snapshot(ctx, s.Sandbox, "snap-4", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	if p, err := b.Paused(ctx, s.ID); err != nil || !p {
		t.Fatalf("paused after snapshot: %v %v", p, err)
	}
	if err := b.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}

	// Forks see the snapshot, and not each other.
	var forks []*conformance.Sandbox
	for i := range 2 {
		sb := conformance.NewSandbox(fmt.Sprintf("fork-%d", i), h.TemplateID)
		if err := b.Fork(ctx, sb, "snap-2"); err != nil {
			t.Fatal(err)
		}
		forks = append(forks, conformance.Adopt(t, h, sb))
	}
	forks[0].Sh(t, "echo mine > /root/a")
	if got := forks[1].Sh(t, snapshotFiles); got != at2 {
		t.Fatalf("fork sees:\n%s\nwant:\n%s", got, at2)
	}
	if got := forks[1].Sh(t, "hostname"); got != "fork-1\n" {
		t.Fatalf("fork hostname %q", got)
	}

	// GC: layers in use (chains of sandboxes, kept snapshots) stay.
	if err := b.GC(ctx, []string{"snap-4"}); err != nil {
		t.Fatal(err)
	}
	for snap, want := range map[string]bool{"snap-1": true, "snap-2": true, "snap-3": true, "snap-4": true} {
		if _, err := os.Stat(b.layerDir(snap)); (err == nil) != want {
			t.Errorf("after GC, layer %s there: %v, want %v", snap, err == nil, want)
		}
	}
	for _, f := range forks {
		f.Destroy(t)
	}
	if err := b.GC(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// s is on snap-3 (over snap-1); its manifest names snap-4.
	for snap, want := range map[string]bool{"snap-1": true, "snap-2": false, "snap-3": true, "snap-4": true} {
		if _, err := os.Stat(b.layerDir(snap)); (err == nil) != want {
			t.Errorf("after GC, layer %s there: %v, want %v", snap, err == nil, want)
		}
	}
	if err := b.Rollback(ctx, s.Sandbox, "snap-2"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("rollback to a removed snapshot: %v", err)
	}
	if got := s.Sh(t, "cat /root/a"); got != "three\n" {
		t.Fatalf("a refused rollback changed the sandbox: %q", got)
	}
	s.Destroy(t)
	if err := b.GC(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(b.cfg.SnapshotDir); len(entries) != 0 {
		t.Fatalf("%d snapshot layers left after GC", len(entries))
	}
}

// TestSnapshotBadInput: bad IDs, a missing sandbox or snapshot are refused
// and change nothing.
func TestSnapshotBadInput(t *testing.T) {
	b, h := newTestBackend(t)
	ctx := context.Background()
	for _, id := range []string{"", "../x", "a/b", "a,b"} {
		if _, err := b.Snapshot(ctx, &core.Sandbox{ID: "0000"}, id, core.SnapshotOptions{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("snapshot id %q: %v", id, err)
		}
	}
	if _, err := b.Snapshot(ctx, &core.Sandbox{ID: "0000000000000000"}, "snap-x", core.SnapshotOptions{}); err == nil {
		t.Fatal("snapshot of a sandbox that does not exist")
	}
	s := conformance.Create(t, h, "bad")
	if err := b.Rollback(ctx, s.Sandbox, "snap-none"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("rollback to a missing snapshot: %v", err)
	}
	if err := b.Fork(ctx, conformance.NewSandbox("f", h.TemplateID), "snap-none"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("fork of a missing snapshot: %v", err)
	}
	if got := s.Sh(t, "echo alive"); got != "alive\n" {
		t.Fatalf("sandbox after refused calls: %q", got)
	}
	if entries, _ := os.ReadDir(b.cfg.SnapshotDir); len(entries) != 0 {
		t.Fatalf("refused calls left %d snapshot files", len(entries))
	}
	// A sandbox made by a nook without snapshots (no chain.json) can take them.
	if err := os.Remove(filepath.Join(b.dir(s.ID), "chain.json")); err != nil {
		t.Fatal(err)
	}
	s.Sh(t, "echo legacy > /root/l")
	if _, err := b.Snapshot(ctx, s.Sandbox, "snap-legacy", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Sh(t, "rm /root/l")
	s.Agent.Close()
	if err := b.Rollback(ctx, s.Sandbox, "snap-legacy"); err != nil {
		t.Fatal(err)
	}
	if got := s.Sh(t, "cat /root/l"); got != "legacy\n" {
		t.Fatalf("after rollback: %q", got)
	}
}

// TestMountDeepChain: a chain longer than mount(2)'s one page of options
// mounts through the new mount API, with the topmost layer winning.
func TestMountDeepChain(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting an overlay needs root")
	}
	root := t.TempDir()
	var lowers []string
	for i := range 120 {
		d := filepath.Join(root, fmt.Sprintf("a-rather-long-layer-directory-name-%03d", i))
		os.MkdirAll(d, 0o755)
		os.WriteFile(filepath.Join(d, "f"), []byte(fmt.Sprint(i)), 0o644)
		os.WriteFile(filepath.Join(d, fmt.Sprintf("only-%d", i)), nil, 0o644)
		lowers = append(lowers, d)
	}
	upper, work, target := filepath.Join(root, "upper"), filepath.Join(root, "work"), filepath.Join(root, "mnt")
	for _, d := range []string{upper, work, target} {
		os.Mkdir(d, 0o755)
	}
	if err := mountOverlay(lowers, upper, work, target); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(target, 0)
	if got, _ := os.ReadFile(filepath.Join(target, "f")); string(got) != "0" {
		t.Fatalf("top of the chain: %q", got)
	}
	if entries, _ := os.ReadDir(target); len(entries) != 121 {
		t.Fatalf("%d entries, want 121", len(entries))
	}
}

// TestCopyLayerRecentFiles: a file changed close to a snapshot's freeze is
// shared with the next snapshot only if its content is unchanged; one
// whose ctime was kept by a write in the same clock tick is copied.
func TestCopyLayerRecentFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("copying owners and xattrs needs root")
	}
	root := t.TempDir()
	src := filepath.Join(root, "upper")
	os.Mkdir(src, 0o755)
	os.WriteFile(filepath.Join(src, "same"), []byte("same"), 0o644)
	os.WriteFile(filepath.Join(src, "changed"), []byte("new!"), 0o644)
	os.WriteFile(filepath.Join(src, "xattr"), []byte("same"), 0o644)
	unix.Lsetxattr(filepath.Join(src, "xattr"), "user.mark", []byte("new"), 0)
	prevLayer := filepath.Join(root, "prev")
	os.Mkdir(prevLayer, 0o755)
	os.WriteFile(filepath.Join(prevLayer, "same"), []byte("same"), 0o644)
	os.WriteFile(filepath.Join(prevLayer, "changed"), []byte("old!"), 0o644)
	os.WriteFile(filepath.Join(prevLayer, "xattr"), []byte("same"), 0o644)
	unix.Lsetxattr(filepath.Join(prevLayer, "xattr"), "user.mark", []byte("old"), 0)
	// The previous snapshot saw both files with the keys they have now, close to its freeze.
	prev := &manifest{Snapshot: "prev", Files: map[string]fileKey{}}
	for _, f := range []string{"same", "changed", "xattr"} {
		var st syscall.Stat_t
		syscall.Stat(filepath.Join(src, f), &st)
		prev.Files[f] = fileKey{Ino: st.Ino, Ctime: st.Ctim.Nano(), Size: st.Size, Mode: st.Mode, UID: st.Uid, GID: st.Gid, Recent: true}
	}
	next, err := copyLayer(src, filepath.Join(root, "next"), prev, prevLayer, 0)
	if err != nil {
		t.Fatal(err)
	}
	var same, changed syscall.Stat_t
	syscall.Stat(filepath.Join(root, "next", "same"), &same)
	syscall.Stat(filepath.Join(root, "next", "changed"), &changed)
	if same.Nlink != 2 {
		t.Errorf("an unchanged recent file was copied, not shared (nlink %d)", same.Nlink)
	}
	if got, _ := os.ReadFile(filepath.Join(root, "next", "changed")); changed.Nlink != 1 || string(got) != "new!" {
		t.Errorf("a recent file changed within its ctime: nlink %d, content %q", changed.Nlink, got)
	}
	var xa syscall.Stat_t
	syscall.Stat(filepath.Join(root, "next", "xattr"), &xa)
	if xa.Nlink != 1 {
		t.Errorf("a recent file whose xattrs changed within its ctime was shared")
	}
	if len(next.Files) != 3 || !next.Files["same"].Recent {
		t.Errorf("next manifest: %+v", next.Files)
	}
}

// TestCopyLayerHardLinks: a file with many names is copied once, however
// many links a sandbox makes to it.
func TestCopyLayerHardLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("copying owners and xattrs needs root")
	}
	root := t.TempDir()
	src := filepath.Join(root, "upper")
	os.Mkdir(src, 0o755)
	os.WriteFile(filepath.Join(src, "data"), make([]byte, 1<<20), 0o644)
	for i := range 200 {
		if err := os.Link(filepath.Join(src, "data"), filepath.Join(src, fmt.Sprintf("link-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := copyLayer(src, filepath.Join(root, "layer"), nil, "", 0); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	syscall.Stat(filepath.Join(root, "layer", "link-99"), &st)
	if st.Nlink != 201 {
		t.Fatalf("201 names of one file became files with %d links", st.Nlink)
	}
	if u := layerUsage(filepath.Join(root, "layer")); u > 2<<20 {
		t.Fatalf("201 names of a 1 MiB file take %d bytes", u)
	}
}

// TestSnapshotWhileWriting: snapshots of a sandbox that writes all the
// time are of one moment (a copy made while it ran would not be).
func TestSnapshotWhileWriting(t *testing.T) {
	b, h := newTestBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "writer")
	// Each round writes a, then z (each through a rename): at any moment z
	// is a or a-1. A copy of the running sandbox would read a, then a big
	// new file (m-...), then z, rounds later.
	if _, err := s.Agent.Start(ctx, &agent.ExecRequest{Argv: []string{"sh", "-c",
		`cd /root && i=0; while :; do i=$((i+1)); echo $i > a.t && mv a.t a; echo $i > z.t && mv z.t z; sleep 0.005; done`}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); s.Sh(t, "cat /root/a 2>/dev/null || true") == s.Sh(t, "sleep 0.05; cat /root/a 2>/dev/null || true"); {
		if time.Now().After(deadline) {
			t.Fatal("the writer does not run")
		}
	}
	for i := 1; i <= 4; i++ {
		s.Sh(t, fmt.Sprintf("head -c 50000000 /dev/urandom > /root/m-%d", i))
		if _, err := b.Snapshot(ctx, s.Sandbox, fmt.Sprintf("w-%d", i), core.SnapshotOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i <= 4; i++ {
		s.Agent.Close()
		if err := b.Rollback(ctx, s.Sandbox, fmt.Sprintf("w-%d", i)); err != nil {
			t.Fatal(err)
		}
		got := s.Sh(t, "cat /root/a /root/z")
		var a, z int
		if _, err := fmt.Sscan(got, &a, &z); err != nil {
			t.Fatalf("snapshot w-%d: %q: %v", i, got, err)
		}
		if z != a && z != a-1 {
			t.Fatalf("snapshot w-%d is not of one moment: a=%d z=%d", i, a, z)
		}
	}
}

// TestRollbackFailureKeepsOldState: a rollback whose new state cannot
// start puts the sandbox back as it was, running, and says so.
func TestRollbackFailureKeepsOldState(t *testing.T) {
	b, h := newTestBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "rbfail")
	s.Sh(t, "echo old > /root/f")
	if _, err := b.Snapshot(ctx, s.Sandbox, "snap-1", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Sh(t, "echo new > /root/f")
	// The snapshot's layer is there, but cannot be mounted.
	layer := filepath.Join(b.layerDir("snap-1"), "layer")
	if err := os.RemoveAll(layer); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(layer, nil, 0o600)
	s.Agent.Close()
	err := b.Rollback(ctx, s.Sandbox, "snap-1")
	if err == nil || !strings.Contains(err.Error(), "runs again on its files from before the rollback") {
		t.Fatalf("rollback onto an unmountable layer: %v", err)
	}
	if got := s.Sh(t, "cat /root/f"); got != "new\n" {
		t.Fatalf("after a failed rollback: %q", got)
	}
	if _, err := os.Stat(filepath.Join(b.dir(s.ID), "rollback.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed rollback left its marker: %v", err)
	}
}

// TestRollbackFinishedAfterCrash: what a crash in the middle of a rollback
// leaves (the marker, the container stopped, the old upper directory set
// aside) is finished by the next Status, which says the sandbox restarted.
func TestRollbackFinishedAfterCrash(t *testing.T) {
	b, h := newTestBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "rbcrash")
	s.Sh(t, "echo snap > /root/f")
	if _, err := b.Snapshot(ctx, s.Sandbox, "snap-1", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Sh(t, "echo later > /root/f")
	s.Agent.Close()
	dir := b.dir(s.ID)
	old, _ := b.sandboxChain(s.ID)
	marker, _ := json.Marshal(pendingRollback{Snapshot: "snap-1", Old: &old})
	os.WriteFile(filepath.Join(dir, "rollback.json"), marker, 0o600)
	if err := b.stop(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	base := b.upperBase(s.ID)
	if base == dir {
		t.Fatal("the sandbox has no disk of its own")
	}
	if err := os.Rename(filepath.Join(base, "upper"), filepath.Join(base, "upper.old")); err != nil {
		t.Fatal(err)
	}
	st, err := b.Status(ctx, s.Sandbox)
	if err != nil || st.State != core.RuntimeRunning || !st.Restarted {
		t.Fatalf("status after a crash mid-rollback: %+v %v", st, err)
	}
	if got := s.Sh(t, "cat /root/f"); got != "snap\n" {
		t.Fatalf("after the finished rollback: %q", got)
	}
	for _, f := range []string{filepath.Join(dir, "rollback.json"), filepath.Join(base, "upper.old")} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after the rollback finished: %v", f, err)
		}
	}
	if st, err := b.Status(ctx, s.Sandbox); err != nil || st.State != core.RuntimeRunning || st.Restarted {
		t.Fatalf("status once more: %+v %v", st, err)
	}
}

// TestSnapshotMmapWrites: a write through a shared mapping to a page that
// is already dirty does not move its file's ctime; the snapshot's frozen
// sync makes the next write fault (and move it), so a later snapshot never
// shares a stale copy.
func TestSnapshotMmapWrites(t *testing.T) {
	b, h := newTestBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "mmap")
	script := `import mmap, os, time
f = open("/root/m", "w+b"); f.write(b"0" * 4096); f.flush()
m = mmap.mmap(f.fileno(), 4096)
m[:4096] = b"A" * 4096
open("/tmp/a-written", "w").close()
while not os.path.exists("/tmp/go"): time.sleep(0.01)
m[:4096] = b"B" * 4096
open("/tmp/b-written", "w").close()
time.sleep(600)
`
	s.Sh(t, "cat > /tmp/m.py <<'EOF'\n"+script+"EOF")
	if _, err := s.Agent.Start(ctx, &agent.ExecRequest{Argv: []string{"python3", "/tmp/m.py"}}); err != nil {
		t.Fatal(err)
	}
	s.Sh(t, "while [ ! -e /tmp/a-written ]; do sleep 0.01; done; sleep 0.2")
	if _, err := b.Snapshot(ctx, s.Sandbox, "m-1", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Sh(t, "touch /tmp/go; while [ ! -e /tmp/b-written ]; do sleep 0.01; done")
	if _, err := b.Snapshot(ctx, s.Sandbox, "m-2", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	for snap, want := range map[string]byte{"m-1": 'A', "m-2": 'B'} {
		got, err := os.ReadFile(filepath.Join(b.layerDir(snap), "layer/root/m"))
		if err != nil || len(got) != 4096 || got[0] != want {
			t.Fatalf("snapshot %s holds %q..., want %c (%v)", snap, got[:min(len(got), 8)], want, err)
		}
	}
}
