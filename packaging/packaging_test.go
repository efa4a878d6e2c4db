package packaging

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nookhq/nook/internal/runcbin"
	"github.com/nookhq/nook/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// unitSettings reads a unit file's KEY=value lines, by section.
func unitSettings(t *testing.T, path string) map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = strings.Trim(line, "[]")
		default:
			k, v, _ := strings.Cut(line, "=")
			got[section+"."+k] = append(got[section+"."+k], v)
		}
	}
	return got
}

// The settings the service depends on: readiness through sd_notify,
// sandboxes that outlive the daemon, its limits.
func TestUnitSettings(t *testing.T) {
	got := unitSettings(t, "nook.service")
	for k, want := range map[string]string{
		"Service.Type":            "notify",
		"Service.ExecStart":       "/usr/local/bin/nook serve",
		"Service.Restart":         "on-failure",
		"Service.KillMode":        "process",
		"Service.Delegate":        "yes",
		"Service.TasksMax":        "infinity",
		"Service.OOMPolicy":       "continue",
		"Service.LimitNOFILE":     "524288",
		"Install.WantedBy":        "multi-user.target",
		"Unit.StartLimitBurst":    "3",
		"Service.TimeoutStartSec": "5min",
	} {
		if v := got[k]; len(v) != 1 || v[0] != want {
			t.Errorf("%s = %q, want %q", k, v, want)
		}
	}
	// systemd would remove /run/nook, runc's state of running
	// containers, at every stop; a mount namespace of the unit's own would
	// hide sandboxes' mounts from the host.
	for _, k := range []string{"Service.RuntimeDirectory", "Service.ProtectSystem", "Service.PrivateTmp", "Service.PrivateMounts", "Service.ProtectHome", "Service.NotifyAccess"} {
		if v, ok := got[k]; ok {
			t.Errorf("%s = %q: the unit must not set it", k, v)
		}
	}
}

// verify runs systemd-analyze verify on unit with its ExecStart binary
// replaced by bin (systemd-analyze checks that it exists), failing on any
// warning: a misspelt key or value is a warning, and exit status 0.
func verify(t *testing.T, unit, from, bin string) {
	t.Helper()
	testutil.RequireCommand(t, "systemd-analyze", "systemd")
	b, err := os.ReadFile(unit)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\nExecStart="+from+" ") {
		t.Fatalf("%s has no ExecStart=%s", unit, from)
	}
	tmp := filepath.Join(t.TempDir(), "nook.service")
	if err := os.WriteFile(tmp, []byte(strings.Replace(string(b), "\nExecStart="+from+" ", "\nExecStart="+bin+" ", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", tmp).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify %s (ExecStart %s): %v\n%s", unit, bin, err, out)
	}
}

// The unit as written (TestMakeInstall and TestDeb verify it as
// installed, with the binaries built): systemd-analyze needs ExecStart's
// file to exist and be executable, which this test's own binary is.
func TestUnitVerifies(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	verify(t, "nook.service", "/usr/local/bin/nook", self)
	// And the check catches a mistake.
	bad := filepath.Join(t.TempDir(), "nook.service")
	b, _ := os.ReadFile("nook.service")
	os.WriteFile(bad, []byte(strings.Replace(string(b), "KillMode=process", "KillMode=proces", 1)), 0o644)
	out, _ := exec.Command("systemd-analyze", "verify", bad).CombinedOutput()
	if !strings.Contains(string(out), "kill mode") {
		t.Errorf("systemd-analyze verify of a unit with KillMode=proces said %q", out)
	}
}

