package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
)

// A vm is a machine: `nook stop` and a guest power off leave it stopped
// (no QEMU, its disk kept), `nook start` boots it again with its files and
// name; a guest reboot brings it back on its own and it stays running; a
// guest that reboots over and over is left stopped as a reboot loop, and
// starts again on request.
func TestVMStopStartReboot(t *testing.T) {
	requireVM(t)
	d := newDaemon(t)
	d.must("create", "--isolation", "vm", "--name", "box", "--cpus", "1", "--memory", "512M")
	d.must("exec", "box", "--", "sh", "-c", "echo kept > /root/kept && sync")
	id := mustID(t, d, "box")
	dir := d.data + "/vms/" + id

	// nook stop: no QEMU; calls fail and say how to start it.
	if got := d.must("stop", "box"); got != "box\n" {
		t.Fatalf("stop printed %q", got)
	}
	if sb := d.inspect("box"); sb.State != api.StateStopped {
		t.Fatalf("after stop: %+v", sb)
	}
	if pid := findQEMU(dir); pid != 0 {
		t.Fatalf("a stopped vm still has QEMU %d", pid)
	}
	r, _ := d.nook("exec", "box", "--", "true")
	if r.code == 0 || !strings.Contains(r.stderr, "nook start box") {
		t.Fatalf("exec on a stopped vm: %+v", r)
	}
	if r, _ := d.nook("stop", "box"); r.code == 0 || !strings.Contains(r.stderr, "already stopped") {
		t.Fatalf("stop of a stopped vm: %+v", r)
	}
	d.must("start", "box")
	if got := d.must("exec", "box", "--", "sh", "-c", "cat /root/kept; hostname"); got != "kept\nbox\n" {
		t.Fatalf("after start: %q", got)
	}

	// The guest powers off.
	d.nook("exec", "box", "--", "sh", "-c", "sync; echo o > /proc/sysrq-trigger")
	sb := d.waitState("box", api.StateStopped, 60*time.Second)
	if !strings.Contains(sb.Reason, "powered off") {
		t.Fatalf("a guest power off: %+v", sb)
	}
	d.must("start", "box")

	// The guest reboots: it comes back by itself, running, with its files.
	boot := d.must("exec", "box", "--", "cat", "/proc/sys/kernel/random/boot_id")
	d.nook("exec", "box", "--", "sh", "-c", "sync; echo b > /proc/sysrq-trigger")
	waitFor(t, "the vm to come back from its reboot", func() bool {
		r, _ := d.nook("exec", "box", "--", "cat", "/proc/sys/kernel/random/boot_id")
		return r.code == 0 && r.stdout != boot
	})
	if sb := d.inspect("box"); sb.State != api.StateRunning || sb.RebootedAt == nil {
		t.Fatalf("after a guest reboot: %+v", sb)
	}
	if !strings.Contains(d.must("inspect", "box"), "rebooted at:") {
		t.Fatal("inspect does not show the reboot")
	}
	if got := d.must("exec", "box", "--", "sh", "-c", "cat /root/kept; hostname"); got != "kept\nbox\n" {
		t.Fatalf("after a guest reboot: %q", got)
	}

	// A reboot loop: the guest reboots as soon as it can, every time.
	d.must("exec", "box", "--", "sh", "-c", "sync")
	deadline := time.Now().Add(3 * time.Minute)
	for d.inspect("box").State == api.StateRunning && time.Now().Before(deadline) {
		// Fails (try again) while it boots.
		d.nook("exec", "box", "--", "sh", "-c", "echo b > /proc/sysrq-trigger")
		time.Sleep(100 * time.Millisecond)
	}
	sb = d.waitState("box", api.StateStopped, 10*time.Second)
	if !strings.Contains(sb.Reason, "reboot loop") {
		t.Fatalf("a reboot loop: %+v", sb)
	}
	if pid := findQEMU(dir); pid != 0 {
		t.Fatalf("a vm stopped as a reboot loop still has QEMU %d", pid)
	}
	d.must("start", "box")
	if got := d.must("exec", "box", "--", "cat", "/root/kept"); got != "kept\n" {
		t.Fatalf("after a reboot loop and a start: %q", got)
	}
}
