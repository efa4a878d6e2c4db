package e2b

import (
	"net/http"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	fspb "github.com/nookhq/nook/internal/e2b/envdpb/filesystem"
)

func TestResolvePath(t *testing.T) {
	for _, c := range []struct{ user, p, want string }{ // want "": an error
		{"", "", "/root"},
		{"", "a.txt", "/root/a.txt"},
		{"root", "~", "/root"},
		{"user", "", "/home/user"},
		{"user", "a/b", "/home/user/a/b"},
		{"user", "./a/../b", "/home/user/b"},
		{"user", "~/x/", "/home/user/x"},
		{"user", "/tmp/../etc/x", "/etc/x"},
		{"user", "../../../../x", "/x"},
		{"user", "/", "/"},
		{"user", "~other/x", ""},
		{"../x", "a", ""},
		{"a/b", "a", ""},
	} {
		got, err := resolvePath(c.user, c.p)
		if c.want == "" {
			if err == nil {
				t.Errorf("resolvePath(%q, %q) = %q, want an error", c.user, c.p, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("resolvePath(%q, %q) = %q, %v; want %q", c.user, c.p, got, err, c.want)
		}
	}
}

func TestKeepaliveEvery(t *testing.T) {
	for v, want := range map[string]time.Duration{
		"":     90 * time.Second,
		"50":   50 * time.Second,
		"1":    time.Second,
		"0":    90 * time.Second,
		"-5":   90 * time.Second,
		"abc":  90 * time.Second,
		"300":  300 * time.Second,
		"1000": 300 * time.Second,
	} {
		h := http.Header{}
		if v != "" {
			h.Set("Keepalive-Ping-Interval", v)
		}
		if got := keepaliveEvery(h); got != want {
			t.Errorf("Keepalive-Ping-Interval %q: %v, want %v", v, got, want)
		}
	}
}

func TestEntryOf(t *testing.T) {
	mtime := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		info  api.FileInfo
		typ   fspb.FileType
		mode  uint32
		perm  string
		owner string
		link  string
	}{
		{api.FileInfo{Path: "/root/a.txt", Type: api.FileTypeFile, Mode: "0644", ModTime: mtime}, fspb.FileType_FILE_TYPE_FILE, 0o644, "-rw-r--r--", "root", ""},
		{api.FileInfo{Path: "/home/user", Type: api.FileTypeDir, Mode: "0755", UID: 1000, GID: 1000}, fspb.FileType_FILE_TYPE_DIRECTORY, 0o755, "drwxr-xr-x", "1000", ""},
		{api.FileInfo{Path: "/usr/bin/su", Type: api.FileTypeFile, Mode: "4755"}, fspb.FileType_FILE_TYPE_FILE, 0o755, "urwxr-xr-x", "root", ""},
		{api.FileInfo{Path: "/a/l", Type: api.FileTypeSymlink, Mode: "0777", LinkTarget: "../b/t"}, fspb.FileType_FILE_TYPE_SYMLINK, 0o777, "Lrwxrwxrwx", "root", "/b/t"},
		{api.FileInfo{Path: "/a/m", Type: api.FileTypeSymlink, Mode: "0777", LinkTarget: "/etc/x"}, fspb.FileType_FILE_TYPE_SYMLINK, 0o777, "Lrwxrwxrwx", "root", "/etc/x"},
		{api.FileInfo{Path: "/run/s.sock", Type: api.FileTypeOther, Mode: "0600"}, fspb.FileType_FILE_TYPE_UNSPECIFIED, 0o600, "?rw-------", "root", ""},
	} {
		e := entryOf(&c.info, nil)
		if e.GetType() != c.typ || e.GetMode() != c.mode || e.GetPermissions() != c.perm || e.GetOwner() != c.owner || e.GetGroup() != c.owner || e.GetSymlinkTarget() != c.link {
			t.Errorf("%s: got %v", c.info.Path, e)
		}
		if e.GetPath() != c.info.Path || e.GetName() != c.info.Path[len(c.info.Path)-len(e.GetName()):] {
			t.Errorf("%s: path %q, name %q", c.info.Path, e.GetPath(), e.GetName())
		}
		if !c.info.ModTime.IsZero() && !e.GetModifiedTime().AsTime().Equal(c.info.ModTime) {
			t.Errorf("%s: modified %v", c.info.Path, e.GetModifiedTime())
		}
	}
}

func TestDepthBelow(t *testing.T) {
	for _, c := range []struct {
		dir, p string
		want   int
	}{
		{"/root", "/root/a", 1},
		{"/root", "/root/a/b", 2},
		{"/", "/a", 1},
		{"/", "/a/b/c", 3},
	} {
		if got := depthBelow(c.dir, c.p); got != c.want {
			t.Errorf("depthBelow(%q, %q) = %d, want %d", c.dir, c.p, got, c.want)
		}
	}
}
