package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// makeTree writes a small tree with every kind of entry cp carries.
func makeTree(t *testing.T, dir string) {
	t.Helper()
	for p, body := range map[string]string{"a.txt": "alpha\n", "sub/b.txt": "beta\n", "sub/deeper/c.txt": "gamma\n", "empty": ""} {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, p), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "run.sh"), []byte("#!/bin/sh\necho ran\n"), 0o755)
	os.Chmod(filepath.Join(dir, "run.sh"), 0o755)
	os.Symlink("sub/b.txt", filepath.Join(dir, "link"))
}

// treeDigest describes a local tree: path, kind, mode and content of each entry.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	var lines []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(dir, p)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			lines = append(lines, fmt.Sprintf("%s link %s", rel, target))
		case fi.IsDir():
			lines = append(lines, fmt.Sprintf("%s dir %o", rel, fi.Mode().Perm()))
		default:
			b, _ := os.ReadFile(p)
			lines = append(lines, fmt.Sprintf("%s file %o %q", rel, fi.Mode().Perm(), b))
		}
		return nil
	})
	return strings.Join(lines, "\n")
}

// `nook cp` both ways, files and trees, with docker cp's rules.
func TestFilesCopy(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "files")
	local := t.TempDir()
	src := filepath.Join(local, "tree")
	makeTree(t, src)
	want := treeDigest(t, src)

	// A directory into an existing directory lands under its own name.
	d.must("cp", src, "files:/root/")
	if got := d.must("exec", "files", "--", "sh", "-c", "cd /root/tree && find . | sort && cat sub/deeper/c.txt link && ./run.sh && stat -c %a run.sh"); got !=
		".\n./a.txt\n./empty\n./link\n./run.sh\n./sub\n./sub/b.txt\n./sub/deeper\n./sub/deeper/c.txt\ngamma\nbeta\nran\n755\n" {
		t.Fatalf("tree in the sandbox:\n%s", got)
	}
	// And back, to a new name and into an existing directory.
	out := filepath.Join(local, "out")
	d.must("cp", "files:/root/tree", out)
	if got := treeDigest(t, out); got != want {
		t.Fatalf("tree copied back:\n%s\nwant:\n%s", got, want)
	}
	existing := filepath.Join(local, "existing")
	os.Mkdir(existing, 0o755)
	d.must("cp", "files:/root/tree", existing)
	if got := treeDigest(t, filepath.Join(existing, "tree")); got != want {
		t.Fatalf("tree copied into a directory:\n%s", got)
	}
	// DIR/. copies the contents; a missing destination is created.
	d.must("cp", src+"/.", "files:/srv/contents")
	if got := d.must("exec", "files", "--", "cat", "/srv/contents/a.txt"); got != "alpha\n" {
		t.Fatalf("contents copy: %q", got)
	}
	d.must("cp", "files:/srv/contents/.", existing)
	if b, _ := os.ReadFile(filepath.Join(existing, "a.txt")); string(b) != "alpha\n" {
		t.Fatalf("contents copied out: %q", b)
	}
	// Single files: renamed, into a directory, overwriting, 0 bytes.
	d.must("cp", filepath.Join(src, "a.txt"), "files:/root/renamed.txt")
	if got := d.must("fs", "cat", "files:/root/renamed.txt"); got != "alpha\n" {
		t.Fatalf("renamed copy: %q", got)
	}
	os.WriteFile(filepath.Join(local, "a.txt"), []byte("changed\n"), 0o600)
	d.must("cp", filepath.Join(local, "a.txt"), "files:/root/renamed.txt")
	if got := d.must("exec", "files", "--", "sh", "-c", "cat /root/renamed.txt; stat -c %a /root/renamed.txt"); got != "changed\n600\n" {
		t.Fatalf("overwrite: %q", got)
	}
	d.must("cp", "files:/etc/hostname", local)
	if b, _ := os.ReadFile(filepath.Join(local, "hostname")); string(b) != "files\n" {
		t.Fatalf("hostname copied out: %q", b)
	}
	d.must("cp", filepath.Join(src, "empty"), "files:/root/zero")
	if got := d.must("exec", "files", "--", "stat", "-c", "%s", "/root/zero"); got != "0\n" {
		t.Fatalf("0-byte upload: %q", got)
	}
	d.must("cp", "files:/root/zero", filepath.Join(local, "zero"))
	if fi, err := os.Stat(filepath.Join(local, "zero")); err != nil || fi.Size() != 0 {
		t.Fatalf("0-byte download: %v %v", fi, err)
	}
	// A tar stream on stdout, and from stdin.
	tarOut := d.must("cp", "files:/root/tree", "-")
	tr := tar.NewReader(strings.NewReader(tarOut))
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil || !strings.HasPrefix(h.Name, "tree") {
			t.Fatalf("tar on stdout: %v %+v", err, h)
		}
		n++
	}
	if n != 9 {
		t.Fatalf("tar on stdout has %d entries", n)
	}
	cmd := exec.Command(d.bin, "cp", "-", "files:/tmp")
	cmd.Env = append(os.Environ(), "NOOK_HOST=unix://"+d.socket())
	cmd.Stdin = strings.NewReader(tarOut)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cp - : %v %s", err, b)
	}
	if got := d.must("exec", "files", "--", "cat", "/tmp/tree/sub/b.txt"); got != "beta\n" {
		t.Fatalf("tar from stdin: %q", got)
	}
}

