package volume

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/agent"
)

// What a hostile vm guest can ask of its volume's directory: nothing
// outside it, no device or fifo opened, no change to a read-only one.
func TestEscapeRemoteVolume(t *testing.T) {
	requireRoot(t)
	top := t.TempDir()
	dir := filepath.Join(top, "vol")
	outside := filepath.Join(top, "outside")
	for _, d := range []string{dir, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600)
	os.Symlink(outside, filepath.Join(dir, "esc"))
	os.Symlink("../outside/secret", filepath.Join(dir, "esc-file"))
	os.WriteFile(filepath.Join(dir, "file"), []byte("in"), 0o644)
	if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRemote([]RemoteMount{{Dir: dir}, {Dir: dir, ReadOnly: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	call := func(c agent.VolCall, data []byte) (syscall.Errno, *agent.VolResult, []byte) {
		t.Helper()
		done := make(chan struct{})
		var res *agent.VolResult
		var out []byte
		go func() { res, out = r.Handle(&c, data); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("%+v blocked", c)
		}
		return syscall.Errno(res.Errno), res, out
	}
	for _, c := range []agent.VolCall{
		{Op: agent.VolOpRead, Path: "esc/secret", Size: 100},
		{Op: agent.VolOpRead, Path: "esc-file", Size: 100},
		{Op: agent.VolOpLookup, Path: "esc/secret"},
		{Op: agent.VolOpReaddir, Path: "esc"},
		{Op: agent.VolOpWrite, Path: "esc/secret"},
		{Op: agent.VolOpCreate, Path: "esc/new", Mode: 0o644},
		{Op: agent.VolOpMkdir, Path: "esc/newdir", Mode: 0o755},
		{Op: agent.VolOpSymlink, Path: "esc/newlink", Target: "/"},
		{Op: agent.VolOpLink, Path: "hl", To: "esc/secret"},
		{Op: agent.VolOpLink, Path: "esc/hl", To: "file"},
		{Op: agent.VolOpRename, Path: "file", To: "esc/moved"},
		{Op: agent.VolOpRename, Path: "esc/secret", To: "stolen"},
		{Op: agent.VolOpUnlink, Path: "esc/secret"},
		{Op: agent.VolOpSetattr, Path: "esc/secret", Set: agent.VolSetMode, Mode: 0o777},
		{Op: agent.VolOpSetattr, Path: "esc-file", Set: agent.VolSetSize},
		{Op: agent.VolOpFsync, Path: "esc/secret"},
		{Op: agent.VolOpRead, Path: "fifo", Size: 10}, // would block a reader
		{Op: agent.VolOpWrite, Path: "fifo"},          // and a writer
		{Op: agent.VolOpRead, Path: "null", Size: 10}, // a device: never opened
		{Op: agent.VolOpFsync, Path: "null"},          //
		{Op: agent.VolOpReaddir, Path: "null"},        //
		{Op: agent.VolOpSetattr, Path: "null", Set: agent.VolSetSize},
		{Op: agent.VolOpUnlink, Path: ""},             // the volume's top
		{Op: agent.VolOpRename, Path: "", To: "x"},    //
		{Op: agent.VolOpLookup, Vol: 2},               // no such volume
		{Op: agent.VolOpWrite, Vol: 1, Path: "file"},  // read-only
		{Op: agent.VolOpCreate, Vol: 1, Path: "new"},  //
		{Op: agent.VolOpUnlink, Vol: 1, Path: "file"}, //
		{Op: agent.VolOpSetattr, Vol: 1, Path: "file", Set: agent.VolSetMode},
	} {
		if e, res, out := call(c, []byte("pwned")); e == 0 {
			t.Errorf("%+v worked: %+v %q", c, res, out)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "secret" {
		t.Errorf("the file outside is now %q", b)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Errorf("outside the volume now: %v", ents)
	}
	fi, _ := os.Stat(filepath.Join(outside, "secret"))
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the file outside has mode %v", fi.Mode())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "file")); string(b) != "in" {
		t.Errorf("the read-only volume's file is %q", b)
	}
	// What a call may be is checked before it is carried out.
	for _, c := range []agent.VolCall{
		{Op: agent.VolOpRead, Path: "../outside/secret", Size: 10},
		{Op: agent.VolOpRead, Path: "/etc/passwd", Size: 10},
		{Op: agent.VolOpRead, Path: "a/../../x", Size: 10},
		{Op: agent.VolOpRead, Path: "file", Size: agent.VolMaxIO + 1},
		{Op: agent.VolOpReaddir, Path: "", Size: agent.VolMaxEntries + 1},
		{Op: agent.VolOpRead, Path: "file", Off: -1},
		{Op: agent.VolOpRename, Path: "file", To: "../x"},
		{Op: agent.VolOpLink, Path: "x"},
		{Op: agent.VolOpRead, Path: "a\x00b"},
		{Op: agent.VolOpRead, Path: strings.Repeat("a", 256)},
		{Op: "mknod", Path: "x"},
		{Op: agent.VolOpLookup, Vol: -1},
	} {
		b, err := agent.EncodeVolCall(&c, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := agent.DecodeVolCall(b); err == nil {
			t.Errorf("%+v decoded", c)
		}
	}
	// Good calls do work.
	if e, _, out := call(agent.VolCall{Op: agent.VolOpRead, Path: "file", Size: 10}, nil); e != 0 || string(out) != "in" {
		t.Errorf("read: %v %q", e, out)
	}
	if e, res, _ := call(agent.VolCall{Op: agent.VolOpCreate, Path: "made", Mode: 0o4755, UID: 1234, GID: 99}, nil); e != 0 || res.Attr.UID != 1234 || res.Attr.Mode&0o7777 != 0o4755 {
		t.Errorf("create: %v %+v", e, res)
	}
}

// A guest racing names (a file swapped for a hard link to a device node
// between the daemon's look and its open) never gets a device opened on
// the host: the daemon opens what it looked at, never a name twice.
func TestEscapeRemoteVolumeDeviceRace(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	if err := unix.Mknod(filepath.Join(dir, "dev"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRemote([]RemoteMount{{Dir: dir, HostDir: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ino, err := unix.InotifyInit1(unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ino)
	if _, err := unix.InotifyAddWatch(ino, filepath.Join(dir, "dev"), unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // all through guest calls
		defer wg.Done()
		for !stop.Load() {
			r.Handle(&agent.VolCall{Op: agent.VolOpCreate, Path: "f", Mode: 0o644}, nil)
			r.Handle(&agent.VolCall{Op: agent.VolOpUnlink, Path: "f"}, nil)
			r.Handle(&agent.VolCall{Op: agent.VolOpLink, Path: "f", To: "dev"}, nil)
			r.Handle(&agent.VolCall{Op: agent.VolOpUnlink, Path: "f"}, nil)
		}
	}()
	buf := make([]byte, 4096)
	opens := 0
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		r.Handle(&agent.VolCall{Op: agent.VolOpRead, Path: "f", Size: 10}, nil)
		r.Handle(&agent.VolCall{Op: agent.VolOpWrite, Path: "f"}, []byte("x"))
		r.Handle(&agent.VolCall{Op: agent.VolOpSetattr, Path: "f", Set: agent.VolSetSize}, nil)
		r.Handle(&agent.VolCall{Op: agent.VolOpFsync, Path: "f"}, nil)
		for {
			n, err := unix.Read(ino, buf)
			if err != nil || n <= 0 {
				break
			}
			opens++
		}
	}
	stop.Store(true)
	wg.Wait()
	if opens > 0 {
		t.Errorf("the daemon opened the device node %d times", opens)
	}
}

// Owners and modes a guest may give: ids a container can see too, and
// no setuid or setgid file in a host directory (host users run them).
func TestRemoteVolumeOwners(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	r, err := OpenRemote([]RemoteMount{{Dir: dir, HostDir: true}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, c := range []agent.VolCall{
		{Op: agent.VolOpCreate, Path: "big-uid", UID: 70000},
		{Op: agent.VolOpMkdir, Path: "big-gid", GID: 1 << 31},
	} {
		if res, _ := r.Handle(&c, nil); syscall.Errno(res.Errno) != syscall.EINVAL {
			t.Errorf("%+v: errno %d, want EINVAL", c, res.Errno)
		}
	}
	r.Handle(&agent.VolCall{Op: agent.VolOpCreate, Path: "suid", Mode: 0o6755}, nil)
	r.Handle(&agent.VolCall{Op: agent.VolOpCreate, Path: "plain", Mode: 0o755}, nil)
	r.Handle(&agent.VolCall{Op: agent.VolOpSetattr, Path: "plain", Set: agent.VolSetMode, Mode: 0o4755}, nil)
	for _, name := range []string{"suid", "plain"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || fi.Mode().Perm() != 0o755 {
			t.Errorf("%s in a host directory: %v, %v", name, fi.Mode(), err)
		}
	}
	// rename without replace is one step: it never replaces.
	r.Handle(&agent.VolCall{Op: agent.VolOpCreate, Path: "a"}, nil)
	if res, _ := r.Handle(&agent.VolCall{Op: agent.VolOpRename, Path: "a", To: "plain", Flags: agent.VolNoReplace}, nil); syscall.Errno(res.Errno) != syscall.EEXIST {
		t.Errorf("rename without replace onto a file: errno %d", res.Errno)
	}
}
