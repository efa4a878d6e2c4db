package e2e

import (
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
)

// Volumes in container sandboxes: one volume mounted by two sandboxes at
// once (one read-only) with files and owners the same in both (their
// uid ranges differ), its size giving ENOSPC, no hard link out of it, a
// pause to disk, a fork, a rollback (which does not rewind it), a kill
// -9 of the daemon and a stop and start keeping it, its data outliving the sandboxes, its removal refused
// while mounted and leaving no mount. A directory of the host mounts
// only from under one the daemon allows. Bad input is a clear error.
func TestVolumes(t *testing.T) {
	requireCRIU(t)
	allowed := t.TempDir()
	d := newDaemon(t, "--allow-host-mounts", allowed)
	vol := "vol-" + strings.TrimPrefix(d.cgroup, "nook-e2e-")
	if got := d.must("volume", "create", vol, "--size", "64M"); got != vol+"\n" {
		t.Fatalf("volume create: %q", got)
	}
	// Files go in without a sandbox.
	seed := t.TempDir()
	os.MkdirAll(filepath.Join(seed, "sub"), 0o755)
	os.WriteFile(filepath.Join(seed, "a"), []byte("seeded\n"), 0o644)
	os.WriteFile(filepath.Join(seed, "sub", "b"), []byte("deeper\n"), 0o600)
	d.must("volume", "cp", seed, vol+":/seed")
	if ls := d.must("volume", "fs", "ls", "-r", vol+":/seed"); !strings.Contains(ls, "/seed/sub/b") {
		t.Errorf("volume fs ls:\n%s", ls)
	}
	d.must("create", "--name", "v-rw", "--volume", vol+":/data")
	if got := d.must("exec", "v-rw", "--", "cat", "/data/seed/a", "/data/seed/sub/b"); got != "seeded\ndeeper\n" {
		t.Errorf("files copied in without a sandbox, seen in one: %q", got)
	}
	d.must("create", "--name", "v-ro", "--volume", vol+":/mnt/in:ro")
	d.must("exec", "v-rw", "--", "sh", "-c", "echo hello > /data/hello && mkdir /data/u && chown 1000:1000 /data/u && ls -ld /data")
	if got := d.must("exec", "v-ro", "--", "sh", "-c", "cat /mnt/in/hello; stat -c '%u:%g' /mnt/in/u; stat -c '%u' /mnt/in"); got != "hello\n1000:1000\n0\n" {
		t.Errorf("the read-only sandbox sees %q", got)
	}
	if r, _ := d.nook("exec", "v-ro", "--", "sh", "-c", "echo x > /mnt/in/x"); r.code == 0 || !strings.Contains(r.stderr+r.stdout, "Read-only") {
		t.Errorf("a write to a read-only volume: %+v", r)
	}
	if r, _ := d.nook("exec", "v-rw", "--", "sh", "-c", "dd if=/dev/zero of=/data/big bs=1M count=100 2>&1"); r.code == 0 || !strings.Contains(r.stdout, "No space left") {
		t.Errorf("writing past the volume's size: %+v", r)
	}
	d.must("exec", "v-rw", "--", "rm", "/data/big")
	if r, _ := d.nook("exec", "v-rw", "--", "ln", "/etc/hostname", "/data/link"); r.code == 0 {
		t.Errorf("a hard link from the sandbox's root into the volume: %+v", r)
	}
	// The daemon reads and writes a volume without following a
	// sandbox's symlink out of it.
	d.must("exec", "v-rw", "--", "sh", "-c", "ln -s /etc /data/esc; ln -s ../../../../../../etc /data/esc2; ln -s seed /data/inside")
	if got := d.must("volume", "fs", "cat", vol+":/hello"); got != "hello\n" {
		t.Errorf("volume fs cat: %q", got)
	}
	if got := d.must("volume", "fs", "cat", vol+":/inside/a"); got != "seeded\n" {
		t.Errorf("a symlink inside the volume: %q", got)
	}
	for _, p := range []string{"/esc/passwd", "/esc2/passwd"} {
		if r, _ := d.nook("volume", "fs", "cat", vol+":"+p); r.code == 0 || strings.Contains(r.stdout, "root:") {
			t.Errorf("volume fs cat %s read through a symlink out of the volume: %+v", p, r)
		}
		if r, _ := d.nook("volume", "cp", seed+"/a", vol+":"+path.Dir(p)+"/"); r.code == 0 {
			t.Errorf("volume cp into %s wrote through a symlink out of the volume: %+v", path.Dir(p), r)
		}
	}
	if _, err := os.Stat("/etc/a"); err == nil {
		t.Fatal("a copy into the volume landed in the host's /etc")
	}
	out := filepath.Join(t.TempDir(), "out")
	d.must("volume", "cp", vol+":/seed", out)
	if b, err := os.ReadFile(filepath.Join(out, "sub", "b")); err != nil || string(b) != "deeper\n" {
		t.Errorf("volume cp out: %q %v", b, err)
	}
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(d.must("inspect", "v-ro", "--json")), &sb); err != nil || len(sb.Volumes) != 1 || sb.Volumes[0] != (api.VolumeMount{Name: vol, Path: "/mnt/in", ReadOnly: true}) {
		t.Errorf("inspect: %+v %v", sb.Volumes, err)
	}
	var v api.Volume
	if err := json.Unmarshal([]byte(d.must("volume", "inspect", vol, "--json")), &v); err != nil || v.SizeBytes != 64<<20 || strings.Join(v.MountedBy, ",") != "v-ro,v-rw" && strings.Join(v.MountedBy, ",") != "v-rw,v-ro" {
		t.Errorf("volume inspect: %+v %v", v, err)
	}
	if r, _ := d.nook("volume", "rm", vol); r.code != 1 || !strings.Contains(r.stderr, "is mounted by") {
		t.Errorf("volume rm while mounted: %+v", r)
	}

	// Paused to disk and resumed, forked: the volume is still there, the
	// same one (not in the snapshot).
	d.must("pause", "v-rw")
	d.must("resume", "v-rw")
	d.must("fork", "v-rw", "--name", "v-fork")
	d.must("exec", "v-fork", "--", "sh", "-c", "echo from-fork > /data/fork")
	if got := d.must("exec", "v-rw", "--", "cat", "/data/hello", "/data/fork"); got != "hello\nfrom-fork\n" {
		t.Errorf("after a pause and a fork: %q", got)
	}
	// A rollback does not rewind the volume: it is in no snapshot.
	d.must("snapshot", "v-rw", "--name", "before")
	d.must("exec", "v-rw", "--", "sh", "-c", "echo kept > /data/after-snapshot; echo gone > /root/after-snapshot")
	d.must("rollback", "v-rw", "before")
	if got := d.must("exec", "v-rw", "--", "sh", "-c", "cat /data/after-snapshot; test -e /root/after-snapshot || echo root rewound"); got != "kept\nroot rewound\n" {
		t.Errorf("after a rollback: %q", got)
	}
	// kill -9 of the daemon: everything comes back.
	d.stop(syscall.SIGKILL)
	d.start()
	if got := d.must("exec", "v-ro", "--", "cat", "/mnt/in/fork"); got != "from-fork\n" {
		t.Errorf("after a kill -9: %q", got)
	}
	d.must("rm", "v-rw", "v-ro", "v-fork")
	d.must("create", "--name", "v-again", "--volume", vol+":/data")
	if got := d.must("exec", "v-again", "--", "cat", "/data/hello"); got != "hello\n" {
		t.Errorf("the volume outlives its sandboxes: %q", got)
	}
	d.must("stop", "v-again")
	d.must("start", "v-again")
	if got := d.must("exec", "v-again", "--", "cat", "/data/hello"); got != "hello\n" {
		t.Errorf("after a stop and a start: %q", got)
	}
	d.must("rm", "v-again")
	// A directory of the host, under the one the daemon allows: the
	// host's files with their owners, written by the sandbox's root as
	// the host's root; read-only where asked.
	os.MkdirAll(filepath.Join(allowed, "sub"), 0o755)
	os.WriteFile(filepath.Join(allowed, "shared.txt"), []byte("from host\n"), 0o644)
	os.Symlink("/etc", filepath.Join(allowed, "etc-link"))
	d.must("create", "--name", "v-host", "--mount", allowed+":/host", "--mount", filepath.Join(allowed, "sub")+":/sub:ro")
	if got := d.must("exec", "v-host", "--", "sh", "-c", "cat /host/shared.txt; echo made > /host/made; stat -c %u /host/shared.txt"); got != "from host\n0\n" {
		t.Errorf("a host mount: %q", got)
	}
	if fi, err := os.Stat(filepath.Join(allowed, "made")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("a file the sandbox's root made in a host mount: %v", err)
	}
	if r, _ := d.nook("exec", "v-host", "--", "touch", "/sub/x"); r.code == 0 {
		t.Errorf("a write to a read-only host mount: %+v", r)
	}
	if out := d.must("inspect", "v-host"); !strings.Contains(out, "host mount:") {
		t.Errorf("inspect shows no host mount:\n%s", out)
	}
	d.must("rm", "v-host")
	d.expectCLI(t, []cliCase{
		{[]string{"create", "--mount", "/etc:/x"}, 1, "not under a directory this daemon allows"},
		{[]string{"create", "--mount", filepath.Join(allowed, "etc-link") + ":/x"}, 1, "not under a directory this daemon allows"},
		{[]string{"create", "--mount", "etc:/x"}, 1, "give an absolute directory"},
		{[]string{"create", "--mount", filepath.Join(allowed, "shared.txt") + ":/x"}, 1, "not a directory"},
		{[]string{"create", "--volume", "nope:/data"}, 1, "volume nope not found"},
		{[]string{"create", "--volume", vol + ":data"}, 1, "is not absolute"},
		{[]string{"create", "--volume", vol + ":/"}, 1, "over the root"},
		{[]string{"create", "--volume", vol + ":/proc/x"}, 1, "cannot be mounted in /proc"},
		{[]string{"create", "--volume", vol + ":/a", "--volume", vol + ":/a/"}, 1, "volumes at /a and /a: one is in the other"},
		{[]string{"create", "--volume", vol + ":/a", "--volume", vol + ":/a/b"}, 1, "volumes at /a and /a/b: one is in the other"},
		{[]string{"create", "--volume", vol + ":/.nook"}, 1, "cannot be mounted in /.nook"},
		{[]string{"create", "--volume", vol + ":/a:rx"}, 1, "give NAME:/path or NAME:/path:ro"},
		{[]string{"volume", "create", vol}, 1, "already exists"},
		{[]string{"volume", "create", "Bad"}, 1, "is not valid"},
		{[]string{"volume", "create", "tiny", "--size", "1M"}, 1, "at least 64 MiB"},
		{[]string{"volume", "rm", "nope"}, 1, "not found"},
	})
	d.must("volume", "rm", vol)
	if ls := d.must("volume", "ls"); strings.Contains(ls, vol) {
		t.Errorf("volume ls after rm:\n%s", ls)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if vols := filepath.Join(d.data, "volumes"); strings.Contains(string(mounts), vols+"/") {
		t.Errorf("mounts left under %s", vols)
	}
	if entries, _ := os.ReadDir(filepath.Join(d.data, "volumes")); len(entries) > 0 {
		t.Errorf("left in the volume store: %v", entries)
	}
}

