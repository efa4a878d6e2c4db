// Package testutil holds what nook's privileged tests share: capability
// checks that skip with a message saying what is missing, the agent binary,
// the shared base template, and a check that a sandbox left nothing behind.
package testutil

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/runcbin"
	"github.com/nookhq/nook/internal/template"
)

var (
	tmpRoot   string
	tmpOnce   sync.Once
	agentOnce sync.Once
	agentPath string
	agentErr  error
)

// Main runs a package's tests and removes what testutil created for them.
func Main(m *testing.M) {
	code := m.Run()
	if tmpRoot != "" {
		os.RemoveAll(tmpRoot)
	}
	os.Exit(code)
}

// TempRoot is a directory for the whole test binary, removed by Main. Paths
// under it are short enough for unix sockets.
func TempRoot(t testing.TB) string {
	tmpOnce.Do(func() {
		var err error
		tmpRoot, err = os.MkdirTemp("", "nooktest")
		if err == nil {
			// Searchable (not listable) by others: a user-namespaced
			// container's root passes it on the way to its rootfs.
			err = os.Chmod(tmpRoot, 0o711)
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	return tmpRoot
}

// RequireRoot skips a test that needs root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (namespaces, mounts, cgroups); make test runs it as root")
	}
}

// RequireRunc skips a test when there is no runc, and returns the one
// nook runs (runcbin.Find: scripts/runc.sh's build, else runc in PATH).
func RequireRunc(t testing.TB) string {
	t.Helper()
	path := runcbin.Find()
	if _, err := exec.LookPath(path); err != nil {
		Missing(t, "runc is not installed (make deps builds it, or apt-get install runc): %v", err)
	}
	return path
}

// RequireCommand skips a test when a host tool is missing (under CI=true
// it fails: make deps installs every tool the tests use).
func RequireCommand(t testing.TB, name, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		Missing(t, "%s is not installed (apt-get install %s, or make deps)", name, pkg)
	}
}

// Missing skips a test whose capability is absent, saying which; under
// CI=true it fails instead, since CI runs make deps, which installs every
// capability the tests need (a skip there would hide a broken install).
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true and a capability make deps installs is missing: %s", msg)
	}
	t.Skip("skipping: " + msg)
}

// ModuleRoot is the repository's root directory.
func ModuleRoot(t testing.TB) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// Build builds a main package of this module (static, as shipped) into the test's temp root.
func Build(t testing.TB, pkg, name string) string {
	t.Helper()
	out := filepath.Join(TempRoot(t), "bin", name)
	cmd := exec.Command("go", "build", "-o", out, "./"+pkg)
	cmd.Dir = ModuleRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// AgentBinary returns a freshly built static nook-agent.
func AgentBinary(t testing.TB) string {
	t.Helper()
	agentOnce.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				agentErr = fmt.Errorf("%v", r)
			}
		}()
		agentPath = Build(t, "cmd/nook-agent", "nook-agent")
	})
	if agentErr != nil {
		t.Fatal(agentErr)
	}
	return agentPath
}

// TemplatesDir is the template store the tests share with `make run`
// (NOOK_TEST_TEMPLATES, else /var/lib/nook/templates): the base template
// is built once and reused.
func TemplatesDir() string {
	if d := os.Getenv("NOOK_TEST_TEMPLATES"); d != "" {
		return d
	}
	return "/var/lib/nook/templates"
}

// BaseTemplate returns the shared template store and the base template's
// build ID, building it first if it is missing.
func BaseTemplate(t testing.TB) (*template.Store, string) { return Template(t, "base") }

// Template returns the shared template store and the build ID of a
// template, building it first if it is missing.
func Template(t testing.TB, name string) (*template.Store, string) {
	t.Helper()
	RequireRoot(t)
	RequireCommand(t, "mmdebstrap", "mmdebstrap")
	st := template.NewStore(TemplatesDir(), slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	tpl, err := st.EnsureBuilt(ctx, name, &progress)
	if err != nil {
		t.Fatalf("%s template: %v\n%s", name, err, progress.String())
	}
	return st, tpl.ID
}

// RandomName returns a short random suffix for names that must not collide across test runs.
func RandomName(prefix string) string {
	b := make([]byte, 4)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// HostResources names where a daemon or backend keeps its host resources.
type HostResources struct {
	StateDir     string // per-sandbox directories
	RuncRoot     string
	CgroupParent string
}

// Leaks lists what sandbox id left on the host: processes whose root is
// inside its directory, mounts under it, loop devices backed by its
// files, its cgroups, its runc state and its files.
func (h HostResources) Leaks(id string) []string {
	var leaks []string
	dir := filepath.Join(h.StateDir, id)
	if _, err := os.Stat(dir); err == nil {
		leaks = append(leaks, "directory "+dir)
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(mi), "\n") {
			if strings.Contains(line, dir) {
				leaks = append(leaks, "mount "+line)
			}
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		if f, err := os.ReadFile(l); err == nil && strings.HasPrefix(strings.TrimSpace(string(f)), dir+"/") {
			leaks = append(leaks, "loop device "+strings.Split(l, "/")[3]+" on "+strings.TrimSpace(string(f)))
		}
	}
	for _, cg := range cgroups.Dirs(h.CgroupParent, id) {
		leaks = append(leaks, "cgroup "+cg)
	}
	if h.RuncRoot != "" {
		if _, err := os.Stat(filepath.Join(h.RuncRoot, id)); err == nil {
			leaks = append(leaks, "runc state "+filepath.Join(h.RuncRoot, id))
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/root")
	for _, p := range procs {
		if root, err := os.Readlink(p); err == nil && strings.HasPrefix(root, dir) {
			leaks = append(leaks, "process "+filepath.Dir(p)+" rooted at "+root)
		}
	}
	return leaks
}

// CleanupCgroupParent removes the (empty) parent cgroups a test's sandboxes used.
func CleanupCgroupParent(t testing.TB, parent string) {
	t.Cleanup(func() {
		for _, d := range cgroups.Dirs(parent, "") {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				t.Errorf("cgroup parent %s left behind: %v", d, err)
			}
		}
	})
}
