package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/testutil"
)

func requireVM(t *testing.T) {
	t.Helper()
	testutil.RequireCommand(t, "qemu-system-x86_64", "qemu-system-x86")
	testutil.RequireCommand(t, "qemu-img", "qemu-utils")
}

var vmCacheOnce sync.Once

// requireVMInSimulatedHost is requireVM for a daemon in a simulated host,
// which reaches no mirror: the guest kernel and the vm template the
// simulated host's daemon will need are made once beforehand, by a daemon
// on the host (the vm cache is shared), whatever tests ran before.
func requireVMInSimulatedHost(t *testing.T) {
	t.Helper()
	requireVM(t)
	vmCacheOnce.Do(func() {
		d := newDaemon(t)
		d.must("create", "--isolation", "vm", "--name", "cache-warmer", "--cpus", "1", "--memory", "512M")
		d.must("rm", "cache-warmer")
		d.stop(syscall.SIGTERM)
	})
}

// A vm sandbox through the CLI: its own kernel, inspect says how it runs,
// processes survive a daemon restart, and a killed QEMU is reported with
// the disk kept until rm.
func TestVMSandbox(t *testing.T) {
	requireVM(t)
	d := newDaemon(t)
	// The shape the backend tests use, so the template snapshot is shared.
	d.must("create", "--isolation", "vm", "--name", "vm1", "--cpus", "1", "--memory", "512M")
	var uts syscall.Utsname
	syscall.Uname(&uts)
	out := d.must("exec", "vm1", "--", "uname", "-a")
	if !strings.Contains(out, "6.1.0-") || !strings.Contains(out, "Debian") {
		t.Fatalf("uname -a in the vm: %q; want Debian's 6.1 guest kernel", out)
	}
	var sb api.Sandbox
	json.Unmarshal([]byte(d.must("inspect", "vm1", "--json")), &sb)
	if sb.Isolation != "vm" || sb.Accelerator == "" || sb.Boot == "" || !strings.HasPrefix(sb.GuestKernel, "6.1.0-") {
		t.Fatalf("inspect: %+v", sb)
	}
	if !strings.Contains(d.must("inspect", "vm1"), "accelerator:") {
		t.Fatal("inspect does not show the accelerator")
	}
	if info := d.must("info"); !strings.Contains(info, "vm") || !strings.Contains(info, "accelerator: ") {
		t.Fatalf("info: %s", info)
	}
	if got := d.must("exec", "vm1", "--", "hostname"); got != "vm1\n" {
		t.Fatalf("hostname %q", got)
	}

	// A background process and a file survive a daemon restart.
	d.must("exec", "-d", "vm1", "--", "sh", "-c", "echo kept > /root/f; sleep 600")
	d.stop(syscall.SIGTERM)
	d.start()
	if got := d.must("exec", "vm1", "--", "cat", "/root/f"); got != "kept\n" {
		t.Fatalf("after restart: %q", got)
	}
	if ps := d.must("ps", "vm1"); !strings.Contains(ps, "sleep 600") {
		t.Fatalf("ps after restart: %s", ps)
	}

	// Paused to disk: no QEMU left; survives a daemon restart; an exec
	// wakes it, with the background process and the clock intact.
	d.must("pause", "vm1")
	json.Unmarshal([]byte(d.must("inspect", "vm1", "--json")), &sb)
	if sb.State != api.StatePaused || !strings.Contains(sb.PauseKind, "disk") {
		t.Fatalf("paused vm: %+v", sb)
	}
	if pid := findQEMU(filepath.Join(d.data, "vms", sb.ID)); pid != 0 {
		t.Fatalf("a paused vm still has QEMU %d", pid)
	}
	d.stop(syscall.SIGKILL)
	d.start()
	json.Unmarshal([]byte(d.must("inspect", "vm1", "--json")), &sb)
	if sb.State != api.StatePaused {
		t.Fatalf("after a daemon kill -9, the paused vm is %s", sb.State)
	}
	if ps := d.must("ps", "vm1"); !strings.Contains(ps, "sleep 600") {
		t.Fatalf("ps after resume: %s", ps)
	}
	before := time.Now().Unix()
	guest, _ := strconv.ParseInt(strings.TrimSpace(d.must("exec", "vm1", "--", "date", "+%s")), 10, 64)
	if after := time.Now().Unix(); guest < before-2 || guest > after+1 {
		t.Fatalf("guest clock after resume: %d, host between %d and %d", guest, before, after)
	}
	d.expectCLI(t, []cliCase{{[]string{"resume", "vm1"}, 1, "not paused"}})
	d.must("pause", "vm1")
	d.expectCLI(t, []cliCase{{[]string{"pause", "vm1"}, 1, "already paused"}})
	d.must("resume", "vm1")

	// QEMU killed: failed, with a reason, disk kept until rm.
	pid := qemuPID(t, filepath.Join(d.data, "vms", sb.ID))
	syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(15 * time.Second)
	for {
		json.Unmarshal([]byte(d.must("inspect", "vm1", "--json")), &sb)
		if sb.State == api.StateFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("vm still %s after its QEMU was killed", sb.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(sb.Reason, "QEMU") {
		t.Fatalf("reason %q does not say QEMU stopped", sb.Reason)
	}
	if _, err := os.Stat(filepath.Join(d.data, "vms", sb.ID, "disk.qcow2")); err != nil {
		t.Fatalf("disk of the failed vm is gone: %v", err)
	}
	d.must("rm", "vm1")
	res := d.resources()
	res.StateDir = filepath.Join(d.data, "vms")
	if leaks := res.Leaks(sb.ID); len(leaks) > 0 {
		t.Fatalf("rm left: %v", leaks)
	}
}

// qemuPID finds the QEMU process serving a vm sandbox directory.
func qemuPID(t *testing.T, dir string) int {
	t.Helper()
	pid := findQEMU(dir)
	if pid == 0 {
		t.Fatalf("no QEMU for %s", dir)
	}
	return pid
}

func findQEMU(dir string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), dir+"/disk.qcow2") {
			var pid int
			if _, err := fmt.Sscan(filepath.Base(filepath.Dir(p)), &pid); err == nil {
				return pid
			}
		}
	}
	return 0
}