// makeIn runs make in the repository with args.
func makeIn(t *testing.T, args ...string) string {
	t.Helper()
	testutil.RequireCommand(t, "make", "make")
	cmd := exec.Command("make", append([]string{"--no-print-directory", "-C", testutil.ModuleRoot(t)}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// static reports whether the ELF file at path needs no loader.
func static(t *testing.T, path string) bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return !slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
}

// hasMode fails unless path has mode.
func hasMode(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != mode {
		t.Errorf("%s: mode %v, want %v", path, fi.Mode(), mode)
	}
}

func TestMakeInstall(t *testing.T) {
	build := t.TempDir()
	for _, tc := range []struct {
		args         []string
		bindir, unit string
	}{
		{nil, "/usr/local/bin", "/usr/local/lib/systemd/system"},
		{[]string{"PREFIX=/usr"}, "/usr/bin", "/usr/lib/systemd/system"},
	} {
		dest := t.TempDir()
		args := append([]string{"install", "DESTDIR=" + dest, "BUILDDIR=" + build}, tc.args...)
		makeIn(t, args...)
		// Again, over the first: an upgrade.
		makeIn(t, args...)
		for _, name := range []string{"nook", "nook-agent"} {
			hasMode(t, filepath.Join(dest, tc.bindir, name), 0o755)
		}
		// The daemon finds the agent beside nook; it must be static.
		if !static(t, filepath.Join(dest, tc.bindir, "nook-agent")) {
			t.Errorf("the installed nook-agent is dynamically linked")
		}
		unit := filepath.Join(dest, tc.unit, "nook.service")
		hasMode(t, unit, 0o644)
		if fi, err := os.Stat(filepath.Join(dest, "etc/nook")); err != nil || !fi.IsDir() {
			t.Errorf("make install made no /etc/nook: %v", err)
		}
		if got := unitSettings(t, unit)["Service.ExecStart"]; len(got) != 1 || got[0] != tc.bindir+"/nook serve" {
			t.Errorf("%s: ExecStart=%q, want %s/nook serve", unit, got, tc.bindir)
		}
		verify(t, unit, tc.bindir+"/nook", filepath.Join(dest, tc.bindir, "nook"))
		// Nothing else.
		var files []string
		filepath.WalkDir(dest, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				files = append(files, strings.TrimPrefix(p, dest))
			}
			return nil
		})
		want := []string{tc.bindir + "/nook", tc.bindir + "/nook-agent", tc.unit + "/nook.service", "/etc/nook/config.toml"}
		slices.Sort(want)
		if !slices.Equal(files, want) {
			t.Errorf("make install %v put %v in place, want %v", tc.args, files, want)
		}
		makeIn(t, append([]string{"uninstall", "DESTDIR=" + dest}, tc.args...)...)
		for _, p := range append(want, "/etc/nook") {
			if _, err := os.Lstat(filepath.Join(dest, p)); err == nil {
				t.Errorf("make uninstall left %s", p)
			}
		}
	}
}

