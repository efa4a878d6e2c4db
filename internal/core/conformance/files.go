package conformance

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/agent"
)

func agentCode(err error) string {
	var ae *agent.AgentError
	if errors.As(err, &ae) {
		return ae.Code
	}
	return ""
}

func readFile(ctx context.Context, s *Sandbox, path string, off, n int64) (string, error) {
	_, rc, err := s.Agent.ReadFile(ctx, path, off, n)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

// testFiles checks the file API inside a real sandbox: paths resolve in
// the sandbox's root whatever they contain, read-only places stay
// read-only, and every operation works on the backend's file system
// (for containers, an overlay over the template).
func testFiles(t *testing.T, h Harness) {
	s := Create(t, h, "conf-files")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Write (with parents and a mode), read back, ranges, stat.
	mode := uint32(0o600)
	info, err := s.Agent.WriteFile(ctx, &agent.FileRequest{Path: "/root/a/b/c.txt", Parents: true, Mode: &mode}, strings.NewReader("0123456789"))
	if err != nil || info.Size != 10 || info.Mode != "0600" || info.UID != 0 {
		t.Fatalf("write: %+v %v", info, err)
	}
	if got := s.Sh(t, "stat -c '%a %s' /root/a/b/c.txt && cat /root/a/b/c.txt"); got != "600 10\n0123456789" {
		t.Fatalf("the sandbox sees %q", got)
	}
	if got, err := readFile(ctx, s, "/root/a/b/c.txt", 3, 4); err != nil || got != "3456" {
		t.Fatalf("read 3+4: %q %v", got, err)
	}
	// A 0-byte file.
	if _, err := s.Agent.WriteFile(ctx, &agent.FileRequest{Path: "/root/empty"}, bytes.NewReader(nil)); err != nil {
		t.Fatal(err)
	}
	if got, err := readFile(ctx, s, "/root/empty", 0, 0); err != nil || got != "" {
		t.Fatalf("read empty: %q %v", got, err)
	}

	// ".." cannot climb out of the sandbox's root.
	if got, err := readFile(ctx, s, "/../../../../etc/hostname", 0, 0); err != nil || strings.TrimSpace(got) != s.Name {
		t.Fatalf("/../../../../etc/hostname reads %q (%v), want the sandbox's hostname", got, err)
	}
	// Neither can a symlink to /, or /proc/1/root: a file on the host is
	// not reachable by any path.
	hostDir, err := os.MkdirTemp("", "nook-conformance-host-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(hostDir)
	hostFile := filepath.Join(hostDir, "host-secret")
	os.WriteFile(hostFile, []byte("host secret"), 0o644)
	s.Sh(t, "ln -s / /root/hostroot && ln -s ../../../../.. /root/up")
	for _, p := range []string{hostFile, "/root/hostroot" + hostFile, "/root/up" + hostFile, "/proc/1/root" + hostFile, "/proc/self/root" + hostFile, "/../.." + hostFile} {
		if got, err := readFile(ctx, s, p, 0, 0); agentCode(err) != agent.CodeNotFound {
			t.Errorf("read %s: %q %v; want not found", p, got, err)
		}
		if _, err := s.Agent.Stat(ctx, p); agentCode(err) != agent.CodeNotFound {
			t.Errorf("stat %s: %v; want not found", p, err)
		}
	}
	// Writing through them lands in the sandbox, not on the host.
	if _, err := s.Agent.WriteFile(ctx, &agent.FileRequest{Path: "/root/hostroot" + hostDir + "/planted", Parents: true}, strings.NewReader("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(hostDir, "planted")); err == nil {
		t.Fatal("a write through a symlink to / reached the host")
	}
	if got := s.Sh(t, "cat "+hostDir+"/planted"); got != "x" {
		t.Fatalf("planted file in the sandbox: %q", got)
	}
	// A tar of the symlink holds the link, not the tree it points to.
	_, rc, err := s.Agent.DownloadTar(ctx, "/root/hostroot")
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(rc)
	hdr, err := tr.Next()
	if err != nil || hdr.Typeflag != tar.TypeSymlink || hdr.Linkname != "/" {
		t.Fatalf("tar of a symlink: %+v %v", hdr, err)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Fatalf("tar of a symlink has more entries: %v", err)
	}
	rc.Close()

	// Read-only places and wrong kinds of file.
	bad := []struct {
		what string
		err  error
		code string
	}{
		{"write under /proc/sys", func() error {
			_, err := s.Agent.WriteFile(ctx, &agent.FileRequest{Path: "/proc/sys/kernel/nook"}, strings.NewReader("x"))
			return err
		}(), agent.CodePermissionDenied},
		{"mkdir under /proc/sys", func() error {
			_, err := s.Agent.Mkdir(ctx, &agent.FileRequest{Path: "/proc/sys/nook"})
			return err
		}(), agent.CodePermissionDenied},
		{"read a directory", func() error { _, err := readFile(ctx, s, "/etc", 0, 0); return err }(), agent.CodeInvalidArgument},
		{"write over a directory", func() error {
			_, err := s.Agent.WriteFile(ctx, &agent.FileRequest{Path: "/etc"}, strings.NewReader("x"))
			return err
		}(), agent.CodeInvalidArgument},
		{"read a missing file", func() error { _, err := readFile(ctx, s, "/nope", 0, 0); return err }(), agent.CodeNotFound},
		{"remove /", s.Agent.Remove(ctx, "/", true), agent.CodeInvalidArgument},
	}
	for _, b := range bad {
		if agentCode(b.err) != b.code {
			t.Errorf("%s: %v; want %s", b.what, b.err, b.code)
		}
	}

	// mkdir, list, chmod, move (a directory of the template's lower layer
	// too, which overlayfs cannot simply rename), remove.
	if _, err := s.Agent.Mkdir(ctx, &agent.FileRequest{Path: "/srv/x/y", Parents: true}); err != nil {
		t.Fatal(err)
	}
	l, err := s.Agent.ListFiles(ctx, &agent.FileRequest{Path: "/root", Recursive: true})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for {
		batch, err := l.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range batch {
			paths = append(paths, e.Path)
		}
	}
	l.Close()
	if !strings.Contains(strings.Join(paths, " "), "/root/a/b/c.txt") {
		t.Fatalf("list -r /root: %v", paths)
	}
	if info, err := s.Agent.Chmod(ctx, "/root/a/b/c.txt", 0o755); err != nil || info.Mode != "0755" {
		t.Fatalf("chmod: %+v %v", info, err)
	}
	if _, err := s.Agent.Move(ctx, "/etc/apt", "/root/apt", false); err != nil {
		t.Fatalf("move a lower-layer directory: %v", err)
	}
	if got := s.Sh(t, "test ! -e /etc/apt && ls /root/apt | grep -c sources"); strings.TrimSpace(got) == "0" {
		t.Fatalf("after moving /etc/apt: %q", got)
	}
	if _, err := s.Agent.Move(ctx, "/root/apt", "/root/a", false); agentCode(err) != agent.CodeAlreadyExists {
		t.Fatalf("move onto an existing directory: %v", err)
	}
	if err := s.Agent.Remove(ctx, "/root/apt", true); err != nil {
		t.Fatal(err)
	}

	// A tar upload cannot write outside its directory, even through a
	// symlink it creates itself; a good one extracts as it should.
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "link", Linkname: "/etc", Typeflag: tar.TypeSymlink})
	tw.WriteHeader(&tar.Header{Name: "link/nook-evil", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	s.Sh(t, "mkdir -p /root/upload")
	if _, err := s.Agent.UploadTar(ctx, "/root/upload", false, &evil); agentCode(err) != agent.CodeInvalidArgument {
		t.Fatalf("escaping tar: %v", err)
	}
	if got := s.Sh(t, "test -e /etc/nook-evil && echo escaped || echo ok"); got != "ok\n" {
		t.Fatal("a tar entry escaped through a symlink")
	}
	var good bytes.Buffer
	tw = tar.NewWriter(&good)
	tw.WriteHeader(&tar.Header{Name: "tree/", Typeflag: tar.TypeDir, Mode: 0o750})
	tw.WriteHeader(&tar.Header{Name: "tree/run.sh", Typeflag: tar.TypeReg, Mode: 0o755, Size: 17})
	tw.Write([]byte("echo from-tar-ok\n"))
	tw.Close()
	if _, err := s.Agent.UploadTar(ctx, "/opt/new", true, &good); err != nil {
		t.Fatal(err)
	}
	if got := s.Sh(t, "stat -c %a /opt/new/tree && /opt/new/tree/run.sh"); got != "750\nfrom-tar-ok\n" {
		t.Fatalf("extracted tree: %q", got)
	}

	// Watch sees what processes in the sandbox do, in new directories too.
	s.Sh(t, "mkdir -p /root/w")
	w, err := s.Agent.Watch(ctx, "/root/w", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s.Sh(t, "mkdir /root/w/d && sleep 0.2 && echo x > /root/w/d/f && rm /root/w/d/f")
	want := []string{"create /root/w/d", "create /root/w/d/f", "remove /root/w/d/f"}
	for len(want) > 0 {
		ev, err := w.Next()
		if err != nil {
			t.Fatalf("watch: %v (still waiting for %v)", err, want)
		}
		if fmt.Sprintf("%s %s", ev.Type, ev.Path) == want[0] {
			want = want[1:]
		}
	}
	if _, err := s.Agent.Ping(ctx); err != nil {
		t.Fatalf("agent after the file tests: %v", err)
	}
}