// A vm's volumes: the same volume mounted by a container and a vm at
// once, both ways; owners for the guest's users; read-only refused;
// the size limit; a pause to disk, a fork, a rollback and a kill -9 of
// the daemon with the volume mounted; a host directory.
func TestVolumesVM(t *testing.T) {
	requireVM(t)
	allowed := t.TempDir()
	d := newDaemon(t, "--allow-host-mounts", allowed)
	vol := "vmvol-" + strings.TrimPrefix(d.cgroup, "nook-e2e-")
	d.must("volume", "create", vol, "--size", "64M")
	os.WriteFile(filepath.Join(allowed, "shared.txt"), []byte("from host\n"), 0o644)
	vmArgs := []string{"--isolation", "vm", "--cpus", "1", "--memory", "512M"}
	d.must("create", "--name", "vv-ct", "--volume", vol+":/data")
	d.must(append([]string{"create", "--name", "vv-vm", "--volume", vol + ":/data", "--volume", vol + ":/ro:ro", "--mount", allowed + ":/host"}, vmArgs...)...)

	d.must("exec", "vv-ct", "--", "sh", "-c", "echo from-ct > /data/ct && mkdir /data/u && chown 1000:1000 /data/u")
	if got := d.must("exec", "vv-vm", "--", "sh", "-c", "cat /data/ct /ro/ct; stat -c %u:%g /data/u"); got != "from-ct\nfrom-ct\n1000:1000\n" {
		t.Errorf("the vm reads the container's writes: %q", got)
	}
	d.must("exec", "--user", "1000", "vv-vm", "--", "sh", "-c", "echo from-vm > /data/u/vm && ln -s vm /data/u/link && mkdir /data/u/d")
	if got := d.must("exec", "vv-ct", "--", "sh", "-c", "cat /data/u/vm /data/u/link; stat -c %u:%g /data/u/vm /data/u/d"); got != "from-vm\nfrom-vm\n1000:1000\n1000:1000\n" {
		t.Errorf("the container reads the vm's writes: %q", got)
	}
	if r, _ := d.nook("exec", "--user", "1000", "vv-vm", "--", "sh", "-c", "echo x > /data/ct"); r.code == 0 {
		t.Errorf("uid 1000 in the vm wrote root's 0644 file: %+v", r)
	}
	if r, _ := d.nook("exec", "vv-vm", "--", "sh", "-c", "echo x > /ro/x"); r.code == 0 || !strings.Contains(r.stderr+r.stdout, "Read-only") {
		t.Errorf("a write to a read-only volume in the vm: %+v", r)
	}
	if r, _ := d.nook("exec", "vv-vm", "--", "sh", "-c", "dd if=/dev/zero of=/data/big bs=1M count=100 2>&1"); r.code == 0 || !strings.Contains(r.stdout, "No space left") {
		t.Errorf("writing past the volume's size in the vm: %+v", r)
	}
	d.must("exec", "vv-vm", "--", "rm", "/data/big")
	if r, _ := d.nook("exec", "vv-vm", "--", "ln", "/etc/hostname", "/data/hl"); r.code == 0 {
		t.Errorf("a hard link from the vm's root into the volume: %+v", r)
	}
	if got := d.must("exec", "vv-vm", "--", "sh", "-c", "cat /host/shared.txt; echo made > /host/made"); got != "from host\n" {
		t.Errorf("a host directory in the vm: %q", got)
	}
	if fi, err := os.Stat(filepath.Join(allowed, "made")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("the file the vm's root made in the host directory: %v", err)
	}
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(d.must("inspect", "vv-vm", "--json")), &sb); err != nil || len(sb.Volumes) != 3 {
		t.Errorf("inspect: %+v %v", sb.Volumes, err)
	}

	// A pause to disk, a fork and a rollback: the mounts come back with
	// the vm's memory, on the same volume, which no snapshot rewinds. A
	// process holding a file of the volume open does not hold the pause.
	d.must("exec", "-d", "vv-vm", "--", "sh", "-c", "exec 3</data/ct; cd /data; sleep 1000")
	d.must("pause", "vv-vm")
	d.must("exec", "vv-ct", "--", "sh", "-c", "echo while-paused > /data/paused")
	d.must("resume", "vv-vm")
	if got := d.must("exec", "vv-vm", "--", "cat", "/data/paused"); got != "while-paused\n" {
		t.Errorf("after a resume: %q", got)
	}
	d.must("fork", "vv-vm", "--name", "vv-fork")
	d.must("exec", "vv-fork", "--", "sh", "-c", "echo from-fork > /data/fork")
	if got := d.must("exec", "vv-ct", "--", "cat", "/data/fork"); got != "from-fork\n" {
		t.Errorf("a fork's write: %q", got)
	}
	d.must("snapshot", "vv-vm", "--name", "before")
	d.must("exec", "vv-vm", "--", "sh", "-c", "echo kept > /data/after; echo gone > /root/after")
	d.must("rollback", "vv-vm", "before")
	if got := d.must("exec", "vv-vm", "--", "sh", "-c", "cat /data/after; test -e /root/after || echo root rewound"); got != "kept\nroot rewound\n" {
		t.Errorf("after a rollback: %q", got)
	}
	// kill -9 of the daemon: the vm runs on, and its volume calls are
	// served again once the daemon is back.
	d.stop(syscall.SIGKILL)
	d.start()
	d.must("exec", "vv-ct", "--", "sh", "-c", "echo after-kill > /data/kill")
	if got := d.must("exec", "vv-vm", "--", "cat", "/data/kill"); got != "after-kill\n" {
		t.Errorf("after a kill -9 of the daemon: %q", got)
	}
	// Stopped and started: a fresh boot mounts them again.
	d.must("stop", "vv-vm")
	d.must("start", "vv-vm")
	if got := d.must("exec", "vv-vm", "--", "cat", "/data/kill"); got != "after-kill\n" {
		t.Errorf("after a stop and a start: %q", got)
	}
	// Removed by force while mounted: the sandboxes keep what they see
	// until they go, and then nothing of it is left.
	d.must("volume", "rm", "--force", vol)
	for _, sb := range []string{"vv-vm", "vv-ct"} {
		if got := d.must("exec", sb, "--", "cat", "/data/kill"); got != "after-kill\n" {
			t.Errorf("%s after its volume was removed by force: %q", sb, got)
		}
	}
	// Paused and resumed, the vm goes on without it: EIO from its files.
	d.must("pause", "vv-vm")
	d.must("resume", "vv-vm")
	if r, _ := d.nook("exec", "vv-vm", "--", "cat", "/data/kill"); r.code == 0 || !strings.Contains(r.stderr+r.stdout, "Input/output error") {
		t.Errorf("a removed volume in a resumed vm: %+v", r)
	}
	d.must("exec", "vv-vm", "--", "cat", "/host/shared.txt")
	d.must("rm", "vv-vm", "vv-fork", "vv-ct")
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), filepath.Join(d.data, "volumes")+"/") {
		t.Errorf("mounts left under the volume store")
	}
	// The loop device goes with the last mount of its file system, which
	// the kernel may finish just after.
	left := func() (on string) {
		loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		for _, l := range loops {
			if b, _ := os.ReadFile(l); strings.HasPrefix(string(b), filepath.Join(d.data, "volumes")) {
				on = string(b)
			}
		}
		return on
	}
	for deadline := time.Now().Add(5 * time.Second); left() != "" && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if on := left(); on != "" {
		t.Errorf("a loop device is left on %s", on)
	}
}
