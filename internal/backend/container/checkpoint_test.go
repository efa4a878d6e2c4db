package container

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/core/conformance"
	"github.com/nookhq/nook/internal/procfs"
	"github.com/nookhq/nook/internal/testutil"
)

// requireCRIU returns the CRIU >= 4 that scripts/criu.sh installs, or skips.
func requireCRIU(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(DefaultCRIU); err != nil {
		testutil.Missing(t, "CRIU >= 4 is not installed at %s (scripts/criu.sh, run by make deps, builds it): %v", DefaultCRIU, err)
	}
	v, ok, why, err := CRIUVersion(context.Background(), DefaultCRIU)
	if err != nil || !ok {
		testutil.Missing(t, "%s is not a usable CRIU (%s): %s %v", DefaultCRIU, v, why, err)
	}
	return DefaultCRIU
}

func newCheckpointBackend(t *testing.T) (*Backend, conformance.Harness) {
	criu := requireCRIU(t)
	b, h := newTestBackend(t)
	b.cfg.CRIU = criu
	return b, h
}

// twin is a second Backend on the same directories: the daemon after a restart.
func twin(b *Backend) *Backend {
	cfg := b.cfg
	cfg.WarmPool = 0
	return New(cfg)
}

// The whole conformance suite with pauses to disk.
func TestConformanceCheckpoint(t *testing.T) {
	_, h := newCheckpointBackend(t)
	conformance.Run(t, h)
}

// memoryScript keeps its state only in memory (a shell counter, a TCP
// connection over loopback) and reports it in files.
const memoryScript = `import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 9000)); s.listen()
c = socket.create_connection(("127.0.0.1", 9000)); a, _ = s.accept()
i = 0
while True:
    i += 1
    c.sendall(b"%d\n" % i)
    got = a.recv(100).decode().strip()
    with open("/tmp/tcp.tmp", "w") as f: f.write(got)
    import os; os.rename("/tmp/tcp.tmp", "/tmp/tcp")
    time.sleep(0.02)
`

func counters(t *testing.T, s *conformance.Sandbox) (count, tcp int) {
	t.Helper()
	out := strings.Fields(s.Sh(t, "cat /tmp/count /tmp/tcp"))
	if len(out) != 2 {
		t.Fatalf("counters: %q", out)
	}
	count, _ = strconv.Atoi(out[0])
	tcp, _ = strconv.Atoi(out[1])
	return count, tcp
}

