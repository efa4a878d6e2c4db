package e2e

import (
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/network/nettest"
)

// serveMirror serves deb.debian.org in the world (debMirror:80) as a
// proxy of Debian's real mirror, which the test process reaches from the
// host as apt does: a sandbox's apt-get then fetches real packages
// through the sandbox's own allowlist, and its packets stay in the
// namespaces the test made.
func (w *world) serveMirror(t *testing.T) {
	t.Helper()
	var ln net.Listener
	if err := nettest.Do(w.topo.World, func() (err error) { ln, err = net.Listen("tcp4", debMirror+":80"); return err }); err != nil {
		t.Fatal(err)
	}
	up, _ := url.Parse("http://deb.debian.org")
	proxy := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(up)
		r.Out.Host = up.Host
	}}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// A vm of the dev template is a whole machine: systemd is its PID 1, a
// package with a service installed by apt-get (from Debian's mirror,
// through the sandbox's allowlist) runs; a reboot (reboot, systemctl
// reboot, sysrq) brings it back running with its files, services, address
// and policy; poweroff leaves it stopped and nook start boots it; a
// daemon killed during a reboot or a start leaves it consistent; an idle
// systemd machine still pauses.
func TestVMSystemd(t *testing.T) {
	requireVM(t)
	w := newWorld(t)
	w.serveMirror(t)
	d := newDaemonIn(t, w.hostPath(), netDaemonArgs("--min-idle-pause", "1s")...)
	d.must("create", "--isolation", "vm", "--template", "dev", "--name", "sd", "--allow", "@registries")
	if sb := d.inspect("sd"); sb.Init != api.InitSystemd {
		t.Fatalf("a dev vm's init is %q, want systemd", sb.Init)
	}
	if !strings.Contains(d.must("inspect", "sd"), "init:") {
		t.Fatal("inspect does not show the init")
	}
	id := mustID(t, d, "sd")
	dir := d.data + "/vms/" + id
	net0 := d.network("sd")
	running := func(what string) {
		t.Helper()
		r := d.sh("sd", "systemctl is-system-running --wait; systemctl --failed --no-legend --plain")
		if r.stdout != "running\n" {
			t.Fatalf("%s: is-system-running: %q", what, r.stdout)
		}
		if got := d.sh("sd", "systemctl is-active cron docker; cat /root/kept; hostname").stdout; got != "active\nactive\nkept\nsd\n" {
			t.Fatalf("%s: services, files and name: %q", what, got)
		}
		if n := d.network("sd"); n.Address != net0.Address || strings.Join(n.Allow, ",") != strings.Join(net0.Allow, ",") {
			t.Fatalf("%s: network %+v, was %+v", what, n, net0)
		}
	}

	// apt-get installs a package with a service, which systemd runs.
	// Bounds, not speed checks: under TCG, on a loaded 2-core host, apt's
	// index of bookworm main takes a minute or more, and a reboot of
	// systemd with dockerd tens of seconds.
	const aptBound, bootBound = 10 * time.Minute, 4 * time.Minute
	start := time.Now()
	r, err := d.nookWithin(aptBound, []string{"NOOK_HOST=unix://" + d.socket()}, "exec", "sd", "--", "sh", "-c", `echo 'deb http://deb.debian.org/debian bookworm main' >/etc/apt/sources.list && rm -f /etc/apt/sources.list.d/* &&
apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cron >/dev/null && echo kept >/root/kept && sync`)
	if err != nil {
		t.Fatal(err)
	}
	if r.code != 0 {
		t.Fatalf("apt-get install cron: exit %d: %s", r.code, r.stderr)
	}
	t.Logf("apt-get update and install of cron in the vm: %s", time.Since(start).Round(time.Second))
	running("after apt-get install")

	// Reboots from inside, three ways: the machine comes back by itself.
	reboot := func(how string) {
		t.Helper()
		boot := d.must("exec", "sd", "--", "cat", "/proc/sys/kernel/random/boot_id")
		d.nook("exec", "sd", "--", "sh", "-c", how)
		waitWithin(t, "the vm to come back from "+how, bootBound, func() bool {
			r, _ := d.nook("exec", "sd", "--", "cat", "/proc/sys/kernel/random/boot_id")
			return r.code == 0 && r.stdout != boot
		})
		if sb := d.inspect("sd"); sb.State != api.StateRunning || sb.RebootedAt == nil {
			t.Fatalf("after %s: %+v", how, sb)
		}
		running("after " + how)
	}
	reboot("reboot")
	reboot("systemctl reboot")
	reboot("sync; echo b >/proc/sysrq-trigger")

	// The daemon is killed while the guest reboots: the daemon that
	// starts next finds it halted (or booting) and brings it back.
	boot := d.must("exec", "sd", "--", "cat", "/proc/sys/kernel/random/boot_id")
	d.nook("exec", "sd", "--", "reboot")
	d.stop(syscall.SIGKILL)
	d.start()
	waitWithin(t, "the vm to come back from a reboot the daemon was killed in", bootBound, func() bool {
		r, _ := d.nook("exec", "sd", "--", "cat", "/proc/sys/kernel/random/boot_id")
		return r.code == 0 && r.stdout != boot
	})
	running("after a reboot across a daemon kill")

	// poweroff: stopped, no QEMU; nook start boots it.
	d.nook("exec", "sd", "--", "poweroff")
	if sb := d.waitState("sd", api.StateStopped, bootBound); !strings.Contains(sb.Reason, "powered off") {
		t.Fatalf("after poweroff: %+v", sb)
	}
	if pid := findQEMU(dir); pid != 0 {
		t.Fatalf("a powered off vm still has QEMU %d", pid)
	}
	mustWithin(t, d, bootBound, "start", "sd")
	running("after poweroff and start")

	// nook stop has systemd power the machine off (its services stopped
	// in order), not QEMU pulled from under it: the guest kernel's last
	// words are its power down.
	start = time.Now()
	mustWithin(t, d, bootBound, "stop", "sd")
	t.Logf("nook stop of a systemd vm: %s", time.Since(start).Round(time.Millisecond))
	console, _ := os.ReadFile(dir + "/console.log")
	thisBoot := string(console)
	if i := strings.LastIndex(thisBoot, "--- nook: boot ---"); i >= 0 {
		thisBoot = thisBoot[i:]
	}
	if !strings.Contains(thisBoot, "reboot: Power down") {
		t.Fatalf("nook stop did not power the guest off: its boot's console %q", thisBoot[max(0, len(thisBoot)-1024):])
	}

	// The daemon is killed during a start: the next daemon leaves the vm
	// stopped or running, never half started, and it starts.
	cmd := exec.Command(d.bin, "start", "sd")
	cmd.Env = append(os.Environ(), "NOOK_HOST=unix://"+d.socket())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the start's QEMU", func() bool { return findQEMU(dir) != 0 })
	d.stop(syscall.SIGKILL)
	cmd.Wait()
	d.start()
	waitWithin(t, "the vm to settle after a start cut short", bootBound, func() bool {
		st := d.inspect("sd").State
		return st == api.StateStopped || st == api.StateRunning
	})
	if d.inspect("sd").State == api.StateStopped {
		if pid := findQEMU(dir); pid != 0 {
			t.Fatalf("a vm recorded stopped has QEMU %d", pid)
		}
		mustWithin(t, d, bootBound, "start", "sd")
	}
	running("after a start cut short by a daemon kill")

	// An idle systemd machine still pauses: what systemd runs by itself
	// (journald, timers, dockerd waiting) is not use.
	d.must("create", "--isolation", "vm", "--template", "dev", "--name", "idle", "--idle-pause", "3s")
	if sb := d.waitState("idle", api.StatePaused, bootBound); !strings.Contains(sb.Reason, "idle") {
		t.Fatalf("an idle systemd vm: %+v", sb)
	}
	if got := d.must("exec", "idle", "--", "systemctl", "is-active", "docker"); got != "active\n" {
		t.Fatalf("after an idle pause: %q", got)
	}
}

// mustWithin runs the CLI with a bound of its own and fails the test
// unless it exits 0.
func mustWithin(t *testing.T, d *daemon, bound time.Duration, args ...string) string {
	t.Helper()
	r, err := d.nookWithin(bound, []string{"NOOK_HOST=unix://" + d.socket()}, args...)
	if err != nil || r.code != 0 {
		t.Fatalf("nook %v: exit %d, %v: %s", args, r.code, err, r.stderr)
	}
	return r.stdout
}
