package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/backend/container"
	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/testutil"
)

// Background processes: started detached, listed, re-attached from an
// offset, signalled; they survive their client and a daemon restart.
func TestBackgroundProcesses(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "bg")
	pid := strings.TrimSpace(d.must("exec", "-d", "bg", "--", "sh", "-c", "echo first; sleep 0.2; echo second >&2; sleep 60"))
	if pid == "" {
		t.Fatal("exec -d printed no PID")
	}
	// The daemon restarts; the process and its output are still there.
	d.stop(syscall.SIGKILL)
	d.start()
	var ps []api.Process
	if err := json.Unmarshal([]byte(d.must("ps", "bg", "--json")), &ps); err != nil || len(ps) != 1 || !ps[0].Running {
		t.Fatalf("ps after a restart: %+v %v", ps, err)
	}
	// Follow from offset 6 ("first\n" skipped) and stop following: the process goes on.
	cmd := exec.Command(d.bin, "attach", "--no-stdin", "--offset", "6", "bg", pid)
	cmd.Env = append(cmd.Environ(), "NOOK_HOST=unix://"+d.socket())
	out, _ := cmd.StdoutPipe()
	errPipe, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := errPipe.Read(buf)
	if string(buf[:n]) != "second\n" {
		t.Fatalf("attach from offset 6 gave %q on stderr", buf[:n])
	}
	cmd.Process.Kill()
	cmd.Wait()
	out.Close()
	if !strings.Contains(d.must("ps", "bg"), "running") {
		t.Fatal("detaching stopped the process")
	}
	d.must("kill", "bg", pid, "-s", "KILL")
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.must("ps", "bg"), "killed KILL") {
		if time.Now().After(deadline) {
			t.Fatalf("process not killed: %s", d.must("ps", "bg"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Its kept output can still be read, and ends with its status.
	r, _ := d.nook("attach", "--no-stdin", "bg", pid)
	if r.stdout != "first\n" || r.stderr != "second\nnook: command killed by signal KILL\n" || r.code != 137 {
		t.Fatalf("attach to a finished process: %+v", r)
	}
	d.expectCLI(t, []cliCase{
		{[]string{"kill", "bg", "99999"}, 1, "no process 99999"},
		{[]string{"kill", "bg", pid}, 1, "already exited"},
		{[]string{"kill", "bg", pid, "-s", "BOGUS"}, 1, "not valid"},
		{[]string{"attach", "bg", "99999"}, 1, "no process 99999"},
		{[]string{"attach", "--offset", "99999999", "--no-stdin", "bg", pid}, 1, "past the end"},
		{[]string{"attach", "bg", "abc"}, 2, "not valid"},
		{[]string{"ps", "ghost"}, 1, "no sandbox"},
	})
}

// A foreground command dies with its client; stdin and terminals work.
func TestInteractiveExec(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "io")
	cmd := exec.Command(d.bin, "exec", "io", "--", "sleep", "300")
	cmd.Env = append(cmd.Environ(), "NOOK_HOST=unix://"+d.socket())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.must("exec", "io", "--", "ps", "-eo", "comm"), "sleep") {
		if time.Now().After(deadline) {
			t.Fatal("sleep never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	for strings.Contains(d.must("exec", "io", "--", "ps", "-eo", "comm"), "sleep") {
		if time.Now().After(deadline) {
			t.Fatal("a foreground command outlived its client")
		}
		time.Sleep(20 * time.Millisecond)
	}

	in := exec.Command(d.bin, "exec", "-i", "io", "--", "sh", "-c", "tr a-z A-Z; exit 3")
	in.Env = append(in.Environ(), "NOOK_HOST=unix://"+d.socket())
	in.Stdin = strings.NewReader("hello stdin\n")
	out, err := in.Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 || string(out) != "HELLO STDIN\n" {
		t.Fatalf("exec -i: %q %v", out, err)
	}

	tty := exec.Command(d.bin, "exec", "-t", "io", "--", "sh", "-c", "tty >/dev/null && echo on-a-tty; stty size")
	tty.Env = append(tty.Environ(), "NOOK_HOST=unix://"+d.socket())
	out, err = tty.Output()
	if err != nil || !strings.Contains(string(out), "on-a-tty") || !strings.Contains(string(out), "24 80") {
		t.Fatalf("exec -t: %q %v", out, err)
	}

	// A shell session detaches on Ctrl-] and is still there to re-attach to.
	sh := exec.Command(d.bin, "shell", "io")
	sh.Env = append(sh.Environ(), "NOOK_HOST=unix://"+d.socket())
	shIn, _ := sh.StdinPipe()
	var shOut strings.Builder
	sh.Stdout, sh.Stderr = &shOut, &shOut
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	shIn.Write([]byte("echo marker-$((6*7))\n"))
	for !strings.Contains(d.must("ps", "io"), "(tty)") {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	shIn.Write([]byte{0x1d})
	if err := sh.Wait(); err != nil {
		t.Fatalf("shell after detach: %v\n%s", err, shOut.String())
	}
	if !strings.Contains(shOut.String(), "marker-42") || !strings.Contains(shOut.String(), "re-attach with: nook attach io") {
		t.Fatalf("shell output %q", shOut.String())
	}
	var ps []api.Process
	json.Unmarshal([]byte(d.must("ps", "io", "--json")), &ps)
	var shellPID int
	for _, p := range ps {
		if p.TTY && p.Running {
			shellPID = p.PID
		}
	}
	if shellPID == 0 {
		t.Fatalf("no running shell session after detach: %+v", ps)
	}
	// Re-attach, type exit, and the session ends with the shell's status.
	re := exec.Command(d.bin, "attach", "io", strings.TrimSpace(jsonInt(shellPID)))
	re.Env = append(re.Environ(), "NOOK_HOST=unix://"+d.socket())
	re.Stdin = strings.NewReader("exit 7\n")
	out, err = re.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
		t.Fatalf("re-attach and exit: %v %q", err, out)
	}
}

func jsonInt(n int) string { b, _ := json.Marshal(n); return string(b) }

// vmHWM is a process's peak resident memory, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &kb)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// A command that floods 1 GiB of output streams through with the
// daemon's and the agent's memory bounded.
func TestFloodKeepsMemoryBounded(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "flood")
	cmd := exec.Command(d.bin, "exec", "flood", "--", "head", "-c", "1073741824", "/dev/zero")
	cmd.Env = append(cmd.Environ(), "NOOK_HOST=unix://"+d.socket())
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n, _ := io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil || n != 1<<30 {
		t.Fatalf("streamed %d bytes: %v", n, err)
	}
	var sb api.Sandbox
	json.Unmarshal([]byte(d.must("inspect", "flood", "--json")), &sb)
	pidb, _ := os.ReadFile(filepath.Join(d.data, "sandboxes", sb.ID, "init.pid"))
	agentPID, _ := strconv.Atoi(strings.TrimSpace(string(pidb)))
	if hwm := vmHWM(t, d.cmd.Process.Pid); hwm > 150<<20 {
		t.Errorf("daemon peaked at %d MiB while streaming 1 GiB", hwm>>20)
	}
	if hwm := vmHWM(t, agentPID); hwm > 64<<20 {
		t.Errorf("agent peaked at %d MiB while streaming 1 GiB", hwm>>20)
	}
	// A background flood keeps only its ring.
	pid := strings.TrimSpace(d.must("exec", "-d", "flood", "--", "head", "-c", "300000000", "/dev/zero"))
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(d.must("ps", "flood"), "exited 0") {
		if time.Now().After(deadline) {
			t.Fatal("background flood did not finish")
		}
		time.Sleep(100 * time.Millisecond)
	}
	var ps []api.Process
	json.Unmarshal([]byte(d.must("ps", "flood", "--json")), &ps)
	for _, p := range ps {
		if strconv.Itoa(p.PID) == pid && (p.OutputTo != 300000000 || p.OutputTo-p.OutputFrom > 2<<20) {
			t.Errorf("background flood: kept [%d, %d)", p.OutputFrom, p.OutputTo)
		}
	}
	if hwm := vmHWM(t, agentPID); hwm > 64<<20 {
		t.Errorf("agent peaked at %d MiB after a background flood", hwm>>20)
	}
}

// Pause keeps everything; any call that needs the sandbox wakes it; the
// state survives a daemon kill -9; a paused sandbox is destroyed cleanly.
// Both kinds of container pause: frozen in RAM, and checkpointed to disk.
func TestPauseResume(t *testing.T) {
	t.Run("freeze", func(t *testing.T) { testPauseResume(t, "freeze") })
	t.Run("checkpoint", func(t *testing.T) {
		requireCRIU(t)
		testPauseResume(t, "checkpoint")
	})
}

// requireCRIU skips a test of container checkpoints where CRIU is not installed.
func requireCRIU(t *testing.T) {
	t.Helper()
	if !haveCRIU() {
		testutil.Missing(t, "CRIU >= 4 is not installed at %s (scripts/criu.sh, run by make deps, builds it)", container.DefaultCRIU)
	}
}

// haveCRIU reports whether the CRIU a default daemon checkpoints with is installed.
func haveCRIU() bool {
	_, err := os.Stat(container.DefaultCRIU)
	return err == nil
}

func testPauseResume(t *testing.T, mode string) {
	d := newDaemon(t, "--container-pause", mode)
	if info := d.must("info"); !strings.Contains(info, "container pause: "+mode) {
		t.Fatalf("info does not say what a pause does:\n%s", info)
	}
	d.must("create", "--name", "nap")
	pid := strings.TrimSpace(d.must("exec", "-d", "nap", "--", "sh", "-c", "echo started; n=0; while :; do n=$((n+1)); echo $n > /tmp/n.tmp; mv /tmp/n.tmp /tmp/n; sleep 0.05; done"))
	// The counter has begun (a loaded host can take a while to start it).
	for deadline := time.Now().Add(20 * time.Second); strings.TrimSpace(d.must("exec", "nap", "--", "sh", "-c", "cat /tmp/n 2>/dev/null || true")) == ""; {
		if time.Now().After(deadline) {
			t.Fatal("the background counter did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	d.must("pause", "nap")
	var sb api.Sandbox
	json.Unmarshal([]byte(d.must("inspect", "nap", "--json")), &sb)
	kind := map[string]string{"freeze": "frozen", "checkpoint": "checkpointed"}[mode]
	if sb.State != api.StatePaused || !strings.HasPrefix(sb.PauseKind, kind) {
		t.Fatalf("after pause: %s %q", sb.State, sb.PauseKind)
	}
	before, _ := os.ReadFile(filepath.Join(d.data, "sandboxes", sb.ID, "disk/upper/tmp/n"))
	if !strings.Contains(d.must("inspect", "nap"), "paused:") {
		t.Fatal("inspect does not say how the sandbox is paused")
	}
	r, _ := d.nook("pause", "nap")
	if r.code != 1 || !strings.Contains(r.stderr, "already paused") {
		t.Fatalf("pause of a paused sandbox: %+v", r)
	}
	// The daemon dies and comes back: still paused, still frozen (or
	// checkpointed: no process, no cgroup).
	d.stop(syscall.SIGKILL)
	d.start("--container-pause", mode)
	json.Unmarshal([]byte(d.must("inspect", "nap", "--json")), &sb)
	state, _ := cgroups.FreezerState(d.cgroup, sb.ID)
	want := map[string]string{"freeze": "FROZEN", "checkpoint": ""}[mode]
	if sb.State != api.StatePaused || state != want {
		t.Fatalf("after a restart: %s, freezer %q", sb.State, state)
	}
	// Nothing ran while it was paused.
	if after, _ := os.ReadFile(filepath.Join(d.data, "sandboxes", sb.ID, "disk/upper/tmp/n")); string(after) != string(before) || len(before) == 0 {
		t.Fatalf("a paused sandbox's counter moved: %q then %q", before, after)
	}
	// An exec wakes it transparently, and its background process is still there.
	if got := d.must("exec", "nap", "--", "echo", "awake"); got != "awake\n" {
		t.Fatalf("exec on a paused sandbox: %q", got)
	}
	json.Unmarshal([]byte(d.must("inspect", "nap", "--json")), &sb)
	if sb.State != api.StateRunning {
		t.Fatalf("after exec: %s", sb.State)
	}
	var ps []api.Process
	json.Unmarshal([]byte(d.must("ps", "nap", "--json")), &ps)
	if len(ps) != 1 || strconv.Itoa(ps[0].PID) != pid || !ps[0].Running {
		t.Fatalf("background process lost across the pause: %+v", ps)
	}
	// Its memory too: the counter goes on from where it was.
	time.Sleep(200 * time.Millisecond)
	n0, _ := strconv.Atoi(strings.TrimSpace(string(before)))
	if n, _ := strconv.Atoi(strings.TrimSpace(d.must("exec", "nap", "--", "cat", "/tmp/n"))); n <= n0 {
		t.Fatalf("the counter after resume is %d, it was %d at the pause", n, n0)
	}
	r, _ = d.nook("resume", "nap")
	if r.code != 1 || !strings.Contains(r.stderr, "not paused") {
		t.Fatalf("resume of a running sandbox: %+v", r)
	}
	d.must("pause", "nap")
	d.must("resume", "nap")
	d.must("pause", "nap")
	d.must("rm", "nap")
	if leaks := d.resources().Leaks(sb.ID); len(leaks) > 0 {
		t.Fatalf("rm of a paused sandbox left: %v", leaks)
	}
	r, _ = d.nook("pause", "ghost")
	if r.code != 1 || !strings.Contains(r.stderr, "no sandbox") {
		t.Fatalf("pause of a missing sandbox: %+v", r)
	}
}

// A kill -9 of the daemon at any moment of a container's pause to disk or
// its resume leaves the old state or the new one: afterwards the sandbox
// is paused or running, an exec answers, and its background process is
// the same one, its memory intact (its counter goes on).
func TestKill9DuringCheckpoint(t *testing.T) {
	requireCRIU(t)
	d := newDaemon(t, "--container-pause", "checkpoint")
	d.must("create", "--name", "ck")
	pid := strings.TrimSpace(d.must("exec", "-d", "ck", "--", "sh", "-c", "n=0; while :; do n=$((n+1)); echo $n > /tmp/n.tmp; mv /tmp/n.tmp /tmp/n; sleep 0.02; done"))
	last := 0
	for i, delay := range []time.Duration{10, 40, 80, 120, 160, 220, 300, 30} {
		var sb api.Sandbox
		json.Unmarshal([]byte(d.must("inspect", "ck", "--json")), &sb)
		op := "pause"
		if sb.State == api.StatePaused {
			op = "resume"
		}
		done := make(chan struct{})
		go func() { d.nook(op, "ck"); close(done) }()
		time.Sleep(delay * time.Millisecond)
		d.stop(syscall.SIGKILL)
		<-done
		d.start("--container-pause", "checkpoint")
		json.Unmarshal([]byte(d.must("inspect", "ck", "--json")), &sb)
		if sb.State != api.StatePaused && sb.State != api.StateRunning {
			t.Fatalf("after a kill -9 %v into %s (round %d): %s (%s)", delay, op, i, sb.State, sb.Reason)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(d.must("exec", "ck", "--", "cat", "/tmp/n")))
		if n < last {
			t.Fatalf("after a kill -9 %v into %s: the counter went back from %d to %d (its memory was lost)", delay, op, last, n)
		}
		last = n
		var ps []api.Process
		json.Unmarshal([]byte(d.must("ps", "ck", "--json")), &ps)
		if len(ps) != 1 || strconv.Itoa(ps[0].PID) != pid || !ps[0].Running {
			t.Fatalf("after a kill -9 %v into %s: background process %+v", delay, op, ps)
		}
		if i%2 == 1 { // sometimes leave it paused for the next round
			d.must("pause", "ck")
		}
	}
	d.must("rm", "ck")
}