func TestFilesCommands(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "fsc")
	d.must("fs", "mkdir", "-p", "--mode", "0750", "fsc:/data/a/b")
	d.must("fs", "mkdir", "-p", "fsc:/data/a/b") // exists: fine with -p
	d.must("exec", "fsc", "--", "sh", "-c", "echo hi > /data/a/b/f; ln -s f /data/a/b/l")
	ls := d.must("fs", "ls", "fsc:/data/a/b")
	if !strings.Contains(ls, "-rw-r--r--") || !strings.Contains(ls, " f\n") || !strings.Contains(ls, "l -> f") {
		t.Fatalf("fs ls:\n%s", ls)
	}
	var list api.FileList
	if err := json.Unmarshal([]byte(d.must("fs", "ls", "-r", "--json", "fsc:/data")), &list); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range list.Entries {
		paths = append(paths, e.Path)
	}
	if strings.Join(paths, " ") != "/data/a /data/a/b /data/a/b/f /data/a/b/l" || list.Truncated || list.Entries[1].Mode != "0750" {
		t.Fatalf("fs ls -r: %+v", list)
	}
	r, _ := d.nook("fs", "ls", "-r", "--max", "2", "fsc:/data")
	if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stderr, "stops at 2 entries") {
		t.Fatalf("fs ls --max 2: %+v", r)
	}
	if got := d.must("fs", "cat", "fsc:/data/a/b/f"); got != "hi\n" {
		t.Fatalf("fs cat: %q", got)
	}
	var st api.FileInfo
	json.Unmarshal([]byte(d.must("fs", "stat", "--json", "fsc:/data/a/b/l")), &st)
	if st.Type != api.FileTypeSymlink || st.LinkTarget != "f" {
		t.Fatalf("fs stat: %+v", st)
	}
	d.must("fs", "chmod", "600", "fsc:/data/a/b/f")
	d.must("fs", "mv", "fsc:/data/a/b/f", "fsc:/data/moved")
	if got := d.must("exec", "fsc", "--", "stat", "-c", "%a %n", "/data/moved"); got != "600 /data/moved\n" {
		t.Fatalf("after chmod and mv: %q", got)
	}
	d.must("fs", "rm", "fsc:/data/moved")
	r, _ = d.nook("fs", "rm", "fsc:/data/a")
	if r.code != 1 || !strings.Contains(r.stderr, "not empty") {
		t.Fatalf("fs rm of a non-empty directory: %+v", r)
	}
	d.must("fs", "rm", "-r", "fsc:/data/a")
	if got := d.must("exec", "fsc", "--", "ls", "-A", "/data"); got != "" {
		t.Fatalf("after rm -r: %q", got)
	}
}

