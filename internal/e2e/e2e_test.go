// Package e2e tests nook as users run it: the real nook binary as daemon
// and CLI, real runc sandboxes, kill -9 of the daemon.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

var (
	binOnce sync.Once
	nookBin string
)

// binaries builds nook and nook-agent side by side, as installed.
func binaries(t *testing.T) string {
	binOnce.Do(func() {
		testutil.Build(t, "cmd/nook-agent", "nook-agent")
		nookBin = testutil.Build(t, "cmd/nook", "nook")
	})
	return nookBin
}

// daemon is a `nook serve` process under test.
type daemon struct {
	t      *testing.T
	bin    string
	data   string
	run    string
	cgroup string
	cmd    *exec.Cmd
	log    *logBuffer
	// netns, if set, is the network namespace (a path) the daemon runs
	// in, with sandbox networking on; otherwise it runs in the host's
	// without (network_test.go).
	netns string
	// args are the flags it was first started with: start() without
	// flags (a restart) uses them again.
	args []string
	// env is added to the daemon's environment.
	env []string
}

// logBuffer holds a daemon's output: written by the copying goroutines
// os/exec starts, read by the test while the daemon runs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newDaemon(t *testing.T, extra ...string) *daemon {
	t.Helper()
	return newDaemonIn(t, "", extra...)
}

// newDaemonIn starts a daemon in the network namespace at netnsPath ("":
// the host's, without sandbox networking).
func newDaemonIn(t *testing.T, netnsPath string, extra ...string) *daemon {
	t.Helper()
	return newDaemonInEnv(t, netnsPath, nil, extra...)
}

// newDaemonInEnv is newDaemonIn with env added to the daemon's
// environment.
func newDaemonInEnv(t *testing.T, netnsPath string, env []string, extra ...string) *daemon {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireRunc(t)
	testutil.BaseTemplate(t)
	root := filepath.Join(testutil.TempRoot(t), testutil.RandomName("d"))
	d := &daemon{t: t, bin: binaries(t), data: filepath.Join(root, "data"), run: filepath.Join(root, "run"), cgroup: testutil.RandomName("nook-e2e-"), netns: netnsPath, args: extra, env: env}
	testutil.CleanupCgroupParent(t, d.cgroup)
	d.start(extra...)
	t.Cleanup(func() {
		// Destroy what the test left, then check nothing remains on the host.
		out, _ := d.nook("ls", "--json")
		var sbs []api.Sandbox
		json.Unmarshal([]byte(out.stdout), &sbs)
		for _, sb := range sbs {
			d.nook("rm", sb.Name)
		}
		// And its volumes: a test that failed half way must not leave
		// one mounted.
		out, _ = d.nook("volume", "ls", "--json")
		var vols api.VolumeList
		json.Unmarshal([]byte(out.stdout), &vols)
		for _, v := range vols.Volumes {
			d.nook("volume", "rm", "--force", v.Name)
		}
		d.stop(syscall.SIGTERM)
		if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil && strings.Contains(string(mi), " "+d.data+"/volumes/") {
			t.Errorf("a volume is left mounted under %s", d.data)
		}
		for _, dir := range []string{"sandboxes", "vms"} {
			entries, _ := os.ReadDir(filepath.Join(d.data, dir))
			for _, e := range entries {
				t.Errorf("sandbox directory left behind: %s/%s", dir, e.Name())
			}
		}
		for _, sb := range sbs {
			if leaks := d.resources().Leaks(sb.ID); len(leaks) > 0 {
				t.Errorf("sandbox %s left: %v", sb.Name, leaks)
			}
		}
		if t.Failed() {
			t.Logf("daemon log:\n%s", d.log.String())
		}
	})
	return d
}

func (d *daemon) resources() testutil.HostResources {
	return testutil.HostResources{StateDir: filepath.Join(d.data, "sandboxes"), RuncRoot: filepath.Join(d.run, "runc"), CgroupParent: d.cgroup}
}

// vmCacheDir is the vm backend's cache (guest kernel, template images and
// snapshots, keyed by content) that tests share with each other and `make run`.
func vmCacheDir() string {
	if d := os.Getenv("NOOK_TEST_VM_CACHE"); d != "" {
		return d
	}
	return "/var/lib/nook/vm"
}

