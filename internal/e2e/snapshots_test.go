package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
)

// TestAgentsDay is the scenario, through the CLI: create a vm
// sandbox, write files and start a background server, snapshot, break
// things, roll back and find the server running and the files intact,
// fork into 3 and see them diverge, leave one idle until it pauses
// itself, and call exec on it.
func TestAgentsDay(t *testing.T) {
	requireVM(t)
	d := newDaemon(t, "--min-idle-pause", "1s")
	d.must("create", "--isolation", "vm", "--name", "day", "--cpus", "1", "--memory", "512M", "--idle-pause", "3s")
	d.must("exec", "day", "--", "sh", "-c", "mkdir -p /srv/www && echo v1 > /srv/www/work.txt")
	d.must("exec", "-d", "day", "--", "python3", "-m", "http.server", "-d", "/srv/www", "8000")
	waitCLIHTTP(t, d, "day")
	if got := d.must("snapshot", "day", "--name", "good"); got != "good\n" {
		t.Fatalf("snapshot: %q", got)
	}
	// Break things: the file gone, junk written, the server killed.
	d.must("exec", "day", "--", "sh", "-c", "rm /srv/www/work.txt; echo broken > /srv/www/junk; pkill -x python3; true")
	if r, _ := d.nook("exec", "day", "--", "curl", "-sf", "localhost:8000/work.txt"); r.code == 0 {
		t.Fatal("the server still answers after it was killed")
	}
	d.must("rollback", "day", "good")
	if got := d.must("exec", "day", "--", "curl", "-s", "localhost:8000/work.txt"); got != "v1\n" {
		t.Fatalf("the server after rollback: %q", got)
	}
	if got := d.must("exec", "day", "--", "ls", "/srv/www"); got != "work.txt\n" {
		t.Fatalf("files after rollback: %q", got)
	}

	// Three forks of the good snapshot, diverging.
	out := d.must("fork", "day:good", "--count", "3", "--name", "branch")
	if out != "branch-1\nbranch-2\nbranch-3\n" {
		t.Fatalf("fork printed %q", out)
	}
	ips := map[string]bool{}
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("branch-%d", i)
		if got := d.must("exec", name, "--", "hostname"); got != name+"\n" {
			t.Fatalf("%s: hostname %q", name, got)
		}
		d.must("exec", name, "--", "sh", "-c", fmt.Sprintf("echo %d > /srv/www/mine", i))
		if got := d.must("exec", name, "--", "curl", "-s", "localhost:8000/work.txt"); got != "v1\n" {
			t.Fatalf("%s: the inherited server answers %q", name, got)
		}
		var sb api.Sandbox
		json.Unmarshal([]byte(d.must("inspect", name, "--json")), &sb)
		if sb.ID == "" || ips[sb.ID] {
			t.Fatalf("%s: id %q not its own", name, sb.ID)
		}
		ips[sb.ID] = true
	}
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("branch-%d", i)
		if got := d.must("exec", name, "--", "cat", "/srv/www/mine"); got != fmt.Sprintf("%d\n", i) {
			t.Fatalf("%s sees %q: forks are not independent", name, got)
		}
	}
	if r, _ := d.nook("exec", "day", "--", "cat", "/srv/www/mine"); r.code == 0 {
		t.Fatal("the source sees a fork's write")
	}

	// Left idle (its server stopped), branch-1 pauses itself; exec answers.
	// Its user's edit of /etc/hosts stays through the pause, and it wakes
	// with the host's time, not the time it was paused at.
	d.must("exec", "branch-1", "--", "sh", "-c", "pkill -x python3; echo '10.9.9.9 mine' >> /etc/hosts; true")
	d.waitState("branch-1", api.StatePaused, 60*time.Second)
	time.Sleep(3 * time.Second)
	if got := d.must("exec", "branch-1", "--", "cat", "/srv/www/mine"); got != "1\n" {
		t.Fatalf("exec on the idle-paused fork: %q", got)
	}
	if hosts := d.must("exec", "branch-1", "--", "cat", "/etc/hosts"); !strings.Contains(hosts, "10.9.9.9 mine") {
		t.Fatalf("a resume rewrote the sandbox's /etc/hosts: %q", hosts)
	}
	before := time.Now().Unix()
	guest, _ := strconv.ParseInt(strings.TrimSpace(d.must("exec", "branch-1", "--", "date", "+%s")), 10, 64)
	if after := time.Now().Unix(); guest < before-1 || guest > after+1 {
		t.Fatalf("the woken vm's clock says %d, the host's %d..%d", guest, before, after)
	}

	// The tree and the disk the snapshots use.
	if tree := d.must("snapshots", "day"); !strings.Contains(tree, "good") {
		t.Fatalf("snapshots: %s", tree)
	}
	var day api.Sandbox
	json.Unmarshal([]byte(d.must("inspect", "day", "--json")), &day)
	if day.SnapshotsBytes <= 0 {
		t.Fatalf("inspect reports no snapshot disk use: %+v", day)
	}

	// Bad input: clear errors, nothing changed.
	var snaps []api.Snapshot
	json.Unmarshal([]byte(d.must("snapshots", "day", "--json")), &snaps)
	d.expectCLI(t, []cliCase{
		{[]string{"snapshot", "day", "--name", "good"}, 1, "already has a snapshot named good"},
		{[]string{"snapshot", "day", "--name", "Not Valid"}, 1, "snapshot name"},
		{[]string{"rollback", "branch-2", snaps[0].ID}, 1, "belongs to sandbox day"},
		{[]string{"rollback", "day", "nosuch"}, 1, `no snapshot "nosuch"`},
		{[]string{"fork", "ghost"}, 1, `no sandbox named "ghost"`},
		{[]string{"fork", "day", "--count", "50"}, 1, "out of range"},
		{[]string{"fork", "day:good", "--name", "branch-2"}, 1, "already exists"},
		{[]string{"snapshot", "rm", "day", "nosuch"}, 1, `no snapshot "nosuch"`},
		{[]string{"rollback", "day"}, 2, "accepts 2 arg"},
	})
	if got := d.must("exec", "branch-2", "--", "cat", "/srv/www/mine"); got != "2\n" {
		t.Fatalf("a refused rollback changed branch-2: %q", got)
	}

	// Removing the snapshot keeps what the forks build on; removing
	// everything leaves no layer behind.
	d.must("snapshot", "rm", "day", "good")
	if got := d.must("exec", "branch-3", "--", "cat", "/srv/www/work.txt"); got != "v1\n" {
		t.Fatalf("a fork after its snapshot was removed: %q", got)
	}
	for _, n := range []string{"day", "branch-1", "branch-2", "branch-3"} {
		d.must("rm", n)
	}
	if entries, _ := os.ReadDir(filepath.Join(d.data, "vm-snapshots")); len(entries) != 0 {
		t.Fatalf("%d snapshot layers left after every sandbox was removed", len(entries))
	}
}

