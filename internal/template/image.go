package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/image"
	"github.com/nookhq/nook/internal/layerstore"
)

// ImageOptions tune BuildImage.
type ImageOptions struct {
	// Pull resolves the reference again; without it, a rebuild of a
	// template from the same registry reference uses the digest the
	// current build recorded (a tag moved since is not followed).
	Pull bool
	// Resolve tunes the registry client (credentials, transport, platform).
	Resolve image.Options
	// OnLayer is told about each layer once it is in the layer store.
	OnLayer func(api.BuildLayerEvent)
	// OnPull is told, every pullEvery while a layer is pulled, how many
	// of its bytes have come.
	OnPull func(api.BuildPullEvent)
	// MaxLayerBytes bounds what one layer unpacks to (0: DefaultMaxLayerBytes).
	MaxLayerBytes int64
	// Start and Ready: see api.BuildTemplateRequest.
	Start, Ready string
}

// MaxReadyWait bounds how long a create waits for a template's service
// to be ready.
const MaxReadyWait = 2 * time.Minute

// ParseReady checks a readiness check (port:N, file:PATH, cmd:CMD) and
// returns its kind and argument.
func ParseReady(s string) (kind, arg string, err error) {
	kind, arg, ok := strings.Cut(s, ":")
	switch {
	case !ok:
	case kind == "port":
		if n, err := strconv.Atoi(arg); err == nil && n > 0 && n < 65536 {
			return kind, arg, nil
		}
	case kind == "file":
		if filepath.IsAbs(arg) && !strings.ContainsRune(arg, 0) {
			return kind, arg, nil
		}
	case kind == "cmd":
		if strings.TrimSpace(arg) != "" && !strings.ContainsRune(arg, 0) {
			return kind, arg, nil
		}
	}
	return "", "", errdefs.Invalid("ready %q is not valid: use port:N (1-65535), file:/ABSOLUTE/PATH or cmd:COMMAND", s)
}

// service is what a template from res starts, as opt says.
func service(cfg *api.ImageConfig, opt ImageOptions) (*api.TemplateService, error) {
	if opt.Ready != "" {
		if _, _, err := ParseReady(opt.Ready); err != nil {
			return nil, err
		}
	}
	switch {
	case opt.Start == "none":
		if opt.Ready != "" {
			return nil, errdefs.Invalid("ready needs a service: drop --start none, or --ready")
		}
		return nil, nil
	case strings.ContainsRune(opt.Start, 0):
		return nil, errdefs.Invalid("start command has a NUL byte")
	case opt.Start != "":
		return &api.TemplateService{Cmd: []string{"sh", "-c", opt.Start}, Ready: opt.Ready}, nil
	}
	cmd := append(append([]string(nil), cfg.Entrypoint...), cfg.Cmd...)
	if len(cmd) == 0 {
		if opt.Ready != "" {
			return nil, errdefs.Invalid("ready needs a service: the image has no ENTRYPOINT or CMD, so give --start")
		}
		return nil, nil
	}
	return &api.TemplateService{Cmd: cmd, Ready: opt.Ready}, nil
}

// DefaultMaxLayerBytes bounds one layer's unpacked files, against a
// decompression bomb.
const DefaultMaxLayerBytes = 64 << 30

// layersDir is the layer store, inside the template store so that a
// build's rootfs can hard-link the layers' files (one filesystem). Its
// name is no valid template name.
func (s *Store) layersDir() string { return filepath.Join(s.dir, ".layers") }

// BuildImage builds template name from an image (see image.ParseRef for
// the references it takes) and makes it current. The image's layers are
// unpacked once into the layer store (shared by every template whose
// stack of layers up to one is the same); the build's rootfs is their
// merged view made of hard links to them (layerstore.Merge), which the
// backends read as they read a recipe's rootfs. The image's config is
// recorded: its Env, WorkingDir and User are its sandboxes' exec
// defaults.
func (s *Store) BuildImage(ctx context.Context, name, from string, opt ImageOptions, progress io.Writer) (api.Template, error) {
	if err := checkName(name); err != nil {
		return api.Template{}, err
	}
	ref, err := image.ParseRef(from)
	if err != nil {
		return api.Template{}, err
	}
	if _, err := service(&api.ImageConfig{Cmd: []string{"-"}}, opt); err != nil { // before any pull
		return api.Template{}, err
	}
	key := "image " + from
	if opt.Pull {
		key += " (pulled again)"
	}
	return s.once(ctx, name, key, progress, func(ctx context.Context) (api.Template, error) {
		return s.buildImage(ctx, name, from, ref, opt, orDiscard(progress))
	})
}