func (d *daemon) socket() string { return filepath.Join(d.run, "nook.sock") }

func (d *daemon) start(extra ...string) {
	d.t.Helper()
	if len(extra) == 0 {
		extra = d.args
	}
	// --config /dev/null: the host's /etc/nook/config.toml (make install
	// puts one there) is not the test's; a test's own --config comes later
	// and wins.
	args := append([]string{"serve", "--config", "/dev/null", "--data-dir", d.data, "--run-dir", d.run, "--templates-dir", testutil.TemplatesDir(),
		"--cgroup-parent", d.cgroup, "--reap-interval", "200ms", "--vm-cache-dir", vmCacheDir()}, extra...)
	if d.log == nil {
		d.log = &logBuffer{}
	}
	// Sandbox networking owns its namespace's nftables table: daemons
	// sharing the host's namespace run without it.
	d.cmd = exec.Command(d.bin, append([]string{"serve", "--network=false"}, args[1:]...)...)
	if d.netns != "" {
		d.cmd = exec.Command("nsenter", append([]string{"--net=" + d.netns, d.bin}, args...)...)
	}
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	if len(d.env) > 0 {
		d.cmd.Env = append(os.Environ(), d.env...)
	}
	if err := d.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("unix", d.socket()); err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("daemon did not start:\n%s", d.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *daemon) stop(sig syscall.Signal) {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(sig)
	d.cmd.Wait()
	d.cmd = nil
}

type result struct {
	stdout, stderr string
	code           int
}

// cliCase is a CLI call and how it must fail (or, with code 0, succeed).
type cliCase struct {
	args []string
	code int
	msg  string // in stderr
}

// expectCLI runs each case: the exit code must match, stderr must hold the
// message, and an error (exit 1) must be one line.
func (d *daemon) expectCLI(t *testing.T, cases []cliCase) {
	t.Helper()
	for _, tc := range cases {
		r, err := d.nook(tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		if r.code != tc.code || !strings.Contains(r.stderr, tc.msg) {
			t.Errorf("nook %s: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.code, tc.msg)
		}
		if tc.code == 1 && strings.Count(strings.TrimSpace(r.stderr), "\n") > 0 {
			t.Errorf("nook %s: error is more than one line: %q", strings.Join(tc.args, " "), r.stderr)
		}
	}
}

// nook runs the CLI against this daemon.
func (d *daemon) nook(args ...string) (result, error) {
	return d.nookEnv([]string{"NOOK_HOST=unix://" + d.socket()}, args...)
}

func (d *daemon) nookEnv(env []string, args ...string) (result, error) {
	return d.nookWithin(2*time.Minute, env, args...)
}

// nookWithin runs the CLI, killed after timeout.
func (d *daemon) nookWithin(timeout time.Duration, env []string, args ...string) (result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
		err = nil
	}
	return r, err
}

// must runs the CLI and fails the test unless it exits 0.
func (d *daemon) must(args ...string) string {
	d.t.Helper()
	r, err := d.nook(args...)
	if err != nil || r.code != 0 {
		d.t.Fatalf("nook %s: exit %d, %v\nstderr: %s", strings.Join(args, " "), r.code, err, r.stderr)
	}
	return r.stdout
}

func TestCreateExecRemove(t *testing.T) {
	d := newDaemon(t)
	name := strings.TrimSpace(d.must("create", "--name", "e2e-one", "--env", "GREETING=hello", "--cpus", "1", "--memory", "512M", "--ttl", "90m"))
	if name != "e2e-one" {
		t.Fatalf("create printed %q", name)
	}
	if got := d.must("exec", "e2e-one", "--", "echo", "hi"); got != "hi\n" {
		t.Fatalf("exec printed %q", got)
	}
	if got := d.must("exec", "e2e-one", "--", "sh", "-c", "echo $NOOK_SANDBOX $(hostname)"); got != "e2e-one e2e-one\n" {
		t.Fatalf("the sandbox does not know its name: %q", got)
	}
	// Nobody but root on the host may list the sandboxes or read the
	// database; a sandbox's directory lets in only its own root's group
	// (an unprivileged gid of its range, on the way to its rootfs).
	for path, want := range map[string]os.FileMode{filepath.Join(d.data, "sandboxes"): 0o711, filepath.Join(d.data, "nook.db"): 0o600} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != want {
			t.Fatalf("%s: mode %v %v, want %v", path, fi.Mode(), err, want)
		}
	}
	// Everything else in the data directory (templates with setuid-root
	// files, snapshots, TLS key, claims) is out of others' reach.
	entries, err := os.ReadDir(d.data)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() != "sandboxes" && fi.Mode().Perm()&0o007 != 0 {
			t.Errorf("%s in the data directory: mode %v, open to others", e.Name(), fi.Mode())
		}
	}
	sbDir := filepath.Join(d.data, "sandboxes", mustID(t, d, "e2e-one"))
	if fi, err := os.Stat(sbDir); err != nil || fi.Mode().Perm() != 0o710 || fi.Sys().(*syscall.Stat_t).Uid != 0 || fi.Sys().(*syscall.Stat_t).Gid < 1<<31 {
		t.Fatalf("%s: %v %+v, want 0710, root's, with the sandbox's root group", sbDir, err, fi)
	}
	r, _ := d.nook("exec", "--env", "X=1", "--cwd", "/tmp", "e2e-one", "--", "sh", "-c", `echo "$GREETING $X $(pwd)"; echo err >&2; exit 42`)
	if r.stdout != "hello 1 /tmp\n" || r.stderr != "err\n" || r.code != 42 {
		t.Fatalf("exec: %+v", r)
	}
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(d.must("inspect", "e2e-one", "--json")), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.State != api.StateRunning || sb.CPUs != 1 || sb.MemoryBytes != 512<<20 || sb.Env["GREETING"] != "hello" || time.Until(sb.ExpiresAt) < 85*time.Minute {
		t.Fatalf("inspect: %+v", sb)
	}
	d.must("ttl", "e2e-one", "3d")
	json.Unmarshal([]byte(d.must("inspect", "e2e-one", "--json")), &sb)
	if time.Until(sb.ExpiresAt) < 71*time.Hour {
		t.Fatalf("ttl not extended: expires %v", sb.ExpiresAt)
	}
	// A generated name, and --json output.
	var gen api.Sandbox
	if err := json.Unmarshal([]byte(d.must("create", "--json")), &gen); err != nil || gen.Name == "" {
		t.Fatalf("create --json: %+v %v", gen, err)
	}
	if !strings.Contains(d.must("ls"), gen.Name) {
		t.Fatal("ls does not show the generated sandbox")
	}
	d.must("rm", "e2e-one", gen.Name)
	for _, id := range []string{sb.ID, gen.ID} {
		if leaks := d.resources().Leaks(id); len(leaks) > 0 {
			t.Fatalf("rm left: %v", leaks)
		}
	}
	if out := d.must("ls", "--json"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("ls after rm: %s", out)
	}
}

