package vm

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/agent/guestinit"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/core/conformance"
	"github.com/nookhq/nook/internal/procfs"
	"github.com/nookhq/nook/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// cacheDir is shared by test runs (and with `make run`): the kernel, the
// template images and snapshots take seconds to make and are keyed by
// content, so reusing them is safe.
func cacheDir() string {
	if d := os.Getenv("NOOK_TEST_VM_CACHE"); d != "" {
		return d
	}
	return "/var/lib/nook/vm"
}

type testConfig struct {
	cold       bool
	warm       int
	kernelRoot string
	boot       time.Duration
}

func newTestBackend(t *testing.T, tc testConfig) (*Backend, conformance.Harness) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireCommand(t, "qemu-system-x86_64", "qemu-system-x86")
	testutil.RequireCommand(t, "qemu-img", "qemu-utils")
	tpls, tplID := testutil.BaseTemplate(t)
	root := filepath.Join(testutil.TempRoot(t), testutil.RandomName("v"))
	res := testutil.HostResources{StateDir: filepath.Join(root, "sandboxes"), CgroupParent: testutil.RandomName("nook-test-")}
	testutil.CleanupCgroupParent(t, res.CgroupParent)
	b := New(Config{
		StateDir: res.StateDir, CacheDir: cacheDir(), AgentBinary: testutil.AgentBinary(t), KernelRoot: tc.kernelRoot,
		CgroupParent: res.CgroupParent, TemplateRootfs: tpls.Rootfs, TemplateStore: tpls.Dir(), ColdBoot: tc.cold, WarmPool: tc.warm, BootTimeout: tc.boot,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	t.Cleanup(func() {
		if err := b.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if entries, _ := os.ReadDir(res.StateDir); len(entries) > 0 {
			t.Errorf("%d sandbox directories left", len(entries))
		}
	})
	if ok, why, _ := b.Available(context.Background()); !ok {
		t.Fatalf("vm backend unavailable: %s", why)
	}
	return b, conformance.Harness{Backend: b, TemplateID: tplID, Leaks: res.Leaks}
}

func TestConformance(t *testing.T) {
	_, h := newTestBackend(t, testConfig{})
	conformance.Run(t, h)
}

func TestConformanceWarmPool(t *testing.T) {
	b, h := newTestBackend(t, testConfig{warm: 1})
	b.Prewarm(conformance.NewSandbox("x", h.TemplateID))
	waitWarm(t, b, h.TemplateID)
	conformance.Run(t, h)
}

func waitWarm(t *testing.T, b *Backend, tplID string) {
	t.Helper()
	key := poolKey(conformance.NewSandbox("x", tplID))
	deadline := time.Now().Add(2 * time.Minute)
	for b.pool.Ready(key) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no warm vm after 2 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestGuestIdentity: the guest runs its own kernel, and two vms restored
// from one snapshot get the time and their own random state.
func TestGuestIdentity(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	create := func(name string) *conformance.Sandbox {
		sb := conformance.NewSandbox(name, h.TemplateID)
		if err := b.Create(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		s := conformance.Adopt(t, h, sb)
		seed := make([]byte, 32)
		rand.Read(seed)
		if err := s.Agent.Configure(context.Background(), &agent.ConfigureRequest{Hostname: name, TimeUnixNano: time.Now().UnixNano(), Seed: seed}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, c := create("vm-a"), create("vm-b")
	if got := a.Sh(t, "uname -r"); !strings.Contains(got, b.kernel.Release) {
		t.Fatalf("uname -r = %q, want the guest kernel %s", got, b.kernel.Release)
	}
	if got := a.Sh(t, "hostname"); got != "vm-a\n" {
		t.Fatalf("hostname %q", got)
	}
	if st, _ := decodeState(a.Sandbox); st.Boot != "snapshot" || st.Accel == "" {
		t.Fatalf("state %+v: want a snapshot restore", st)
	}
	now := time.Now().Unix()
	guest, _ := strconv.ParseInt(strings.TrimSpace(a.Sh(t, "date +%s")), 10, 64)
	if d := guest - now; d < -5 || d > 5 {
		t.Fatalf("guest clock is %ds off the host's", d)
	}
	ua, uc := a.Sh(t, "head -c 16 /dev/urandom | od -An -tx1"), c.Sh(t, "head -c 16 /dev/urandom | od -An -tx1")
	if ua == uc {
		t.Fatalf("two vms from one snapshot read the same random bytes: %s", ua)
	}
}

func TestColdBoot(t *testing.T) {
	_, h := newTestBackend(t, testConfig{cold: true})
	s := conformance.Create(t, h, "vm-cold")
	if st, _ := decodeState(s.Sandbox); st.Boot != "cold" {
		t.Fatalf("boot %q, want cold", st.Boot)
	}
	if got := s.Sh(t, "echo hello from a booted vm"); got != "hello from a booted vm\n" {
		t.Fatalf("%q", got)
	}
}

// TestQEMUKilled: a vm whose QEMU dies is reported stopped, with why, and
// its destroy still removes everything.
func TestQEMUKilled(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	s := conformance.Create(t, h, "vm-killed")
	var st state
	json.Unmarshal(s.BackendState, &st)
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rs, err := b.Status(context.Background(), s.Sandbox)
		if err != nil {
			t.Fatal(err)
		}
		if rs.State == core.RuntimeStopped {
			if !strings.Contains(rs.Detail, "QEMU") {
				t.Fatalf("detail %q does not say what stopped", rs.Detail)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status still %v after QEMU was killed", rs.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(b.dir(s.ID), "disk.qcow2")); err != nil {
		t.Fatalf("the disk of a dead vm is gone: %v", err)
	}
}

// TestMissingKernel: a kernel directory without a kernel is a clear error.
func TestMissingKernel(t *testing.T) {
	b, h := newTestBackend(t, testConfig{kernelRoot: t.TempDir()})
	sb := conformance.NewSandbox("vm-nokernel", h.TemplateID)
	err := b.Create(context.Background(), sb)
	if err == nil || !strings.Contains(err.Error(), "no Debian kernel") {
		t.Fatalf("create without a kernel: %v", err)
	}
	if leaks := h.Leaks(sb.ID); len(leaks) > 0 {
		t.Fatalf("failed create left %v", leaks)
	}
}

// TestDevSystemd: a vm of the dev template boots systemd as PID 1 (its
// default init), with the agent as a unit: the system reaches running;
// journald, timers and socket activation work; dockerd was started by
// systemd, so docker runs a locally imported image right after create.
func TestDevSystemd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the dev template and boots systemd with dockerd under TCG: minutes")
	}
	b, h := newTestBackend(t, testConfig{})
	_, devID := testutil.Template(t, "dev")
	h.TemplateID = devID
	sb := conformance.NewSandbox("vm-dev", devID)
	sb.Template, sb.CPUs, sb.MemoryBytes = "dev", 2, 2<<30
	var err error
	if sb.Init, err = b.ChooseInit(sb, ""); err != nil || sb.Init != api.InitSystemd {
		t.Fatalf("init of a dev vm: %q, %v; want systemd", sb.Init, err)
	}
	ctx := context.Background()
	if err := h.Backend.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	s := conformance.Adopt(t, h, sb)
	var v api.Sandbox
	b.Describe(sb, &v)
	if v.Init != api.InitSystemd {
		t.Fatalf("inspect says init %q, want systemd", v.Init)
	}
	if err := s.Agent.Configure(ctx, &agent.ConfigureRequest{Hostname: "vm-dev", TimeUnixNano: time.Now().UnixNano()}); err != nil {
		t.Fatal(err)
	}
	if comm := s.Sh(t, "cat /proc/1/comm"); comm != "systemd\n" {
		t.Fatalf("PID 1 is %q, want systemd", comm)
	}
	if st := s.Sh(t, "systemctl is-system-running --wait || systemctl --failed --no-legend --plain"); st != "running\n" {
		t.Fatalf("systemctl is-system-running: %q", st)
	}
	if out := s.Sh(t, "systemctl is-active nook-agent docker containerd"); out != "active\nactive\nactive\n" {
		t.Fatalf("units: %q", out)
	}
	if out := s.Sh(t, "hostname; cat /etc/hostname"); out != "vm-dev\nvm-dev\n" {
		t.Fatalf("hostname: %q", out)
	}
	// journald has the agent's unit; a socket unit starts its service on
	// the first connection; a timer fires.
	s.Sh(t, "journalctl -u nook-agent --no-pager -q >/dev/null")
	s.Sh(t, `cat >/etc/systemd/system/nook-echo.socket <<'E'
[Socket]
ListenStream=127.0.0.1:7777
Accept=yes
E
cat >/etc/systemd/system/nook-echo@.service <<'E'
[Service]
ExecStart=/bin/cat
StandardInput=socket
E
systemctl daemon-reload && systemctl start nook-echo.socket`)
	if out := s.Sh(t, `bash -c 'exec 3<>/dev/tcp/127.0.0.1/7777; echo ping >&3; read -t 30 l <&3; echo "$l"'`); out != "ping\n" {
		t.Fatalf("socket activation: %q", out)
	}
	// The timer starts after the daemon-reload above, with an accuracy
	// of 100 ms. systemd delays a timer's firing by up to AccuracySec (a
	// minute by default, as long as this test waits), and a reload that
	// comes while a one-shot timer elapses can lose its firing: once in
	// CI the timer stayed "running" and its service never started.
	s.Sh(t, "systemd-run -q --on-active=1 --timer-property=AccuracySec=100ms --unit nook-timer touch /tmp/timer-fired")
	deadline := time.Now().Add(time.Minute)
	for s.Sh(t, "test -e /tmp/timer-fired && echo yes || true") != "yes\n" {
		if time.Now().After(deadline) {
			t.Fatalf("the timer did not fire: %s", s.Sh(t, "systemctl status nook-timer.timer --no-pager || true"))
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A minimal image from the guest's own dash and libc, imported locally,
	// run on docker's default bridge network.
	s.Sh(t, "tar -C / -cf /tmp/mini.tar bin lib lib64 usr/bin/dash usr/lib/x86_64-linux-gnu/libc.so.6 usr/lib64/ld-linux-x86-64.so.2 usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 && docker import /tmp/mini.tar local/mini >/dev/null")
	out := s.Sh(t, "docker run --rm local/mini /usr/bin/dash -c 'echo hello from docker in a vm'")
	if out != "hello from docker in a vm\n" {
		t.Fatalf("docker run: %q", out)
	}
}

// TestDisk: a vm's disk is its template's files and the disk it asks
// for beside them: 8 GiB free by default, and --disk above that grows
// the vm's disk and its root filesystem.
func TestDisk(t *testing.T) {
	_, h := newTestBackend(t, testConfig{})
	for _, c := range []struct {
		name string
		disk int64
		want int64
	}{{"vm-disk-default", 0, 8 << 30}, {"vm-disk", 12 << 30, 12 << 30}} {
		sb := conformance.NewSandbox(c.name, h.TemplateID)
		sb.DiskBytes = c.disk
		if err := h.Backend.Create(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
		s := conformance.Adopt(t, h, sb)
		free, _ := strconv.ParseInt(strings.TrimSpace(s.Sh(t, "df -B1 --output=avail / | tail -1")), 10, 64)
		if free < c.want-c.want/32 || free > c.want+1<<30 {
			t.Fatalf("%s: %d bytes free on the root filesystem, want about %d GiB", c.name, free, c.want>>30)
		}
	}
}

// TestBootTimeout: a guest that does not answer in time is a clear error
// (with the guest console's last lines when it printed any), and nothing
// of it is left.
func TestBootTimeout(t *testing.T) {
	b, h := newTestBackend(t, testConfig{cold: true, boot: 300 * time.Millisecond})
	sb := conformance.NewSandbox("vm-slow", h.TemplateID)
	err := b.Create(context.Background(), sb)
	if err == nil || !strings.Contains(err.Error(), "did not answer within 300ms") {
		t.Fatalf("create with a boot timeout: %v", err)
	}
	if leaks := h.Leaks(sb.ID); len(leaks) > 0 {
		t.Fatalf("failed create left %v", leaks)
	}
}

// TestSnapshots: snapshot a running vm with a file and a background
// server, break things, roll back (the server still runs, the file is
// back), fork twice (each fork sees the snapshot, not the other's writes),
// snapshot a paused vm (it stays paused), and GC removes every layer once
// nothing uses them.
func TestSnapshots(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	ctx := context.Background()
	s := conformance.Create(t, h, "vm-snap")
	s.Sh(t, "echo one > /root/a")
	srv, err := s.Agent.Start(ctx, &agent.ExecRequest{Argv: []string{"python3", "-m", "http.server", "-d", "/root", "8000"}})
	if err != nil {
		t.Fatal(err)
	}
	waitHTTP(t, s)
	before, _ := b.readRun(s.ID)
	info, err := b.Snapshot(ctx, s.Sandbox, "snap-1", core.SnapshotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !info.Memory || info.SizeBytes <= 0 {
		t.Fatalf("snapshot info %+v", info)
	}
	// It goes on running after the snapshot, in the same QEMU (a
	// copy-on-write switch of its disk, not a restart).
	if after, live := b.readRun(s.ID); !live || after.PID != before.PID {
		t.Fatalf("QEMU %d before the snapshot, %d (live %v) after", before.PID, after.PID, live)
	}
	if got := s.Sh(t, "cat /root/a"); got != "one\n" {
		t.Fatalf("after snapshot: %q", got)
	}
	// What the guest writes now goes to its new layer: the snapshot's
	// disk does not change.
	layerDisk := filepath.Join(b.layerDir("snap-1"), "disk.qcow2")
	sum := fileSum(t, layerDisk)
	s.Sh(t, "head -c 4000000 /dev/urandom > /root/big && sync")
	if fileSum(t, layerDisk) != sum {
		t.Fatal("the guest's writes after a snapshot changed the snapshot's disk")
	}
	s.Sh(t, "rm /root/big && sync")
	// Break things.
	s.Sh(t, "rm /root/a; echo junk > /root/b")
	if err := s.Agent.SignalProcess(ctx, srv, "KILL"); err != nil {
		t.Fatal(err)
	}
	if err := b.Rollback(ctx, &core.Sandbox{ID: s.ID}, "snap-1"); err != nil {
		t.Fatal(err)
	}
	s.Agent.Close()
	if got := s.Sh(t, "cat /root/a; ls /root"); got != "one\na\n" {
		t.Fatalf("after rollback: %q", got)
	}
	if got := s.Sh(t, "curl -s localhost:8000/a"); got != "one\n" {
		t.Fatalf("the server after rollback: %q", got)
	}

	// A fork of a snapshot of the running source, while the source runs
	// on (it still holds its old top layer, of which the snapshot's disk
	// is a copy, open).
	if _, err := b.Snapshot(ctx, s.Sandbox, "snap-live", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	live := conformance.NewSandbox("vm-fork-live", h.TemplateID)
	if err := b.Fork(ctx, live, "snap-live"); err != nil {
		t.Fatal(err)
	}
	liveFork := conformance.Adopt(t, h, live)
	if got := liveFork.Sh(t, "cat /root/a"); got != "one\n" {
		t.Fatalf("a fork of a live snapshot sees %q", got)
	}
	liveFork.Destroy(t)

	// Forks: independent, each from the snapshot.
	var forks []*conformance.Sandbox
	for i := 0; i < 2; i++ {
		sb := conformance.NewSandbox(fmt.Sprintf("vm-fork-%d", i), h.TemplateID)
		if err := b.Fork(ctx, sb, "snap-1"); err != nil {
			t.Fatal(err)
		}
		f := conformance.Adopt(t, h, sb)
		if err := f.Agent.Configure(ctx, &agent.ConfigureRequest{Hostname: sb.Name}); err != nil {
			t.Fatal(err)
		}
		forks = append(forks, f)
	}
	forks[0].Sh(t, "echo zero > /root/f0")
	forks[1].Sh(t, "echo first > /root/f1")
	if got := forks[1].Sh(t, "ls /root; hostname"); got != "a\nf1\nvm-fork-1\n" {
		t.Fatalf("fork 1 sees: %q", got)
	}
	if got := forks[0].Sh(t, "ls /root; curl -s localhost:8000/a"); got != "a\nf0\none\n" {
		t.Fatalf("fork 0 sees: %q", got)
	}
	if got := s.Sh(t, "ls /root"); got != "a\n" {
		t.Fatalf("the source sees its forks' writes: %q", got)
	}

	// A paused vm's snapshot leaves it paused.
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Snapshot(ctx, s.Sandbox, "snap-2", core.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	if paused, _ := b.Paused(ctx, s.ID); !paused {
		t.Fatal("a paused vm runs after its snapshot")
	}
	if err := b.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	s.Agent.Close()
	if got := s.Sh(t, "cat /root/a"); got != "one\n" {
		t.Fatalf("after resume: %q", got)
	}

	// Layers the sandboxes use survive GC; once they are gone, so are the layers.
	if err := b.GC(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.layerDir("snap-1")); err != nil {
		t.Fatalf("GC removed a layer in use: %v", err)
	}
	for _, f := range forks {
		f.Destroy(t)
	}
	s.Destroy(t)
	if err := b.GC(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(b.cfg.LayersDir); len(entries) != 0 {
		t.Fatalf("GC left %d layers", len(entries))
	}
	if err := b.Rollback(ctx, &core.Sandbox{ID: "0000000000000000"}, "snap-1"); err == nil {
		t.Fatal("rollback to a removed snapshot succeeded")
	}
}

func waitHTTP(t *testing.T, s *conformance.Sandbox) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := s.Exec(t, &agent.ExecRequest{Argv: []string{"curl", "-sf", "localhost:8000/"}})
		if err == nil && r.Exit.ExitCode == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the server in the vm did not answer")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// The console log a guest writes is read back without its terminal
// escapes, and emptied when it grows past maxConsole.
func TestConsoleLogIsTamed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	os.WriteFile(path, []byte("boot ok\r\n\x1b]0;pwned\x07\x1b[2Jend\n"), 0o600)
	if got := readTail(path); got != "boot ok\n?]0;pwned??[2Jend\n" {
		t.Fatalf("readTail = %q", got)
	}
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(make([]byte, maxConsole+1))
	capConsole(path)
	f.Write([]byte("after\n"))
	f.Close()
	if b, _ := os.ReadFile(path); string(b) != "after\n" {
		t.Fatalf("after the cap the log holds %d bytes", len(b))
	}
}

// TestBackingHeaderIgnored: a vm's top qcow2 layer is writable by its QEMU
// (which runs what the guest attacks); a backing file name rewritten in
// its header must not make a later start open another file. nook passes
// the chain from its own records.
func TestBackingHeaderIgnored(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	ctx := context.Background()
	s := conformance.Create(t, h, "vm-header")
	s.Sh(t, "echo mine > /root/a && sync")
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	disk := filepath.Join(b.dir(s.ID), b.readHead(s.ID).Disk)
	if out, err := exec.Command("qemu-img", "rebase", "-u", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", disk).CombinedOutput(); err != nil {
		t.Fatalf("rewrite the header: %v: %s", err, out)
	}
	if err := b.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	s.Agent.Close()
	if got := s.Sh(t, "cat /root/a"); got != "mine\n" {
		t.Fatalf("after the header was rewritten: %q", got)
	}
	// qemuPID finds the vm's QEMU among its user's processes.
	if st, live := b.readRun(s.ID); !live || qemuPID(b.dir(s.ID)) != st.PID {
		t.Fatalf("qemuPID found %d, the vm's QEMU is %d (live %v)", qemuPID(b.dir(s.ID)), st.PID, live)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", qemuPID(b.dir(s.ID))))
	if strings.Contains(string(cmdline), "/etc/passwd") {
		t.Fatal("QEMU was given the rewritten backing file")
	}
	for _, fd := range mustGlob(t, fmt.Sprintf("/proc/%d/fd/*", qemuPID(b.dir(s.ID)))) {
		if target, _ := os.Readlink(fd); target == "/etc/passwd" {
			t.Fatal("QEMU opened the backing file the header names")
		}
	}
}

func mustGlob(t *testing.T, pattern string) []string {
	m, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestStoppedGuestContinued: a guest QEMU holds stopped with no operation
// on the vm under way (as a crash at the wrong moment could leave it) does
// not hang a connection: it is continued, and the agent answers.
func TestStoppedGuestContinued(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	s := conformance.Create(t, h, "vm-stuck")
	old := agentAnswer
	agentAnswer = 2 * time.Second
	t.Cleanup(func() { agentAnswer = old })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mon, err := dialQMP(ctx, filepath.Join(b.dir(s.ID), "qmp.sock"))
	if err != nil {
		t.Fatal(err)
	}
	if err := mon.run("stop", nil, nil); err != nil {
		t.Fatal(err)
	}
	mon.close()
	s.Agent.Close()
	if got := s.Sh(t, "echo back"); got != "back\n" {
		t.Fatalf("after the guest was left stopped: %q", got)
	}
}

// TestAgentAnswersAfterLostReady: a guest whose Ready went to a
// connection that closed before its Go (the host's wait ended as the
// answer came) answers the connection dialed right after it. The guest
// does not see that port change (the new connection's Hellos queue
// behind the old one's); the first handshake, without nonces, left it
// waiting for the closed connection's Go, deaf to every later greeting:
// how TestStoppedGuestContinued failed, once in many runs, after a
// continued guest's first answer came as its host gave up.
func TestAgentAnswersAfterLostReady(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	s := conformance.Create(t, h, "vm-lost-ready")
	s.Agent.Close()
	sock := filepath.Join(b.dir(s.ID), "agent.sock")
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		// The host reads Ready, and its Go never goes out.
		err = guestinit.DialHandshake(ctx, noGo{conn})
		conn.Close()
		if !errors.Is(err, errNoGo) {
			t.Fatalf("greeting %d: %v", i, err)
		}
		conn, err = dialAgent(ctx, sock)
		cancel()
		if err != nil {
			t.Fatalf("the connection after lost Ready %d: %v", i, err)
		}
		conn.Close()
	}
	// The same on one connection: the greeting after the lost Ready is
	// a new one (a new nonce), whether or not the guest saw a change.
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := guestinit.DialHandshake(ctx, noGo{conn}); !errors.Is(err, errNoGo) {
		t.Fatal(err)
	}
	if err := guestinit.DialHandshake(ctx, conn); err != nil {
		t.Fatalf("greeted again on the same connection: %v", err)
	}
	s.Agent = agent.NewClient(func(context.Context) (net.Conn, error) { return conn, nil })
	if got := s.Sh(t, "echo back"); got != "back\n" {
		t.Fatalf("after the handshake: %q", got)
	}
}

// noGo is a connection whose host's Go is lost: the write fails.
type noGo struct{ net.Conn }

var errNoGo = errors.New("the Go was lost")

func (c noGo) Write(p []byte) (int, error) {
	if bytes.HasSuffix(p, guestinit.Go) {
		return 0, errNoGo
	}
	return c.Conn.Write(p)
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(data)
}

// TestCopyLayer: a snapshot's copy of a running vm's disk layer is a new
// file with the same bytes and size, and the source's holes stay holes.
func TestCopyLayer(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 1<<20)
	rand.Read(data)
	// data, an 8 MiB hole, data, and a hole to the end
	for _, off := range []int64{0, 9 << 20} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(32 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := copyLayer(src, dst); err != nil {
		t.Fatal(err)
	}
	if fileSum(t, src) != fileSum(t, dst) {
		t.Fatal("the copy's bytes differ")
	}
	var s, d syscall.Stat_t
	syscall.Stat(src, &s)
	syscall.Stat(dst, &d)
	if s.Ino == d.Ino || d.Size != s.Size || d.Blocks > s.Blocks+64 {
		t.Fatalf("copy: inode %d (source %d), size %d (%d), blocks %d (%d)", d.Ino, s.Ino, d.Size, s.Size, d.Blocks, s.Blocks)
	}
	if err := copyLayer(src, dst); err == nil {
		t.Fatal("copyLayer replaced an existing file")
	}
}

// TestDestroyFindsUnplacedQEMU: a QEMU outside the vm's cgroups (a start
// cut short before it was placed, so no placedFile) is found among the
// host's processes and killed by a destroy; with the file, a destroy
// trusts the cgroups and searches nothing.
func TestDestroyFindsUnplacedQEMU(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	s := conformance.Create(t, h, "vm-unplaced")
	ctx := context.Background()
	st, live := b.readRun(s.ID)
	if !live {
		t.Fatal("the vm's QEMU is not running")
	}
	if _, err := os.Stat(placedFile(b.dir(s.ID))); err != nil {
		t.Fatalf("a started vm has no record that its QEMU is in its cgroups: %v", err)
	}
	// Out of its cgroups (into each hierarchy's root), as if never placed.
	os.Remove(placedFile(b.dir(s.ID)))
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/cgroup.procs")
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.procs"); err == nil {
		roots = []string{"/sys/fs/cgroup/cgroup.procs"}
	}
	for _, procs := range roots {
		if err := os.WriteFile(procs, []byte(strconv.Itoa(st.PID)), 0); err != nil {
			t.Logf("move QEMU to %s: %v", procs, err)
		}
	}
	t.Cleanup(func() { syscall.Kill(st.PID, syscall.SIGKILL) })
	if err := b.Destroy(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if procfs.StartTime(st.PID) == st.StartTime {
		t.Fatalf("QEMU (pid %d) outside the vm's cgroups survived its destroy", st.PID)
	}
}

// TestGuestUsesItsRAM: a vm made from its template's snapshot can use
// its RAM. Its QEMU maps the template's RAM copy privately; a hole of
// that copy it touched became a page of the copy charged to its memory
// cgroup, beside its own copy of the page, so that a 1 GiB vm whose
// guest wrote 700 MiB had its QEMU killed at its limit (RAM + 384 MiB).
func TestGuestUsesItsRAM(t *testing.T) {
	_, h := newTestBackend(t, testConfig{})
	sb := conformance.NewSandbox("vm-ram", h.TemplateID)
	sb.MemoryBytes = 1 << 30
	ctx := context.Background()
	if err := h.Backend.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	s := conformance.Adopt(t, h, sb)
	out := s.Sh(t, "python3 -c \"a = bytearray(b'x') * (700 << 20); print(len(a) >> 20)\" && echo alive")
	if out != "700\nalive\n" {
		t.Fatalf("a guest that used 700 MiB of its 1 GiB: %q", out)
	}
}