func (s *Store) buildImage(ctx context.Context, name, from string, ref image.Ref, opt ImageOptions, progress io.Writer) (api.Template, error) {
	start := time.Now()
	resolveRef := ref
	if old, err := s.Get(name); err == nil && !opt.Pull && ref.Kind == image.Registry && old.Source == SourceImage && old.Image == from && old.Canonical != "" {
		if r, err := image.ParseRef(old.Canonical); err == nil {
			resolveRef = r
			fmt.Fprintf(progress, "%s: using the digest template %s recorded (%s); --pull resolves the reference again\n", from, name, old.Digest)
		}
	}
	fmt.Fprintf(progress, "resolving %s\n", resolveRef)
	res, err := image.Resolve(ctx, resolveRef, opt.Resolve)
	if err != nil {
		return api.Template{}, err
	}
	var total int64
	for _, l := range res.Layers {
		total += l.Size
	}
	fmt.Fprintf(progress, "%s is %s (%s), %d layers, %d MB\n", from, res.Digest, res.Platform.String(), len(res.Layers), total>>20)

	cfg, warnings, err := imageConfig(res)
	if err != nil {
		return api.Template{}, fmt.Errorf("image %s: %w", from, err)
	}
	for _, w := range warnings {
		fmt.Fprintf(progress, "warning: %s\n", w)
	}
	svc, err := service(cfg, opt)
	if err != nil {
		return api.Template{}, err
	}
	// From the first layer until the build is committed, no layer GC may
	// run (the layers are not yet named by any build): builds share the
	// lock, a GC takes it alone or not at all.
	ls, err := layerstore.Attach(s.layersDir())
	if err != nil {
		return api.Template{}, err
	}
	unlockGC, err := fsutil.FlockShared(ctx, filepath.Join(s.layersDir(), ".gc.lock"))
	if err != nil {
		return api.Template{}, err
	}
	defer unlockGC()
	maxLayer := opt.MaxLayerBytes
	if maxLayer == 0 {
		maxLayer = DefaultMaxLayerBytes
	}
	m := &meta{Name: name, Source: SourceImage, Image: from, Digest: res.Digest.String(), Platform: res.Platform.String()}
	if res.Canonical != "" {
		m.Canonical = res.Canonical
	}
	dirs, err := pullLayers(ctx, ls, res, maxLayer, "", progress, opt.OnPull, func(i int, l image.Layer, made bool, took time.Duration) {
		if made {
			fmt.Fprintf(progress, "layer %d/%d %s: %.1f MB pulled and unpacked in %s (%.1f MB/s)\n", i+1, len(res.Layers), short(l.Digest.String()),
				float64(l.Size)/1e6, took.Round(time.Millisecond), float64(l.Size)/1e6/max(took.Seconds(), 1e-3))
		} else {
			fmt.Fprintf(progress, "layer %d/%d %s: cached\n", i+1, len(res.Layers), short(l.Digest.String()))
		}
		if opt.OnLayer != nil {
			opt.OnLayer(api.BuildLayerEvent{Index: i, Count: len(res.Layers), Digest: l.Digest.String(), Size: l.Size, Cached: !made, Seconds: took.Seconds()})
		}
		m.Layers = append(m.Layers, metaLayer{TemplateLayer: api.TemplateLayer{Digest: l.Digest.String(), DiffID: l.DiffID.String(), Size: l.Size}, Chain: l.ChainID.String()})
	})
	if err != nil {
		return api.Template{}, fmt.Errorf("image %s: %w", from, err)
	}
	m.Config, m.Service = cfg, svc

	buildID := newBuildID()
	tmp := filepath.Join(s.dir, name, ".build-"+buildID)
	final := filepath.Join(s.dir, name, buildID)
	defer os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return api.Template{}, err
	}
	m.ID = name + "/" + buildID
	if err := s.commitLayers(ctx, ls, tmp, final, m, dirs); err != nil {
		return api.Template{}, err
	}
	fmt.Fprintf(progress, "template %s built from %s in %s\n", name, from, time.Since(start).Round(time.Millisecond))
	s.log.Info("template built from an image", "template", m.ID, "image", from, "digest", m.Digest, "duration", time.Since(start))
	return m.template(), nil
}