// Every wrong input is refused with exit status 1 or 2 and one line that says what to do.
func TestBadInput(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "taken")
	cases := []cliCase{
		{[]string{"create", "--template", "nosuch"}, 1, `template "nosuch" not found`},
		{[]string{"create", "--name", "Bad_Name"}, 1, "is not valid"},
		{[]string{"create", "--name", "taken"}, 1, "already exists"},
		{[]string{"create", "--memory", "1000T"}, 1, "more than this host has"},
		{[]string{"create", "--memory", "lots"}, 1, "is not valid"},
		{[]string{"create", "--cpus", "512"}, 1, "more than this host has"},
		{[]string{"create", "--disk", "1M"}, 1, "too small for a container sandbox: ask for at least 64M"},
		{[]string{"create", "--ttl", "10s"}, 1, "out of range"},
		{[]string{"create", "--ttl", "1y"}, 1, "not valid"},
		{[]string{"create", "--idle-pause", "10s"}, 1, "idle pause \"10s\" is out of range: use between 1m and 30d, or off"},
		{[]string{"create", "--idle-pause", "31d"}, 1, "out of range"},
		{[]string{"create", "--idle-pause", "soon"}, 1, "not valid"},
		{[]string{"create", "--idle-pause", "-5m"}, 1, "negative"},
		{[]string{"create", "--on-expire", "explode"}, 1, "use destroy, pause or stop"},
		{[]string{"create", "--init", "sysv"}, 1, `init "sysv" is not valid: use systemd or agent`},
		{[]string{"create", "--init", "systemd"}, 1, "container sandboxes run nook-agent as their init, not systemd"},
		{[]string{"create", "--isolation", "vm", "--init", "systemd"}, 1, "template base has no systemd"},
		{[]string{"serve", "--idle-pause", "5s"}, 2, "out of range"},
		{[]string{"create", "--isolation", "vm", "--memory", "128M"}, 1, "too small for a vm sandbox"},
		{[]string{"create", "--isolation", "jail"}, 1, "not valid"},
		{[]string{"create", "--env", "NOEQUALS"}, 2, "KEY=VALUE"},
		{[]string{"inspect", "ghost"}, 1, `no sandbox named "ghost"`},
		{[]string{"exec", "ghost", "--", "true"}, 1, `no sandbox named "ghost"`},
		{[]string{"exec", "taken", "--", "no-such-command"}, 1, `command "no-such-command" not found`},
		{[]string{"exec", "taken", "--", "true"}, 0, ""},
		{[]string{"exec", "--cwd", "/nope", "taken", "--", "true"}, 1, "does not exist"},
		{[]string{"exec", "--user", "ghost", "taken", "--", "true"}, 1, "does not exist"},
		{[]string{"exec", "taken"}, 2, "needs a sandbox name and a command"},
		{[]string{"ttl", "taken", "forever"}, 1, "not valid"},
		{[]string{"ttl", "ghost", "1h"}, 1, "no sandbox"},
		{[]string{"rm", "ghost"}, 1, "no sandbox"},
		{[]string{"template", "build", "nosuch"}, 1, "does not know how to build"},
		{[]string{"template", "rm", "base"}, 1, "used by"},
		{[]string{"bogus"}, 2, "unknown command"},
		{[]string{"create", "--bogus"}, 2, "unknown flag"},
	}
	d.expectCLI(t, cases)
	// Nothing was half-created by any of it.
	var sbs []api.Sandbox
	json.Unmarshal([]byte(d.must("ls", "--json")), &sbs)
	if len(sbs) != 1 {
		t.Fatalf("bad input left sandboxes: %+v", sbs)
	}
	// Stopped, the daemon has destroyed its warm pool: what is left on disk is the one sandbox.
	d.stop(syscall.SIGTERM)
	entries, _ := os.ReadDir(filepath.Join(d.data, "sandboxes"))
	if len(entries) != 1 || entries[0].Name() != sbs[0].ID {
		t.Fatalf("bad input left %d sandbox directories", len(entries))
	}
	d.start()

	// The raw API answers with a stable code and a message.
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.socket())
	}}}
	apiCases := []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/v1/sandboxes", `{"name": "x", "memroy": "1G"}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", ``, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", `{"name": "taken"}`, 409, api.CodeAlreadyExists},
		{"GET", "/v1/sandboxes/ghost", ``, 404, api.CodeNotFound},
		{"POST", "/v1/sandboxes/taken/exec", `{"cmd": []}`, 400, api.CodeInvalidArgument},
		{"PUT", "/v1/sandboxes/taken/ttl", `{"ttl": "-5m"}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", `{"name": "x", "idle_pause": "1s"}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", `{"name": "x", "idle_pause": 600}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes", `{"name": "x", "on_expire": "keep"}`, 400, api.CodeInvalidArgument},
		{"GET", "/v2/nothing", ``, 404, api.CodeNotFound},
	}
	for _, tc := range apiCases {
		req, _ := http.NewRequest(tc.method, "http://nook"+tc.path, strings.NewReader(tc.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var eb api.ErrorBody
		json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if resp.StatusCode != tc.status || eb.Error.Code != tc.code || eb.Error.Message == "" {
			t.Errorf("%s %s: %d %+v; want %d %s", tc.method, tc.path, resp.StatusCode, eb, tc.status, tc.code)
		}
	}
}

// Host limits: a create over --max-sandboxes or --max-memory fails with
// the limit and the figures (429 limit_reached on the API), and info
// shows the limits and their use.
func TestHostLimits(t *testing.T) {
	d := newDaemon(t, "--max-sandboxes", "2", "--max-memory", "1G", "--warm-pool", "-1")
	d.must("create", "--name", "lim-a", "--memory", "512M")
	d.expectCLI(t, []cliCase{
		{[]string{"create", "--name", "lim-b", "--memory", "1G"}, 1, "host limit reached: creating this 1G sandbox would commit 1.5G of memory, over --max-memory 1G (512M committed)"},
		{[]string{"create", "--name", "lim-b", "--memory", "512M"}, 0, ""},
		{[]string{"create", "--name", "lim-c", "--memory", "64M"}, 1, "host limit reached: 2 sandboxes exist (nook serve --max-sandboxes 2)"},
		{[]string{"stop", "lim-b"}, 0, ""},
		{[]string{"serve", "--max-memory", "lots"}, 2, "--max-memory: size \"lots\" is not valid"},
		{[]string{"serve", "--max-sandboxes", "-1"}, 2, "--max-sandboxes -1 is not valid"},
	})
	if out := d.must("info"); !strings.Contains(out, "sandboxes: 2 of 2 (--max-sandboxes)\ncommitted memory: 512M of 1G (--max-memory)\n") {
		t.Errorf("info: %s", out)
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.socket())
	}}}
	resp, err := hc.Post("http://nook/v1/sandboxes", "application/json", strings.NewReader(`{"name": "lim-c"}`))
	if err != nil {
		t.Fatal(err)
	}
	var eb api.ErrorBody
	json.NewDecoder(resp.Body).Decode(&eb)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || eb.Error.Code != api.CodeLimitReached || !strings.Contains(eb.Error.Message, "--max-sandboxes 2") {
		t.Fatalf("create over the limit: %d %+v", resp.StatusCode, eb)
	}
	// Room made, the create goes through.
	d.must("rm", "lim-b")
	d.must("create", "--name", "lim-c", "--memory", "512M")
}

