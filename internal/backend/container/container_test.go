package container

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/core/conformance"
	"github.com/nookhq/nook/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

func newTestBackend(t *testing.T) (*Backend, conformance.Harness) {
	return newTestBackendPool(t, 0)
}

func newTestBackendPool(t *testing.T, warm int) (*Backend, conformance.Harness) {
	t.Helper()
	return newTestBackendPoolMax(t, warm, 0)
}

// newTestBackendPoolMax: a warm pool of warm containers per template,
// growing to warmMax after bursts.
func newTestBackendPoolMax(t *testing.T, warm, warmMax int) (*Backend, conformance.Harness) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireRunc(t)
	tpls, tplID := testutil.BaseTemplate(t)
	root := filepath.Join(testutil.TempRoot(t), testutil.RandomName("c"))
	res := testutil.HostResources{
		StateDir:     filepath.Join(root, "sandboxes"),
		RuncRoot:     filepath.Join(root, "runc"),
		CgroupParent: testutil.RandomName("nook-test-"),
	}
	testutil.CleanupCgroupParent(t, res.CgroupParent)
	b := New(Config{
		RuncRoot: res.RuncRoot, StateDir: res.StateDir, AgentBinary: testutil.AgentBinary(t),
		CgroupParent: res.CgroupParent, TemplateRootfs: tpls.Rootfs, Log: slog.New(slog.DiscardHandler), WarmPool: warm,
		WarmPoolMax: warmMax,
	})
	t.Cleanup(func() {
		if err := b.Shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if entries, _ := os.ReadDir(res.StateDir); len(entries) > 0 {
			t.Errorf("%d sandbox directories left after shutdown", len(entries))
		}
	})
	if ok, why, _ := b.Available(context.Background()); !ok {
		t.Fatalf("container backend unavailable: %s", why)
	}
	return b, conformance.Harness{Backend: b, TemplateID: tplID, Leaks: res.Leaks}
}

func TestConformance(t *testing.T) {
	_, h := newTestBackend(t)
	conformance.Run(t, h)
}

// The whole suite again with a warm pool: claimed containers behave like fresh ones.
func TestConformanceWarmPool(t *testing.T) {
	b, h := newTestBackendPool(t, 2)
	b.Prewarm(&core.Sandbox{TemplateID: h.TemplateID})
	waitWarm(t, b, h.TemplateID, 2)
	conformance.Run(t, h)
}