// pullLayers makes each layer of res in ls, bottom first, and returns
// their directories; done is told of each once it is unpacked. While a
// layer unpacks, the next one not in the store yet comes from the
// registry (up to prefetchAhead bytes of it): the network and the disk
// work at once. The layers made are synced once and named together at
// the end (a layerstore.Batch); those made before a layer that fails are
// kept.
func pullLayers(ctx context.Context, ls *layerstore.Store, res *image.Resolved, maxBytes int64, indent string, progress io.Writer, onPull func(api.BuildPullEvent), done func(i int, l image.Layer, made bool, took time.Duration)) ([]string, error) {
	batch := ls.NewBatch()
	defer batch.Close()
	var dirs []string
	var next layerstore.Blob
	stopNext := func() {}
	defer func() { stopNext() }()
	for i, l := range res.Layers {
		lowers := make([]string, 0, len(dirs))
		for j := len(dirs) - 1; j >= 0; j-- {
			lowers = append(lowers, dirs[j])
		}
		blob, stop := l.Blob(), func() {}
		if next.Open != nil {
			blob, stop = next, stopNext
			next, stopNext = layerstore.Blob{}, func() {}
		}
		if i+1 < len(res.Layers) && !ls.Has(res.Layers[i+1].ChainID.String()) {
			next, stopNext = layerstore.Prefetch(res.Layers[i+1].Blob(), prefetchAhead)
		}
		start := time.Now()
		label := fmt.Sprintf("%slayer %d/%d %s", indent, i+1, len(res.Layers), short(l.Digest.String()))
		dir, made, err := ensureLayer(ctx, batch, blob, l, lowers, maxBytes, label, progress, pullReporter(onPull, i, len(res.Layers), l))
		stop()
		if err != nil {
			batch.Commit() // the layers below it are whole: a retry finds them
			return nil, fmt.Errorf("layer %d of %d (%s): %w", i+1, len(res.Layers), l.Digest, err)
		}
		done(i, l, made, time.Since(start))
		dirs = append(dirs, dir)
	}
	if err := batch.Commit(); err != nil {
		return nil, err
	}
	for i := range dirs {
		dirs[i] = batch.Final(dirs[i])
	}
	return dirs, nil
}

// prefetchAhead is how much of the next layer is read from the registry
// while one unpacks.
const prefetchAhead = 32 << 20

// progressEvery is how often a layer still being pulled says how far it
// is in a line of progress; pullEvery how often it tells onPull.
var progressEvery, pullEvery = 5 * time.Second, 250 * time.Millisecond

// ensureLayer is batch.Ensure of an image layer, saying every progressEvery
// how many bytes have come and how fast, or that none has: a pull that
// stalls says what it waits for. onPull (if not nil) is told the bytes
// come so far every pullEvery while they change.
func ensureLayer(ctx context.Context, batch *layerstore.Batch, blob layerstore.Blob, l image.Layer, lowers []string, maxBytes int64, label string, progress io.Writer, onPull func(int64)) (string, bool, error) {
	var n atomic.Int64
	open := blob.Open
	blob.Open = func() (io.ReadCloser, error) {
		rc, err := open()
		if err != nil {
			return nil, err
		}
		return &countingReader{ReadCloser: rc, n: &n}, nil
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		t := time.NewTicker(min(pullEvery, progressEvery))
		defer t.Stop()
		said, told := start, int64(-1)
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			got := n.Load()
			if onPull != nil && got != told {
				onPull(got)
				told = got
			}
			if time.Since(said) < progressEvery {
				continue
			}
			said = time.Now()
			if got == 0 {
				fmt.Fprintf(progress, "%s: no byte yet after %s: waiting for the registry (or for another build unpacking this layer)\n", label, time.Since(start).Round(time.Second))
				continue
			}
			fmt.Fprintf(progress, "%s: %.1f of %.1f MB (%.1f MB/s)\n", label, float64(got)/1e6, float64(l.Size)/1e6, float64(got)/1e6/time.Since(start).Seconds())
		}
	}()
	dir, made, err := batch.Ensure(ctx, blob, lowers, layerstore.Options{MaxBytes: maxBytes})
	close(done)
	wg.Wait()
	return dir, made, err
}

// pullReporter tells onPull (if not nil) how far layer i of count is.
func pullReporter(onPull func(api.BuildPullEvent), i, count int, l image.Layer) func(int64) {
	if onPull == nil {
		return nil
	}
	return func(n int64) {
		onPull(api.BuildPullEvent{Index: i, Count: count, Digest: l.Digest.String(), Size: l.Size, Received: n})
	}
}

type countingReader struct {
	io.ReadCloser
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.ReadCloser.Read(p)
	c.n.Add(int64(k))
	return k, err
}

func short(digest string) string {
	d := strings.TrimPrefix(digest, "sha256:")
	if len(d) > 12 {
		d = d[:12]
	}
	return d
}

// Bounds on what an image's config may give its sandboxes' commands.
const (
	maxImageEnv      = 1024
	maxImageEnvBytes = 64 << 10
)

