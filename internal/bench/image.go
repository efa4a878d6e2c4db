package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"log/slog"
	"maps"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/template"
)

// imageRounds is how many times each image figure is taken.
const imageRounds = 5

// runImage measures a template built from an image in a registry on a
// loopback port (50 MB in 3 gzip layers), pulled, unpacked and merged
// into a template, beside the registry library's own pull of the same
// image to a tarball (what `crane pull` does), each into an empty store.
func runImage(ctx context.Context, cfg Config, root string) error {
	fmt.Fprintln(cfg.Out, "image template: a 50 MB, 3-layer image in a registry on 127.0.0.1...")
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/bench:1"
	img, err := benchImage(3, 50<<20)
	if err != nil {
		return err
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return err
	}
	if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("push the bench image: %w", err)
	}
	dir := filepath.Join(root, "image")
	var pull, build, rebuild []time.Duration
	for i := range imageRounds {
		f := filepath.Join(dir, fmt.Sprintf("pull-%d.tar", i))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		start := time.Now()
		ri, err := remote.Image(r, remote.WithContext(ctx))
		if err == nil {
			err = tarball.WriteToFile(f, r, ri)
		}
		if err != nil {
			return fmt.Errorf("baseline pull: %w", err)
		}
		pull = append(pull, time.Since(start))
		os.Remove(f)

		store := template.NewStore(filepath.Join(dir, fmt.Sprintf("templates-%d", i)), slog.New(slog.DiscardHandler))
		start = time.Now()
		if _, err := store.BuildImage(ctx, "bench", ref, template.ImageOptions{}, nil); err != nil {
			return fmt.Errorf("template from the image: %w", err)
		}
		build = append(build, time.Since(start))
		// Another template of the same image: every layer cached.
		start = time.Now()
		if _, err := store.BuildImage(ctx, "again", ref, template.ImageOptions{}, nil); err != nil {
			return fmt.Errorf("template from the image again: %w", err)
		}
		rebuild = append(rebuild, time.Since(start))
	}
	// The stores go only now: ext4 skips, one by one, the inodes freed
	// in the last minutes (more while their blocks are dirty) when it
	// picks one for a new file, so a round right after the removal of
	// the last one's 650 files would pay for it (0.3-0.8 ms more per
	// file created on this machine's disk).
	for i := range imageRounds {
		if err := os.RemoveAll(filepath.Join(dir, fmt.Sprintf("templates-%d", i))); err != nil {
			return err
		}
	}
	fromBase, fromImage, vmBase, vmImage, err := createFromImage(ctx, cfg, root)
	if err != nil {
		return err
	}
	coldApp, warmApp, err := dockerfileRebuild(ctx, cfg, root, appSteps)
	if err != nil {
		return err
	}
	cold, warm, err := dockerfileRebuild(ctx, cfg, root, trivialSteps)
	if err != nil {
		return err
	}
	fmt.Fprintln(cfg.Out)
	tw := tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "image template (50 MB, 3 layers, gzip)\tp50\tbaseline\tbaseline p50\tratio p50\ttarget")
	fmt.Fprintf(tw, "template build --from (pull, unpack, merge)\t%s\tgo-containerregistry pull to a tarball\t%s\t%.2fx\t<= 1.5x\n",
		ms(pct(build, .5)), ms(pct(pull, .5)), float64(pct(build, .5))/float64(pct(pull, .5)))
	fmt.Fprintf(tw, "another template of the same image (layers cached)\t%s\ttemplate build --from\t%s\t%.2fx\t-\n",
		ms(pct(rebuild, .5)), ms(pct(build, .5)), float64(pct(rebuild, .5))/float64(pct(build, .5)))
	fmt.Fprintf(tw, "container create from a Debian image template -> first exec output (cold)\t%s\tthe same from base\t%s\t%.2fx\t<= 1.1x\n",
		ms(pct(fromImage, .5)), ms(pct(fromBase, .5)), float64(pct(fromImage, .5))/float64(pct(fromBase, .5)))
	fmt.Fprintf(tw, "%s\t%s\tits cold build\t%s\t%.2fx\t<= 0.10x\n",
		appSteps.what, ms(pct(warmApp, .5)), ms(pct(coldApp, .5)), float64(pct(warmApp, .5))/float64(pct(coldApp, .5)))
	fmt.Fprintf(tw, "%s\t%s\tits cold build\t%s\t%.2fx\t- (>= 0.10x by construction)\n",
		trivialSteps.what, ms(pct(warm, .5)), ms(pct(cold, .5)), float64(pct(warm, .5))/float64(pct(cold, .5)))
	if len(vmImage) > 0 {
		fmt.Fprintf(tw, "vm create from a Debian image template -> first exec output\t%s\tthe same from base\t%s\t%.2fx\t<= 1.1x\n",
			ms(pct(vmImage, .5)), ms(pct(vmBase, .5)), float64(pct(vmImage, .5))/float64(pct(vmBase, .5)))
	}
	return tw.Flush()
}

