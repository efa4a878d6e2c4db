package vm

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/core/conformance"
)

// TestEscapeTemplateRAMReadOnly: a QEMU restored from a template snapshot
// (which a guest may have taken over) cannot change the template's RAM,
// which every later vm of the template and its running siblings' unwritten
// pages read: none of its descriptors on it can write (a read-write one
// must be on a memfd sealed against writes, and a write through it fails),
// none of its mappings of it is shared and writable, and its user cannot
// open the snapshot's file for writing.
func TestEscapeTemplateRAMReadOnly(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	s := conformance.Create(t, h, "vm-ram")
	st, live := b.readRun(s.ID)
	if !live || st.Boot != "snapshot" {
		t.Fatalf("run.json %+v (live %v): want a vm restored from the template snapshot", st, live)
	}
	k, err := b.ensureKernel(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	snap, err := b.ensureSnapshot(context.Background(), h.TemplateID, b.machineFor(s.Sandbox, k))
	if err != nil {
		t.Fatal(err)
	}
	// The RAM's inodes: the snapshot's file and the copy vms are given.
	ram := map[[2]uint64]string{}
	addInode := func(path string) {
		var fst unix.Stat_t
		if err := unix.Stat(path, &fst); err != nil {
			t.Fatal(err)
		}
		ram[[2]uint64{fst.Dev, fst.Ino}] = path
	}
	addInode(snap.mem)
	b.ramMu.Lock()
	for _, r := range b.rams {
		addInode(fmt.Sprintf("/proc/self/fd/%d", r.f.Fd()))
	}
	b.ramMu.Unlock()

	pid := st.PID
	fds := mustGlob(t, fmt.Sprintf("/proc/%d/fd/*", pid))
	found := 0
	for _, fd := range fds {
		var fst unix.Stat_t
		if unix.Stat(fd, &fst) != nil {
			continue
		}
		what, ok := ram[[2]uint64{fst.Dev, fst.Ino}]
		if !ok {
			continue
		}
		found++
		flags := fdFlags(t, pid, filepath.Base(fd))
		if flags&unix.O_ACCMODE == unix.O_RDONLY {
			continue
		}
		// Writable: only a memfd sealed against writes will do, and a
		// write through it (as QEMU's own descriptor would) must fail.
		f, err := os.OpenFile(fd, os.O_RDWR, 0)
		if err != nil {
			t.Fatalf("QEMU's descriptor %s on the template RAM (%s) is open for writing (flags %o), and reopening it: %v", fd, what, flags, err)
		}
		seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
		if err != nil || seals&unix.F_SEAL_WRITE == 0 {
			f.Close()
			t.Fatalf("QEMU's descriptor %s on the template RAM (%s) is open for writing (flags %o) and not sealed (seals %#x, %v)", fd, what, flags, seals, err)
		}
		if _, err := f.WriteAt([]byte{1}, 4096); err == nil {
			f.Close()
			t.Fatalf("wrote into the template RAM through QEMU's descriptor %s", fd)
		}
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); err == nil {
			f.Close()
			t.Fatalf("punched a hole into the template RAM through QEMU's descriptor %s", fd)
		}
		f.Close()
	}
	// Its mappings of the RAM: private, or read-only.
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer maps.Close()
	mapped := 0
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		// address perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		ino, _ := strconv.ParseUint(fields[4], 10, 64)
		if ino == 0 {
			continue
		}
		for key, what := range ram {
			if key[1] != ino || !sameDev(fields[3], key[0]) {
				continue
			}
			mapped++
			if perms := fields[1]; perms[1] == 'w' && perms[3] == 's' {
				t.Fatalf("QEMU maps the template RAM (%s) shared and writable: %s", what, sc.Text())
			}
		}
	}
	if found == 0 || mapped == 0 {
		t.Fatalf("QEMU %d has %d descriptors and %d mappings on the template RAM: the test looks in the wrong place", pid, found, mapped)
	}
	// QEMU's user cannot open the snapshot's file for writing.
	uid, gid := procIDs(t, pid)
	cmd := exec.Command("/bin/sh", "-c", `exec 3<>"$1"`, "sh", snap.mem)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Fatalf("as QEMU's user (%d) opening %s read-write: %v: %s", uid, snap.mem, err, out)
	}
}