func TestFilesWatch(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "watched")
	d.must("fs", "mkdir", "watched:/root/w")
	cmd := exec.Command(d.bin, "fs", "watch", "-r", "watched:/root/w")
	cmd.Env = append(os.Environ(), "NOOK_HOST=unix://"+d.socket())
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	// The watch is in place once it says so.
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "watching watched:/root/w") {
		t.Fatalf("fs watch said %q %v", line, err)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	expect := func(want ...string) {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for len(want) > 0 {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("fs watch ended, still waiting for %v", want)
				}
				if f := strings.Fields(l); len(f) == 3 && f[1]+" "+f[2] == want[0] {
					want = want[1:]
				}
			case <-timeout:
				t.Fatalf("no events for %v", want)
			}
		}
	}
	// A new directory is watched too: what is made in it before its watch
	// is in place is reported by a scan (as created), and changes after.
	d.must("exec", "watched", "--", "sh", "-c", "mkdir /root/w/sub && touch /root/w/sub/new")
	expect("create /root/w/sub", "create /root/w/sub/new")
	d.must("exec", "watched", "--", "sh", "-c", "echo x > /root/w/sub/new")
	expect("write /root/w/sub/new")
}

// Bad input is refused with a clear one-line error; nothing can reach the host.
func TestFilesBadInput(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "fbad")
	local := t.TempDir()
	os.WriteFile(filepath.Join(local, "f"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(local, "dir"), 0o755)

	// A file on the host, and every path that might lead a sandbox to it.
	hostDir := t.TempDir()
	hostFile := filepath.Join(hostDir, "host-secret")
	os.WriteFile(hostFile, []byte("host secret"), 0o644)
	d.must("exec", "fbad", "--", "sh", "-c", "ln -s / /root/hostroot && ln -s ../../../../../.. /root/up")

	evil := filepath.Join(local, "evil.tar")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "../../../../escaped", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	os.WriteFile(evil, buf.Bytes(), 0o644)

	cases := []cliCase{
		{[]string{"fs", "cat", "fbad:/no/such/file"}, 1, "no such file"},
		{[]string{"fs", "cat", "fbad:/etc"}, 1, "is a directory"},
		{[]string{"fs", "ls", "fbad:/nope"}, 1, "no such file"},
		{[]string{"cp", "fbad:/nope", local}, 1, "no such file"},
		{[]string{"cp", filepath.Join(local, "nope"), "fbad:/root/"}, 1, "no such file"},
		{[]string{"cp", filepath.Join(local, "dir"), "fbad:/etc/hostname"}, 1, "cannot copy directory"},
		{[]string{"cp", "fbad:/etc", filepath.Join(local, "f")}, 1, "cannot copy directory"},
		{[]string{"cp", filepath.Join(local, "f"), "fbad:/no/such/dir/"}, 1, "does not exist"},
		{[]string{"cp", filepath.Join(local, "f"), "fbad:/proc/sys/kernel/nook"}, 1, "read-only file system"},
		{[]string{"fs", "mkdir", "fbad:/proc/sys/nook"}, 1, "read-only file system"},
		{[]string{"fs", "mkdir", "fbad:/etc"}, 1, "already exists"},
		{[]string{"fs", "rm", "-r", "fbad:/"}, 1, "refusing to remove /"},
		{[]string{"fs", "rm", "fbad:/root"}, 1, "not empty"},
		{[]string{"fs", "cat", "fbad:/root/hostroot" + hostFile}, 1, "no such file"},
		{[]string{"fs", "cat", "fbad:/root/up" + hostFile}, 1, "no such file"},
		{[]string{"fs", "cat", "fbad:/../../../.." + hostFile}, 1, "no such file"},
		{[]string{"fs", "cat", "fbad:/proc/1/root" + hostFile}, 1, "no such file"},
		{[]string{"fs", "ls", "fbad:/root/hostroot" + hostDir}, 1, "no such file"},
		{[]string{"cp", "fbad:/root/hostroot" + hostDir, filepath.Join(local, "stolen")}, 1, "no such file"},
		{[]string{"cp", evil, "fbad:/root/"}, 0, ""}, // a tar file is a file like any other
		{[]string{"fs", "cat", "ghost:/etc/hostname"}, 1, `no sandbox named "ghost"`},
		{[]string{"fs", "ls", "fbad:relative"}, 2, "must be absolute"},
		{[]string{"fs", "ls", "/no/sandbox/named"}, 2, "NAME:/path"},
		{[]string{"fs", "chmod", "999", "fbad:/root"}, 2, "not valid"},
		{[]string{"fs", "mv", "fbad:/a", "other:/b"}, 2, "different sandboxes"},
		{[]string{"cp", filepath.Join(local, "f"), filepath.Join(local, "g")}, 2, "one of SRC and DST"},
		{[]string{"cp", "fbad:/a", "fbad:/b"}, 2, "one of SRC and DST"},
	}
	d.expectCLI(t, cases)
	// ".." stays in the sandbox: its own /etc/hostname.
	if got := d.must("fs", "cat", "fbad:/../../../etc/hostname"); got != "fbad\n" {
		t.Fatalf("/../../../etc/hostname: %q", got)
	}
	// Writes through a symlink to / land in the sandbox.
	planted := "/tmp/nook-planted-" + filepath.Base(local)
	d.must("cp", filepath.Join(local, "f"), "fbad:/root/hostroot"+planted)
	if _, err := os.Stat(planted); err == nil {
		os.Remove(planted)
		t.Fatal("a copy through a symlink to / reached the host")
	}
	if got := d.must("exec", "fbad", "--", "cat", planted); got != "x" {
		t.Fatalf("the planted file in the sandbox: %q", got)
	}
	// A tar with an entry escaping its directory is refused.
	cmd := exec.Command(d.bin, "cp", "-", "fbad:/root")
	cmd.Env = append(os.Environ(), "NOOK_HOST=unix://"+d.socket())
	cmd.Stdin = bytes.NewReader(buf.Bytes())
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "leaves the target directory") {
		t.Fatalf("cp - of an escaping tar: %v %s", err, out)
	}
	if got := d.must("exec", "fbad", "--", "sh", "-c", "ls /escaped /root/../escaped 2>&1 | grep -c 'No such'"); got != "2\n" {
		t.Fatalf("escaping entry: %q", got)
	}

	// The raw API answers with stable codes.
	hc := unixHTTP(d)
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"GET", "/v1/sandboxes/fbad/files/stat?path=etc", "", 400, api.CodeInvalidArgument},
		{"GET", "/v1/sandboxes/fbad/files/stat", "", 400, api.CodeInvalidArgument},
		{"GET", "/v1/sandboxes/fbad/files/content?path=/nope", "", 404, api.CodeNotFound},
		{"GET", "/v1/sandboxes/fbad/files/content?path=/etc", "", 400, api.CodeInvalidArgument},
		{"GET", "/v1/sandboxes/fbad/files/content?path=/etc/hostname&offset=-1", "", 400, api.CodeInvalidArgument},
		{"PUT", "/v1/sandboxes/fbad/files/content?path=/root/x&mode=999", "x", 400, api.CodeInvalidArgument},
		{"PUT", "/v1/sandboxes/fbad/files/content?path=/proc/sys/kernel/x", "x", 403, api.CodePermissionDenied},
		{"PUT", "/v1/sandboxes/fbad/files/content?path=/root", "x", 400, api.CodeInvalidArgument},
		{"GET", "/v1/sandboxes/fbad/files/list?path=/&recursive=maybe", "", 400, api.CodeInvalidArgument},
		{"GET", "/v1/sandboxes/fbad/files/list?path=/&max_entries=1000000", "", 400, api.CodeInvalidArgument},
		{"DELETE", "/v1/sandboxes/fbad/files?path=/", "", 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes/fbad/files/mkdir", `{"path": "/x", "mdoe": "0755"}`, 400, api.CodeInvalidArgument},
		{"POST", "/v1/sandboxes/fbad/files/move", `{"from": "/nope", "to": "/x"}`, 404, api.CodeNotFound},
		{"POST", "/v1/sandboxes/fbad/files/chmod", `{"path": "/root"}`, 400, api.CodeInvalidArgument},
		{"PUT", "/v1/sandboxes/fbad/files/archive?path=/root", "not a tar at all, not at all, no", 400, api.CodeInvalidArgument},
		{"GET", "/v1/sandboxes/fbad/files/archive?path=/nope", "", 404, api.CodeNotFound},
		{"GET", "/v1/sandboxes/fbad/files/watch?path=/nope", "", 404, api.CodeNotFound},
		{"GET", "/v1/sandboxes/ghost/files/stat?path=/", "", 404, api.CodeNotFound},
	} {
		req, _ := http.NewRequest(tc.method, "http://nook"+tc.path, strings.NewReader(tc.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var eb api.ErrorBody
		json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if resp.StatusCode != tc.status || eb.Error.Code != tc.code || eb.Error.Message == "" {
			t.Errorf("%s %s: %d %+v; want %d %s", tc.method, tc.path, resp.StatusCode, eb, tc.status, tc.code)
		}
	}
}

func unixHTTP(d *daemon) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", d.socket())
	}}}
}

