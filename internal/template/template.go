package template

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/layerstore"
)

// Recipe says how to build a template.
type Recipe struct {
	Name        string
	Description string
	Suite       string
	Packages    []string
	// Hooks are shell commands mmdebstrap runs once the packages are
	// in ("$1" is the root being made): its --customize-hook.
	Hooks []string
	// Config is what its sandboxes' commands default to (User,
	// WorkingDir), as an image's config is.
	Config *api.ImageConfig
}

// basePackages are what the base template adds to Debian's minbase.
var basePackages = []string{
	"ca-certificates", "curl", "wget", "git", "python3", "python3-venv", "procps", "iproute2",
	"iputils-ping", "less", "jq", "unzip", "xz-utils", "openssh-client", "sudo", "vim-tiny", "file", "gnupg",
}

// Recipes are the templates nook can build.
var Recipes = []Recipe{{
	Name:        "base",
	Description: "Debian 12 (bookworm) minbase with curl, git, python3 and the tools an agent reaches for first",
	Suite:       "bookworm",
	Packages:    basePackages,
}, {
	Name:        "e2b",
	Description: "base plus Node.js, with E2B's default user: user (uid 1000, home /home/user, passwordless sudo), whom commands run as; E2B's SDKs get it for E2B's base template",
	Suite:       "bookworm",
	Packages:    append(slices.Clone(basePackages), "nodejs"),
	Hooks: []string{
		`chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash user`,
		`echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > "$1/etc/sudoers.d/user" && chmod 0440 "$1/etc/sudoers.d/user"`,
		// E2B runs every command in a login shell (bash -l -c CMD), and
		// Debian's /etc/profile forks id(1) to learn the uid: 1.3 of
		// the 3 ms a `bash -l -c true` costs. bash knows it already
		// ($EUID); other shells still ask id.
		`sed -i 's/"$(id -u)"/"${EUID:-$(id -u)}"/g' "$1/etc/profile" && grep -q 'EUID:-' "$1/etc/profile"`,
	},
	Config: &api.ImageConfig{User: "user", WorkingDir: "/home/user"},
}, {
	Name:        "dev",
	Description: "base plus systemd, build-essential and Docker (docker.io): a vm sandbox boots systemd, so services run and docker run works",
	Suite:       "bookworm",
	Packages: append(slices.Clone(basePackages), "build-essential", "pkg-config", "docker.io", "kmod", "iptables",
		"systemd", "systemd-sysv", "dbus", "apparmor"),
}}

func recipe(name string) (Recipe, bool) {
	for _, r := range Recipes {
		if r.Name == name {
			return r, true
		}
	}
	return Recipe{}, false
}

// CheckBuildable returns an ErrInvalidArgument unless nook has a recipe for the template.
func CheckBuildable(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if _, ok := recipe(name); !ok {
		return errdefs.Invalid("nook does not know how to build template %q: it can build %s", name, recipeNames())
	}
	return nil
}

func recipeNames() string {
	var names []string
	for _, r := range Recipes {
		names = append(names, r.Name)
	}
	return strings.Join(names, ", ")
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// Store is a directory of templates.
type Store struct {
	dir string
	log *slog.Logger

	mu     sync.Mutex
	builds map[string]*build // in progress, by name

	byID sync.Map // build ID -> api.Template, of builds read (they never change)

	// removed, if set, is told the ID of every build the store removes.
	removed func(id string)
}

// OnRemove has f told the ID of every build the store removes (a GC, a
// template's removal), once it is gone: what a backend made from it
// (a vm's root image and snapshots) can go too.
func (s *Store) OnRemove(f func(id string)) { s.removed = f }

// Exists reports whether the build id is in the store.
func (s *Store) Exists(id string) bool {
	name, build, ok := strings.Cut(id, "/")
	if !ok || checkName(name) != nil || !nameRE.MatchString(build) {
		return false
	}
	_, err := os.Stat(filepath.Join(s.dir, name, build))
	return err == nil
}

type build struct {
	key  string // what it builds from: a caller asking for another source is refused
	done chan struct{}
	tpl  api.Template
	err  error
}

// meta is template.json in a build directory.
type meta struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	SizeBytes int64     `json:"size_bytes"`
	Packages  []string  `json:"packages"`
	Hooks     []string  `json:"hooks,omitempty"` // a recipe's
	// Source is SourceRecipe (also when absent: builds from before
	// images) or SourceImage.
	Source    string               `json:"source,omitempty"`
	Image     string               `json:"image,omitempty"`
	Digest    string               `json:"digest,omitempty"`
	Canonical string               `json:"canonical,omitempty"`
	Platform  string               `json:"platform,omitempty"`
	Layers    []metaLayer          `json:"layers,omitempty"`
	Config    *api.ImageConfig     `json:"config,omitempty"`
	Service   *api.TemplateService `json:"service,omitempty"`
	// Cache names the layers a Dockerfile build made for stages other
	// than its target: kept (for the next build's cache) as long as the
	// build is.
	Cache []string `json:"cache,omitempty"`
}