// startCounters starts a shell counter and memoryScript in s, waits
// until both have counted to 20 (far enough that a restart, from 1,
// cannot pass for going on), and returns the shell's PID.
func startCounters(t *testing.T, s *conformance.Sandbox) int {
	t.Helper()
	ctx := context.Background()
	pid, err := s.Agent.Start(ctx, &agent.ExecRequest{Argv: []string{"sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /tmp/count.tmp; mv /tmp/count.tmp /tmp/count; sleep 0.02; done"}})
	if err != nil {
		t.Fatal(err)
	}
	s.Sh(t, "cat > /tmp/tcp.py <<'EOF'\n"+memoryScript+"EOF")
	if _, err := s.Agent.Start(ctx, &agent.ExecRequest{Argv: []string{"python3", "/tmp/tcp.py"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for s.Sh(t, "test -s /tmp/tcp && test -s /tmp/count && echo ok || true") != "ok\n" {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox's counters did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitCounters(t, s, 20, 20)
	return pid
}

// waitCounters waits until s's counters reach count and tcp.
func waitCounters(t *testing.T, s *conformance.Sandbox, count, tcp int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for c, tc := counters(t, s); c < count || tc < tcp; c, tc = counters(t, s) {
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox's counters are slow: %d %d, want %d %d", c, tc, count, tcp)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCheckpointPauseResume: a pause to disk ends every process of the
// container (no process, cgroup or mount left; only files), survives a
// daemon restart, and a resume brings back the same processes with their
// memory and their TCP connection.
func TestCheckpointPauseResume(t *testing.T) {
	b, h := newCheckpointBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "ckpt")
	pid := startCounters(t, s)
	c0, t0 := counters(t, s)
	var init state
	if err := readState(b, s.ID, &init); err != nil {
		t.Fatal(err)
	}

	s.Agent.Close()
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if k := b.PauseKind(s.ID); !strings.HasPrefix(k, "checkpointed") {
		t.Fatalf("pause kind %q", k)
	}
	// Nothing of it runs or holds memory: its init is gone, and so are
	// its cgroups and its root mount.
	if procfs.StartTime(init.PID) == init.StartTime {
		t.Fatalf("the sandbox's init %d still runs after a pause to disk", init.PID)
	}
	if dirs := cgroups.Dirs(b.cfg.CgroupParent, s.ID); len(dirs) > 0 {
		t.Fatalf("the cgroups of a checkpointed sandbox are still there: %v", dirs)
	}
	if isMount(b.rootfs(s.ID)) {
		t.Fatal("a checkpointed sandbox's root is still mounted")
	}
	if !isNetns(b.netnsFile(s.ID)) {
		t.Fatal("a checkpointed sandbox lost its network namespace")
	}
	// The daemon restarts: the sandbox is still paused, to disk.
	b2 := twin(b)
	if st, err := b2.Status(ctx, s.Sandbox); err != nil || st.State != core.RuntimeSaved {
		t.Fatalf("status after restart: %v %v", st, err)
	}
	if paused, err := b2.Paused(ctx, s.ID); err != nil || !paused {
		t.Fatalf("Paused after restart = %v, %v", paused, err)
	}
	before := time.Now()
	if err := b2.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	t.Logf("resume took %v", time.Since(before))
	if st, err := b2.Status(ctx, s.Sandbox); err != nil || st.State != core.RuntimeRunning {
		t.Fatalf("status after resume: %v %v", st, err)
	}
	if b2.checkpointed(s.ID) {
		t.Fatal("the checkpoint's images are still there after a resume")
	}
	// Same processes, same memory: the counters go on from where they
	// were (a restart would begin at 1), and the TCP connection still works.
	c1, t1 := counters(t, s)
	if c1 < c0 || t1 < t0 {
		t.Fatalf("counters: before the pause count %d tcp %d; after the resume count %d, tcp %d", c0, t0, c1, t1)
	}
	waitCounters(t, s, c1+1, t1+1)
	ps, err := s.Agent.Processes(ctx)
	if err != nil || len(ps) != 2 || ps[0].PID != pid || !ps[0].Running || !ps[1].Running {
		t.Fatalf("processes after resume: %+v %v", ps, err)
	}
	// Paused to disk again and destroyed: Create's cleanup checks for leaks.
	s.Agent.Close()
	if err := b2.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointNothingRunsOn: no process of a checkpointed container
// runs past its dump. A shell appends to a file it holds open as fast as
// it can; had it run for a moment between the dump and its end, the file
// would be longer than the images say and CRIU would refuse the restore
// ("has bad size"). runc's own kill of a paused container signals its
// init and thaws the cgroup at once, which let this happen.
func TestCheckpointNothingRunsOn(t *testing.T) {
	b, h := newCheckpointBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "ckpt-busy")
	if _, err := s.Agent.Start(ctx, &agent.ExecRequest{Argv: []string{"sh", "-c", "exec 3>>/tmp/log; i=0; while :; do i=$((i+1)); echo $i > /tmp/busy; echo $i >&3; done"}}); err != nil {
		t.Fatal(err)
	}
	last := 0
	for round := 1; round <= 10; round++ {
		deadline := time.Now().Add(10 * time.Second)
		for {
			n, _ := strconv.Atoi(strings.TrimSpace(s.Sh(t, "cat /tmp/busy 2>/dev/null; true"))) // not there until the writer starts
			if n > last {
				last = n
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the writer did not go on from %d", round, last)
			}
			time.Sleep(20 * time.Millisecond)
		}
		s.Agent.Close()
		if err := b.Pause(ctx, s.ID); err != nil {
			t.Fatalf("round %d: pause: %v", round, err)
		}
		if err := b.Resume(ctx, s.ID); err != nil {
			t.Fatalf("round %d: resume: %v", round, err)
		}
	}
}

func readState(b *Backend, id string, st *state) error {
	var err error
	*st, err = b.lookupInit(id)
	return err
}

func isMount(path string) bool {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	return err == nil && strings.Contains(string(mi), " "+path+" ")
}

// A crash between the checkpoint's commit and the end of the container
// leaves both; Status ends the container, and the sandbox is paused to disk.
func TestCheckpointFinishedAfterCrash(t *testing.T) {
	b, h := newCheckpointBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "ckpt-crash")
	s.Sh(t, "echo kept > /root/f")
	s.Agent.Close()
	// The checkpoint's steps up to its commit, without the end.
	if err := b.freeze(ctx, s.ID, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.runc(ctx, s.ID, "checkpoint", "--image-path", b.checkpointDir(s.ID), "--work-path", filepath.Join(b.dir(s.ID), "criu"),
		"--leave-running", "--tcp-established", "--file-locks", s.ID); err != nil {
		t.Fatal(err)
	}
	init, err := b.lookupInit(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	b2 := twin(b)
	if st, err := b2.Status(ctx, s.Sandbox); err != nil || st.State != core.RuntimeSaved {
		t.Fatalf("status after the crash: %v %v", st, err)
	}
	if procfs.StartTime(init.PID) == init.StartTime {
		t.Fatal("the checkpointed container still runs")
	}
	if err := b2.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if got := s.Sh(t, "cat /root/f"); got != "kept\n" {
		t.Fatalf("after resume: %q", got)
	}

	// A crash after CRIU restored the container, before the images went:
	// Status finishes the resume.
	s.Agent.Close()
	if err := b2.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	restoredByCrash(t, b2, s)
	b3 := twin(b)
	if st, err := b3.Status(ctx, s.Sandbox); err != nil || st.State != core.RuntimeRunning {
		t.Fatalf("status after a crash mid-resume: %v %v", st, err)
	}
	if paused, _ := b3.Paused(ctx, s.ID); paused || b3.checkpointed(s.ID) {
		t.Fatal("still paused after the resume was finished")
	}
	if got := s.Sh(t, "cat /root/f"); got != "kept\n" {
		t.Fatalf("after the finished resume: %q", got)
	}

	// The same, but the restarted daemon's first call is a resume, made
	// while the dead daemon's runc still holds the CRIU lock: the resume
	// waits for it, then keeps the container that runc restored (its
	// processes ran on from the images) rather than ending it and
	// restoring the images once more.
	s.Agent.Close()
	if err := b3.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	orphan, err := b3.lockCRIU(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	restored := restoredByCrash(t, b3, s)
	b4 := twin(b)
	done := make(chan error, 1)
	go func() { done <- b4.Resume(ctx, s.ID) }()
	select {
	case err := <-done:
		t.Fatalf("a resume did not wait for the runc still at work (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	orphan.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if init, err := b4.lookupInit(s.ID); err != nil || init.PID != restored {
		t.Fatalf("after the resume the init is %d (%v); the one restored before it was %d", init.PID, err, restored)
	}
	if b4.checkpointed(s.ID) {
		t.Fatal("the images are still there after the resume")
	}
	if got := s.Sh(t, "cat /root/f"); got != "kept\n" {
		t.Fatalf("after the resume: %q", got)
	}
}

// restoredByCrash does what a resume does up to CRIU's restore, and no
// more (a daemon killed then), and returns the restored init's PID.
func restoredByCrash(t *testing.T, b *Backend, s *conformance.Sandbox) int {
	t.Helper()
	ctx := context.Background()
	dir := b.dir(s.ID)
	lowers, err := b.lowerDirs(chain{Template: s.TemplateID})
	if err != nil {
		t.Fatal(err)
	}
	m, err := b.readIDMap(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.mountRoot(s.ID, lowers, m); err != nil {
		t.Fatal(err)
	}
	if err := readableImages(b.checkpointDir(s.ID)); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "restoring"), nil, 0o600)
	if err := b.runc(ctx, s.ID, "restore", "--detach", "--image-path", b.checkpointDir(s.ID), "--work-path", filepath.Join(dir, "criu"),
		"--tcp-established", "--file-locks", "--pid-file", filepath.Join(dir, "init.pid"), "--bundle", dir, s.ID); err != nil {
		t.Fatal(err)
	}
	pid, err := os.ReadFile(filepath.Join(dir, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(pid)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMemorySnapshotRollbackFork: with CRIU, a snapshot of a running
// container has its memory. The container runs on meanwhile (the same
// init); a rollback brings its processes back as they stood at the
// snapshot (the counters go back to it, not to 1, and the loopback TCP
// connection works); a fork starts from there with its own hostname and
// files. A snapshot of a container paused to disk keeps its images. A
// snapshot while an exec is in flight takes the disk only, and the exec
// is not cut off.
func TestMemorySnapshotRollbackFork(t *testing.T) {
	b, h := newCheckpointBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "memsnap")
	pid := startCounters(t, s)
	c0, _ := counters(t, s)
	init0, err := b.lookupInit(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	info, err := b.Snapshot(ctx, s.Sandbox, "mem-1", core.SnapshotOptions{Quiesce: s.Agent.Quiesce})
	if err != nil {
		t.Fatal(err)
	}
	if !info.Memory {
		t.Fatalf("snapshot of a running container with CRIU has no memory: %+v", info)
	}
	if _, err := os.Stat(filepath.Join(b.memoryDir("mem-1"), "inventory.img")); err != nil {
		t.Fatalf("snapshot's images: %v", err)
	}
	c1, t1 := counters(t, s)
	if init1, err := b.lookupInit(s.ID); err != nil || init1 != init0 {
		t.Fatalf("the container did not run on through its snapshot: init %+v, was %+v (%v)", init1, init0, err)
	}
	// Far past the snapshot, and a file it does not have.
	waitCounters(t, s, c1+100, t1+100)
	s.Sh(t, "echo later > /root/later")
	before, _ := counters(t, s)

	s.Agent.Close()
	if err := b.Rollback(ctx, s.Sandbox, "mem-1"); err != nil {
		t.Fatal(err)
	}
	c2, t2 := counters(t, s)
	if c2 < c0 || c2 >= before-50 {
		t.Fatalf("after the rollback the counter is at %d: want it back near the snapshot's (%d to %d), not at %d or 1", c2, c0, c1, before)
	}
	waitCounters(t, s, c2+5, t2+5) // and both go on: the TCP connection too
	if got := s.Sh(t, "cat /root/later 2>&1 || true"); !strings.Contains(got, "No such file") {
		t.Fatalf("after the rollback /root/later: %q", got)
	}
	if ps, err := s.Agent.Processes(ctx); err != nil || len(ps) != 2 || ps[0].PID != pid || !ps[0].Running || !ps[1].Running {
		t.Fatalf("processes after the rollback: %+v %v", ps, err)
	}

	// A fork: the same processes, its own hostname, files and address
	// (TCP connections come back closed, so only the shell's counter is checked).
	fsb := conformance.NewSandbox("memfork", h.TemplateID)
	if err := b.Fork(ctx, fsb, "mem-1"); err != nil {
		t.Fatal(err)
	}
	f := conformance.Adopt(t, h, fsb)
	if got := f.Sh(t, "hostname"); got != "memfork\n" {
		t.Fatalf("fork's hostname %q", got)
	}
	fc, _ := counters(t, f)
	if fc < c0 || fc >= before-50 {
		t.Fatalf("the fork's counter is at %d: want it near the snapshot's (%d to %d)", fc, c0, c1)
	}
	if ps, err := f.Agent.Processes(ctx); err != nil || len(ps) == 0 || ps[0].PID != pid || !ps[0].Running {
		t.Fatalf("processes in the fork: %+v %v", ps, err)
	}
	// Its TCP connection came back closed: the script's next send fails.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ps, err := f.Agent.Processes(ctx)
		if err != nil || len(ps) != 2 {
			t.Fatalf("processes in the fork: %+v %v", ps, err)
		}
		if !ps[1].Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fork's TCP connection still works: it was restored open")
		}
	}
	if conf, err := os.ReadFile(filepath.Join(b.dir(fsb.ID), "criu.conf")); err != nil || strings.Contains(string(conf), "tcp-close") {
		t.Fatalf("the fork's criu.conf after its restore (a later pause must keep connections): %q %v", conf, err)
	}
	f.Sh(t, "echo fork > /root/fork")
	if got := s.Sh(t, "cat /root/fork 2>&1 || true"); !strings.Contains(got, "No such file") {
		t.Fatalf("the source sees the fork's file: %q", got)
	}

	// Paused to disk: the snapshot keeps the checkpoint's images, and a
	// fork of it runs.
	s.Agent.Close()
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	info, err = b.Snapshot(ctx, s.Sandbox, "mem-2", core.SnapshotOptions{Quiesce: s.Agent.Quiesce})
	if err != nil || !info.Memory {
		t.Fatalf("snapshot of a container paused to disk: %+v %v", info, err)
	}
	if err := b.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	f2sb := conformance.NewSandbox("memfork-2", h.TemplateID)
	if err := b.Fork(ctx, f2sb, "mem-2"); err != nil {
		t.Fatal(err)
	}
	f2 := conformance.Adopt(t, h, f2sb)
	if got := f2.Sh(t, "hostname; cat /root/later 2>&1 || true"); !strings.Contains(got, "memfork-2\n") || !strings.Contains(got, "No such file") {
		t.Fatalf("fork of the paused snapshot: %q", got)
	}
	if ps, err := f2.Agent.Processes(ctx); err != nil || len(ps) == 0 || ps[0].PID != pid || !ps[0].Running {
		t.Fatalf("processes in the fork of the paused snapshot: %+v %v", ps, err)
	}

	// Images CRIU cannot restore: the fork starts afresh on the files.
	if err := os.WriteFile(filepath.Join(b.memoryDir("mem-2"), "inventory.img"), []byte("not an image"), 0o600); err != nil {
		t.Fatal(err)
	}
	f3sb := conformance.NewSandbox("memfork-3", h.TemplateID)
	if err := b.Fork(ctx, f3sb, "mem-2"); err != nil {
		t.Fatalf("fork of a snapshot whose memory cannot be restored: %v", err)
	}
	f3 := conformance.Adopt(t, h, f3sb)
	if got := f3.Sh(t, "hostname"); got != "memfork-3\n" {
		t.Fatalf("fork started afresh: %q", got)
	}
	if ps, err := f3.Agent.Processes(ctx); err != nil || len(ps) != 0 {
		t.Fatalf("a fork started afresh has processes: %+v %v", ps, err)
	}

	// An exec in flight: the disk only, and the exec goes on.
	p, err := s.Agent.Exec(ctx, &agent.ExecRequest{Argv: []string{"sh", "-c", "sleep 1; echo done"}})
	if err != nil {
		t.Fatal(err)
	}
	info, err = b.Snapshot(ctx, s.Sandbox, "mem-3", core.SnapshotOptions{Quiesce: s.Agent.Quiesce})
	if err != nil || info.Memory {
		t.Fatalf("snapshot with an exec in flight: %+v %v", info, err)
	}
	var out strings.Builder
	for {
		kind, data, err := p.Next()
		if err != nil {
			t.Fatalf("the exec in flight was cut off by the snapshot: %v", err)
		}
		if kind == api.FrameStdout {
			out.Write(data)
		}
		if kind == api.FrameExit {
			break
		}
	}
	p.Close()
	if out.String() != "done\n" {
		t.Fatalf("exec through the snapshot: %q", out.String())
	}
}

// vforkScript spawns a child (posix_spawn: clone with CLONE_VFORK) that
// blocks before its exec, opening a FIFO no one writes yet: its parent
// waits in vfork until the FIFO is opened for writing.
const vforkScript = `import os
os.mkfifo("/tmp/fifo")
pid = os.posix_spawn("/bin/true", ["true"], os.environ, file_actions=[(os.POSIX_SPAWN_OPEN, 3, "/tmp/fifo", os.O_RDONLY, 0)])
os.waitpid(pid, 0)
open("/tmp/spawned", "w").close()
import time
while True: time.sleep(1)
`

// TestVforkWaiter: CRIU cannot save a process waiting in vfork for a
// child that has not reached its exec (it waits out its timeout, then
// fails). A dump freezes again until no process waits there; one that
// waits on (a child blocked before its exec) makes a snapshot of the disk
// only and a pause in RAM, at once and with the sandbox intact; once the
// child goes on, both save the memory again.
func TestVforkWaiter(t *testing.T) {
	b, h := newCheckpointBackend(t)
	ctx := context.Background()
	s := conformance.Create(t, h, "vfork")
	s.Sh(t, "cat > /tmp/vfork.py <<'EOF'\n"+vforkScript+"EOF")
	if _, err := s.Agent.Start(ctx, &agent.ExecRequest{Argv: []string{"python3", "/tmp/vfork.py"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for b.vforkWaiter(s.ID) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no process of the sandbox waits in vfork")
		}
		time.Sleep(20 * time.Millisecond)
	}
	info, err := b.Snapshot(ctx, s.Sandbox, "vf-1", core.SnapshotOptions{Quiesce: s.Agent.Quiesce})
	if err != nil || info.Memory {
		t.Fatalf("snapshot while a process waits in vfork: %+v %v (want the disk only)", info, err)
	}
	// Refused before CRIU ran (which would wait out its timeout).
	if _, err := os.Stat(filepath.Join(b.dir(s.ID), "criu", "dump.log")); !os.IsNotExist(err) {
		t.Fatalf("CRIU ran a dump that could not work: %v", err)
	}
	if frozen, err := b.frozen(s.ID); err != nil || frozen {
		t.Fatalf("the sandbox is frozen after the snapshot: %v %v", frozen, err)
	}
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatalf("pause while a process waits in vfork: %v", err)
	}
	if k := b.PauseKind(s.ID); !strings.HasPrefix(k, "frozen") {
		t.Fatalf("pause kind %q, want frozen (in RAM)", k)
	}
	if err := b.Resume(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	// The child goes on (its open returns), execs and exits.
	s.Sh(t, ": > /tmp/fifo; while ! test -e /tmp/spawned; do sleep 0.02; done")
	if tid := b.vforkWaiter(s.ID); tid != 0 {
		t.Fatalf("thread %d still waits in vfork", tid)
	}
	info, err = b.Snapshot(ctx, s.Sandbox, "vf-2", core.SnapshotOptions{Quiesce: s.Agent.Quiesce})
	if err != nil || !info.Memory {
		t.Fatalf("snapshot once the child went on: %+v %v", info, err)
	}
	s.Agent.Close()
	if err := b.Pause(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if !b.checkpointed(s.ID) {
		t.Fatalf("pause once the child went on: %s", b.PauseKind(s.ID))
	}
}