func waitCLIHTTP(t *testing.T, d *daemon, name string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if r, _ := d.nook("exec", name, "--", "curl", "-sf", "localhost:8000/"); r.code == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server in %s did not answer", name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A daemon killed at any moment of a snapshot, rollback or fork leaves
// the old state or the new one: after a restart the sandbox runs with its
// files, every recorded snapshot can be rolled back to, and no
// half-made fork or layer is left.
func TestKill9DuringSnapshots(t *testing.T) {
	requireVM(t)
	d := newDaemon(t)
	d.must("create", "--isolation", "vm", "--name", "src", "--cpus", "1", "--memory", "512M")
	d.must("exec", "src", "--", "sh", "-c", "echo base > /root/f")
	d.must("snapshot", "src", "--name", "base")
	killDuringSnapshots(t, d, "src", "/root/f", "base\n", "base", []time.Duration{40, 120, 250, 400, 700, 1000, 1500, 2500})
	d.must("rm", "src")
	if entries, _ := os.ReadDir(filepath.Join(d.data, "vm-snapshots")); len(entries) != 0 {
		t.Fatalf("%d snapshot layers left", len(entries))
	}
	if entries, _ := os.ReadDir(filepath.Join(d.data, "vms")); len(entries) != 0 {
		t.Fatalf("%d vm directories left", len(entries))
	}
}

// TestContainerSnapshots: a container sandbox's snapshots hold its files
// and, with CRIU (--container-pause checkpoint), its processes: a rollback
// brings them back, and forks start from them with their own hostnames.
// Without CRIU (freeze) they start afresh. A daemon killed in the middle
// of a snapshot, rollback or fork leaves the old state or the new one.
func TestContainerSnapshots(t *testing.T) {
	for _, mode := range []string{"freeze", "checkpoint"} {
		t.Run(mode, func(t *testing.T) {
			if mode == "checkpoint" {
				requireCRIU(t)
			}
			testContainerSnapshots(t, mode)
		})
	}
}

func testContainerSnapshots(t *testing.T, mode string) {
	memory := mode == "checkpoint"
	d := newDaemon(t, "--container-pause", mode)
	d.must("create", "--name", "c")
	d.must("exec", "c", "--", "sh", "-c", "mkdir -p /srv && echo v1 > /srv/work.txt")
	pid := strings.TrimSpace(d.must("exec", "-d", "c", "--", "sleep", "600"))
	if got := d.must("snapshot", "c", "--name", "good"); got != "good\n" {
		t.Fatalf("snapshot: %q", got)
	}
	wantMem := map[bool]string{true: "yes", false: "no (disk only)"}[memory]
	if tree := d.must("snapshots", "c"); !strings.Contains(tree, "good") || !strings.Contains(tree, wantMem) {
		t.Fatalf("snapshots (want memory %q):\n%s", wantMem, tree)
	}
	d.must("exec", "c", "--", "sh", "-c", "rm /srv/work.txt; echo broken > /srv/junk")
	if memory { // so that only the rollback can bring it back
		d.must("exec", "c", "--", "kill", pid)
	}
	d.must("rollback", "c", "good")
	if got := d.must("exec", "c", "--", "ls", "/srv"); got != "work.txt\n" {
		t.Fatalf("files after rollback: %q", got)
	}
	// The background process: back with its memory, or gone with it.
	var ps []api.Process
	json.Unmarshal([]byte(d.must("ps", "c", "--json")), &ps)
	back := len(ps) == 1 && strconv.Itoa(ps[0].PID) == pid && ps[0].Running
	if back != memory {
		t.Fatalf("after a rollback (memory %v) the background process: %+v", memory, ps)
	}
	if got := d.must("exec", "c", "--", "hostname"); got != "c\n" {
		t.Fatalf("hostname after rollback: %q", got)
	}
	if out := d.must("fork", "c:good", "--count", "2", "--name", "f"); out != "f-1\nf-2\n" {
		t.Fatalf("fork printed %q", out)
	}
	d.must("exec", "f-1", "--", "sh", "-c", "echo one > /srv/mine")
	if r, _ := d.nook("exec", "f-2", "--", "cat", "/srv/mine"); r.code == 0 {
		t.Fatal("a fork sees another's write")
	}
	for _, f := range []string{"f-1", "f-2"} {
		if got := d.must("exec", f, "--", "sh", "-c", "hostname; cat /srv/work.txt; echo $NOOK_SANDBOX"); got != f+"\nv1\n"+f+"\n" {
			t.Fatalf("fork %s: %q", f, got)
		}
		json.Unmarshal([]byte(d.must("ps", f, "--json")), &ps)
		if back := len(ps) == 1 && ps[0].Running; back != memory {
			t.Fatalf("fork %s (memory %v): background processes %+v", f, memory, ps)
		}
	}
	var c api.Sandbox
	json.Unmarshal([]byte(d.must("inspect", "c", "--json")), &c)
	if c.SnapshotsBytes <= 0 {
		t.Fatalf("inspect reports no snapshot disk use: %+v", c)
	}
	d.must("rm", "f-1", "f-2")

	killDuringSnapshots(t, d, "c", "/srv/work.txt", "v1\n", "good", []time.Duration{5, 15, 30, 50, 80, 120, 200, 300})
	d.must("rm", "c")
	if entries, _ := os.ReadDir(filepath.Join(d.data, "container-snapshots")); len(entries) != 0 {
		t.Fatalf("%d snapshot layers left after every sandbox was removed", len(entries))
	}
}

// killDuringSnapshots kills the daemon (kill -9) at each delay into a
// snapshot, rollback or fork of sandbox src (whose file holds want, in
// snapshot snap too) and checks after each restart that every sandbox
// runs with the file intact and that a fork made before the kill works;
// then that every recorded snapshot of src can be rolled back to.
func killDuringSnapshots(t *testing.T, d *daemon, src, file, want, snap string, delays []time.Duration) {
	t.Helper()
	ops := [][]string{
		{"snapshot", src},
		{"rollback", src, snap},
		{"fork", src + ":" + snap, "--name", "child"},
		{"fork", src, "--name", "child"},
	}
	for i, delay := range delays {
		op := ops[i%len(ops)]
		done := make(chan struct{})
		go func() { d.nook(op...); close(done) }()
		time.Sleep(delay * time.Millisecond)
		d.stop(syscall.SIGKILL)
		<-done
		d.start()
		if got := d.must("exec", src, "--", "cat", file); got != want {
			t.Fatalf("after a kill -9 %v into %v: %s is %q", delay, op, file, got)
		}
		var sbs []api.Sandbox
		json.Unmarshal([]byte(d.must("ls", "--json")), &sbs)
		for _, sb := range sbs {
			if sb.State != api.StateRunning {
				t.Fatalf("after a kill -9 %v into %v: %s is %s (%s)", delay, op, sb.Name, sb.State, sb.Reason)
			}
			if sb.Name == "child" {
				if got := d.must("exec", "child", "--", "cat", file); got != want {
					t.Fatalf("the fork made before the kill: %q", got)
				}
				d.must("rm", "child")
			}
		}
	}
	var snaps []api.Snapshot
	json.Unmarshal([]byte(d.must("snapshots", src, "--json")), &snaps)
	for _, sn := range snaps {
		d.must("rollback", src, sn.Name)
		if got := d.must("exec", src, "--", "cat", file); got != want {
			t.Fatalf("rollback to %s: %q", sn.Name, got)
		}
	}
}