// Clients that go away mid-transfer change nothing, leave nothing behind,
// and do not disturb the daemon or the sandbox.
func TestFilesClientDisconnects(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "cut")
	d.must("exec", "cut", "--", "sh", "-c", "echo original > /root/f && head -c 100000000 /dev/zero > /root/big")
	// A background command must survive everything below.
	pid := strings.TrimSpace(d.must("exec", "-d", "cut", "--", "sleep", "300"))

	// An upload cut after 10 MB of a promised 100 MB.
	conn, err := net.Dial("unix", d.socket())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT /v1/sandboxes/cut/files/content?path=/root/f HTTP/1.1\r\nHost: nook\r\nContent-Length: 100000000\r\n\r\n")
	chunk := make([]byte, 1<<20)
	for i := 0; i < 10; i++ {
		if _, err := conn.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	// A download read for 1 MB, then dropped.
	resp, err := unixHTTP(d).Get("http://nook/v1/sandboxes/cut/files/content?path=/root/big")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("download: %v", err)
	}
	io.CopyN(io.Discard, resp.Body, 1<<20)
	resp.Body.Close()
	// A watch dropped.
	resp, err = unixHTTP(d).Get("http://nook/v1/sandboxes/cut/files/watch?path=/root")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("watch: %v", err)
	}
	resp.Body.Close()

	deadline := time.Now().Add(10 * time.Second)
	for {
		got := d.must("exec", "cut", "--", "sh", "-c", "cat /root/f; ls -A /root | grep -c nook-write || true")
		if got == "original\n0\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a cut upload: %q", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var ps []api.Process
	json.Unmarshal([]byte(d.must("ps", "cut", "--json")), &ps)
	if len(ps) != 1 || strconv.Itoa(ps[0].PID) != pid || !ps[0].Running {
		t.Fatalf("background command after the disconnects: %+v", ps)
	}
}