// metaLayer is a layer of an image build; Chain keys it in the layer store.
type metaLayer struct {
	api.TemplateLayer
	Chain string `json:"chain"`
}

// Where a build came from.
const (
	SourceRecipe = "recipe"
	SourceImage  = "image"
)

func (m *meta) template() api.Template {
	t := api.Template{Name: m.Name, ID: m.ID, CreatedAt: m.CreatedAt, SizeBytes: m.SizeBytes, Packages: m.Packages, Hooks: m.Hooks,
		Source: m.Source, Image: m.Image, Digest: m.Digest, Canonical: m.Canonical, Platform: m.Platform, Config: m.Config, Service: m.Service}
	if t.Source == "" {
		t.Source = SourceRecipe
	}
	for _, l := range m.Layers {
		t.Layers = append(t.Layers, l.TemplateLayer)
	}
	return t
}

// NewStore returns the template store in dir.
func NewStore(dir string, log *slog.Logger) *Store {
	return &Store{dir: dir, log: log, builds: map[string]*build{}}
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// CheckName returns an ErrInvalidArgument unless name can name a template.
func CheckName(name string) error { return checkName(name) }

func checkName(name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.Invalid("template name %q is not valid: use lowercase letters, digits and '-'", name)
	}
	return nil
}

// Get returns the current build of a template, or an ErrNotFound.
func (s *Store) Get(name string) (api.Template, error) {
	if err := checkName(name); err != nil {
		return api.Template{}, err
	}
	cur, err := os.ReadFile(filepath.Join(s.dir, name, "current"))
	if err != nil {
		hint := fmt.Sprintf("build it with `nook template build %s`", name)
		if _, ok := recipe(name); !ok {
			hint = "templates nook can build: " + recipeNames() + "; or build it from an image: nook template build " + name + " --from IMAGE"
		}
		return api.Template{}, errdefs.NotFound("template %q not found: %s", name, hint)
	}
	return s.readMeta(name, strings.TrimSpace(string(cur)))
}

func (s *Store) readMeta(name, build string) (api.Template, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, name, build, "template.json"))
	if err != nil {
		return api.Template{}, fmt.Errorf("template %s: %w", name, err)
	}
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return api.Template{}, fmt.Errorf("template %s: corrupt template.json: %w", name, err)
	}
	return m.template(), nil
}

// ByID returns a build by its ID ("name/build"), current or not. Builds
// never change: their metadata is kept once read.
func (s *Store) ByID(id string) (api.Template, error) {
	if v, ok := s.byID.Load(id); ok {
		return v.(api.Template), nil
	}
	name, build, ok := strings.Cut(id, "/")
	if !ok || checkName(name) != nil || !nameRE.MatchString(build) {
		return api.Template{}, errdefs.Invalid("template build id %q is not valid", id)
	}
	t, err := s.readMeta(name, build)
	if err != nil {
		return api.Template{}, err
	}
	s.byID.Store(id, t)
	return t, nil
}

// Layers returns the layer directories (topmost first) of a build made
// of layers (a Dockerfile build's step: layers.json in its directory,
// naming layers of the store), or nil for a build that is one rootfs.
func (s *Store) Layers(id string) ([]string, error) {
	name, build, ok := strings.Cut(id, "/")
	if !ok || checkName(name) != nil || !nameRE.MatchString(build) {
		return nil, errdefs.Invalid("template build id %q is not valid", id)
	}
	var dirs []string
	if err := fsutil.ReadJSON(filepath.Join(s.dir, name, build, "layers.json"), &dirs); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("template build %s: %w", id, err)
	}
	for _, d := range dirs {
		if rel, err := filepath.Rel(s.layersDir(), d); err != nil || !filepath.IsLocal(rel) {
			return nil, fmt.Errorf("template build %s: layer %s is not in the layer store", id, d)
		}
	}
	return dirs, nil
}

