package vm

import (
	"context"
	"fmt"
	"github.com/nookhq/nook/internal/agent"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/core/conformance"
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

func newTestBackend(t *testing.T, cold bool) (*Backend, conformance.Harness) {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireCommand(t, "qemu-system-x86_64", "qemu-system-x86")
	testutil.RequireCommand(t, "qemu-img", "qemu-utils")
	tpls, tplID := testutil.BaseTemplate(t)
	root := filepath.Join(testutil.TempRoot(t), testutil.RandomName("v"))
	res := testutil.HostResources{StateDir: filepath.Join(root, "sandboxes"), CgroupParent: testutil.RandomName("nook-test-")}
	testutil.CleanupCgroupParent(t, res.CgroupParent)
	b := New(Config{
		StateDir: res.StateDir, CacheDir: cacheDir(), AgentBinary: testutil.AgentBinary(t),
		CgroupParent: res.CgroupParent, TemplateRootfs: tpls.Rootfs, ColdBoot: cold,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	t.Cleanup(func() {
		if entries, _ := os.ReadDir(res.StateDir); len(entries) > 0 {
			t.Errorf("%d sandbox directories left", len(entries))
		}
	})
	if ok, why, _ := b.Available(context.Background()); !ok {
		t.Fatalf("vm backend unavailable: %s", why)
	}
	return b, conformance.Harness{Backend: b, TemplateID: tplID, Leaks: res.Leaks}
}

func TestGuestKernel(t *testing.T) {
	b, h := newTestBackend(t, false)
	start := time.Now()
	sb := conformance.Create(t, h, "vm-uname")
	t.Logf("create + agent: %s", time.Since(start))
	for i := 0; i < 3; i++ {
		start := time.Now()
		sb := conformance.Create(t, h, fmt.Sprintf("vm-again-%d", i))
		t1 := time.Now()
		sb.Sh(t, "true")
		t2 := time.Now()
		sb.Sh(t, "true")
		t3 := time.Now()
		sb.Exec(t, &agent.ExecRequest{Argv: []string{"/bin/true"}})
		t4 := time.Now()
		sb.Exec(t, &agent.ExecRequest{Argv: []string{"/bin/true"}})
		t.Logf("direct true %s, %s", t4.Sub(t3), time.Since(t4))
		t.Log(sb.Sh(t, "cat /sys/devices/system/clocksource/clocksource0/current_clocksource /sys/devices/system/clocksource/clocksource0/available_clocksource; nproc; a=$(date +%s%N); /bin/true; /bin/true; /bin/true; /bin/true; /bin/true; b=$(date +%s%N); echo in-guest 5x true: $(( (b-a)/1000000 ))ms; dmesg | grep -i -E 'tsc|clocksource' | tail -5"))
		t.Logf("create + agent: %s, exec %s, %s, %s", t1.Sub(start), t2.Sub(t1), t3.Sub(t2), time.Since(t3))
	}
	out := sb.Sh(t, "uname -r")
	if !strings.Contains(out, b.kernel.Release) {
		t.Fatalf("uname -r = %q, want the guest kernel %s", out, b.kernel.Release)
	}
}