func vmRSS(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// bigFile is just over 2 GiB, past any 32-bit size or offset.
const bigFile = 2<<30 + 1

// A 2 GiB file goes in and out intact while the daemon's memory stays small.
func TestFilesLargeRoundTrip(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "big")
	local := t.TempDir()
	src := filepath.Join(local, "big.bin")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	if _, err := io.CopyN(io.MultiWriter(f, h), rand.Reader, bigFile); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := hex.EncodeToString(h.Sum(nil))

	pid := d.cmd.Process.Pid
	var mu sync.Mutex
	var peak int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if rss := vmRSS(t, pid); rss > 0 {
				mu.Lock()
				peak = max(peak, rss)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	d.must("cp", src, "big:/root/big.bin")
	up := time.Since(start)
	if got := strings.Fields(d.must("exec", "big", "--", "sha256sum", "/root/big.bin")); len(got) == 0 || got[0] != want {
		t.Fatalf("sha256 in the sandbox %v, want %s", got, want)
	}
	start = time.Now()
	back := filepath.Join(local, "back.bin")
	d.must("cp", "big:/root/big.bin", back)
	down := time.Since(start)
	bf, err := os.Open(back)
	if err != nil {
		t.Fatal(err)
	}
	h.Reset()
	io.Copy(h, bf)
	bf.Close()
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		t.Fatalf("sha256 after the round trip %s, want %s", got, want)
	}
	// The same through the raw content endpoint (no tar).
	start = time.Now()
	cat := exec.Command(d.bin, "fs", "cat", "big:/root/big.bin")
	cat.Env = append(os.Environ(), "NOOK_HOST=unix://"+d.socket())
	catOut, _ := os.Create(filepath.Join(local, "cat.bin"))
	cat.Stdout = catOut
	err = cat.Run()
	catOut.Seek(0, 0)
	h.Reset()
	io.Copy(h, catOut)
	catOut.Close()
	if got := hex.EncodeToString(h.Sum(nil)); err != nil || got != want {
		t.Fatalf("fs cat of 2 GiB: %v, sha256 %s", err, got)
	}
	close(stop)
	<-sampled
	mu.Lock()
	defer mu.Unlock()
	t.Logf("2 GiB up %v, down %v, cat %v; daemon peak VmRSS %d MiB", up.Round(time.Millisecond), down.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), peak>>20)
	if peak > 150<<20 {
		t.Fatalf("daemon VmRSS peaked at %d MiB moving 2 GiB", peak>>20)
	}
}