// Rootfs returns the root filesystem directory of a template build ID ("name/build").
func (s *Store) Rootfs(id string) (string, error) {
	name, build, ok := strings.Cut(id, "/")
	if !ok || checkName(name) != nil || !nameRE.MatchString(build) {
		return "", errdefs.Invalid("template build id %q is not valid", id)
	}
	p := filepath.Join(s.dir, name, build, "rootfs")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	layers, err := s.Layers(id)
	if err != nil || layers == nil {
		return "", errdefs.NotFound("template build %s is missing from %s", id, s.dir)
	}
	// A build of layers gets its merged rootfs on first use (a vm's root
	// image, a look for systemd): made aside, renamed into place; of two
	// callers at once, one's stays.
	tmp, err := os.MkdirTemp(filepath.Join(s.dir, name, build), ".rootfs-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", err
	}
	dirs := make([]string, 0, len(layers))
	for i := len(layers) - 1; i >= 0; i-- {
		dirs = append(dirs, layers[i])
	}
	if err := layerstore.Merge(tmp, dirs); err != nil {
		return "", fmt.Errorf("template build %s: merge its layers: %w", id, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		if _, serr := os.Stat(p); serr == nil {
			return p, nil
		}
		return "", err
	}
	return p, nil
}

// commitLayers commits a build made of layers (dirs, bottom first, in the
// store): its layers.json names them, topmost first, over the layer of
// the base directories; its rootfs is merged when first asked for.
func (s *Store) commitLayers(ctx context.Context, ls *layerstore.Store, tmp, final string, m *meta, dirs []string) error {
	base, key, err := s.baseDirsLayer(ctx, ls)
	if err != nil {
		return err
	}
	if !slices.Contains(m.Cache, key) {
		m.Cache = append(m.Cache, key)
	}
	top := []string{}
	for i := len(dirs) - 1; i >= 0; i-- {
		top = append(top, dirs[i])
		n, _ := dirSize(dirs[i])
		m.SizeBytes += n
	}
	if err := fsutil.WriteJSONAtomic(filepath.Join(tmp, "layers.json"), append(top, base)); err != nil {
		return err
	}
	return s.commit(tmp, final, m)
}

// baseDirsLayer is a stored layer of the directories every sandbox
// mounts on (baseDirs): the bottom of every build of layers.
func (s *Store) baseDirsLayer(ctx context.Context, ls *layerstore.Store) (dir, key string, err error) {
	key = "sha256:" + strings.Repeat("0", 56) + "0000ba5e"
	dir, err = ls.Make(ctx, key, baseDirs)
	return dir, key, err
}

// List returns the current build of every template.
func (s *Store) List() ([]api.Template, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var out []api.Template
	for _, e := range entries {
		if !e.IsDir() || checkName(e.Name()) != nil {
			continue
		}
		if t, err := s.Get(e.Name()); err == nil {
			out = append(out, t)
		}
	}
	return out, nil
}

// Build builds a template from its recipe and makes it current. Progress
// (mmdebstrap's output) goes to progress. Concurrent builds of one name,
// in this process or another, are serialized; a caller that waited for
// another's build in this process gets its result.
func (s *Store) Build(ctx context.Context, name string, progress io.Writer) (api.Template, error) {
	if err := CheckBuildable(name); err != nil {
		return api.Template{}, err
	}
	return s.once(ctx, name, "nook's recipe", progress, func(ctx context.Context) (api.Template, error) {
		r, _ := recipe(name)
		return s.build(ctx, r, orDiscard(progress))
	})
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// EnsureBuilt returns the current build of a template, building it first if
// it is missing, or if nook's recipe for it changed since it was built
// (a newer nook's dev template has systemd, say): what a recipe promises
// holds for every sandbox made from it.
func (s *Store) EnsureBuilt(ctx context.Context, name string, progress io.Writer) (api.Template, error) {
	t, err := s.Get(name)
	if err == nil && !stale(t) || err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return t, err
	}
	if CheckBuildable(name) != nil {
		return t, err
	}
	return s.once(ctx, name, "nook's recipe", progress, func(ctx context.Context) (api.Template, error) {
		old, oldErr := s.Get(name)
		if oldErr == nil && !stale(old) { // another process built it while we waited for the lock
			return old, nil
		}
		if oldErr == nil {
			fmt.Fprintf(orDiscard(progress), "template %s was built from an older recipe: building it again\n", name)
		}
		r, _ := recipe(name)
		t, err := s.build(ctx, r, orDiscard(progress))
		if err != nil && oldErr == nil {
			// The build that exists still works: keep using it.
			fmt.Fprintf(orDiscard(progress), "rebuilding template %s failed (%v): using its build %s\n", name, err, old.ID)
			s.log.Warn("rebuild of a template from a newer recipe failed: its older build stays in use", "template", name, "build", old.ID, "err", err)
			return old, nil
		}
		return t, err
	})
}

// stale reports whether a build of a built-in template has other packages
// (or hooks) than its recipe now names.
func stale(t api.Template) bool {
	r, ok := recipe(t.Name)
	return ok && (t.Source == SourceRecipe || t.Source == "") && (!slices.Equal(r.Packages, t.Packages) || !slices.Equal(r.Hooks, t.Hooks))
}

// once runs fn under the template's cross-process lock, sharing one run
// among the callers in this process that arrive while it is in progress.
func (s *Store) once(ctx context.Context, name, key string, progress io.Writer, fn func(context.Context) (api.Template, error)) (api.Template, error) {
	progress = orDiscard(progress)
	s.mu.Lock()
	if b, ok := s.builds[name]; ok {
		s.mu.Unlock()
		if b.key != key {
			return api.Template{}, errdefs.Precondition("template %s is being built from %s: wait for that build, or build this one under another name", name, b.key)
		}
		fmt.Fprintf(progress, "waiting for the build of template %s already in progress\n", name)
		select {
		case <-b.done:
			return b.tpl, b.err
		case <-ctx.Done():
			return api.Template{}, ctx.Err()
		}
	}
	b := &build{key: key, done: make(chan struct{})}
	s.builds[name] = b
	s.mu.Unlock()
	// The build goes on if this caller goes away: others may wait for it.
	bctx := context.WithoutCancel(ctx)
	unlock, err := s.lock(bctx, name)
	if err == nil {
		b.tpl, b.err = fn(bctx)
		if b.err != nil {
			s.dropNameless(name)
		}
		unlock()
	} else {
		b.err = err
	}
	s.mu.Lock()
	delete(s.builds, name)
	s.mu.Unlock()
	close(b.done)
	return b.tpl, b.err
}

// dropNameless removes the directory of a template that has no build
// (its first build failed): a failed build leaves no trace. The caller
// holds its lock.
func (s *Store) dropNameless(name string) {
	dir := filepath.Join(s.dir, name)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.Name() != ".lock" {
			return // a build, current, or one in progress
		}
	}
	os.Remove(filepath.Join(dir, ".lock"))
	os.Remove(dir)
}