func TestDaemonNotRunning(t *testing.T) {
	bin := binaries(t)
	cmd := exec.Command(bin, "ls")
	cmd.Env = append(os.Environ(), "NOOK_HOST=unix://"+filepath.Join(t.TempDir(), "none.sock"))
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "cannot reach the nook daemon") || !strings.Contains(string(out), "nook serve") {
		t.Fatalf("ls without a daemon: %v %s", err, out)
	}
	cmd = exec.Command(bin, "ls")
	cmd.Env = append(os.Environ(), "NOOK_HOST=ftp://x")
	out, err = cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "NOOK_HOST") {
		t.Fatalf("bad NOOK_HOST: %v %s", err, out)
	}
}

// kill -9 of the daemon loses nothing it acknowledged: after a restart
// the sandboxes are listed and serve exec.
func TestKill9AndRestart(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "survivor")
	d.must("exec", "survivor", "--", "sh", "-c", "echo kept > /root/state")
	d.stop(syscall.SIGKILL)
	d.start()
	if got := d.must("exec", "survivor", "--", "cat", "/root/state"); got != "kept\n" {
		t.Fatalf("after restart: %q", got)
	}
	if !strings.Contains(d.must("ls"), "running") {
		t.Fatal("sandbox not running after restart")
	}
}