// createFromImage times creates to first exec output from base and from
// a template of an image holding base's own root (one uncompressed
// layer, and a small one on top), alternately, in one daemon without a
// warm pool; vms too (after one create of each has made the template's
// snapshot) when cfg.VM.
func createFromImage(ctx context.Context, cfg Config, root string) (fromBase, fromImage, vmBase, vmImage []time.Duration, err error) {
	fmt.Fprintln(cfg.Out, "image template: creates from a template of base's root as an image, beside creates from base...")
	tpls := template.NewStore(cfg.TemplatesDir, slog.New(slog.DiscardHandler))
	base, err := tpls.Get("base")
	if err != nil {
		return nil, nil, nil, nil, err
	}
	rootfs, err := tpls.Rootfs(base.ID)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	tarFile := filepath.Join(root, "base.tar")
	if out, err := exec.CommandContext(ctx, "tar", "--xattrs", "--numeric-owner", "-C", rootfs, "-cf", tarFile, ".").CombinedOutput(); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("tar base: %v: %s", err, out)
	}
	raw, err := os.ReadFile(tarFile)
	os.Remove(tarFile)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	top, err := benchImage(1, 1<<20)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	topLayers, _ := top.Layers()
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(raw, types.OCIUncompressedLayer), topLayers[0])
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, nil, nil, nil, err
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/debian:1"
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
		return nil, nil, nil, nil, err
	}
	dir := filepath.Join(root, "imgd")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, nil, nil, nil, err
	}
	cl, stop, err := serve(ctx, cfg, dir, -1)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	defer stop()
	tname := fmt.Sprintf("bench-img-%d", time.Now().UnixNano()%1e6)
	if _, err := cl.BuildTemplateFrom(ctx, api.BuildTemplateRequest{Name: tname, From: ref, Start: "none"}, nil); err != nil {
		return nil, nil, nil, nil, fmt.Errorf("template from the Debian image: %w", err)
	}
	defer cl.DeleteTemplate(context.WithoutCancel(ctx), tname)
	create := func(i int, tpl, isolation string, out *[]time.Duration) error {
		sb := fmt.Sprintf("bench-img-%s-%d", isolation, i)
		req := api.CreateSandboxRequest{Name: sb, Template: tpl, Isolation: isolation}
		if isolation == api.IsolationVM {
			req.CPUs, req.Memory = 1, "512M"
		}
		start := time.Now()
		if _, err := cl.CreateSandbox(ctx, req); err != nil {
			return err
		}
		fw := &firstWrite{start: start}
		if _, err := cl.Exec(ctx, sb, api.ExecRequest{Cmd: []string{"echo", "hi"}}, fw, io.Discard); err != nil {
			return err
		}
		if i >= 0 {
			*out = append(*out, fw.at)
		}
		return cl.DeleteSandbox(ctx, sb)
	}
	for i := range 10 {
		if err := create(i, "base", api.IsolationContainer, &fromBase); err != nil {
			return nil, nil, nil, nil, err
		}
		if err := create(i, tname, api.IsolationContainer, &fromImage); err != nil {
			return nil, nil, nil, nil, err
		}
	}
	if !cfg.VM {
		return fromBase, fromImage, nil, nil, nil
	}
	for i := -1; i < 5; i++ { // -1: the template snapshot of each is made
		if err := create(i, "base", api.IsolationVM, &vmBase); err != nil {
			return nil, nil, nil, nil, err
		}
		if err := create(i, tname, api.IsolationVM, &vmImage); err != nil {
			return nil, nil, nil, nil, err
		}
	}
	return fromBase, fromImage, vmBase, vmImage, nil
}

// benchImage is an image of n gzip layers holding size bytes of random
// (incompressible) data between them, in files of 1 MiB and a few small ones.
func benchImage(n int, size int64) (v1.Image, error) {
	var layers []v1.Layer
	for i := range n {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		chunk := make([]byte, 1<<20)
		for j := int64(0); j < size/int64(n)/int64(len(chunk)); j++ {
			rand.Read(chunk)
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("layer%d/data%d", i, j), Mode: 0o644, Size: int64(len(chunk)), Typeflag: tar.TypeReg}); err != nil {
				return nil, err
			}
			tw.Write(chunk)
		}
		for j := range 200 {
			s := fmt.Sprintf("small file %d of layer %d\n", j, i)
			if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("layer%d/small/%d", i, j), Mode: 0o644, Size: int64(len(s)), Typeflag: tar.TypeReg}); err != nil {
				return nil, err
			}
			tw.Write([]byte(s))
		}
		tw.Close()
		data := b.Bytes()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	return mutate.ConfigFile(img, cf)
}

