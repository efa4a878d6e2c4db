package container

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nookhq/nook/internal/runcbin"
	"github.com/nookhq/nook/internal/testutil"
)

// TestEscapeRuncAdvisories: where make deps built a fixed runc
// (scripts/runc.sh), the backend runs that one, not a runc lacking the
// fixes for known container escapes (bookworm's 1.1.5: CVE-2025-31133,
// CVE-2025-52565, CVE-2025-52881).
func TestEscapeRuncAdvisories(t *testing.T) {
	if _, err := os.Stat(runcbin.DefaultPath); err != nil {
		testutil.Missing(t, "no runc built by scripts/runc.sh (make deps): %v", err)
	}
	b := New(Config{StateDir: filepath.Join(t.TempDir(), "sandboxes")})
	info := runcbin.Probe(context.Background(), b.cfg.Runc)
	if info.Error != "" {
		t.Fatalf("runc %s: %s", b.cfg.Runc, info.Error)
	}
	if open := runcbin.Affected(info); len(open) > 0 {
		t.Fatalf("the backend runs %s (runc %s), which lacks the fixes for %v", info.Path, info.Version, open)
	}
}

// pathOf is the PATH in env.
func pathOf(env []string) string {
	for _, kv := range env {
		if p, ok := strings.CutPrefix(kv, "PATH="); ok {
			return p
		}
	}
	return ""
}

// runc from 1.4 on has no --criu flag: the CRIU to use reaches runc as the
// first directory of its PATH, under the name "criu".
func TestRuncEnvCRIU(t *testing.T) {
	root := t.TempDir()
	b := &Backend{cfg: Config{StateDir: filepath.Join(root, "sandboxes")}}
	if env := b.runcEnv(); env != nil {
		t.Fatalf("without CRIU the daemon's environment: %v", env)
	}
	b.cfg.CRIU = "/usr/local/lib/nook/criu/sbin/criu"
	if p := pathOf(b.runcEnv()); !strings.HasPrefix(p, "/usr/local/lib/nook/criu/sbin:") {
		t.Fatalf("PATH %q", p)
	}
	// Another name: a link named criu to it, in a directory of its own.
	other := filepath.Join(root, "criu-4.2")
	os.WriteFile(other, []byte("#!/bin/sh\n"), 0o755)
	b.cfg.CRIU = other
	for range 2 { // the second time finds the link in place
		p := pathOf(b.runcEnv())
		dir, _, _ := strings.Cut(p, ":")
		if got, err := os.Readlink(filepath.Join(dir, "criu")); err != nil || got != other {
			t.Fatalf("PATH %q: criu -> %q, %v", p, got, err)
		}
		if strings.HasPrefix(dir, b.cfg.StateDir) {
			t.Fatalf("the link's directory %s is in the state directory (a sandbox to List)", dir)
		}
	}
}