// kill -9 in the middle of creates: after a restart every sandbox is
// either whole and working or gone without a trace, with and without a
// warm pool.
func TestKill9DuringCreate(t *testing.T) {
	for _, pool := range []string{"-1", "2"} {
		t.Run("warm-pool="+pool, func(t *testing.T) {
			d := newDaemon(t, "--warm-pool", pool)
			for i, delay := range []time.Duration{5, 15, 30, 45, 60, 90} {
				name := fmt.Sprintf("crash-%d", i)
				done := make(chan struct{})
				go func() { d.nook("create", "--name", name); close(done) }()
				time.Sleep(delay * time.Millisecond)
				d.stop(syscall.SIGKILL)
				<-done
				d.start()
			}
			var sbs []api.Sandbox
			json.Unmarshal([]byte(d.must("ls", "--json")), &sbs)
			ids := map[string]bool{}
			for _, sb := range sbs {
				ids[sb.ID] = true
				if sb.State != api.StateRunning {
					t.Errorf("%s is %s after restart (%s)", sb.Name, sb.State, sb.Reason)
					continue
				}
				if got := d.must("exec", sb.Name, "--", "hostname"); got != sb.Name+"\n" {
					t.Errorf("%s: hostname %q", sb.Name, got)
				}
			}
			// A graceful stop destroys the warm pool: then only recorded sandboxes remain.
			d.stop(syscall.SIGTERM)
			entries, _ := os.ReadDir(filepath.Join(d.data, "sandboxes"))
			for _, e := range entries {
				if !ids[e.Name()] {
					t.Errorf("half-created sandbox %s left on disk: %v", e.Name(), d.resources().Leaks(e.Name()))
				}
			}
			d.start()
			t.Logf("%d of 6 interrupted creates had completed", len(sbs))
		})
	}
}