// fdFlags reads a descriptor's open flags from /proc/PID/fdinfo (octal).
func fdFlags(t *testing.T, pid int, fd string) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "flags:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			if err != nil {
				t.Fatalf("fdinfo flags %q: %v", v, err)
			}
			return int(n)
		}
	}
	t.Fatalf("no flags in fdinfo of %d/%s", pid, fd)
	return 0
}

// sameDev compares a maps "major:minor" (hex) with a stat st_dev.
func sameDev(field string, dev uint64) bool {
	maj, min, ok := strings.Cut(field, ":")
	a, err1 := strconv.ParseUint(maj, 16, 32)
	c, err2 := strconv.ParseUint(min, 16, 32)
	return ok && err1 == nil && err2 == nil && unix.Mkdev(uint32(a), uint32(c)) == dev
}

// procIDs returns a process's effective uid and gid.
func procIDs(t *testing.T, pid int) (uint32, uint32) {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	var uid, gid uint64
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == "Uid:" {
			uid, _ = strconv.ParseUint(f[2], 10, 32)
		}
		if len(f) >= 3 && f[0] == "Gid:" {
			gid, _ = strconv.ParseUint(f[2], 10, 32)
		}
	}
	return uint32(uid), uint32(gid)
}

// TestEscapeQEMUNamespace: a guest that escapes into its QEMU finds
// itself in an empty network namespace (no host address, service or
// metadata endpoint to reach: only a loopback that is down), as a user of
// its own (not root, not another vm's QEMU's, no supplementary groups),
// which a restarted daemon finds again and a destroyed vm gives back.
func TestEscapeQEMUNamespace(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	a := conformance.Create(t, h, "vm-ns-a")
	c := conformance.Create(t, h, "vm-ns-b")
	hostNS := nsInode(t, "/proc/self/ns/net")
	uids := map[uint32]string{}
	for _, s := range []*conformance.Sandbox{a, c} {
		st, live := b.readRun(s.ID)
		if !live {
			t.Fatalf("%s: QEMU not running", s.Name)
		}
		pid := st.PID
		if ns := nsInode(t, fmt.Sprintf("/proc/%d/ns/net", pid)); ns == hostNS {
			t.Fatalf("%s: QEMU %d runs in the host's network namespace", s.Name, pid)
		}
		if ns := nsInode(t, fmt.Sprintf("/proc/%d/ns/ipc", pid)); ns == nsInode(t, "/proc/self/ns/ipc") {
			t.Fatalf("%s: QEMU %d shares the host's IPC namespace (SysV segments would outlive it)", s.Name, pid)
		}
		ns, err := netns.GetFromPath(fmt.Sprintf("/proc/%d/ns/net", pid))
		if err != nil {
			t.Fatal(err)
		}
		nh, err := netlink.NewHandleAt(ns)
		ns.Close()
		if err != nil {
			t.Fatal(err)
		}
		links, err := nh.LinkList()
		nh.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range links {
			if l.Attrs().Name != "lo" || l.Attrs().Flags&net.FlagUp != 0 {
				t.Fatalf("%s: QEMU's network namespace has %s (flags %v); want only a loopback that is down", s.Name, l.Attrs().Name, l.Attrs().Flags)
			}
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			t.Fatal(err)
		}
		var uid uint32
		for _, l := range strings.Split(string(status), "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) > 0 && (f[0] == "Uid:" || f[0] == "Gid:"):
				// real, effective, saved, filesystem: one ID, not root
				if len(f) != 5 || f[1] != f[2] || f[1] != f[3] || f[1] != f[4] || f[1] == "0" {
					t.Fatalf("%s: QEMU's %s", s.Name, l)
				}
				v, _ := strconv.ParseUint(f[1], 10, 32)
				uid = uint32(v)
			case len(f) > 0 && f[0] == "Groups:" && len(f) > 1:
				t.Fatalf("%s: QEMU has supplementary groups: %s", s.Name, l)
			}
		}
		checkQEMURoot(t, s.Name, pid, uid)
		if other, dup := uids[uid]; dup {
			t.Fatalf("%s and %s's QEMUs both run as %d", other, s.Name, uid)
		}
		uids[uid] = s.Name
		if rec, err := New(b.cfg).vmUID(s.ID); err != nil || rec != uid {
			t.Fatalf("%s: QEMU runs as %d; a restarted daemon finds %d (%v)", s.Name, uid, rec, err)
		}
	}
	// Claimed host-wide while the vm lives (no other daemon gives it to
	// another QEMU), and given back once it is destroyed.
	uidA, _ := b.recordedUID(a.ID)
	claims := b.uidClaims()
	if got := claims.Holder(int(uidA - b.cfg.UIDBase)); got != b.dir(a.ID) {
		t.Fatalf("%s's QEMU user %d is claimed by %q", a.Name, uidA, got)
	}
	a.Destroy(t)
	if got := claims.Holder(int(uidA - b.cfg.UIDBase)); got != "" {
		t.Fatalf("the destroyed vm's QEMU user %d is still claimed by %q", uidA, got)
	}
}

