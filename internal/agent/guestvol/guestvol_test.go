//go:build linux

package guestvol_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/agent/guestvol"
	"github.com/nookhq/nook/internal/volume"
)

// The guest's and the daemon's sides of a vm's volumes, end to end on
// this host: the agent's FUSE mounts (real FUSE, the host's kernel as
// the guest's), its volume stream to a real agent client serving it with
// a volume.Remote on a directory, as the daemon does.

type rig struct {
	back, mnt, roBack, roMnt string
	c                        *agent.Client
}

func requireFUSE(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI runs the tests as root, which this one needs")
		}
		t.Skip("needs root (mounts FUSE)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("this kernel has no /dev/fuse")
	}
}

// serve runs the daemon's loop: open the volume stream again whenever it ends.
func serve(ctx context.Context, c *agent.Client, req *agent.VolumesRequest, h agent.VolumeHandler, mounted chan<- struct{}) {
	var once sync.Once
	for ctx.Err() == nil {
		c.ServeVolumes(ctx, req, h, func() { once.Do(func() { close(mounted) }) })
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func newRig(t *testing.T) *rig {
	requireFUSE(t)
	dir := t.TempDir()
	// Other users (uid 1000 below) must reach the mount.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r := &rig{back: filepath.Join(dir, "back"), mnt: filepath.Join(dir, "mnt"), roBack: filepath.Join(dir, "roback"), roMnt: filepath.Join(dir, "romnt")}
	for _, d := range []string{r.back, r.roBack} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(r.roBack, "kept"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The guest's side (the agent and its FUSE servers) runs in a process
	// of its own, as in a vm: were it this one, a test that failed while
	// this process waited on the mount would wait on itself for ever.
	sock := filepath.Join(dir, "agent.sock")
	guest := exec.Command(os.Args[0], "-test.run=^$")
	guest.Env = append(os.Environ(), guestEnv+"="+sock)
	guest.Stderr = os.Stderr
	guest.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := guest.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.c = agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	remote, err := volume.OpenRemote([]volume.RemoteMount{{Dir: r.back}, {Dir: r.roBack, ReadOnly: true}})
	if err != nil {
		t.Fatal(err)
	}
	req := &agent.VolumesRequest{Mounts: []agent.VolumeMountSpec{{Name: "data", Path: r.mnt}, {Name: "ro", Path: r.roMnt, ReadOnly: true}}}
	mounted := make(chan struct{})
	done := make(chan struct{})
	go func() { serve(ctx, r.c, req, remote, mounted); close(done) }()
	t.Cleanup(func() {
		for _, m := range []string{r.mnt, r.roMnt} {
			if err := unix.Unmount(m, 0); err != nil && !errors.Is(err, unix.EINVAL) {
				t.Logf("unmount %s: %v", m, err)
				if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
					t.Errorf("unmount %s: %v", m, err)
				}
			}
		}
		cancel()
		r.c.Close()
		<-done
		remote.Close()
		guest.Process.Kill()
		guest.Wait()
	})
	select {
	case <-mounted:
	case <-time.After(20 * time.Second):
		t.Fatal("the volumes were not mounted")
	}
	return r
}

// guestEnv, set to a socket path, makes the test binary the guest's side:
// an agent serving volumes (guestvol) on that socket.
const guestEnv = "NOOK_TEST_GUESTVOL_AGENT"

func TestMain(m *testing.M) {
	if sock := os.Getenv(guestEnv); sock != "" {
		ln, err := net.Listen("unix", sock)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		srv := agent.NewServer(slog.New(slog.DiscardHandler), false, false)
		srv.SetVolumes(guestvol.New())
		srv.Serve(context.Background(), ln)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// as runs a shell command as uid:gid.
func as(t *testing.T, uid, gid uint32, script string) (string, error) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestVolumeFiles(t *testing.T) {
	r := newRig(t)
	m := r.mnt
	// Bytes both ways, at offsets, bigger than one call.
	big := make([]byte, 3*agent.VolMaxIO+123)
	rand.Read(big)
	if err := os.WriteFile(filepath.Join(m, "big"), big, 0o640); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(r.back, "big")); !bytes.Equal(b, big) {
		t.Fatalf("the host has %d bytes, want the %d written", len(b), len(big))
	}
	if err := os.WriteFile(filepath.Join(r.back, "fromhost"), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(m, "fromhost")); err != nil || string(b) != "host" {
		t.Fatalf("a file the host wrote reads %q, %v", b, err)
	}
	// Changed on the host: seen within the attribute cache's second; a
	// name the host makes, at once.
	if err := os.WriteFile(filepath.Join(r.back, "fromhost"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for b, _ := os.ReadFile(filepath.Join(m, "fromhost")); string(b) != "changed"; b, _ = os.ReadFile(filepath.Join(m, "fromhost")) {
		if time.Now().After(deadline) {
			t.Fatalf("3 s after the host changed it, it reads %q", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join(m, "nothere")); !os.IsNotExist(err) {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(r.back, "nothere"), nil, 0o644)
	if _, err := os.Stat(filepath.Join(m, "nothere")); err != nil {
		t.Fatalf("a file the host made just after the guest missed it: %v", err)
	}
	fi, err := os.Stat(filepath.Join(r.back, "big"))
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode on the host %v, %v; want 0640", fi.Mode(), err)
	}

	// Directories, renames, links, symlinks, truncate, chmod, times.
	steps := []struct{ what, script string }{
		{"mkdir -p", "mkdir -p " + m + "/a/b/c"},
		{"rename", "mv " + m + "/big " + m + "/a/b/big2"},
		{"hard link", "ln " + m + "/a/b/big2 " + m + "/hl"},
		{"symlink", "ln -s a/b " + m + "/sl"},
		{"truncate", "truncate -s 10 " + m + "/hl"},
		{"chmod", "chmod 4711 " + m + "/a"},
		{"touch -d", "touch -d '2001-02-03 04:05:06' " + m + "/a/b/c"},
	}
	for _, s := range steps {
		if out, err := as(t, 0, 0, s.script); err != nil {
			t.Fatalf("%s: %v: %s", s.what, err, out)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(r.back, "a/b/big2")); len(b) != 10 {
		t.Errorf("truncated through a hard link: %d bytes, want 10", len(b))
	}
	st1, st2 := stat(t, filepath.Join(m, "hl")), stat(t, filepath.Join(m, "a/b/big2"))
	if st1.Ino != st2.Ino || st1.Nlink != 2 {
		t.Errorf("hard links: inodes %d and %d, nlink %d; want one inode, 2 links", st1.Ino, st2.Ino, st1.Nlink)
	}
	if target, err := os.Readlink(filepath.Join(r.back, "sl")); err != nil || target != "a/b" {
		t.Errorf("symlink on the host: %q, %v", target, err)
	}
	if _, err := os.Stat(filepath.Join(m, "sl/big2")); err != nil {
		t.Errorf("through the symlink: %v", err)
	}
	if fi, _ := os.Stat(filepath.Join(r.back, "a")); fi.Mode()&os.ModeSetuid == 0 || fi.Mode().Perm() != 0o711 {
		t.Errorf("chmod 4711 gave %v", fi.Mode())
	}
	if fi, _ := os.Stat(filepath.Join(r.back, "a/b/c")); fi.ModTime().Year() != 2001 {
		t.Errorf("touch -d gave %v", fi.ModTime())
	}

	// Owners: a new file is its creator's; the guest's kernel checks
	// modes against the host's owners.
	if out, err := as(t, 0, 0, "mkdir "+m+"/home && chown 1000:1000 "+m+"/home && echo root > "+m+"/rootfile"); err != nil {
		t.Fatal(err, out)
	}
	if out, err := as(t, 1000, 1000, "echo u > "+m+"/home/mine && mkdir "+m+"/home/d && ln -s x "+m+"/home/l"); err != nil {
		t.Fatalf("uid 1000 in its directory: %v: %s", err, out)
	}
	for _, p := range []string{"home/mine", "home/d", "home/l"} {
		if st := lstat(t, filepath.Join(r.back, p)); st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("%s is %d:%d on the host, want 1000:1000", p, st.Uid, st.Gid)
		}
	}
	if out, err := as(t, 1000, 1000, "echo x >> "+m+"/rootfile"); err == nil {
		t.Errorf("uid 1000 appended to root's 0644 file: %s", out)
	}
	if out, err := as(t, 1000, 1000, "rm "+m+"/rootfile"); err == nil {
		t.Errorf("uid 1000 removed root's file from root's directory: %s", out)
	}

	// Removal, and what a volume never makes.
	if out, err := as(t, 0, 0, "rm -r "+m+"/a && rm "+m+"/hl "+m+"/sl"); err != nil {
		t.Fatal(err, out)
	}
	if _, err := os.Stat(filepath.Join(r.back, "a")); !os.IsNotExist(err) {
		t.Errorf("removed tree still on the host: %v", err)
	}
	if err := unix.Mkfifo(filepath.Join(m, "fifo"), 0o644); !errors.Is(err, unix.EPERM) {
		t.Errorf("mkfifo in a volume: %v, want EPERM", err)
	}
	if err := unix.Mknod(filepath.Join(m, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err == nil {
		t.Error("made a device node in a volume")
	}

	// A listing of more entries than one call carries.
	n := agent.VolMaxEntries*2 + 7
	if err := os.Mkdir(filepath.Join(r.back, "many"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := os.WriteFile(filepath.Join(r.back, "many", fmt.Sprint(i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(filepath.Join(m, "many"))
	if err != nil || len(ents) != n {
		t.Fatalf("listed %d entries (%v), want %d", len(ents), err, n)
	}
	// Pages of the longest names, and names that are not UTF-8, as the
	// bytes they are.
	os.Mkdir(filepath.Join(r.back, "long"), 0o755)
	for i := range agent.VolMaxEntries + 10 {
		name := fmt.Sprintf("%05d-%s", i, strings.Repeat("\x01", 249))
		if err := os.WriteFile(filepath.Join(r.back, "long", name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if ents, err := os.ReadDir(filepath.Join(m, "long")); err != nil || len(ents) != agent.VolMaxEntries+10 {
		t.Fatalf("listed %d entries of 255-byte names (%v)", len(ents), err)
	}
	os.WriteFile(filepath.Join(r.back, "bad\xff"), []byte("latin"), 0o644)
	if b, err := os.ReadFile(filepath.Join(m, "bad\xff")); err != nil || string(b) != "latin" {
		t.Errorf("a name that is not UTF-8, from the host: %q %v", b, err)
	}
	if err := os.WriteFile(filepath.Join(m, "a\xfe"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.back, "a\xfe")); err != nil {
		t.Errorf("a name that is not UTF-8, from the guest: %v", err)
	}
	if out, err := as(t, 0, 0, "rm -r "+m+"/long "+m+"/many"); err != nil {
		t.Errorf("rm -r of the listings: %v: %s", err, out)
	}

	var sfs unix.Statfs_t
	if err := unix.Statfs(m, &sfs); err != nil || sfs.Blocks == 0 {
		t.Errorf("statfs: %+v, %v", sfs, err)
	}
}

func TestVolumeReadOnly(t *testing.T) {
	r := newRig(t)
	if b, err := os.ReadFile(filepath.Join(r.roMnt, "kept")); err != nil || string(b) != "kept" {
		t.Fatalf("read-only volume reads %q, %v", b, err)
	}
	for _, script := range []string{"echo x > " + r.roMnt + "/new", "echo x >> " + r.roMnt + "/kept", "rm " + r.roMnt + "/kept", "mkdir " + r.roMnt + "/d"} {
		if out, err := as(t, 0, 0, script); err == nil {
			t.Errorf("%q worked on a read-only volume: %s", script, out)
		}
	}
	// What the guest's mount says is not what holds: the host refuses too.
	res, _ := mustRemote(t, r.roBack, true).Handle(&agent.VolCall{Op: agent.VolOpWrite, Path: "kept"}, []byte("x"))
	if syscall.Errno(res.Errno) != syscall.EROFS {
		t.Errorf("a write call to a read-only volume: errno %d, want EROFS", res.Errno)
	}
	if b, _ := os.ReadFile(filepath.Join(r.roBack, "kept")); string(b) != "kept" {
		t.Errorf("read-only volume's file is now %q", b)
	}
}

// The volume stream ends (the vm was paused, the daemon restarted) while
// a writer runs: its calls wait and are sent again, nothing is lost.
func TestVolumeStreamReconnects(t *testing.T) {
	r := newRig(t)
	cmd := exec.Command("sh", "-c", `i=0; while [ $i -lt 300 ]; do echo "line $i" > `+r.mnt+`/f$i || exit 1; i=$((i+1)); done`)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	cuts := 0
	deadline := time.After(60 * time.Second)
loop:
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("writer failed: %v: %s", err, out.String())
			}
			break loop
		case <-deadline:
			cmd.Process.Kill()
			t.Fatal("writer did not finish")
		case <-time.After(20 * time.Millisecond):
			r.c.Close() // the session ends; the serving loop dials again
			cuts++
		}
	}
	for i := range 300 {
		b, err := os.ReadFile(filepath.Join(r.back, fmt.Sprintf("f%d", i)))
		if err != nil || string(b) != fmt.Sprintf("line %d\n", i) {
			t.Fatalf("f%d: %q, %v", i, b, err)
		}
	}
	t.Logf("300 files written across %d stream cuts", cuts)
}

func mustRemote(t *testing.T, dir string, ro bool) *volume.Remote {
	t.Helper()
	rem, err := volume.OpenRemote([]volume.RemoteMount{{Dir: dir, ReadOnly: ro}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rem.Close() })
	return rem
}

func stat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

func lstat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}