// A dockerfileShape is a Dockerfile of 10 steps whose first step is new
// each round (nonce) and whose last step is last, and its context's
// files.
type dockerfileShape struct {
	key   string // its daemon's directory
	what  string
	df    func(nonce int64, last string) string
	files map[string]string
}

// trivialSteps is FROM base and 10 RUN steps, each an echo to a file: a
// rebuild (the fixed cost and one step) is then at least a tenth of the
// cold build (the fixed cost and ten steps).
var trivialSteps = dockerfileShape{
	key:  "trivial",
	what: "Dockerfile of 10 trivial RUN steps FROM base (echo to a file), rebuilt with the last changed",
	df: func(nonce int64, last string) string {
		var df strings.Builder
		fmt.Fprintf(&df, "FROM base\nRUN echo %d > /nonce\n", nonce)
		for i := 2; i < 10; i++ {
			fmt.Fprintf(&df, "RUN echo step %d > /step%d\n", i, i)
		}
		fmt.Fprintf(&df, "RUN echo %s > /last\n", last)
		return df.String()
	},
}

// appSteps is a Python service's Dockerfile as Docker's cache advice
// shapes one: its dependencies first (a virtualenv with pip installed
// in it from the wheel Python carries: no network), its code copied and
// compiled, its user, and its version stamped last, the line a release
// changes.
var appSteps = dockerfileShape{
	key:  "app",
	what: "Dockerfile of a Python service (10 steps: venv, COPY, compile, user...), rebuilt with the last changed",
	df: func(nonce int64, last string) string {
		return fmt.Sprintf(`FROM base
ENV BUILD_NONCE=%d PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
RUN /opt/venv/bin/python -m pip --version > /opt/venv/pip-version
WORKDIR /app
COPY app/ /app/
RUN /opt/venv/bin/python -m compileall -q /app
RUN useradd --create-home --uid 1500 svc && chown -R svc /app
USER svc
EXPOSE 8000
RUN echo %s > /app/VERSION
`, nonce, last)
	},
	files: map[string]string{
		"app/main.py":         "from app import server\n\nif __name__ == '__main__':\n    server.run(8000)\n",
		"app/app/__init__.py": "",
		"app/app/server.py":   "import http.server\n\n\ndef run(port):\n    http.server.ThreadingHTTPServer(('', port), http.server.SimpleHTTPRequestHandler).serve_forever()\n",
		".dockerignore":       "*.pyc\n",
	},
}

// dockerfileRebuild times, 3 times, the cold build of a Dockerfile of
// the shape (its first step new each time) and its rebuild with the last
// step changed, in a daemon of its own.
func dockerfileRebuild(ctx context.Context, cfg Config, root string, shape dockerfileShape) (cold, warm []time.Duration, err error) {
	fmt.Fprintf(cfg.Out, "image template: %s, cold and rebuilt...\n", shape.what)
	dir := filepath.Join(root, "dfd-"+shape.key)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, nil, err
	}
	cl, stop, err := serve(ctx, cfg, dir, -1)
	if err != nil {
		return nil, nil, err
	}
	defer stop()
	for round := range 3 {
		nonce := time.Now().UnixNano()
		name := fmt.Sprintf("bench-df-%d", nonce%1e6)
		build := func(last string) (time.Duration, error) {
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			files := map[string]string{"Dockerfile": shape.df(nonce, last)}
			maps.Copy(files, shape.files)
			for _, n := range slices.Sorted(maps.Keys(files)) {
				tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(files[n])), Typeflag: tar.TypeReg})
				tw.Write([]byte(files[n]))
			}
			tw.Close()
			start := time.Now()
			_, err := cl.BuildTemplateDockerfile(ctx, name, api.DockerfileBuild{}, &b, nil)
			return time.Since(start), err
		}
		c, err := build("first")
		if err != nil {
			return nil, nil, fmt.Errorf("the cold build of the Dockerfile: %w", err)
		}
		w, err := build(fmt.Sprintf("changed-%d", round))
		if err != nil {
			return nil, nil, fmt.Errorf("the rebuild of the Dockerfile: %w", err)
		}
		cold, warm = append(cold, c), append(warm, w)
		if err := cl.DeleteTemplate(ctx, name); err != nil {
			return nil, nil, err
		}
	}
	return cold, warm, nil
}