// TestEscapeQEMUNeverRoot: no configuration and no call starts QEMU as
// root, and a range of QEMU users holding root is refused with a clear
// error.
func TestEscapeQEMUNeverRoot(t *testing.T) {
	dir := t.TempDir()
	b := New(Config{StateDir: dir, CacheDir: dir, QEMU: "/bin/false"})
	if b.cfg.UIDBase == 0 {
		t.Fatal("the default QEMU users start at root")
	}
	_, err := b.start(context.Background(), &core.Sandbox{ID: "x"}, launch{Disk: filepath.Join(dir, "x", "disk.qcow2")}, 0)
	if err == nil || !strings.Contains(err.Error(), "refusing to run QEMU as root") {
		t.Fatalf("start as uid 0: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); err == nil {
		t.Fatal("a refused start left files")
	}
	wrap := New(Config{StateDir: dir, CacheDir: dir, UIDBase: 1<<32 - 10})
	if _, err := wrap.vmUID("y"); err == nil || !strings.Contains(err.Error(), "must not include root") {
		t.Fatalf("a QEMU user range that wraps to root: %v", err)
	}
	if _, _, err := wrap.reserveUID(); err == nil {
		t.Fatal("a template boot got a user from a range that wraps to root")
	}
	if ok, why, _ := wrap.Available(context.Background()); ok || !strings.Contains(why, "root") {
		t.Fatalf("Available with a range that wraps to root: %v %q", ok, why)
	}
}

func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// checkQEMURoot: QEMU is chrooted into a directory with nothing but what
// it opens, and its /proc shows it no other user's process.
func checkQEMURoot(t *testing.T, name string, pid int, uid uint32) {
	t.Helper()
	root := fmt.Sprintf("/proc/%d/root", pid)
	if target, err := os.Readlink(root); err != nil || target == "/" {
		t.Fatalf("%s: QEMU's root is %q (%v): not chrooted", name, target, err)
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{"usr": true, "lib": true, "lib64": true, "dev": true, "proc": true, "ok": true}
	for _, e := range entries {
		if !allowed[e.Name()] {
			t.Fatalf("%s: QEMU's root holds %s", name, e.Name())
		}
	}
	if devs, _ := os.ReadDir(root + "/dev"); len(devs) != 1 || devs[0].Name() != "null" {
		t.Fatalf("%s: QEMU's /dev holds %v", name, devs)
	}
	// As QEMU's user, its /proc lists only that user's processes.
	cmd := exec.Command("/bin/ls", "-a", root+"/proc")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: list QEMU's /proc as its user: %v: %s", name, err, out)
	}
	seen := false
	for _, e := range strings.Fields(string(out)) {
		n, err := strconv.Atoi(e)
		if err != nil {
			if e != "." && e != ".." && e != "self" && e != "thread-self" {
				t.Fatalf("%s: QEMU's /proc holds %s", name, e)
			}
			continue
		}
		if n == pid {
			seen = true
			continue
		}
		if n == cmd.Process.Pid || !procStillThere(n) {
			continue // ls itself
		}
		if u, _ := procIDs(t, n); u != uid {
			t.Fatalf("%s: QEMU's /proc shows process %d of user %d", name, n, u)
		}
	}
	if !seen {
		t.Fatalf("%s: QEMU's /proc does not show QEMU itself: %s", name, out)
	}
}

func procStillThere(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

// TestEscapeSnapshotLayerNotWritable: the files of a snapshot of a
// running vm (its layer: the disk, the saved state, the records), which
// every later rollback and fork starts from, are no inode that the vm's
// QEMU, which goes on running what the guest may take over, holds open
// for writing: a write through such a descriptor would reach every one
// of them. Nor are they for a fork's QEMU, restored from the snapshot.
// It also times the snapshot, with 50 MB the guest wrote in its layer.
func TestEscapeSnapshotLayerNotWritable(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	ctx := context.Background()
	t.Cleanup(func() { b.GC(ctx, nil) }) // after the sandboxes' destroys
	s := conformance.Create(t, h, "vm-snapfd")
	s.Sh(t, "head -c 50000000 /dev/urandom > /root/big && sync")
	before, _ := b.readRun(s.ID)
	start := time.Now()
	if _, err := b.Snapshot(ctx, s.Sandbox, "snap-fd", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("live snapshot of a vm with 50 MB written to its disk: %v", time.Since(start))
	after, live := b.readRun(s.ID)
	if !live || after.PID != before.PID {
		t.Fatalf("QEMU %d before the snapshot, %d (live %v) after: want the same QEMU going on", before.PID, after.PID, live)
	}
	layer := map[[2]uint64]string{}
	entries, err := os.ReadDir(b.layerDir("snap-fd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		path := filepath.Join(b.layerDir("snap-fd"), e.Name())
		var fst unix.Stat_t
		if err := unix.Stat(path, &fst); err != nil {
			t.Fatal(err)
		}
		layer[[2]uint64{fst.Dev, fst.Ino}] = path
	}
	if len(layer) < 2 {
		t.Fatalf("the snapshot's layer holds %v", entries)
	}
	// The vm's own top layer, which its QEMU writes: the walk must find it.
	var fst unix.Stat_t
	if err := unix.Stat(filepath.Join(b.dir(s.ID), b.readHead(s.ID).Disk), &fst); err != nil {
		t.Fatal(err)
	}
	own := [2]uint64{fst.Dev, fst.Ino}
	check := func(who string, pid int, wantOwn bool) {
		t.Helper()
		sawOwn := false
		for _, fd := range mustGlob(t, fmt.Sprintf("/proc/%d/fd/*", pid)) {
			var fst unix.Stat_t
			if unix.Stat(fd, &fst) != nil {
				continue
			}
			key := [2]uint64{fst.Dev, fst.Ino}
			flags := fdFlags(t, pid, filepath.Base(fd))
			writable := flags&unix.O_ACCMODE == unix.O_WRONLY || flags&unix.O_ACCMODE == unix.O_RDWR
			if key == own && writable {
				sawOwn = true
			}
			if what, ok := layer[key]; ok && writable {
				target, _ := os.Readlink(fd)
				t.Errorf("%s's QEMU %d holds the snapshot's %s open for writing: descriptor %s (%s), flags %o",
					who, pid, filepath.Base(what), filepath.Base(fd), target, flags)
			}
		}
		if wantOwn && !sawOwn {
			t.Fatalf("%s's QEMU %d has no writable descriptor on its own top layer: the test looks in the wrong place", who, pid)
		}
	}
	check("the source", after.PID, true)
	// The guest goes on, and writes: still nothing of the layer writable.
	s.Sh(t, "head -c 1000000 /dev/urandom > /root/more && sync")
	check("the source", after.PID, false)

	fork := conformance.NewSandbox("vm-snapfd-fork", h.TemplateID)
	if err := b.Fork(ctx, fork, "snap-fd"); err != nil {
		t.Fatal(err)
	}
	f := conformance.Adopt(t, h, fork)
	if got := f.Sh(t, "ls /root"); got != "big\n" {
		t.Fatalf("the fork sees %q", got)
	}
	fst2, _ := b.readRun(fork.ID)
	check("the fork", fst2.PID, false)
	check("the source", after.PID, false)
}