// control reads a control file's fields (continuation lines dropped).
func control(s string) map[string]string {
	fields := map[string]string{}
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && line != "" && line[0] != ' ' {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields
}

func TestDeb(t *testing.T) {
	testutil.RequireCommand(t, "dpkg-deb", "dpkg")
	if _, err := os.Stat(runcbin.DefaultPath); err != nil {
		testutil.Missing(t, "the runc the package ships is not built (make deps builds it into %s): %v", runcbin.DefaultPath, err)
	}
	build := t.TempDir()
	out := strings.TrimSpace(makeIn(t, "deb", "BUILDDIR="+build))
	debs, _ := filepath.Glob(filepath.Join(build, "nook_*.deb"))
	if len(debs) != 1 || !strings.HasSuffix(out, debs[0]) {
		t.Fatalf("make deb made %v, printed %q", debs, out)
	}
	deb := debs[0]
	info, err := exec.Command("dpkg-deb", "--field", deb).Output()
	if err != nil {
		t.Fatal(err)
	}
	f := control(string(info))
	arch, _ := exec.Command("dpkg", "--print-architecture").Output()
	if f["Package"] != "nook" || f["Architecture"] != strings.TrimSpace(string(arch)) || f["Version"] == "" {
		t.Errorf("control: %v", f)
	}
	depends := strings.Split(f["Depends"], ", ")
	for _, p := range []string{"mmdebstrap", "qemu-system-x86", "qemu-utils", "e2fsprogs", "libseccomp2", "libc6"} {
		if !slices.Contains(depends, p) {
			t.Errorf("Depends: %s lacks %s", f["Depends"], p)
		}
	}
	// Debian's runc is not what nook runs (the package ships its own).
	if slices.Contains(depends, "runc") {
		t.Errorf("Depends: %s names runc", f["Depends"])
	}
	contents, err := exec.Command("dpkg-deb", "--contents", deb).Output()
	if err != nil {
		t.Fatal(err)
	}
	wantFiles := map[string]string{
		"./usr/bin/nook":                    "-rwxr-xr-x root/root",
		"./usr/bin/nook-agent":              "-rwxr-xr-x root/root",
		"./usr/lib/nook/runc/runc":          "-rwxr-xr-x root/root",
		"./lib/systemd/system/nook.service": "-rw-r--r-- root/root",
		"./etc/nook/":                       "drwxr-xr-x root/root",
		"./etc/nook/config.toml":            "-rw-r--r-- root/root",
	}
	var files []string
	for _, line := range strings.Split(strings.TrimSpace(string(contents)), "\n") {
		fs := strings.Fields(line)
		if len(fs) < 6 {
			t.Fatalf("dpkg-deb --contents: %q", line)
		}
		path := fs[5]
		if !strings.HasSuffix(path, "/") {
			files = append(files, path)
		}
		if want, ok := wantFiles[path]; ok {
			if got := fs[0] + " " + fs[1]; got != want {
				t.Errorf("%s: %s, want %s", path, got, want)
			}
			delete(wantFiles, path)
		}
	}
	for p := range wantFiles {
		t.Errorf("the package has no %s", p)
	}
	if len(files) != 5 {
		t.Errorf("the package holds %v, want the 5 files", files)
	}
	for _, script := range []string{"postinst", "prerm", "postrm"} {
		if !strings.Contains(string(mustRun(t, "dpkg-deb", "--info", deb)), " "+script+" ") {
			t.Errorf("the package has no %s", script)
		}
	}

	root := t.TempDir()
	mustRun(t, "dpkg-deb", "-x", deb, root)
	ctl := t.TempDir()
	mustRun(t, "dpkg-deb", "-e", deb, ctl)
	for _, script := range []string{"postinst", "prerm", "postrm"} {
		hasMode(t, filepath.Join(ctl, script), 0o755)
		mustRun(t, "sh", "-n", filepath.Join(ctl, script))
	}
	unit := filepath.Join(root, "lib/systemd/system/nook.service")
	if got := unitSettings(t, unit)["Service.ExecStart"]; len(got) != 1 || got[0] != "/usr/bin/nook serve --runc /usr/lib/nook/runc/runc" {
		t.Errorf("the package's unit: ExecStart=%q", got)
	}
	verify(t, unit, "/usr/bin/nook", filepath.Join(root, "usr/bin/nook"))
	if !static(t, filepath.Join(root, "usr/bin/nook-agent")) {
		t.Errorf("the package's nook-agent is dynamically linked")
	}
	v, err := exec.Command(filepath.Join(root, "usr/lib/nook/runc/runc"), "--version").Output()
	if err != nil || !strings.HasPrefix(string(v), "runc version ") {
		t.Errorf("the package's runc --version: %v %q", err, v)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/bin/nook")); err == nil {
		if v, err := exec.Command(filepath.Join(root, "usr/bin/nook"), "--version").CombinedOutput(); err != nil {
			t.Errorf("the package's nook --version: %v %s", err, v)
		}
	}
	// Every package the .deb asks for is a real Debian package: make deps
	// installs each of them on this host.
	for _, p := range append(depends, strings.Split(f["Recommends"], ", ")...) {
		out, err := exec.Command("dpkg-query", "-W", "-f=${Status}", p).Output()
		if err != nil || string(out) != "install ok installed" {
			testutil.Missing(t, "the package depends on %s, which is not installed here (make deps installs it): %v %s", p, err, out)
		}
	}
}

func mustRun(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// The maintainer scripts as dpkg runs them, through an install, an
// upgrade, a removal and a purge, in a mount namespace of the test's own
// whose /etc/systemd/system, /lib/systemd/system, /var/lib and /run are
// empty tmpfs: Debian's deb-systemd-helper enables and masks for real
// there, systemctl and deb-systemd-invoke are stubs that record their
// calls, and /run/systemd/system says systemd runs.
func TestMaintainerScripts(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireCommand(t, "unshare", "util-linux")
	testutil.RequireCommand(t, "deb-systemd-helper", "init-system-helpers")
	dir, err := filepath.Abs("deb")
	if err != nil {
		t.Fatal(err)
	}
	unit, err := filepath.Abs("nook.service")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	calls := filepath.Join(tmp, "calls")
	stubs := filepath.Join(tmp, "stubs")
	os.Mkdir(stubs, 0o755)
	systemctl, err := exec.LookPath("systemctl")
	if err != nil {
		testutil.Missing(t, "systemctl is not installed (apt-get install systemd, or make deps)")
	}
	for _, name := range []string{"systemctl", "deb-systemd-invoke"} {
		stub := "#!/bin/sh\necho \"" + name + " $*\" >> " + calls + "\n"
		if name == "systemctl" {
			// What works on files alone (deb-systemd-helper's preset,
			// --root=/) the real systemctl does.
			stub += "case \"$1\" in --root=*) exec " + systemctl + " \"$@\";; esac\n"
		}
		if err := os.WriteFile(filepath.Join(stubs, name), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Each step: a script and its arguments, then what the step prints:
	// the calls it made and what the systemd directories hold.
	script := `set -e
for d in /etc/systemd/system /lib/systemd/system /var/lib /run; do mount -t tmpfs tmpfs "$d"; done
mkdir -p /run/systemd/system
cp "$UNIT" /lib/systemd/system/nook.service
export DPKG_MAINTSCRIPT_PACKAGE=nook PATH="$STUBS:$PATH"
step() {
	echo "== $*"
	: > "$CALLS"
	DPKG_MAINTSCRIPT_NAME=$1 "$DIR/$1" "$2" ${3:-}
	cat "$CALLS"
	find /etc/systemd/system -name 'nook.service' -printf '%p -> %l\n' | sort
	find /var/lib/systemd -path '*nook*' -type f -printf '%p\n' | sort
}
step postinst configure
stat -c '/var/lib/nook %a' /var/lib/nook
step postinst configure 0.1
step prerm upgrade 0.2
step prerm remove
rm /lib/systemd/system/nook.service
step postrm remove
step postrm purge
`
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", script)
	cmd.Env = append(os.Environ(), "UNIT="+unit, "DIR="+dir, "STUBS="+stubs, "CALLS="+calls)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := `== postinst configure
Created symlink /etc/systemd/system/multi-user.target.wants/nook.service → /lib/systemd/system/nook.service.
systemctl --root=/ --system --preset-mode=enable-only preset nook.service
systemctl --system daemon-reload
deb-systemd-invoke start nook.service
/etc/systemd/system/multi-user.target.wants/nook.service -> /lib/systemd/system/nook.service
/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/nook.service
/var/lib/systemd/deb-systemd-helper-enabled/nook.service.dsh-also
/var/lib/nook 711
== postinst configure 0.1
systemctl --system daemon-reload
deb-systemd-invoke restart nook.service
/etc/systemd/system/multi-user.target.wants/nook.service -> /lib/systemd/system/nook.service
/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/nook.service
/var/lib/systemd/deb-systemd-helper-enabled/nook.service.dsh-also
== prerm upgrade 0.2
/etc/systemd/system/multi-user.target.wants/nook.service -> /lib/systemd/system/nook.service
/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/nook.service
/var/lib/systemd/deb-systemd-helper-enabled/nook.service.dsh-also
== prerm remove
deb-systemd-invoke stop nook.service
/etc/systemd/system/multi-user.target.wants/nook.service -> /lib/systemd/system/nook.service
/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/nook.service
/var/lib/systemd/deb-systemd-helper-enabled/nook.service.dsh-also
== postrm remove
systemctl --system daemon-reload
/etc/systemd/system/multi-user.target.wants/nook.service -> /lib/systemd/system/nook.service
/etc/systemd/system/nook.service -> /dev/null
/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/nook.service
/var/lib/systemd/deb-systemd-helper-enabled/nook.service.dsh-also
/var/lib/systemd/deb-systemd-helper-masked/nook.service
== postrm purge
systemctl --system daemon-reload
`
	// Left out: deb-systemd-helper's own reloads (its mask and purge),
	// and systemctl's complaint that this empty /lib/systemd/system has
	// no multi-user.target.
	var lines []string
	for _, l := range strings.SplitAfter(string(out), "\n") {
		if l != "systemctl daemon-reload\n" && !strings.HasPrefix(l, "Unit /lib/systemd/system/nook.service is added as a dependency to a non-existent unit") {
			lines = append(lines, l)
		}
	}
	if got := strings.Join(lines, ""); got != want {
		t.Errorf("the maintainer scripts did:\n%s\nwant:\n%s", got, want)
	}
}