// lock takes an exclusive flock on the template's directory, across processes.
func (s *Store) lock(ctx context.Context, name string) (func(), error) {
	// Root's alone: a template's rootfs has setuid-root files and device nodes.
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(s.dir, name), 0o755); err != nil {
		return nil, err
	}
	return fsutil.Flock(ctx, filepath.Join(s.dir, name, ".lock"))
}

// build runs mmdebstrap; the caller holds the template's lock.
func (s *Store) build(ctx context.Context, r Recipe, progress io.Writer) (api.Template, error) {
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return api.Template{}, errdefs.Precondition("mmdebstrap is not installed: apt-get install mmdebstrap (make deps does it)")
	}
	buildID := newBuildID()
	tmp := filepath.Join(s.dir, r.Name, ".build-"+buildID)
	final := filepath.Join(s.dir, r.Name, buildID)
	defer os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return api.Template{}, err
	}
	start := time.Now()
	fmt.Fprintf(progress, "building template %s (%s) with mmdebstrap; this takes a minute\n", r.Name, r.Description)
	args := []string{"--variant=minbase", "--include=" + strings.Join(r.Packages, ",")}
	for _, h := range r.Hooks {
		args = append(args, "--customize-hook="+h)
	}
	cmd := exec.CommandContext(ctx, "mmdebstrap", append(args, r.Suite, filepath.Join(tmp, "rootfs"))...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			fmt.Fprintf(progress, "  %s\n", sc.Text())
		}
		io.Copy(io.Discard, pr)
	}()
	err := cmd.Run()
	pw.Close()
	<-copied
	if err != nil {
		return api.Template{}, fmt.Errorf("mmdebstrap failed building template %s: %w (see the output above)", r.Name, err)
	}
	size, _ := dirSize(filepath.Join(tmp, "rootfs"))
	m := &meta{Name: r.Name, ID: r.Name + "/" + buildID, SizeBytes: size, Packages: r.Packages, Hooks: r.Hooks, Source: SourceRecipe, Config: r.Config}
	if err := s.commit(tmp, final, m); err != nil {
		return api.Template{}, err
	}
	fmt.Fprintf(progress, "template %s built in %s (%d MB)\n", r.Name, time.Since(start).Round(time.Second), size>>20)
	s.log.Info("template built", "template", m.ID, "duration", time.Since(start))
	return m.template(), nil
}

