package runcbin

import (
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
)

const debianVersion = `runc version 1.1.5+ds1
commit: 1.1.5+ds1-1+deb12u1
spec: 1.0.2-dev
go: go1.19.8
libseccomp: 2.5.4
`

func TestParseVersion(t *testing.T) {
	v, err := ParseVersion(debianVersion)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Version{Version: "1.1.5+ds1", Commit: "1.1.5+ds1-1+deb12u1", Spec: "1.0.2-dev", Libseccomp: "2.5.4"}); v != want {
		t.Fatalf("got %+v, want %+v", v, want)
	}
	v, err = ParseVersion("runc version 1.5.2\ncommit: v1.5.2\nspec: 1.3.0\ngo: go1.26.8\nlibseccomp: 2.5.4\nlibpathrs: 0.2.6\n")
	if err != nil || v.Version != "1.5.2" || v.Commit != "v1.5.2" || v.Spec != "1.3.0" {
		t.Fatalf("got %+v, %v", v, err)
	}
	for _, bad := range []string{"", "crun version 1.8.1\n", "runc version \n", "runc version 1.1 extra words\n", "\nrunc version 1.1.5"} {
		if v, err := ParseVersion(bad); err == nil {
			t.Errorf("ParseVersion(%q) = %+v, want an error", bad, v)
		}
	}
}

func TestSemver(t *testing.T) {
	for in, want := range map[string]string{
		"1.5.2":                      "v1.5.2",
		"1.4.0-rc.3":                 "v1.4.0-rc.3",
		"1.0.0-rc93":                 "v1.0.0-rc.93",
		"1.1.5+ds1":                  "v1.1.5",
		"1.1.12-0ubuntu2~22.04.1":    "v1.1.12",
		"v1.3.3":                     "v1.3.3",
		"01.02.03":                   "v1.2.3",
		"1.2":                        "",
		"garbage":                    "",
		"99999999999.0.0":            "",
		"1.2.3456789012345678901234": "",
		"1.2.3.4":                    "",
	} {
		if got := Semver(in); got != want {
			t.Errorf("Semver(%q) = %q, want %q", in, got, want)
		}
	}
}

// status returns the status Check gives advisory id for version v.
func status(t *testing.T, v, id string, patched map[string]bool) string {
	t.Helper()
	for _, a := range Check(v, patched, "a changelog") {
		if a.ID == id {
			return a.Status
		}
	}
	t.Fatalf("no advisory %s", id)
	return ""
}

func TestCheck(t *testing.T) {
	const nov = "CVE-2025-31133" // the November 2025 advisories share their fixed releases
	for _, c := range []struct {
		version, id, want string
	}{
		{"1.1.5", nov, api.AdvisoryAffected},
		{"1.1.5+ds1", "CVE-2025-52565", api.AdvisoryAffected},
		{"1.1.14", "CVE-2025-52881", api.AdvisoryAffected},
		{"1.0.0-rc93", nov, api.AdvisoryAffected},
		{"1.2.7", nov, api.AdvisoryAffected},
		{"1.2.8", nov, api.AdvisoryFixed},
		{"1.2.8", "CVE-2025-52881", api.AdvisoryFixed},
		{"1.3.2", nov, api.AdvisoryAffected},
		{"1.3.3", nov, api.AdvisoryFixed},
		{"1.3.3", "CVE-2025-52565", api.AdvisoryFixed},
		{"1.4.0-rc.2", nov, api.AdvisoryAffected},
		{"1.4.0-rc.3", nov, api.AdvisoryFixed},
		{"1.4.0", nov, api.AdvisoryFixed},
		{"1.5.0-rc.1", nov, api.AdvisoryFixed}, // a line newer than every fixed one
		{"2.0.0", nov, api.AdvisoryFixed},
		// The low-severity /dev symlink one: fixed later, and never in 1.2.
		{"1.2.8", "CVE-2026-41579", api.AdvisoryAffected},
		{"1.3.3", "CVE-2026-41579", api.AdvisoryAffected},
		{"1.3.6", "CVE-2026-41579", api.AdvisoryFixed},
		{"1.4.2", "CVE-2026-41579", api.AdvisoryAffected},
		{"1.4.3", "CVE-2026-41579", api.AdvisoryFixed},
		{"1.5.0-rc.2", "CVE-2026-41579", api.AdvisoryAffected},
		{"1.5.0-rc.3", "CVE-2026-41579", api.AdvisoryFixed},
		{"1.5.2", "CVE-2026-41579", api.AdvisoryFixed},
		{"garbage", nov, api.AdvisoryUnknown},
		{"", nov, api.AdvisoryUnknown},
	} {
		if got := status(t, c.version, c.id, nil); got != c.want {
			t.Errorf("%s against %s: %s, want %s", c.version, c.id, got, c.want)
		}
	}
	// A distribution's changelog naming the CVE counts as fixed, whatever the version.
	if got := status(t, "1.1.5+ds1", nov, map[string]bool{nov: true}); got != api.AdvisoryFixed {
		t.Errorf("1.1.5 patched for %s: %s", nov, got)
	}
	if got := status(t, "1.1.5+ds1", "CVE-2025-52881", map[string]bool{nov: true}); got != api.AdvisoryAffected {
		t.Errorf("1.1.5 patched for another CVE: %s", got)
	}
	// Check hands out copies: changing one does not change the table.
	a := Check("1.5.2", nil, "")
	a[0].FixedIn[0] = "9.9.9"
	if Advisories[0].FixedIn[0] == "9.9.9" {
		t.Fatal("Check returned the table's own FixedIn")
	}
}