// A vm left idle pauses itself to disk (no QEMU left) and an exec wakes
// it with its files and background process intact: part of the issue's
// "agent's day" (snapshots, rollback and fork are not built yet).
func TestVMIdlePause(t *testing.T) {
	requireVM(t)
	d := newDaemon(t, "--min-idle-pause", "1s")
	d.must("create", "--isolation", "vm", "--name", "vm-idle", "--cpus", "1", "--memory", "512M", "--idle-pause", "3s")
	d.must("exec", "vm-idle", "--", "sh", "-c", "echo work > /root/notes")
	pid := strings.TrimSpace(d.must("exec", "-d", "vm-idle", "--", "sh", "-c", "python3 -m http.server 8000 >/dev/null 2>&1"))
	// A background process started through nook keeps it awake...
	time.Sleep(5 * time.Second)
	if sb := d.inspect("vm-idle"); sb.State != api.StateRunning {
		t.Fatalf("a vm running a background server was paused: %+v", sb)
	}
	// ...until it ends.
	d.must("kill", "vm-idle", pid)
	sb := d.waitState("vm-idle", api.StatePaused, 60*time.Second)
	// The record says paused first; the save to disk follows.
	for deadline := time.Now().Add(20 * time.Second); findQEMU(filepath.Join(d.data, "vms", sb.ID)) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("an idle-paused vm still has its QEMU")
		}
	}
	if got := d.must("exec", "vm-idle", "--", "cat", "/root/notes"); got != "work\n" {
		t.Fatalf("after waking: %q", got)
	}
	if sb := d.inspect("vm-idle"); sb.State != api.StateRunning {
		t.Fatalf("exec did not wake the vm: %s", sb.State)
	}
}
