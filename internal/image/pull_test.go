package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/layerstore"
)

type file struct {
	name, data, link string
	typ              byte
}

func tarLayer(t *testing.T, comp compression.Compression, files ...file) v1.Layer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Typeflag: f.typ, Linkname: f.link, Mode: 0o644, ModTime: time.Unix(1700000000, 0)}
		if h.Typeflag == 0 {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if h.Typeflag == tar.TypeDir {
			h.Mode = 0o755
		}
		tw.WriteHeader(h)
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

// From a registry to a root filesystem: an image of a gzip and a zstd
// layer is resolved, each layer unpacked over the ones below it into the
// layer store (checked against its digests), and the layers mounted as
// overlay lowers show the image's files: the upper layer's whiteout and
// its hard link to a file of the lower one included. A second image that
// shares the bottom layer reuses it.
func TestPullIntoLayerStore(t *testing.T) {
	requireRoot(t)
	host := serve(t, nil)
	base := tarLayer(t, compression.GZip,
		file{name: "etc/", typ: tar.TypeDir},
		file{name: "etc/os-release", data: "ID=test\n"},
		file{name: "etc/motd", data: "old\n"},
		file{name: "usr/bin/tool", data: "tool\n"})
	top := tarLayer(t, compression.ZStd,
		file{name: "etc/.wh.motd"},
		file{name: "usr/bin/alias", typ: tar.TypeLink, link: "usr/bin/tool"},
		file{name: "srv/app", data: "app\n"})
	img, err := mutate.AppendLayers(empty.Image, base, top)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	push(t, host+"/app:1", img)
	other, _ := mutate.AppendLayers(empty.Image, base, tarLayer(t, compression.GZip, file{name: "other", data: "x"}))
	ocf, _ := other.ConfigFile()
	ocf = ocf.DeepCopy()
	ocf.OS, ocf.Architecture = "linux", "amd64"
	other, _ = mutate.ConfigFile(other, ocf)
	push(t, host+"/other:1", other)

	store, err := layerstore.Open(filepath.Join(t.TempDir(), "layers"))
	if err != nil {
		t.Fatal(err)
	}
	pull := func(ref string) (dirs []string, made int) {
		res, err := resolve(t, ref, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range res.Layers {
			lowers := make([]string, 0, len(dirs))
			for i := len(dirs) - 1; i >= 0; i-- {
				lowers = append(lowers, dirs[i])
			}
			dir, m, err := store.Ensure(context.Background(), l.Blob(), lowers, layerstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if m {
				made++
			}
			dirs = append(dirs, dir)
		}
		return dirs, made
	}
	dirs, made := pull(host + "/app:1")
	if made != 2 {
		t.Fatalf("made %d layers of 2", made)
	}
	if _, made := pull(host + "/other:1"); made != 1 {
		t.Fatalf("the second image made %d layers; its base is shared", made)
	}
	mnt := t.TempDir()
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+dirs[1]+":"+dirs[0]); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	for p, want := range map[string]string{"etc/os-release": "ID=test\n", "usr/bin/alias": "tool\n", "srv/app": "app\n"} {
		if got, err := os.ReadFile(filepath.Join(mnt, p)); err != nil || string(got) != want {
			t.Errorf("%s: %q %v", p, got, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(mnt, "etc/motd")); !os.IsNotExist(err) {
		t.Errorf("the whited-out etc/motd: %v", err)
	}
}