// The Go SDK's file calls against a real daemon: streaming writes with a
// mode and parents, ranged reads, listing, archives and a watch.
func TestFilesSDK(t *testing.T) {
	d := newDaemon(t)
	d.must("create", "--name", "sdkfiles")
	c, err := sdk.New("unix://"+d.socket(), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := c.WriteFile(ctx, "sdkfiles", "/opt/app/config.txt", strings.NewReader("key=value\n"), &sdk.WriteOptions{Mode: 0o640, Parents: true})
	if err != nil || info.Size != 10 || info.Mode != "0640" {
		t.Fatalf("write: %+v %v", info, err)
	}
	rc, err := c.ReadFile(ctx, "sdkfiles", "/opt/app/config.txt", &sdk.ReadOptions{Offset: 4, Length: 5})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != "value" {
		t.Fatalf("ranged read: %q %v", b, err)
	}
	// A failing source abandons the write: the file keeps its content.
	_, err = c.WriteFile(ctx, "sdkfiles", "/opt/app/config.txt", io.MultiReader(strings.NewReader("partial"), failing{}), nil)
	if err == nil || !strings.Contains(err.Error(), "source broke") {
		t.Fatalf("write from a failing source: %v", err)
	}
	if got := d.must("exec", "sdkfiles", "--", "cat", "/opt/app/config.txt"); got != "key=value\n" {
		t.Fatalf("after an abandoned write: %q", got)
	}
	if _, err := c.Mkdir(ctx, "sdkfiles", "/opt/app/sub", false, 0o700); err != nil {
		t.Fatal(err)
	}
	l, err := c.ListFiles(ctx, "sdkfiles", "/opt", sdk.ListOptions{Recursive: true})
	if err != nil || len(l.Entries) != 3 || l.Entries[2].Path != "/opt/app/sub" || l.Entries[2].Mode != "0700" {
		t.Fatalf("list: %+v %v", l, err)
	}
	if _, err := c.MoveFile(ctx, "sdkfiles", "/opt/app/config.txt", "/opt/app/sub/c.txt", false); err != nil {
		t.Fatal(err)
	}
	if info, err := c.Chmod(ctx, "sdkfiles", "/opt/app/sub/c.txt", 0o644|os.ModeSetgid); err != nil || info.Mode != "2644" {
		t.Fatalf("chmod: %+v %v", info, err)
	}
	ar, err := c.DownloadArchive(ctx, "sdkfiles", "/opt/app")
	if err != nil {
		t.Fatal(err)
	}
	var tarball bytes.Buffer
	io.Copy(&tarball, ar)
	ar.Close()
	if _, err := c.UploadArchive(ctx, "sdkfiles", "/srv/copy", bytes.NewReader(tarball.Bytes()), true); err != nil {
		t.Fatal(err)
	}
	if got := d.must("exec", "sdkfiles", "--", "stat", "-c", "%a %s", "/srv/copy/app/sub/c.txt"); got != "2644 10\n" {
		t.Fatalf("archive round trip: %q", got)
	}
	w, err := c.WatchFiles(ctx, "sdkfiles", "/srv", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := c.RemoveFile(ctx, "sdkfiles", "/srv/copy", true); err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		if ev.Type == api.FileEventRemove && ev.Path == "/srv/copy" {
			break
		}
	}
	if _, err := c.StatFile(ctx, "sdkfiles", "/srv/copy"); !sdk.IsNotFound(err) {
		t.Fatalf("stat after remove: %v", err)
	}
}

type failing struct{}

func (failing) Read([]byte) (int, error) { return 0, errors.New("source broke") }
