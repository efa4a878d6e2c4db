package container

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/core/conformance"
)

// A sandbox lacks the capabilities it has no use for (NET_RAW, MKNOD,
// AUDIT_WRITE, SETFCAP), cannot read the host's interrupt counts, and
// still pings (unprivileged ICMP sockets; the template's ping, marked
// cap_net_raw=ep, still runs).
func TestEscapeContainerCaps(t *testing.T) {
	_, h := newTestBackend(t)
	s := conformance.Create(t, h, "caps")
	const (
		capNetRaw     = 13
		capMknod      = 27
		capAuditWrite = 29
		capSetfcap    = 31
		capChown      = 0
	)
	// A child of the agent (PID 1): what every exec gets.
	status := s.Sh(t, "grep -E '^Cap(Eff|Bnd|Prm):' /proc/self/status")
	for _, line := range strings.Split(strings.TrimSpace(status), "\n") {
		name, hex, _ := strings.Cut(line, ":\t")
		v, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		for _, c := range []int{capNetRaw, capMknod, capAuditWrite, capSetfcap} {
			if v&(1<<c) != 0 {
				t.Errorf("%s %x has capability %d", name, v, c)
			}
		}
		if v&(1<<capChown) == 0 {
			t.Errorf("%s %x lacks CAP_CHOWN (package installs need it)", name, v)
		}
	}
	fails := func(script, want string) {
		t.Helper()
		r, err := s.Exec(t, &agent.ExecRequest{Argv: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Exit.ExitCode == 0 || !strings.Contains(r.Stdout+r.Stderr, want) {
			t.Errorf("%q: exit %d, output %q %q; want a failure saying %q", script, r.Exit.ExitCode, r.Stdout, r.Stderr, want)
		}
	}
	fails(`python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'`, "Operation not permitted")
	fails(`python3 -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)'`, "Operation not permitted")
	fails("mknod /tmp/null c 1 3", "Operation not permitted")
	if got := s.Sh(t, "cat /proc/interrupts; echo end"); got != "end\n" {
		t.Errorf("/proc/interrupts in the sandbox reads %q, want nothing", got)
	}
	// Unprivileged ICMP echo in the sandbox's own network namespace.
	out := s.Sh(t, `python3 -c '
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
s.settimeout(5)
s.sendto(b"\x08\x00\x00\x00\x00\x00\x00\x01nook", ("127.0.0.1", 0))
r = s.recv(64)
print("type", r[0], r[8:].decode())
'`)
	if strings.TrimSpace(out) != "type 0 nook" {
		t.Errorf("ICMP echo reply %q", out)
	}
	// The template's ping (cap_net_raw=ep) runs, unprivileged.
	s.Sh(t, "ping -c1 -W5 127.0.0.1 >/dev/null")
	s.Sh(t, "su nobody -s /bin/sh -c 'ping -c1 -W5 127.0.0.1' >/dev/null")
}

// A sandbox cannot fill the host's disk: it writes into its own disk
// (a 64 MiB one here) and gets ENOSPC past it, for blocks and for
// inodes, while the host's free space and another sandbox are untouched;
// what it deletes it can write again; its destroy leaves no mount, loop
// device or file.
func TestEscapeContainerDiskFull(t *testing.T) {
	b, h := newTestBackend(t)
	ctx := context.Background()
	sb := conformance.NewSandbox("small-disk", h.TemplateID)
	sb.DiskBytes = MinDisk
	if err := b.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	small := conformance.Adopt(t, h, sb)
	other := conformance.Create(t, h, "other")

	// What the sandbox costs the host: its image's allocated blocks. (The
	// host's free space is no measure: the tests running beside this one
	// wrote gigabytes to the same filesystem meanwhile.) Everything the
	// sandbox writes goes to that image: its / is the overlay whose
	// writable layer lives there, and it is no bigger than the image.
	checkHost := func() {
		t.Helper()
		var st unix.Stat_t
		if err := unix.Stat(b.diskImage(sb.ID), &st); err != nil {
			t.Fatalf("the sandbox's disk image: %v", err)
		}
		if alloc := st.Blocks * 512; alloc > MinDisk+8<<20 {
			t.Errorf("the sandbox's 64 MiB disk takes %d MiB on the host", alloc>>20)
		}
	}
	if size := strings.TrimSpace(small.Sh(t, "df -B1M --output=size / | tail -1")); size == "" || len(size) > 2 {
		t.Errorf("the sandbox's / is %s MiB, want at most 64", size)
	}
	fails := func(s *conformance.Sandbox, script, want string) {
		t.Helper()
		r, err := s.Exec(t, &agent.ExecRequest{Argv: []string{"sh", "-c", script}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Exit.ExitCode == 0 || !strings.Contains(r.Stdout+r.Stderr, want) {
			t.Fatalf("%q: exit %d, output %q %q; want a failure saying %q", script, r.Exit.ExitCode, r.Stdout, r.Stderr, want)
		}
	}
	fails(small, "fallocate -l 1G /big", "No space left on device")
	fails(small, "dd if=/dev/zero of=/big bs=1M count=1024 status=none && sync", "No space left on device")
	checkHost()
	// Another sandbox still writes.
	other.Sh(t, "dd if=/dev/zero of=/data bs=1M count=32 status=none && sync && rm /data")
	// Deleting frees the space again.
	small.Sh(t, "rm -f /big && sync && dd if=/dev/zero of=/again bs=1M count=16 status=none && sync && rm /again")

	// Inodes: empty files stop at the disk's inode count.
	out := small.Sh(t, `python3 -c '
import os, errno
os.mkdir("/many")
n = 0
try:
    while n < 200000:
        open("/many/%d" % n, "w").close()
        n += 1
except OSError as e:
    print(n, errno.errorcode[e.errno])
'`)
	var n int
	var code string
	if _, err := fmt.Sscan(out, &n, &code); err != nil || code != "ENOSPC" || n < 1000 || n > 20000 {
		t.Fatalf("creating empty files: %q (%v); want ENOSPC after a few thousand", out, err)
	}
	small.Sh(t, "rm -rf /many && touch /after-inodes")
	checkHost()

	// Destroy leaves nothing (Leaks looks for mounts and loop devices too).
	img := b.diskImage(sb.ID)
	small.Destroy(t)
	if _, err := os.Stat(img); err == nil {
		t.Errorf("disk image %s left after destroy", img)
	}
}

// A container sandbox's root is not root on the host (finding 5): every
// process of it, a fork's restored ones included, runs as uids of a range
// that is its own; the template's files are root's inside and stay
// 0-owned on disk; what it writes is its range's on the host, and a
// snapshot records it 0-based, for a fork to see in its own range.
func TestEscapeUserNamespace(t *testing.T) {
	b, h := newCheckpointBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "userns")
	m := readRange(t, b, s.ID)
	inRange(t, b, s.ID, m, "the sandbox")
	if got, want := s.Sh(t, "id -u; cat /proc/self/uid_map"), fmt.Sprintf("0\n%10d %10d %10d\n", 0, m.Base, idRangeSize); got != want {
		t.Errorf("inside: id and uid_map %q, want %q", got, want)
	}
	if got := s.Sh(t, "stat -c %u:%g /usr/bin/ls"); got != "0:0\n" {
		t.Errorf("the template's ls is owned by %q inside, want 0:0", got)
	}
	// setuid works for the sandbox's users: a template's binary (idmapped
	// layer) and one the sandbox made (upper directory).
	if got := s.Sh(t, "su nobody -s /bin/sh -c 'sudo -n true' 2>&1; true"); !strings.Contains(got, "sudo:") || strings.Contains(got, "effective uid is not 0") {
		t.Errorf("the template's setuid sudo does not run as root for nobody: %q", got)
	}
	if got := s.Sh(t, "cp /usr/bin/id /root/sid && chmod 4755 /root/sid && chmod 755 /root && su nobody -s /bin/sh -c '/root/sid -u'"); got != "0\n" {
		t.Errorf("a setuid-root binary the sandbox made runs as %q for nobody, want 0", got)
	}
	lowers, err := b.lowerDirs(chain{Template: s.TemplateID})
	if err != nil {
		t.Fatal(err)
	}
	if o := owner(t, filepath.Join(lowers[len(lowers)-1], "usr/bin/ls")); o != [2]uint32{0, 0} {
		t.Errorf("the template's ls is owned by %v on disk, want 0:0", o)
	}
	s.Sh(t, "touch /root/mine && useradd -u 1000 u1 && touch /root/theirs && chown u1:u1 /root/theirs")
	upper := filepath.Join(b.upperBase(s.ID), "upper", "root")
	if o := owner(t, filepath.Join(upper, "mine")); o != [2]uint32{m.Base, m.Base} {
		t.Errorf("a file the sandbox's root made is %v on the host, want %d:%d", o, m.Base, m.Base)
	}
	if o := owner(t, filepath.Join(upper, "theirs")); o != [2]uint32{m.Base + 1000, m.Base + 1000} {
		t.Errorf("a file of the sandbox's uid 1000 is %v on the host, want %d", o, m.Base+1000)
	}
	// Root inside cannot take what the host's root owns: a file it did
	// not make, mapped to no uid of its range, stays out of its reach.
	if err := os.WriteFile(filepath.Join(upper, "hosts"), []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := s.Exec(t, &agent.ExecRequest{Argv: []string{"sh", "-c", "stat -c %u /root/hosts; cat /root/hosts"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Exit.ExitCode == 0 || !strings.Contains(r.Stderr, "Permission denied") || strings.Contains(r.Stdout, "secret") {
		t.Errorf("the sandbox's root read a host root's file: exit %d, %q %q", r.Exit.ExitCode, r.Stdout, r.Stderr)
	}
	os.Remove(filepath.Join(upper, "hosts"))

	s2 := conformance.Create(t, h, "userns-2")
	if m2 := readRange(t, b, s2.ID); m2.Base == m.Base {
		t.Errorf("two sandboxes share the uid range %d", m.Base)
	}

	// An ACL naming uid 1000: the kernel gives the host its host uid.
	s.Sh(t, aclScript("set", "/root/theirs"))
	if got := s.Sh(t, aclScript("get", "/root/theirs")); got != "1000\n" {
		t.Fatalf("the ACL reads %q inside, want user 1000", got)
	}
	s.Sh(t, "setsid sleep 1000 >/dev/null 2>&1 < /dev/null & true")
	info, err := b.Snapshot(ctx, s.Sandbox, "uns-1", core.SnapshotOptions{Quiesce: s.Agent.Quiesce})
	if err != nil {
		t.Fatal(err)
	}
	if !info.Memory {
		t.Fatal("the snapshot has no memory: the fork would not be a restore")
	}
	layer := filepath.Join(b.layerDir("uns-1"), "layer", "root")
	if o := owner(t, filepath.Join(layer, "mine")); o != [2]uint32{0, 0} {
		t.Errorf("the snapshot records the root's file as %v, want 0:0", o)
	}
	if o := owner(t, filepath.Join(layer, "theirs")); o != [2]uint32{1000, 1000} {
		t.Errorf("the snapshot records uid 1000's file as %v, want 1000:1000", o)
	}
	if acl, err := getXattr(filepath.Join(layer, "theirs"), "system.posix_acl_access"); err != nil || len(acl) < 20 || binary.LittleEndian.Uint32(acl[16:]) != 1000 {
		t.Errorf("the snapshot records the ACL as %x (%v), want its user entry 1000", acl, err)
	}
	fsb := conformance.NewSandbox("userns-fork", h.TemplateID)
	if err := b.Fork(ctx, fsb, "uns-1"); err != nil {
		t.Fatal(err)
	}
	f := conformance.Adopt(t, h, fsb)
	mf := readRange(t, b, fsb.ID)
	if mf.Base == m.Base {
		t.Fatalf("the fork runs in its parent's uid range %d", m.Base)
	}
	inRange(t, b, fsb.ID, mf, "the fork")
	if got := f.Sh(t, "pgrep -x sleep >/dev/null && echo restored"); got != "restored\n" {
		t.Errorf("the fork's processes were not restored: %q", got)
	}
	if got := f.Sh(t, "id -u; stat -c %u /root/mine /root/theirs"); got != "0\n0\n1000\n" {
		t.Errorf("in the fork: id and owners %q, want 0, 0, 1000", got)
	}
	if got := f.Sh(t, aclScript("get", "/root/theirs")); got != "1000\n" {
		t.Errorf("in the fork the ACL reads %q, want user 1000", got)
	}
	f.Sh(t, "touch /root/forked")
	if o := owner(t, filepath.Join(b.upperBase(fsb.ID), "upper", "root", "forked")); o != [2]uint32{mf.Base, mf.Base} {
		t.Errorf("a file the fork's root made is %v on the host, want %d", o, mf.Base)
	}

	// Destroyed, a sandbox gives its range back.
	claim := filepath.Join(b.cfg.IDClaimDir, strconv.Itoa(mf.slot()))
	if _, err := os.Stat(claim); err != nil {
		t.Fatalf("the fork's range is not claimed: %v", err)
	}
	if err := b.Destroy(ctx, fsb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(claim); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the destroyed fork's range claim %s is still there (%v)", claim, err)
	}
}

func readRange(t *testing.T, b *Backend, id string) idmap {
	t.Helper()
	m, err := b.readIDMap(id)
	if err != nil {
		t.Fatal(err)
	}
	if !m.enabled() {
		t.Fatalf("sandbox %s has no user namespace", id)
	}
	return m
}

// inRange checks that every process of sandbox id (every process in its
// init's PID namespace) runs as uids and gids of m's range on the host.
func inRange(t *testing.T, b *Backend, id string, m idmap, what string) {
	t.Helper()
	init, err := b.lookupInit(id)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", init.PID))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid)); err != nil || l != ns {
			continue
		}
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			continue // gone meanwhile
		}
		n++
		for _, line := range strings.Split(string(status), "\n") {
			name, ids, ok := strings.Cut(line, ":")
			if !ok || name != "Uid" && name != "Gid" {
				continue
			}
			for _, f := range strings.Fields(ids) {
				v, _ := strconv.ParseUint(f, 10, 32)
				if uint32(v) < m.Base || uint32(v)-m.Base >= idRangeSize {
					t.Errorf("%s: process %d has %s %d on the host, outside its range %d+%d", what, pid, name, v, m.Base, idRangeSize)
				}
			}
		}
	}
	if n == 0 {
		t.Fatalf("%s: no process found in %s", what, ns)
	}
}

func owner(t *testing.T, path string) [2]uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return [2]uint32{st.Uid, st.Gid}
}

// aclScript sets (a user entry for uid 1000) or gets (the user entries'
// uids) the access ACL of path, in the sandbox's python3.
func aclScript(op, path string) string {
	return fmt.Sprintf(`python3 -c '
import os, struct, sys
op, path = sys.argv[1], sys.argv[2]
if op == "set":
    e = lambda tag, perm, id: struct.pack("<HHI", tag, perm, id)
    none = 0xFFFFFFFF
    os.setxattr(path, "system.posix_acl_access", struct.pack("<I", 2) + e(1, 6, none) + e(2, 6, 1000) + e(4, 4, none) + e(0x10, 6, none) + e(0x20, 4, none))
else:
    v = os.getxattr(path, "system.posix_acl_access")
    for off in range(4, len(v), 8):
        tag, perm, id = struct.unpack_from("<HHI", v, off)
        if tag == 2:
            print(id)
' %s %s`, op, path)
}

func getXattr(path, name string) ([]byte, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(path, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}