func waitWarm(t *testing.T, b *Backend, templateID string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := b.pool.Ready(templateID)
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("warm pool has %d of %d containers", got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// After a burst of takes the pool refills to the burst (its cap here), in
// parallel, and reports it; Shutdown leaves nothing (the cleanup checks).
func TestWarmPoolGrowsAfterBurst(t *testing.T) {
	b, h := newTestBackendPoolMax(t, 1, 4)
	b.Prewarm(&core.Sandbox{TemplateID: h.TemplateID})
	waitWarm(t, b, h.TemplateID, 1)
	hits := 0
	for range 6 {
		if _, ok := b.TakeWarm(&core.Sandbox{TemplateID: h.TemplateID}); ok {
			hits++
		}
	}
	if hits != 1 {
		t.Fatalf("%d of 6 takes found a warm container, with 1 ready", hits)
	}
	waitWarm(t, b, h.TemplateID, 4)
	pools := b.WarmPools()
	want := api.WarmPool{Isolation: api.IsolationContainer, Key: h.TemplateID, Ready: 4, Target: 4, Min: 1, Max: 4, Hits: 1, Misses: 5}
	if len(pools) != 1 || pools[0] != want {
		t.Fatalf("warm pools %+v, want %+v", pools, want)
	}
}

// A claimed warm container gets the sandbox's own limits and hostname.
func TestWarmClaimAppliesIdentity(t *testing.T) {
	b, h := newTestBackendPool(t, 1)
	b.Prewarm(&core.Sandbox{TemplateID: h.TemplateID})
	waitWarm(t, b, h.TemplateID, 1)
	id, ok := b.TakeWarm(&core.Sandbox{TemplateID: h.TemplateID})
	if !ok {
		t.Fatal("no warm container")
	}
	// conformance.Create takes the next one; this one must be claimed by ID.
	sb := conformance.NewSandbox("claimed", h.TemplateID)
	sb.ID = id
	sb.MemoryBytes, sb.PidsLimit, sb.CPUs = 256<<20, 77, 0.5
	if err := b.Create(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	defer b.Destroy(context.Background(), sb.ID)
	mem, _ := cgroups.Read(b.cfg.CgroupParent, id, "memory.limit_in_bytes", "memory.max")
	pids, _ := cgroups.Read(b.cfg.CgroupParent, id, "pids.max")
	quota, _ := cgroups.Read(b.cfg.CgroupParent, id, "cpu.cfs_quota_us", "cpu.max")
	if mem != "268435456" || pids != "77" || firstField(quota) != "50000" {
		t.Fatalf("limits after claim: memory %s pids %s quota %s", mem, pids, quota)
	}
	var st state
	json.Unmarshal(sb.BackendState, &st)
	uts, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/uts", st.PID))
	host, _ := os.Readlink("/proc/1/ns/uts")
	if uts == "" || uts == host {
		t.Fatalf("container's UTS namespace %q is the host's (%q)", uts, host)
	}
	// No thread of this process was left in the container's namespace.
	threads, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/ns/uts", os.Getpid()))
	for _, th := range threads {
		if ns, _ := os.Readlink(th); ns == uts {
			t.Fatalf("thread %s stayed in the sandbox's UTS namespace", th)
		}
	}
	if h, _ := os.Hostname(); h == "claimed" {
		t.Fatal("setting the sandbox's hostname changed the host's")
	}
}

// firstField is a v2 cpu.max's quota ("50000 100000"), or a v1 value as it is.
func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return s
}

// The cgroup limits a sandbox was created with are the ones it lives under.
func TestLimitsApply(t *testing.T) {
	b, h := newTestBackend(t)
	s := conformance.Create(t, h, "limits")
	// Inside, the sandbox's cgroup namespace: v1 hierarchies, or v2's
	// files at the root of /sys/fs/cgroup.
	in := func(v1, v2 string) string {
		return strings.TrimSpace(s.Sh(t, "cat /sys/fs/cgroup/"+v1+" 2>/dev/null || cat /sys/fs/cgroup/"+v2))
	}
	mem := in("memory/memory.limit_in_bytes", "memory.max")
	pids := in("pids/pids.max", "pids.max")
	quota := firstField(in("cpu/cpu.cfs_quota_us", "cpu.max"))
	if mem != "536870912" || pids != "512" || quota != "100000" {
		t.Fatalf("memory %s pids %s cpu quota %s", mem, pids, quota)
	}
	// The pids limit holds: a fork bomb stays in its box.
	s.Exec(t, &agent.ExecRequest{Argv: []string{"sh", "-c", "for i in $(seq 600); do sleep 120 & done 2>/dev/null; true"}})
	cur, err := cgroups.Read(b.cfg.CgroupParent, s.ID, "pids.current")
	if got, _ := strconv.Atoi(cur); err != nil || got > 512 || got < 500 {
		t.Fatalf("pids.current %s (%v), want close to the limit of 512", cur, err)
	}
}

// The sandbox runs with the runtime's default confinement: no dangerous
// capabilities, seccomp on, read-only /sys, and no way to mount.
func TestConfinement(t *testing.T) {
	_, h := newTestBackend(t)
	s := conformance.Create(t, h, "confined")
	status := s.Sh(t, "grep -E '^(CapEff|Seccomp):' /proc/self/status")
	if !strings.Contains(status, "Seccomp:\t2") {
		t.Fatalf("seccomp not in filter mode: %q", status)
	}
	const capSysAdmin = 21
	var capEff uint64
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:\t"); ok {
			if err := json.Unmarshal([]byte(`"`+v+`"`), new(string)); err == nil {
				for _, c := range v {
					capEff <<= 4
					switch {
					case c >= '0' && c <= '9':
						capEff |= uint64(c - '0')
					case c >= 'a' && c <= 'f':
						capEff |= uint64(c-'a') + 10
					}
				}
			}
		}
	}
	if capEff&(1<<capSysAdmin) != 0 || capEff == 0 {
		t.Fatalf("effective capabilities %x include CAP_SYS_ADMIN (or none were parsed)", capEff)
	}
	for _, escape := range []string{
		"mount -t tmpfs none /mnt",
		"echo 1 > /proc/sys/kernel/sysrq",
		"touch /sys/kernel/x",
		"touch /.nook/nook-agent",
	} {
		r, err := s.Exec(t, &agent.ExecRequest{Argv: []string{"sh", "-c", escape}})
		if err != nil || r.Exit.ExitCode == 0 {
			t.Errorf("%q succeeded inside the sandbox (%v)", escape, err)
		}
	}
}

// A sandbox whose init dies is reported stopped, and destroy still cleans up.
func TestStatusAfterInitDies(t *testing.T) {
	b, h := newTestBackend(t)
	s := conformance.Create(t, h, "dies")
	var st state
	if err := json.Unmarshal(s.BackendState, &st); err != nil || st.PID == 0 {
		t.Fatalf("backend state %s: %v", s.BackendState, err)
	}
	if rs, _ := b.Status(context.Background(), s.Sandbox); rs.State != core.RuntimeRunning {
		t.Fatalf("status %v", rs.State)
	}
	syscall.Kill(st.PID, syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for {
		rs, _ := b.Status(context.Background(), s.Sandbox)
		if rs.State == core.RuntimeStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status still %v after init was killed", rs.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A create that fails half-way leaves nothing behind.
func TestFailedCreateLeavesNothing(t *testing.T) {
	b, h := newTestBackend(t)
	sb := conformance.NewSandbox("bad-agent", h.TemplateID)
	b.cfg.AgentBinary = "/nonexistent/nook-agent"
	if err := b.Create(context.Background(), sb); err == nil {
		b.Destroy(context.Background(), sb.ID)
		t.Fatal("create with a missing agent binary succeeded")
	}
	if leaks := h.Leaks(sb.ID); len(leaks) > 0 {
		t.Fatalf("failed create left: %v", leaks)
	}
	sb = conformance.NewSandbox("bad-template", "base/nonexistent")
	if err := b.Create(context.Background(), sb); err == nil {
		t.Fatal("create from a missing template build succeeded")
	}
	if _, err := os.Stat(b.dir(sb.ID)); err == nil {
		t.Fatal("failed create left its directory")
	}
}