// A sandbox whose processes die outside nook is marked failed with a reason, and rm cleans it up.
func TestDeadSandboxIsReported(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "victim")
	var sb api.Sandbox
	json.Unmarshal([]byte(d.must("inspect", "victim", "--json")), &sb)
	pidb, err := os.ReadFile(filepath.Join(d.data, "sandboxes", sb.ID, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscan(string(pidb), &pid)
	syscall.Kill(pid, syscall.SIGKILL)
	deadline := time.Now().Add(15 * time.Second)
	for {
		json.Unmarshal([]byte(d.must("inspect", "victim", "--json")), &sb)
		if sb.State == api.StateFailed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %s after its init was killed", sb.State)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if sb.Reason == "" {
		t.Fatal("failed sandbox has no reason")
	}
	r, _ := d.nook("exec", "victim", "--", "true")
	if r.code != 1 || !strings.Contains(r.stderr, "failed") {
		t.Fatalf("exec in a dead sandbox: %+v", r)
	}
	d.must("rm", "victim")
	if leaks := d.resources().Leaks(sb.ID); len(leaks) > 0 {
		t.Fatalf("rm of a dead sandbox left: %v", leaks)
	}
}

// freeAddr is a loopback address with a port free now, for a daemon's
// listener.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The TCP listener requires a token; the unix socket mints them.
func TestTokenAuth(t *testing.T) {
	addr := freeAddr(t)
	d := newDaemon(t, "--listen", addr)
	// The TCP listener serves HTTPS with a self-signed certificate whose
	// fingerprint the daemon logs and `nook info` shows; clients pin it.
	var info api.Info
	if err := json.Unmarshal([]byte(d.must("info", "--json")), &info); err != nil || !strings.HasPrefix(info.TLSFingerprint, "sha256:") {
		t.Fatalf("info: %v %+v", err, info)
	}
	if !strings.Contains(d.log.String(), info.TLSFingerprint) {
		t.Fatalf("the daemon did not log its certificate's fingerprint:\n%s", d.log.String())
	}
	if out := d.must("version"); out != "client: "+info.Version+"\nserver: "+info.Version+"\n" {
		t.Errorf("nook version beside its daemon:\n%s", out)
	}
	tcp := []string{"NOOK_HOST=https://" + addr, "NOOK_TLS_FINGERPRINT=" + info.TLSFingerprint}
	r, _ := d.nookEnv([]string{"NOOK_HOST=https://" + addr}, "ls")
	if r.code != 1 || !strings.Contains(r.stderr, "NOOK_TLS_FINGERPRINT") {
		t.Fatalf("ls over TLS without trusting the certificate: %+v", r)
	}
	r, _ = d.nookEnv(tcp, "ls")
	if r.code != 1 || !strings.Contains(r.stderr, "nook token create") {
		t.Fatalf("ls over TCP without a token: %+v", r)
	}
	r, _ = d.nookEnv(append(tcp, "NOOK_TOKEN=nook_wrong"), "ls")
	if r.code != 1 || !strings.Contains(r.stderr, "not valid") {
		t.Fatalf("ls over TCP with a wrong token: %+v", r)
	}
	token := strings.TrimSpace(d.must("token", "create", "--name", "ci"))
	if !strings.HasPrefix(token, "nook_") {
		t.Fatalf("token %q", token)
	}
	r, _ = d.nookEnv(append(tcp, "NOOK_TOKEN="+token), "ls")
	if r.code != 0 {
		t.Fatalf("ls over TCP with a token: %+v", r)
	}
	// A token cannot mint more tokens or revoke others: only the host can.
	for _, args := range [][]string{{"token", "create"}, {"token", "ls"}} {
		r, _ = d.nookEnv(append(tcp, "NOOK_TOKEN="+token), args...)
		if r.code != 1 || !strings.Contains(r.stderr, "managed on the host") {
			t.Fatalf("nook %v over TCP: %+v", args, r)
		}
	}
	// Only a hash of the token is stored.
	db, _ := os.ReadFile(filepath.Join(d.data, "nook.db"))
	wal, _ := os.ReadFile(filepath.Join(d.data, "nook.db-wal"))
	if bytes.Contains(db, []byte(token)) || bytes.Contains(wal, []byte(token)) {
		t.Fatal("the token's secret is stored in the database")
	}
	id := strings.Fields(strings.Split(d.must("token", "ls"), "\n")[1])[0]
	d.must("token", "rm", id)
	r, _ = d.nookEnv(append(tcp, "NOOK_TOKEN="+token), "ls")
	if r.code != 1 {
		t.Fatalf("revoked token still works: %+v", r)
	}

	// Scopes, end to end.
	d.must("create", "--name", "box")
	d.must("create", "--name", "other")
	box := strings.TrimSpace(d.must("token", "create", "--scope", "sandbox:box", "--ttl", "1h"))
	ro := strings.TrimSpace(d.must("token", "create", "--scope", "read-only"))
	as := func(tok string, args ...string) result {
		r, err := d.nookEnv(append(tcp, "NOOK_TOKEN="+tok), args...)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := as(box, "ls"); r.code != 0 || !strings.Contains(r.stdout, "box") || strings.Contains(r.stdout, "other") {
		t.Fatalf("ls with a sandbox:box token: %+v", r)
	}
	if r := as(box, "exec", "box", "--", "echo", "in-box"); r.code != 0 || r.stdout != "in-box\n" {
		t.Fatalf("exec in box with its token: %+v", r)
	}
	if r := as(box, "exec", "other", "--", "true"); r.code != 1 || !strings.Contains(r.stderr, "for sandbox box only") {
		t.Fatalf("exec in other with box's token: %+v", r)
	}
	if r := as(box, "create", "--name", "more"); r.code != 1 || !strings.Contains(r.stderr, "admin token") {
		t.Fatalf("create with box's token: %+v", r)
	}
	if r := as(ro, "ls"); r.code != 0 || !strings.Contains(r.stdout, "other") {
		t.Fatalf("ls with a read-only token: %+v", r)
	}
	if r := as(ro, "exec", "box", "--", "true"); r.code != 1 || !strings.Contains(r.stderr, "read-only") {
		t.Fatalf("exec with a read-only token: %+v", r)
	}
	ls := d.must("token", "ls")
	if !strings.Contains(ls, "sandbox:box") || !strings.Contains(ls, "read-only") || !strings.Contains(ls, "EXPIRES") {
		t.Fatalf("token ls:\n%s", ls)
	}
	// box's token is for that sandbox, not a later one of the same name.
	d.must("rm", "box")
	d.must("create", "--name", "box")
	if r := as(box, "exec", "box", "--", "true"); r.code != 1 || !strings.Contains(r.stderr, "earlier sandbox") {
		t.Fatalf("exec in a new box with the old box's token: %+v", r)
	}
}

func mustID(t *testing.T, d *daemon, name string) string {
	t.Helper()
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(d.must("inspect", name, "--json")), &sb); err != nil {
		t.Fatal(err)
	}
	return sb.ID
}
