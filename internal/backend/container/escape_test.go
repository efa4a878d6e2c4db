package container

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/agent"
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