func writeGz(t *testing.T, text string) string {
	t.Helper()
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	zw.Write([]byte(text))
	zw.Close()
	p := filepath.Join(t.TempDir(), "changelog.Debian.gz")
	if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDebianPatched(t *testing.T) {
	const changelog = `runc (1.1.5+ds1-1+deb12u2) bookworm-security; urgency=high

  * CVE-2025-31133: masked paths
  * CVE-2025-52565, CVE-2025-52881: /dev/console and procfs writes

 -- Someone <someone@debian.org>  Mon, 01 Dec 2025 00:00:00 +0000

runc (1.1.5+ds1-1+deb12u1) bookworm-security; urgency=high

  * CVE-2024-21626: leaked fds
`
	p := writeGz(t, changelog)
	cves, ok, err := DebianPatched(p, "1.1.5+ds1-1+deb12u2")
	if err != nil || !ok {
		t.Fatalf("ok=%v err=%v", ok, err)
	}
	for _, id := range []string{"CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881", "CVE-2024-21626"} {
		if !cves[id] {
			t.Errorf("%s not found", id)
		}
	}
	// Another build's changelog (the binary is not that package's) says nothing.
	if cves, ok, err := DebianPatched(p, "1.1.5+ds1-1+deb12u1"); ok || cves != nil || err != nil {
		t.Errorf("changelog of another version: %v %v %v", cves, ok, err)
	}
	if _, ok, err := DebianPatched(p, "v1.5.2"); ok || err != nil {
		t.Errorf("a runc not from Debian: %v %v", ok, err)
	}
	if _, ok, err := DebianPatched(filepath.Join(t.TempDir(), "none.gz"), "1.1.5+ds1-1+deb12u2"); ok || err != nil {
		t.Errorf("no changelog: %v %v", ok, err)
	}
	notGz := filepath.Join(t.TempDir(), "bad.gz")
	os.WriteFile(notGz, []byte("not gzip"), 0o644)
	if _, ok, err := DebianPatched(notGz, "1.1.5+ds1-1+deb12u2"); ok || err == nil {
		t.Errorf("a changelog that is not gzip: %v %v", ok, err)
	}
	// With it, Debian's 1.1.5 with those patches is fixed for them (and
	// still affected by the one the changelog does not name).
	cves, _, _ = DebianPatched(p, "1.1.5+ds1-1+deb12u2")
	got := map[string]string{}
	for _, a := range Check("1.1.5+ds1", cves, "Debian's changelog") {
		got[a.ID] = a.Status
	}
	if got["CVE-2025-31133"] != api.AdvisoryFixed || got["CVE-2025-52881"] != api.AdvisoryFixed || got["CVE-2026-41579"] != api.AdvisoryAffected {
		t.Errorf("statuses: %v", got)
	}
}

// TestProbe runs Probe on the runc Find finds: it must parse and give
// every advisory a status.
func TestProbe(t *testing.T) {
	path := Find()
	if _, err := exec.LookPath(path); err != nil {
		t.Skipf("no runc: %v (make deps installs it)", err)
	}
	info := Probe(context.Background(), path)
	if info.Error != "" || info.Version == "" || !filepath.IsAbs(info.Path) {
		t.Fatalf("%+v", info)
	}
	if len(info.Advisories) != len(Advisories) {
		t.Fatalf("%d advisories, want %d", len(info.Advisories), len(Advisories))
	}
	for _, a := range info.Advisories {
		if a.Status != api.AdvisoryFixed && a.Status != api.AdvisoryAffected {
			t.Errorf("%s: status %q for runc %s", a.ID, a.Status, info.Version)
		}
	}
	if path == DefaultPath && len(Affected(info)) > 0 {
		t.Errorf("the runc scripts/runc.sh built (%s) has advisories against it: %v", info.Version, Affected(info))
	}
	if bad := Probe(context.Background(), filepath.Join(t.TempDir(), "no-runc")); bad.Error == "" || bad.Advisories[0].Status != api.AdvisoryUnknown {
		t.Errorf("a missing runc: %+v", bad)
	}
}

func FuzzParseVersion(f *testing.F) {
	f.Add(debianVersion)
	f.Add("runc version 1.5.2\ncommit: v1.5.2\nspec: 1.3.0\n")
	f.Add("runc version 1.4.0-rc.2\n")
	f.Add("runc version 1.0.0-rc93\ncommit: x:y:z\n")
	f.Add("garbage")
	f.Fuzz(func(t *testing.T, out string) {
		v, err := ParseVersion(out)
		if err != nil {
			return
		}
		if v.Version == "" || strings.ContainsAny(v.Version, " \t\n") {
			t.Fatalf("version %q from %q", v.Version, out)
		}
		sv := Semver(v.Version)
		if sv != "" && Semver(sv) != sv {
			t.Fatalf("Semver not stable: %q -> %q -> %q", v.Version, sv, Semver(sv))
		}
		for _, a := range Check(v.Version, nil, "") {
			switch a.Status {
			case api.AdvisoryFixed, api.AdvisoryAffected:
				if sv == "" {
					t.Fatalf("%s decided for an unparsable version %q", a.ID, v.Version)
				}
			case api.AdvisoryUnknown:
				if sv != "" {
					t.Fatalf("%s unknown for %q (%s)", a.ID, v.Version, sv)
				}
			default:
				t.Fatalf("status %q", a.Status)
			}
		}
	})
}
