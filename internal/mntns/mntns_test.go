package mntns

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/testutil"
)

func TestParseMountinfo(t *testing.T) {
	for _, c := range []struct{ line, point, fstype string }{
		{`36 35 98:0 /mnt1 /mnt/parent\040dir rw,noatime master:1 - ext3 /dev/root rw,errors=continue`, "/mnt/parent dir", "ext3"},
		{`97 99 0:48 / /tmp/x rw,relatime - tmpfs tmpfs rw,size=1024k`, "/tmp/x", "tmpfs"},
		{`520 30 0:4 net:[4026532] /run/a\134b rw shared:5 - nsfs nsfs rw`, `/run/a\b`, "nsfs"},
		{`1 2 0:4 / /odd\09 rw - tmpfs t rw`, `/odd\09`, "tmpfs"},
	} {
		p, f, ok := parseMountinfo(c.line)
		if !ok || p != c.point || f != c.fstype {
			t.Errorf("%q: %q %q %v; want %q %q", c.line, p, f, ok, c.point, c.fstype)
		}
	}
	if _, _, ok := parseMountinfo("garbage"); ok {
		t.Error("a line without a separator parsed")
	}
}

// A program started from a base sees the host's mounts but not the hidden
// ones nor any namespace file, and sees its binds at their paths; the
// host's namespace is unchanged, and a mount the host makes after the base
// does not appear in it.
func TestStart(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	// state is a mount (a disk for the sandboxes) that stays; hidden, a
	// mount below it, goes.
	state := filepath.Join(dir, "state")
	hidden, bind, later := filepath.Join(state, "hidden"), filepath.Join(dir, "bind"), filepath.Join(dir, "later")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", state, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(state, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(state, "config.json"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{hidden, bind, later} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", d, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(d, unix.MNT_DETACH) })
	}
	if err := os.WriteFile(filepath.Join(bind, "f"), []byte("in the bind\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	nsFile := filepath.Join(dir, "netns")
	if err := os.WriteFile(nsFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("/proc/self/ns/net", nsFile, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(nsFile, unix.MNT_DETACH) })
	unix.Unmount(later, unix.MNT_DETACH) // mounted again after the base

	base, err := New(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", later, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	// Only the test's own mounts are compared: a daemon running beside
	// the tests mounts and unmounts its sandboxes' meanwhile.
	hostBefore := mountsBelow(mountPoints(t, "/proc/self/mountinfo"), dir)
	var out bytes.Buffer
	cmd := exec.Command("sh", "-c", "cat /proc/self/mountinfo; echo ==; cat "+filepath.Join(bind, "f")+" "+filepath.Join(state, "config.json"))
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := base.Start(cmd, bind); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	info, file, _ := strings.Cut(out.String(), "==\n")
	if file != "in the bind\n{}" {
		t.Errorf("the bind's file read %q", file)
	}
	seen := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if p, f, ok := parseMountinfo(sc.Text()); ok {
			seen[p] = f
		}
	}
	if _, ok := seen[hidden]; ok {
		t.Error("the hidden mount is in the program's namespace")
	}
	if seen[state] != "tmpfs" {
		t.Error("the mount at the hidden directory itself is not in the program's namespace")
	}
	if _, ok := seen[later]; ok {
		t.Error("a mount made after the base is in the program's namespace")
	}
	if seen[bind] != "tmpfs" {
		t.Errorf("the bind is not mounted in the program's namespace: %v", seen)
	}
	for p, f := range seen {
		if f == "nsfs" {
			t.Errorf("a namespace file at %s in the program's namespace", p)
		}
	}
	if seen["/proc"] != "proc" {
		t.Error("no /proc in the program's namespace")
	}
	if after := mountsBelow(mountPoints(t, "/proc/self/mountinfo"), dir); !slices.Equal(after, hostBefore) {
		t.Errorf("the test's mounts in the host's namespace changed: %v, then %v", hostBefore, after)
	}
}

// mountsBelow is the mount points at or below dir, sorted.
func mountsBelow(points []string, dir string) []string {
	var out []string
	for _, p := range points {
		if p == dir || strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

func mountPoints(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if p, _, ok := parseMountinfo(l); ok {
			out = append(out, p)
		}
	}
	return out
}
