package container

import (
	"strconv"
	"strings"
	"testing"

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