// newBuildID names a new build: its time, and randomness.
func newBuildID() string {
	rnd := make([]byte, 3)
	rand.Read(rnd)
	return time.Now().UTC().Format("20060102t150405") + "-" + hex.EncodeToString(rnd)
}

// commit writes m into the build directory tmp (its rootfs made), moves
// it to final and makes it the template's current build.
func (s *Store) commit(tmp, final string, m *meta) error {
	m.CreatedAt = time.Now().UTC()
	mb, _ := json.MarshalIndent(m, "", "  ")
	if err := fsutil.WriteFileSync(filepath.Join(tmp, "template.json"), mb); err != nil {
		return err
	}
	if err := os.Rename(tmp, final); err != nil {
		return err
	}
	if err := fsutil.WriteFileSync(filepath.Join(s.dir, m.Name, ".current.tmp"), []byte(filepath.Base(final)+"\n")); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(s.dir, m.Name, ".current.tmp"), filepath.Join(s.dir, m.Name, "current")); err != nil {
		return err
	}
	syncDir(filepath.Join(s.dir, m.Name))
	return nil
}

// Remove deletes a template: its current build and every build that
// inUse reports unused. A template whose current build is in use is refused.
func (s *Store) Remove(ctx context.Context, name string, inUse func(id string) (int, error)) error {
	t, err := s.Get(name)
	if err != nil {
		return err
	}
	n, err := inUse(t.ID)
	if err != nil {
		return err
	}
	if n > 0 {
		return errdefs.Precondition("template %s is used by %d sandbox(es): remove them first (nook ls)", name, n)
	}
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	if err := os.Remove(filepath.Join(s.dir, name, "current")); err != nil {
		return err
	}
	return errors.Join(s.gcLocked(name, inUse), s.GCLayers(ctx))
}

// GC removes the builds of a template that are neither current nor in use.
func (s *Store) GC(ctx context.Context, name string, inUse func(id string) (int, error)) error {
	unlock, err := s.lock(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	return errors.Join(s.gcLocked(name, inUse), s.GCLayers(ctx))
}

func (s *Store) gcLocked(name string, inUse func(id string) (int, error)) error {
	cur, _ := os.ReadFile(filepath.Join(s.dir, name, "current"))
	entries, err := os.ReadDir(filepath.Join(s.dir, name))
	if err != nil {
		return err
	}
	var errs []error
	remaining := 0
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if e.Name() == strings.TrimSpace(string(cur)) {
			remaining++
			continue
		}
		if n, err := inUse(name + "/" + e.Name()); err != nil || n > 0 {
			remaining++
			continue
		}
		id := name + "/" + e.Name()
		if err := os.RemoveAll(filepath.Join(s.dir, name, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		s.byID.Delete(id)
		if s.removed != nil {
			s.removed(id)
		}
	}
	if remaining == 0 && len(cur) == 0 {
		os.RemoveAll(filepath.Join(s.dir, name))
	}
	return errors.Join(errs...)
}

// BuildableList returns the recipes, for the API.
func BuildableList() []api.TemplateRecipe {
	out := make([]api.TemplateRecipe, 0, len(Recipes))
	for _, r := range Recipes {
		out = append(out, api.TemplateRecipe{Name: r.Name, Description: r.Description})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func dirSize(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n, err
}

func syncDir(dir string) {
	if f, err := os.Open(dir); err == nil {
		f.Sync()
		f.Close()
	}
}
