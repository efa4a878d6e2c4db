// Package runcbin finds the runc binary nook runs and tells what it is:
// its version, as `runc --version` prints it, and the known security
// advisories against it.
//
// Debian bookworm's runc (1.1.5+ds1-1+deb12u1) lacks the fixes for the
// runc advisories of November 2025 (CVE-2025-31133, CVE-2025-52565,
// CVE-2025-52881: container escapes through mount races), so
// scripts/runc.sh builds a fixed runc from its Go module into
// DefaultPath, and Find prefers that one. The container backend, the
// tests' harness and the benchmarks all find runc through Find.
//
// An advisory is fixed in a runc whose version is at least the fixed
// release of its minor line, or whose minor line is newer than every
// fixed release (it branched after the fix). A distribution's runc keeps
// its old version and carries patches: Debian's prints its package
// version as the commit, and when /usr/share/doc/runc/changelog.Debian.gz
// is that package's changelog, every CVE ID it names counts as fixed.
package runcbin

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/semver"

	"github.com/nookhq/nook/api"
)

// DefaultPath is where scripts/runc.sh installs the runc nook builds.
const DefaultPath = "/usr/local/lib/nook/runc/runc"

// DebianChangelog is where Debian's runc package keeps its changelog.
const DebianChangelog = "/usr/share/doc/runc/changelog.Debian.gz"

// Find returns the runc to run: DefaultPath where scripts/runc.sh
// installed it, else "runc" (looked up in PATH when run).
func Find() string {
	if st, err := os.Stat(DefaultPath); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return DefaultPath
	}
	return "runc"
}

// Version is what `runc --version` prints.
type Version struct {
	Version    string // e.g. 1.5.2, or Debian's 1.1.5+ds1
	Commit     string // Debian's runc prints its package version here, e.g. 1.1.5+ds1-1+deb12u1
	Spec       string // the OCI runtime spec version
	Libseccomp string
}

// maxVersionOutput bounds what ParseVersion reads.
const maxVersionOutput = 64 << 10

// ParseVersion parses the output of `runc --version`:
//
//	runc version 1.5.2
//	commit: v1.5.2
//	spec: 1.3.0
//	go: go1.26.8
//	libseccomp: 2.5.4
//
// Lines it does not know are skipped; the first line is required.
func ParseVersion(out string) (Version, error) {
	if len(out) > maxVersionOutput {
		return Version{}, fmt.Errorf("runc --version printed %d bytes, more than a version", len(out))
	}
	var v Version
	for i, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if i == 0 {
			rest, ok := strings.CutPrefix(line, "runc version ")
			rest = strings.TrimSpace(rest)
			if !ok || rest == "" || strings.ContainsAny(rest, " \t") {
				return Version{}, fmt.Errorf("runc --version did not start with \"runc version X\": %q", firstLine(out))
			}
			v.Version = rest
			continue
		}
		key, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		switch key {
		case "commit":
			v.Commit = val
		case "spec":
			v.Spec = val
		case "libseccomp":
			v.Libseccomp = val
		}
	}
	return v, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	return s
}

// runcVersion matches a runc release at the start of a version string:
// 1.5.2, 1.4.0-rc.3, 1.0.0-rc93, 1.1.5+ds1 (Debian), 1.1.12-0ubuntu2.
var runcVersion = regexp.MustCompile(`^v?(\d{1,9})\.(\d{1,9})\.(\d{1,9})(?:-rc\.?(\d{1,9}))?(?:[^\d.]|$)`)

// Semver returns runc version v as a semantic version for
// golang.org/x/mod/semver ("v1.4.0-rc.3"), or "" if v is not a runc
// release. A distribution's suffix (Debian's +ds1) is dropped.
func Semver(v string) string {
	m := runcVersion.FindStringSubmatch(v)
	if m == nil {
		return ""
	}
	n := make([]uint64, 0, 4)
	for _, s := range m[1:] {
		if s == "" {
			continue
		}
		x, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return ""
		}
		n = append(n, x)
	}
	sv := fmt.Sprintf("v%d.%d.%d", n[0], n[1], n[2])
	if len(n) == 4 {
		sv += fmt.Sprintf("-rc.%d", n[3])
	}
	return sv
}

// Advisories are the known security advisories against runc, newest
// first. FixedIn lists the first fixed release of each minor line that
// got the fix; lines older than all of them never did.
var Advisories = []api.RuncAdvisory{
	{
		ID: "CVE-2026-41579", GHSA: "GHSA-xjvp-4fhw-gc47", Severity: "low",
		Summary: "an image with a /dev symlink gets limited writes to host files while the rootfs is prepared",
		FixedIn: []string{"1.3.6", "1.4.3", "1.5.0-rc.3"},
	},
	{
		ID: "CVE-2025-52881", GHSA: "GHSA-cgrx-mc8f-2prm", Severity: "high",
		Summary: "container escape: runc's writes to /proc (LSM labels, sysctls) redirected through racing shared mounts",
		FixedIn: []string{"1.2.8", "1.3.3", "1.4.0-rc.3"},
	},
	{
		ID: "CVE-2025-52565", GHSA: "GHSA-qw9x-cqr3-wc7r", Severity: "high",
		Summary: "container escape: the /dev/console bind mount raced to mount over a masked or read-only path",
		FixedIn: []string{"1.2.8", "1.3.3", "1.4.0-rc.3"},
	},
	{
		ID: "CVE-2025-31133", GHSA: "GHSA-9493-h29p-rfm2", Severity: "high",
		Summary: "container escape: a masked path's /dev/null bind mount raced to mount a procfs file read-write",
		FixedIn: []string{"1.2.8", "1.3.3", "1.4.0-rc.3"},
	},
}