// imageConfig is what nook keeps of an image's config, checked: every
// exec of every sandbox of the template gets its Env, User and
// WorkingDir, so an entry the agent would refuse (a NUL, a variable
// without a name) is dropped with a warning, and a config past the
// bounds, or a user nook cannot pass on, fails the build.
func imageConfig(res *image.Resolved) (*api.ImageConfig, []string, error) {
	c := res.Config.Config
	out := &api.ImageConfig{User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd, Labels: c.Labels}
	var warnings []string
	if len(c.Env) > maxImageEnv {
		return nil, nil, errdefs.Invalid("its config sets %d environment variables: nook takes at most %d", len(c.Env), maxImageEnv)
	}
	size := 0
	for _, kv := range c.Env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsRune(kv, 0) || !utf8.ValidString(kv) {
			warnings = append(warnings, fmt.Sprintf("the image's environment entry %q is not NAME=VALUE text: left out", kv))
			continue
		}
		size += len(kv)
		out.Env = append(out.Env, kv)
	}
	if size > maxImageEnvBytes {
		return nil, nil, errdefs.Invalid("its config's environment is %d bytes: nook takes at most %d", size, maxImageEnvBytes)
	}
	if strings.ContainsRune(c.User, 0) || !utf8.ValidString(c.User) || len(c.User) > 256 {
		return nil, nil, errdefs.Invalid("its config's user %q is not a user nook can run commands as", c.User)
	}
	switch wd := c.WorkingDir; {
	case wd == "":
	case !filepath.IsAbs(wd) || strings.ContainsRune(wd, 0) || !utf8.ValidString(wd) || len(wd) > 4096:
		warnings = append(warnings, fmt.Sprintf("the image's working directory %q is not an absolute path: commands start in the user's home", wd))
	default:
		out.WorkingDir = wd
	}
	for p := range c.ExposedPorts {
		out.ExposedPorts = append(out.ExposedPorts, p)
	}
	sort.Strings(out.ExposedPorts)
	return out, warnings, nil
}

// baseDirs makes the directories every sandbox mounts on or writes to
// that a minimal image may lack (a vm's agent mounts /proc, /sys, /dev
// and /run, and writes /etc/hosts); present ones are left as they are.
func baseDirs(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, d := range []struct {
		name string
		mode fs.FileMode
	}{{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"run", 0o755}, {"etc", 0o755}, {"root", 0o700}, {"tmp", 0o777 | fs.ModeSticky}} {
		if _, err := root.Lstat(d.name); err == nil {
			continue
		}
		if err := root.Mkdir(d.name, 0o700); err != nil {
			return err
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return err
		}
	}
	return nil
}

// GCLayers removes the layers no build of any template names. Builds
// from images hold the same lock from their first layer to their commit.
func (s *Store) GCLayers(ctx context.Context) error {
	if _, err := os.Stat(s.layersDir()); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	// Never wait for a build (a pull may take minutes): the next GC
	// collects what this one leaves.
	unlock, ok, err := fsutil.TryFlock(filepath.Join(s.layersDir(), ".gc.lock"))
	if err != nil || !ok {
		if !ok && err == nil {
			s.log.Info("layer GC skipped: an image build is in progress")
		}
		return err
	}
	defer unlock()
	// Alone in the store: what a crash cut short goes too.
	if _, err := layerstore.Open(s.layersDir()); err != nil {
		return err
	}
	used := map[string]bool{}
	names, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	for _, n := range names {
		if !n.IsDir() || checkName(n.Name()) != nil {
			continue
		}
		builds, err := os.ReadDir(filepath.Join(s.dir, n.Name()))
		if err != nil {
			return err
		}
		for _, b := range builds {
			if !b.IsDir() || strings.HasPrefix(b.Name(), ".") {
				continue
			}
			var m meta
			raw, err := os.ReadFile(filepath.Join(s.dir, n.Name(), b.Name(), "template.json"))
			if errors.Is(err, fs.ErrNotExist) {
				continue // being removed
			}
			if err != nil {
				return fmt.Errorf("layer GC: %w", err) // never take a build's layers for unused
			}
			if err := json.Unmarshal(raw, &m); err != nil {
				return fmt.Errorf("template build %s/%s: corrupt template.json: %w", n.Name(), b.Name(), err)
			}
			for _, l := range m.Layers {
				used[strings.TrimPrefix(l.Chain, "sha256:")] = true
			}
			for _, c := range m.Cache {
				used[strings.TrimPrefix(c, "sha256:")] = true
			}
		}
	}
	entries, err := os.ReadDir(s.layersDir())
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, ".") || used[strings.TrimSuffix(n, ".lock")] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.layersDir(), n)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
