package cli

import (
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/runcbin"
)

// nook info names the runc in use and every advisory it lacks the fix for.
func TestPrintRunc(t *testing.T) {
	var b strings.Builder
	old := &api.RuncInfo{Path: "/usr/sbin/runc", Version: "1.1.5+ds1", Commit: "1.1.5+ds1-1+deb12u1", Spec: "1.0.2-dev", Libseccomp: "2.5.4",
		Advisories: runcbin.Check("1.1.5+ds1", nil, "")}
	printRunc(&b, old)
	out := b.String()
	for _, want := range []string{"runc: /usr/sbin/runc 1.1.5+ds1 (commit 1.1.5+ds1-1+deb12u1, spec 1.0.2-dev, libseccomp 2.5.4)",
		"AFFECTED CVE-2025-31133 (high, GHSA-9493-h29p-rfm2)", "AFFECTED CVE-2025-52565", "AFFECTED CVE-2025-52881", "make deps builds a fixed runc"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	b.Reset()
	printRunc(&b, &api.RuncInfo{Path: runcbin.DefaultPath, Version: "1.5.2", Advisories: runcbin.Check("1.5.2", nil, "")})
	if out := b.String(); strings.Contains(out, "AFFECTED") || !strings.Contains(out, "none open") {
		t.Errorf("a fixed runc:\n%s", out)
	}
	b.Reset()
	printRunc(&b, &api.RuncInfo{Path: "runc", Error: "runc not found", Advisories: runcbin.Check("", nil, "")})
	if out := b.String(); !strings.Contains(out, "error: runc not found") || !strings.Contains(out, "UNKNOWN CVE-2025-31133") {
		t.Errorf("no runc:\n%s", out)
	}
}

// nook info shows each warm pool's fill, target and how creates fared.
func TestPrintWarmPools(t *testing.T) {
	var b strings.Builder
	printWarmPools(&b, nil)
	if b.Len() != 0 {
		t.Errorf("no pools printed %q", b.String())
	}
	printWarmPools(&b, []api.WarmPool{
		{Isolation: "container", Key: "base/b1", Ready: 3, Starting: 2, Stopping: 4, Target: 10, Min: 2, Max: 16, Hits: 12, Misses: 8},
		{Isolation: "vm", Key: "base/b1@1,1073741824,\x1b[2J", Ready: 1, Target: 1, Min: 1, Max: 1},
	})
	out := b.String()
	for _, want := range []string{"warm pools:\n",
		"  container  base/b1  ready 3 of 10 (2 starting, 4 stopping, min 2, max 16), creates: 12 warm, 8 cold\n",
		"  vm         base/b1@1,1073741824,\\x1b[2J  ready 1 of 1 (0 starting, min 1, max 1), creates: 0 warm, 0 cold\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}