// fixedIn reports whether release sv (a Semver) has a fix first released
// in fixedIn: sv is at least the fixed release of its minor line, or its
// line is newer than every line in fixedIn.
func fixedIn(sv string, fixed []string) bool {
	line := semver.MajorMinor(sv)
	newest := ""
	for _, f := range fixed {
		fv := Semver(f)
		fl := semver.MajorMinor(fv)
		if fl == line {
			return semver.Compare(sv, fv) >= 0
		}
		if newest == "" || semver.Compare(fl, newest) > 0 {
			newest = fl
		}
	}
	return newest != "" && semver.Compare(line, newest) > 0
}

// Check returns every advisory with its status for runc version v.
// patched holds the CVE IDs a distribution's changelog for this build
// names (nil: none), and patchedBy says whose ("Debian's changelog for
// 1.1.5+ds1-1+deb12u1").
func Check(v string, patched map[string]bool, patchedBy string) []api.RuncAdvisory {
	sv := Semver(v)
	out := make([]api.RuncAdvisory, 0, len(Advisories))
	for _, a := range Advisories {
		a.FixedIn = append([]string(nil), a.FixedIn...)
		fixedList := strings.Join(a.FixedIn, ", ")
		switch {
		case patched[a.ID]:
			a.Status, a.Why = api.AdvisoryFixed, patchedBy+" names it"
		case sv == "":
			a.Status, a.Why = api.AdvisoryUnknown, fmt.Sprintf("runc version %q is not one nook can compare; the fix is in %s", v, fixedList)
		case fixedIn(sv, a.FixedIn):
			a.Status = api.AdvisoryFixed
		default:
			a.Status, a.Why = api.AdvisoryAffected, fmt.Sprintf("fixed in %s; this is %s", fixedList, v)
		}
		out = append(out, a)
	}
	return out
}

var (
	debianEntry = regexp.MustCompile(`^runc \(([^()\s]+)\)`)
	cveID       = regexp.MustCompile(`CVE-\d{4}-\d{4,7}`)
)

// maxChangelog bounds how much of a changelog is read (bookworm's is 9 KiB gzipped, 30 KiB unpacked).
const maxChangelog = 4 << 20

// DebianPatched reads a Debian changelog.Debian.gz and returns the CVE
// IDs it names, if its newest entry is for package version pkgVersion
// (what Debian's runc prints as its commit). ok is false when the
// changelog is not that build's (another package version, or none).
func DebianPatched(path, pkgVersion string) (cves map[string]bool, ok bool, err error) {
	if pkgVersion == "" {
		return nil, false, nil
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, false, fmt.Errorf("read %s: %w", path, err)
	}
	defer zr.Close()
	sc := bufio.NewScanner(io.LimitReader(zr, maxChangelog))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	cves = map[string]bool{}
	first := true
	for sc.Scan() {
		line := sc.Text()
		if first {
			m := debianEntry.FindStringSubmatch(line)
			if m == nil || m[1] != pkgVersion {
				return nil, false, nil
			}
			first = false
			continue
		}
		for _, id := range cveID.FindAllString(line, -1) {
			cves[id] = true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, false, fmt.Errorf("read %s: %w", path, err)
	}
	return cves, !first, nil
}

// Probe describes the runc at path ("runc": looked up in PATH): its
// version and the status of every known advisory against it.
func Probe(ctx context.Context, path string) api.RuncInfo {
	info := api.RuncInfo{Path: path}
	fail := func(err error) api.RuncInfo {
		info.Error = err.Error()
		info.Advisories = Check("", nil, "")
		return info
	}
	abs, err := exec.LookPath(path)
	if err != nil {
		return fail(fmt.Errorf("runc not found: %w (make deps installs it)", err))
	}
	info.Path = abs
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, abs, "--version").Output()
	if err != nil {
		return fail(fmt.Errorf("%s --version: %w", abs, err))
	}
	v, err := ParseVersion(string(out))
	if err != nil {
		return fail(err)
	}
	info.Version, info.Commit, info.Spec, info.Libseccomp = v.Version, v.Commit, v.Spec, v.Libseccomp
	patched, ok, err := DebianPatched(DebianChangelog, v.Commit)
	if err != nil {
		info.Error = err.Error()
	}
	by := ""
	if ok {
		by = "Debian's changelog for " + v.Commit
	}
	info.Advisories = Check(v.Version, patched, by)
	return info
}

// Affected returns the IDs of the advisories whose status is not fixed.
func Affected(info api.RuncInfo) []string {
	var ids []string
	for _, a := range info.Advisories {
		if a.Status != api.AdvisoryFixed {
			ids = append(ids, a.ID)
		}
	}
	return ids
}

// EnvWithCRIU returns the daemon's environment with dir (a directory
// holding the criu binary to use) first in PATH. runc 1.1 ran the CRIU
// its --criu flag named; 1.2 and 1.3 ignore that flag and run the criu
// in PATH, and 1.4 dropped it: the PATH works with all of them.
func EnvWithCRIU(dir string) []string {
	env := os.Environ()
	for i, kv := range env {
		if p, ok := strings.CutPrefix(kv, "PATH="); ok {
			env[i] = "PATH=" + dir + string(os.PathListSeparator) + p
			return env
		}
	}
	return append(env, "PATH="+dir+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
}
