package template

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
)

type tfile struct {
	name, data, link string
	typ              byte
	uid              int
	mode             int64
	xattrs           map[string]string
}

func tarLayer(t *testing.T, comp compression.Compression, files ...tfile) v1.Layer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Typeflag: f.typ, Linkname: f.link, Mode: 0o644, Uid: f.uid, Gid: f.uid, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if h.Typeflag == tar.TypeDir {
			h.Mode = 0o755
		}
		if f.mode != 0 {
			h.Mode = f.mode
		}
		for k, v := range f.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(f.data))
	}
	tw.Close()
	data := b.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }, tarball.WithCompression(comp))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func testImage(t *testing.T, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

func serveRegistry(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

func pushImage(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root (image layers keep owners and device nodes); make test runs it as root")
	}
}

// treeOf describes every entry below root: type, mode, owner, size,
// content digest or link target, and user xattrs.
func treeOf(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("mode=%o uid=%d gid=%d", st.Mode, st.Uid, st.Gid)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, _ := os.ReadFile(p)
			desc += fmt.Sprintf(" size=%d sha=%x", st.Size, sha256.Sum256(b))
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			desc += " -> " + l
		case unix.S_IFDIR:
		default:
			desc += fmt.Sprintf(" rdev=%d", st.Rdev)
		}
		buf := make([]byte, 4096)
		if n, err := unix.Llistxattr(p, buf); err == nil && n > 0 {
			names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
			sort.Strings(names)
			for _, x := range names {
				v := make([]byte, 4096)
				m, _ := unix.Lgetxattr(p, x, v)
				desc += fmt.Sprintf(" %s=%q", x, v[:m])
			}
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// An image's layers become a template: the build's rootfs is what an
// overlay mount of the stored layers shows (the oracle: whiteouts, an
// opaque directory, a directory over a lower symlink, a hard link across
// layers, owners, modes and xattrs), made of hard links to the layers'
// files; its config is recorded. A second image sharing the base layer
// reuses it; a tag rebuilt without --pull keeps its digest, with it
// follows the tag; removing the templates collects their layers.
func TestBuildImage(t *testing.T) {
	requireRoot(t)
	host := serveRegistry(t, nil)
	base := tarLayer(t, compression.GZip,
		tfile{name: "etc/", typ: tar.TypeDir},
		tfile{name: "etc/os-release", data: "ID=test\n"},
		tfile{name: "etc/motd", data: "old\n"},
		tfile{name: "usr/", typ: tar.TypeDir},
		tfile{name: "usr/lib/", typ: tar.TypeDir},
		tfile{name: "usr/lib/libx.so", data: "lib\n"},
		tfile{name: "lib", typ: tar.TypeSymlink, link: "usr/lib"},
		tfile{name: "usr/bin/tool", data: "tool\n", mode: 0o755, xattrs: map[string]string{"user.note": "kept"}},
		tfile{name: "opq/a", data: "a\n"},
		tfile{name: "opq/b", data: "b\n"},
		tfile{name: "home/app/", typ: tar.TypeDir, uid: 1000},
		tfile{name: "home/app/data", data: "mine\n", uid: 1000, mode: 0o600})
	mid := tarLayer(t, compression.ZStd,
		tfile{name: "etc/.wh.motd"},
		tfile{name: "usr/bin/alias", typ: tar.TypeLink, link: "usr/bin/tool"},
		tfile{name: "opq/.wh..wh..opq"},
		tfile{name: "opq/c", data: "c\n"})
	top := tarLayer(t, compression.GZip,
		tfile{name: "lib/", typ: tar.TypeDir, mode: 0o750},
		tfile{name: "lib/own", data: "own\n"},
		tfile{name: "srv/app.py", data: "print('hi')\n"})
	cfg := v1.Config{Env: []string{"PATH=/usr/local/bin:/usr/bin:/bin", "APP=1"}, WorkingDir: "/srv", User: "1000:1000",
		Cmd: []string{"python3", "app.py"}, ExposedPorts: map[string]struct{}{"8000/tcp": {}}, Labels: map[string]string{"org": "nook"}}
	pushImage(t, host+"/app:1", testImage(t, cfg, base, mid, top))
	pushImage(t, host+"/other:1", testImage(t, v1.Config{}, base, tarLayer(t, compression.None, tfile{name: "other", data: "x"})))

	dir := t.TempDir()
	s := NewStore(dir, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	var events []api.BuildLayerEvent
	var progress bytes.Buffer
	tpl, err := s.BuildImage(ctx, "app", host+"/app:1", ImageOptions{OnLayer: func(e api.BuildLayerEvent) { events = append(events, e) }}, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Source != SourceImage || tpl.Image != host+"/app:1" || !strings.HasPrefix(tpl.Digest, "sha256:") || len(tpl.Layers) != 3 ||
		!strings.Contains(tpl.Canonical, "@sha256:") || tpl.Platform != "linux/amd64" {
		t.Fatalf("template: %+v", tpl)
	}
	if c := tpl.Config; c == nil || c.WorkingDir != "/srv" || c.User != "1000:1000" || len(c.Env) != 2 || c.ExposedPorts[0] != "8000/tcp" || c.Labels["org"] != "nook" || c.Cmd[1] != "app.py" {
		t.Fatalf("config: %+v", tpl.Config)
	}
	if len(events) != 3 || events[0].Cached || events[2].Index != 2 || events[2].Count != 3 {
		t.Fatalf("layer events: %+v", events)
	}
	if got, err := s.Get("app"); err != nil || got.ID != tpl.ID || got.Digest != tpl.Digest || got.Config.User != "1000:1000" {
		t.Fatalf("Get: %+v %v", got, err)
	}
	rootfs, err := s.Rootfs(tpl.ID)
	if err != nil {
		t.Fatal(err)
	}

	// The oracle: overlay's own view of the stored layers.
	var layerDirs []string
	m := readMetaFile(t, dir, tpl.ID)
	for i := len(m.Layers) - 1; i >= 0; i-- {
		layerDirs = append(layerDirs, filepath.Join(dir, ".layers", strings.TrimPrefix(m.Layers[i].Chain, "sha256:"), "layer"))
	}
	mnt := t.TempDir()
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(layerDirs, ":")); err != nil {
		t.Fatal(err)
	}
	want := treeOf(t, mnt)
	unix.Unmount(mnt, unix.MNT_DETACH)
	got := treeOf(t, rootfs)
	for _, d := range []string{"proc", "sys", "dev", "run", "root", "tmp"} { // made for every sandbox
		if _, ok := got[d]; !ok {
			t.Errorf("rootfs lacks /%s", d)
		}
		delete(got, d)
	}
	delete(got, ".")
	delete(want, ".")
	for p, w := range want {
		if got[p] != w {
			t.Errorf("%s: rootfs %q, overlay %q", p, got[p], w)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s: in the rootfs, not in overlay's view", p)
		}
	}
	for _, p := range []string{"etc/motd", "opq/a", "opq/b"} {
		if _, ok := got[p]; ok {
			t.Errorf("%s was whited out or under an opaque directory", p)
		}
	}
	if !strings.HasPrefix(got["lib"], fmt.Sprintf("mode=%o", unix.S_IFDIR|0o750)) || got["lib/own"] == "" {
		t.Errorf("the top layer's lib/ directory replaces the base's symlink: %q", got["lib"])
	}
	if !strings.Contains(got["home/app/data"], "uid=1000") || !strings.Contains(got["usr/bin/tool"], `user.note="kept"`) {
		t.Errorf("owners and xattrs: %q %q", got["home/app/data"], got["usr/bin/tool"])
	}
	buf := make([]byte, 8)
	if _, err := unix.Lgetxattr(filepath.Join(rootfs, "opq"), "trusted.overlay.opaque", buf); err == nil {
		t.Error("the rootfs's opq has overlay's opaque xattr: a merged rootfs has none")
	}
	var a, b unix.Stat_t
	unix.Stat(filepath.Join(rootfs, "srv/app.py"), &a)
	unix.Stat(filepath.Join(layerDirs[0], "srv/app.py"), &b)
	if a.Ino != b.Ino {
		t.Error("rootfs files are copies, not links to the stored layer's")
	}

	// Another image with the same base: one layer more in the store.
	if _, err := s.BuildImage(ctx, "other", host+"/other:1", ImageOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	if n := countLayers(t, dir); n != 5 { // and the base directories' layer
		t.Fatalf("%d layers stored for 2 images sharing a base: want 5", n)
	}

	// A new image under the same tag: a rebuild keeps the recorded digest
	// unless told to pull.
	pushImage(t, host+"/app:1", testImage(t, cfg, base, mid))
	again, err := s.BuildImage(ctx, "app", host+"/app:1", ImageOptions{}, nil)
	if err != nil || again.Digest != tpl.Digest || again.ID == tpl.ID {
		t.Fatalf("rebuild without pull: %+v %v", again, err)
	}
	pulled, err := s.BuildImage(ctx, "app", host+"/app:1", ImageOptions{Pull: true}, nil)
	if err != nil || pulled.Digest == tpl.Digest || len(pulled.Layers) != 2 {
		t.Fatalf("rebuild with pull: %+v %v", pulled, err)
	}
	none := func(string) (int, error) { return 0, nil }
	if err := s.GC(ctx, "app", none); err != nil {
		t.Fatal(err)
	}
	if n := countLayers(t, dir); n != 4 { // base, mid, other's, the base directories'
		t.Fatalf("%d layers after the old builds went: want 4", n)
	}
	if err := s.Remove(ctx, "app", none); err != nil {
		t.Fatal(err)
	}
	if n := countLayers(t, dir); n != 3 {
		t.Fatalf("%d layers after app went: want other's 2 and the base directories'", n)
	}
	if err := s.Remove(ctx, "other", none); err != nil {
		t.Fatal(err)
	}
	if n := countLayers(t, dir); n != 0 {
		t.Fatalf("%d layers after every template went", n)
	}
	// A recipe's name built from an image is the image's: never "stale".
	fakeBuild(t, dir, "base", "b1", false)
	if _, err := s.BuildImage(ctx, "base", host+"/other:1", ImageOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := s.EnsureBuilt(ctx, "base", nil); err != nil || got.Source != SourceImage {
		t.Fatalf("an image template named base was rebuilt from the recipe: %+v %v", got, err)
	}
}

// Bad input: an unknown image, a corrupt layer (its bytes are not its
// digest's) and a layer that climbs out of itself are clear errors, and
// no template (or build directory) is left.
func TestBuildImageBadInput(t *testing.T) {
	requireRoot(t)
	corrupt, flipAt := false, -1
	host := serveRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if corrupt && r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/sha256:") {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				body := rec.Body.Bytes()
				if len(body) > 4096 { // the layer, not the config
					body = bytes.Clone(body)
					if flipAt >= 0 {
						body[flipAt] ^= 0xff
					} else {
						body[len(body)/2] ^= 0xff
					}
				}
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				w.Write(body)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	dir := t.TempDir()
	s := NewStore(dir, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	noTemplate := func(name string) {
		t.Helper()
		if _, err := s.Get(name); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("template %s exists after a failed build: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Errorf("a failed first build left the template's directory: %v", err)
		}
	}
	if _, err := s.BuildImage(ctx, "nope", host+"/nothing:1", ImageOptions{}, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown image: %v", err)
	}
	noTemplate("nope")
	if _, err := s.BuildImage(ctx, "bad", "oci:", ImageOptions{}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("bad reference: %v", err)
	}

	evil := tarLayer(t, compression.GZip, tfile{name: "x", typ: tar.TypeSymlink, link: "/"}, tfile{name: "x/etc/passwd", data: "pwned"})
	pushImage(t, host+"/evil:1", testImage(t, v1.Config{}, evil))
	if _, err := s.BuildImage(ctx, "evil", host+"/evil:1", ImageOptions{}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "layer 1 of 1") {
		t.Errorf("escaping layer: %v", err)
	}
	noTemplate("evil")

	noise := make([]byte, 64<<10)
	rand.Read(noise)
	pushImage(t, host+"/corrupt:1", testImage(t, v1.Config{}, tarLayer(t, compression.GZip, tfile{name: "f", data: string(noise)})))
	corrupt = true
	_, err := s.BuildImage(ctx, "corrupt", host+"/corrupt:1", ImageOptions{}, nil)
	corrupt = false
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "layer 1 of 1") || !strings.Contains(err.Error(), "decompress") && !strings.Contains(err.Error(), "digest") {
		t.Errorf("corrupt layer: %v", err)
	}
	noTemplate("corrupt")
	// A byte of gzip's header time changed: the stream still reads, its
	// tar is the same, only the bytes' digest (which the registry client
	// checks at their end) tells.
	corrupt, flipAt = true, 5
	_, err = s.BuildImage(ctx, "corrupt", host+"/corrupt:1", ImageOptions{}, nil)
	corrupt, flipAt = false, -1
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "digest") {
		t.Errorf("a layer whose bytes are not its digest's: %v", err)
	}
	noTemplate("corrupt")
}

func readMetaFile(t *testing.T, dir, id string) *meta {
	t.Helper()
	n, b, _ := strings.Cut(id, "/")
	var m meta
	raw, err := os.ReadFile(filepath.Join(dir, n, b, "template.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return &m
}

func countLayers(t *testing.T, dir string) int {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(dir, ".layers"))
	n := 0
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			n++
		}
	}
	return n
}

// An image's config reaches every exec of every sandbox of the
// template: entries the agent would refuse are left out with a warning,
// a user it could not pass on fails the build.
func TestImageConfigChecked(t *testing.T) {
	requireRoot(t)
	host := serveRegistry(t, nil)
	layer := tarLayer(t, compression.GZip, tfile{name: "f", data: "x"})
	pushImage(t, host+"/odd:1", testImage(t, v1.Config{Env: []string{"GOOD=1", "NOEQUALS", "=empty", "NUL=a\x00b"}, WorkingDir: "relative/dir"}, layer))
	pushImage(t, host+"/baduser:1", testImage(t, v1.Config{User: "root\x00evil"}, layer))
	s := NewStore(t.TempDir(), slog.New(slog.DiscardHandler))
	var progress bytes.Buffer
	tpl, err := s.BuildImage(context.Background(), "odd", host+"/odd:1", ImageOptions{}, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if c := tpl.Config; len(c.Env) != 1 || c.Env[0] != "GOOD=1" || c.WorkingDir != "" {
		t.Errorf("config kept: %+v", c)
	}
	if n := strings.Count(progress.String(), "warning:"); n != 4 {
		t.Errorf("%d warnings, want 4:\n%s", n, progress.String())
	}
	if _, err := s.BuildImage(context.Background(), "baduser", host+"/baduser:1", ImageOptions{}, nil); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a user with a NUL: %v", err)
	}
}

// A pull that stalls says what it waits for, and one that flows says
// how far it is, while the layer comes.
func TestBuildImageSaysWhatItWaitsFor(t *testing.T) {
	requireRoot(t)
	defer func(d, p time.Duration) { progressEvery, pullEvery = d, p }(progressEvery, pullEvery)
	progressEvery, pullEvery = 20*time.Millisecond, 20*time.Millisecond
	progress := &watchedBuffer{}
	host := serveRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				if rec.Body.Len() < 4096 { // the config
					w.WriteHeader(rec.Code)
					w.Write(rec.Body.Bytes())
					return
				}
				// Nothing until the build has said it waits; half until
				// it has said how far it is; then the rest.
				progress.waitFor(t, "no byte yet")
				w.WriteHeader(rec.Code)
				body := rec.Body.Bytes()
				w.Write(body[:len(body)/2])
				w.(http.Flusher).Flush()
				progress.waitFor(t, "of 0.3 MB")
				w.Write(body[len(body)/2:])
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	noise := make([]byte, 256<<10)
	rand.Read(noise)
	pushImage(t, host+"/slow:1", testImage(t, v1.Config{}, tarLayer(t, compression.GZip, tfile{name: "f", data: string(noise)})))
	var pulls []api.BuildPullEvent // told in order, all before BuildImage returns
	if _, err := NewStore(t.TempDir(), slog.New(slog.DiscardHandler)).BuildImage(context.Background(), "slow", host+"/slow:1",
		ImageOptions{OnPull: func(p api.BuildPullEvent) { pulls = append(pulls, p) }}, progress); err != nil {
		t.Fatal(err)
	}
	if out := progress.String(); !strings.Contains(out, "no byte yet") || !strings.Contains(out, "MB/s)") || !strings.Contains(out, "of 0.3 MB") {
		t.Errorf("progress of a slow pull:\n%s", out)
	}
	// The events say how far the layer is: none of it, then part of it
	// (the registry sent half and waited), never going back.
	var part bool
	for i, p := range pulls {
		if p.Index != 0 || p.Count != 1 || p.Size < 256<<10 || p.Received > p.Size || (i > 0 && p.Received <= pulls[i-1].Received) {
			t.Fatalf("pull events: %+v", pulls)
		}
		part = part || (p.Received > 0 && p.Received < p.Size)
	}
	if len(pulls) == 0 || pulls[0].Received != 0 || !part {
		t.Errorf("pull events: %+v", pulls)
	}
}

// watchedBuffer is a build's progress that a test can wait on.
type watchedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *watchedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *watchedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitFor waits (at most 30 s) until the progress holds s.
func (b *watchedBuffer) waitFor(t *testing.T, s string) {
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(b.String(), s) {
		if time.Now().After(deadline) {
			t.Errorf("the progress never said %q:\n%s", s, b.String())
			return
		}
		<-time.After(5 * time.Millisecond) // a poll of the condition, bounded by the deadline
	}
}
