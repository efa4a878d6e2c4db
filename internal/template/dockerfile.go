package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/dockerignore"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/image"
	"github.com/nookhq/nook/internal/layerstore"
)

// SourceDockerfile is a build made from a Dockerfile.
const SourceDockerfile = "dockerfile"

// RunStep is a Dockerfile RUN to execute.
type RunStep struct {
	Argv []string
	Env  []string // NAME=VALUE: the stage's ENV and ARGs
	User string
	Cwd  string
	Line int // in the Dockerfile
	// Caches are RUN --mount=type=cache: a host directory (Dir) whose
	// files the step finds at Target and whose files after the step are
	// kept there for the next build. Nothing below Target reaches the
	// step's layer.
	Caches []CacheMount
	// Secrets are RUN --mount=type=secret: a host file (Src) the step
	// reads at Target (mode 0400); nothing of it reaches the layer.
	Secrets []SecretMount
}

// CacheMount is a build cache a RUN step mounts: its files keep their
// owners between builds; its directory is UID:GID with Mode (by default
// root's, 0755); a ReadOnly one is not kept after the step. Builds that
// use one cache take turns (BuildKit's sharing=locked, for every sharing
// mode: the cache is copied in and out, so two steps at once would lose
// one's files).
type CacheMount struct {
	Dir, Target string
	UID, GID    int
	Mode        fs.FileMode
	ReadOnly    bool
}

// SecretMount is a secret a RUN step mounts.
type SecretMount struct{ Src, Target string }

// Runner runs a RUN step in a sandbox of the template build templateID
// (whose rootfs is the stage so far), streaming its output to out, and
// writes what it changed to changes (an empty directory's path that does
// not exist yet) as a layer in overlay's format with 0-based owners.
// A command that exits non-zero is an error that says its exit code.
type Runner interface {
	Run(ctx context.Context, templateID string, step RunStep, changes string, out io.Writer) error
}

// DockerfileOptions say what to build from a Dockerfile.
type DockerfileOptions struct {
	// Context is the build context: a directory on this host (the API
	// extracts the context tar a client sent into one).
	Context string
	// Dockerfile is its path inside Context (default "Dockerfile").
	Dockerfile string
	BuildArgs  map[string]string
	// Target is the stage to build (default the last).
	Target string
	// Secrets are the files of the build's secrets, by id (RUN
	// --mount=type=secret,id=ID).
	Secrets map[string]string
	Runner  Runner
	// Pull resolves the images FROM names again (default: a registry
	// reference resolves to what the registry serves now anyway; Pull is
	// kept for the image builds' sake).
	Resolve      image.Options
	Start, Ready string
	// OnPull is told how far each layer of an image FROM names is, as
	// ImageOptions.OnPull.
	OnPull func(api.BuildPullEvent)
}

// cacheMountDir is the host directory of build cache id (RUN
// --mount=type=cache), shared by every build of this store.
func (s *Store) cacheMountDir(id string) (string, error) {
	sum := sha256.Sum256([]byte(id))
	top := filepath.Join(s.dir, ".cache-mounts")
	dir := filepath.Join(top, hex.EncodeToString(sum[:16]))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	// Root's alone, whatever made it: the caches' files have the owners
	// the step sandboxes gave them, which may be host users'.
	if err := os.Chmod(top, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// ContextDir makes an empty directory, root's alone, for a build
// context sent to the daemon; the caller removes it. Ones a crash left
// (older than a day) go first.
func (s *Store) ContextDir() (string, error) {
	parent := filepath.Join(s.dir, ".contexts")
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", err
	}
	if old, err := os.ReadDir(parent); err == nil {
		for _, e := range old {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > 24*time.Hour {
				os.RemoveAll(filepath.Join(parent, e.Name()))
			}
		}
	}
	return os.MkdirTemp(parent, "ctx-")
}

// stageState is a Dockerfile stage as its steps build it.
type stageState struct {
	layers []stepLayer // bottom first
	cfg    api.ImageConfig
	shell  []string
	args   map[string]string // ARGs in scope (with their values)
	key    string            // cache key of the stack so far
	cmdSet bool              // this stage set CMD
}

type stepLayer struct {
	dir string
	metaLayer
}

func (st *stageState) clone() *stageState {
	c := *st
	c.layers = append([]stepLayer(nil), st.layers...)
	c.cfg.Env = append([]string(nil), st.cfg.Env...)
	c.cfg.Entrypoint = append([]string(nil), st.cfg.Entrypoint...)
	c.cfg.Cmd = append([]string(nil), st.cfg.Cmd...)
	c.cfg.ExposedPorts = append([]string(nil), st.cfg.ExposedPorts...)
	c.cfg.Labels = map[string]string{}
	for k, v := range st.cfg.Labels {
		c.cfg.Labels[k] = v
	}
	c.shell = append([]string(nil), st.shell...)
	c.args = map[string]string{}
	c.cmdSet = false
	return &c
}

// push adds a layer a step made (or found cached) under key.
func (st *stageState) push(dir, key string) {
	st.layers = append(st.layers, stepLayer{dir: dir, metaLayer: metaLayer{TemplateLayer: api.TemplateLayer{Digest: key}, Chain: key}})
	st.key = key
}

// topFirst is the stage's layer directories, topmost first.
func (st *stageState) topFirst() []string {
	out := make([]string, 0, len(st.layers))
	for i := len(st.layers) - 1; i >= 0; i-- {
		out = append(out, st.layers[i].dir)
	}
	return out
}

func (st *stageState) env() []string {
	env := append([]string(nil), st.cfg.Env...)
	keys := make([]string, 0, len(st.args))
	for k := range st.args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !hasEnvKey(env, k) {
			env = append(env, k+"="+st.args[k])
		}
	}
	return env
}

func hasEnvKey(env []string, k string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			return true
		}
	}
	return false
}

func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

func stepKey(parent string, parts ...string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", parent)
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\n", len(p), p)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// dockerBuild is one Dockerfile build in progress.
type dockerBuild struct {
	s        *Store
	name     string
	opt      DockerfileOptions
	progress io.Writer
	ls       *layerstore.Store
	lex      *shell.Lex
	stages   []instructions.Stage
	done     map[int]*stageState
	ignore   *dockerignore.Matcher
	usedArgs map[string]bool
	tmpDirs  []string
	ctxRoot  *os.Root // the build context
	// extraKeys are layers the build made beside its stages' (kept with it).
	extraKeys []string
	active    map[int]bool // stages begun
	global    map[string]string
}

// BuildDockerfile builds template name from a Dockerfile and makes it
// current. FROM takes an image, a nook template (a name nook has, or
// base and dev) or an earlier stage; RUN runs in a sandbox of the stage
// so far (opt.Runner) and keeps what it changed as a layer; COPY and ADD
// copy from the context or (--from) another stage or an image; ENV,
// ARG, WORKDIR, USER, SHELL, ENTRYPOINT, CMD, EXPOSE and LABEL make the
// template's config. Every step that makes a layer is cached by content
// (the stack below it, the step as expanded, the ARGs in scope, the
// digests of what it copies): a rebuild reruns from the first step that
// changed. What nook cannot honour is a warning naming its line (ONBUILD,
// HEALTHCHECK, STOPSIGNAL, VOLUME) or, where going on would build
// something else than asked (RUN --mount, ADD of a URL or an archive), an
// error naming it.
func (s *Store) BuildDockerfile(ctx context.Context, name string, opt DockerfileOptions, progress io.Writer) (api.Template, error) {
	if err := checkName(name); err != nil {
		return api.Template{}, err
	}
	if opt.Dockerfile == "" {
		opt.Dockerfile = "Dockerfile"
	}
	if opt.Runner == nil {
		return api.Template{}, errors.New("a Dockerfile build needs a runner for its RUN steps")
	}
	if _, err := service(&api.ImageConfig{Cmd: []string{"-"}}, ImageOptions{Start: opt.Start, Ready: opt.Ready}); err != nil {
		return api.Template{}, err
	}
	return s.once(ctx, name, "Dockerfile", progress, func(ctx context.Context) (api.Template, error) {
		b := &dockerBuild{s: s, name: name, opt: opt, progress: orDiscard(progress), done: map[int]*stageState{}, usedArgs: map[string]bool{}, active: map[int]bool{}}
		defer func() {
			for _, d := range b.tmpDirs {
				os.RemoveAll(d)
			}
		}()
		return b.build(ctx)
	})
}

func (b *dockerBuild) warnf(line int, format string, args ...any) {
	fmt.Fprintf(b.progress, "warning: Dockerfile line %d: %s\n", line, fmt.Sprintf(format, args...))
}

// lineError is an error of a Dockerfile's line, with its category.
type lineError struct {
	line int
	err  error
}

func (e *lineError) Error() string { return fmt.Sprintf("Dockerfile line %d: %v", e.line, e.err) }
func (e *lineError) Unwrap() error { return e.err }

func atLine(line int, format string, args ...any) error {
	return &lineError{line: line, err: fmt.Errorf(format, args...)}
}

func lineOf(c instructions.Command) int {
	if loc := c.Location(); len(loc) > 0 {
		return loc[0].Start.Line
	}
	return 0
}

func (b *dockerBuild) build(ctx context.Context) (api.Template, error) {
	start := time.Now()
	ctxRoot, err := os.OpenRoot(b.opt.Context)
	if err != nil {
		return api.Template{}, errdefs.Invalid("build context %s: %v", b.opt.Context, err)
	}
	defer ctxRoot.Close()
	b.ctxRoot = ctxRoot
	df, err := ctxRoot.ReadFile(b.opt.Dockerfile)
	if err != nil {
		return api.Template{}, errdefs.Invalid("the Dockerfile %s is not in the build context: %v", b.opt.Dockerfile, err)
	}
	if ig, err := ctxRoot.ReadFile(".dockerignore"); err == nil {
		if b.ignore, err = dockerignore.Parse(ig); err != nil {
			return api.Template{}, errdefs.Invalid(".dockerignore: %v", err)
		}
	}
	res, err := parser.Parse(bytes.NewReader(df))
	if err != nil {
		return api.Template{}, errdefs.Invalid("Dockerfile: %v", describeParseError(err))
	}
	for _, w := range res.Warnings {
		fmt.Fprintf(b.progress, "warning: Dockerfile: %s\n", w.Short)
	}
	b.lex = shell.NewLex(res.EscapeToken)
	stages, metaArgs, err := instructions.Parse(res.AST, nil)
	if err != nil {
		return api.Template{}, errdefs.Invalid("Dockerfile: %v", describeParseError(err))
	}
	if len(stages) == 0 {
		return api.Template{}, errdefs.Invalid("Dockerfile: no FROM")
	}
	b.stages = stages
	// ARGs before the first FROM: for FROM lines, and for stages that
	// declare them again.
	global := map[string]string{}
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			v := kv.ValueString()
			if bv, ok := b.opt.BuildArgs[kv.Key]; ok {
				v, b.usedArgs[kv.Key] = bv, true
			} else if kv.Value != nil {
				if v, err = b.expand(kv.ValueString(), envOf(global)); err != nil {
					return api.Template{}, errdefs.Invalid("Dockerfile line %d: %v", lineOf(&a), err)
				}
			}
			global[kv.Key] = v
		}
	}
	target := len(stages) - 1
	if b.opt.Target != "" {
		target = -1
		for i, st := range stages {
			if strings.EqualFold(st.Name, b.opt.Target) {
				target = i
			}
		}
		if target < 0 {
			return api.Template{}, errdefs.Invalid("target stage %q is not in the Dockerfile (its stages: %s)", b.opt.Target, stageNames(stages))
		}
	}
	ls, err := layerstore.Attach(b.s.layersDir())
	if err != nil {
		return api.Template{}, err
	}
	b.ls = ls
	unlockGC, err := fsutil.FlockShared(ctx, filepath.Join(b.s.layersDir(), ".gc.lock"))
	if err != nil {
		return api.Template{}, err
	}
	defer unlockGC()
	b.global = global
	st, err := b.stage(ctx, target)
	if err != nil {
		return api.Template{}, err
	}
	for k := range b.opt.BuildArgs {
		if !b.usedArgs[k] {
			fmt.Fprintf(b.progress, "warning: build argument %s is not used by the Dockerfile\n", k)
		}
	}
	cfg := st.cfg
	svc, err := service(&cfg, ImageOptions{Start: b.opt.Start, Ready: b.opt.Ready})
	if err != nil {
		return api.Template{}, err
	}
	buildID := newBuildID()
	tmp := filepath.Join(b.s.dir, b.name, ".build-"+buildID)
	final := filepath.Join(b.s.dir, b.name, buildID)
	defer os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return api.Template{}, err
	}
	m := &meta{Name: b.name, ID: b.name + "/" + buildID, Source: SourceDockerfile, Image: b.opt.Dockerfile, Config: &cfg, Service: svc}
	inTarget := map[string]bool{}
	for _, l := range st.layers {
		m.Layers = append(m.Layers, l.metaLayer)
		inTarget[l.Chain] = true
	}
	for _, other := range b.done {
		for _, l := range other.layers {
			if !inTarget[l.Chain] {
				inTarget[l.Chain] = true
				m.Cache = append(m.Cache, l.Chain)
			}
		}
	}
	for _, k := range b.extraKeys {
		if !inTarget[k] {
			inTarget[k] = true
			m.Cache = append(m.Cache, k)
		}
	}
	sort.Strings(m.Cache)
	var dirs []string
	for _, l := range st.layers {
		dirs = append(dirs, l.dir)
	}
	if err := b.s.commitLayers(ctx, b.ls, tmp, final, m, dirs); err != nil {
		return api.Template{}, err
	}
	fmt.Fprintf(b.progress, "template %s built from %s in %s\n", b.name, b.opt.Dockerfile, time.Since(start).Round(time.Millisecond))
	b.s.log.Info("template built from a Dockerfile", "template", m.ID, "duration", time.Since(start))
	return m.template(), nil
}

func stageNames(stages []instructions.Stage) string {
	var out []string
	for i, st := range stages {
		if st.Name != "" {
			out = append(out, st.Name)
		} else {
			out = append(out, strconv.Itoa(i))
		}
	}
	return strings.Join(out, ", ")
}

// describeParseError adds the line (and column) BuildKit's parser knows.
func describeParseError(err error) string {
	var le *parser.LocationError
	if errors.As(err, &le) && len(le.Locations) > 0 && len(le.Locations[0]) > 0 {
		r := le.Locations[0][0]
		return fmt.Sprintf("line %d, column %d: %v", r.Start.Line, r.Start.Character+1, err)
	}
	return err.Error()
}

func envOf(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

func (b *dockerBuild) expand(word string, env []string) (string, error) {
	r, err := b.lex.ProcessWordWithMatches(word, shell.EnvsFromSlice(env))
	for k := range r.Matched {
		b.usedArgs[k] = true
	}
	return r.Result, err
}

// merge makes dir the merged view of a stage (recipe rootfs layers and
// stored layers alike), with the directories every sandbox needs.
func (b *dockerBuild) merge(dir string, st *stageState) error {
	var dirs []string
	for _, l := range st.layers {
		dirs = append(dirs, l.dir)
	}
	if err := layerstore.Merge(dir, dirs); err != nil {
		return err
	}
	return baseDirs(dir)
}

// stage builds stage i (and the stages it needs), once.
func (b *dockerBuild) stage(ctx context.Context, i int) (*stageState, error) {
	if st, ok := b.done[i]; ok {
		return st, nil
	}
	b.active[i] = true
	global := b.global
	stg := b.stages[i]
	fromLine := 0
	if len(stg.Location) > 0 {
		fromLine = stg.Location[0].Start.Line
	}
	baseName, err := b.expand(stg.BaseName, envOf(global))
	if err != nil {
		return nil, errdefs.Invalid("Dockerfile line %d: FROM %s: %v", fromLine, stg.BaseName, err)
	}
	if stg.Platform != "" {
		b.warnf(fromLine, "FROM --platform=%s: nook builds for this host's platform", stg.Platform)
	}
	label := stg.Name
	if label == "" {
		label = strconv.Itoa(i)
	}
	fmt.Fprintf(b.progress, "[stage %s] FROM %s\n", label, baseName)
	st, err := b.from(ctx, i, baseName, fromLine)
	if err != nil {
		return nil, err
	}
	st = st.clone()
	for _, c := range stg.Commands {
		if err := b.step(ctx, st, c, label); err != nil {
			return nil, err
		}
	}
	b.done[i] = st
	return st, nil
}

// stageIndex finds an earlier stage by name or index, or -1.
func (b *dockerBuild) stageIndex(ref string, before int) int {
	for j := 0; j < before; j++ {
		if b.stages[j].Name != "" && strings.EqualFold(b.stages[j].Name, ref) {
			return j
		}
	}
	if n, err := strconv.Atoi(ref); err == nil && n >= 0 && n < before {
		return n
	}
	return -1
}

// from is the state a stage starts from: scratch, an earlier stage, a
// nook template, or an image.
func (b *dockerBuild) from(ctx context.Context, i int, ref string, line int) (*stageState, error) {
	empty := &stageState{shell: []string{"/bin/sh", "-c"}, cfg: api.ImageConfig{Labels: map[string]string{}}, args: map[string]string{}, key: stepKey("", "scratch")}
	if strings.EqualFold(ref, "scratch") {
		return empty, nil
	}
	if j := b.stageIndex(ref, i); j >= 0 {
		return b.stage(ctx, j)
	}
	if t, err := b.templateBase(ctx, ref); err != nil {
		return nil, err
	} else if t != nil {
		return t, nil
	}
	st := empty
	layers, cfg, err := b.pull(ctx, ref, line)
	if err != nil {
		return nil, err
	}
	st.layers, st.cfg = layers, cfg
	if st.cfg.Labels == nil {
		st.cfg.Labels = map[string]string{}
	}
	if len(layers) > 0 {
		st.key = layers[len(layers)-1].Chain
	}
	return st, nil
}

// templateBase is a FROM naming a nook template: one built here (any
// source), or a recipe nook builds on first use. Its current build's
// rootfs is the stage's one layer.
func (b *dockerBuild) templateBase(ctx context.Context, ref string) (*stageState, error) {
	if checkName(ref) != nil || ref == b.name {
		return nil, nil
	}
	t, err := b.s.Get(ref)
	if errors.Is(err, errdefs.ErrNotFound) {
		if _, ok := recipe(ref); !ok {
			return nil, nil // an image, then
		}
		fmt.Fprintf(b.progress, "template %s is not built yet: building it\n", ref)
		if t, err = b.s.EnsureBuilt(ctx, ref, b.progress); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	rootfs, err := b.s.Rootfs(t.ID)
	if err != nil {
		return nil, err
	}
	// The template's rootfs, merged into a stored layer of its own (hard
	// links: cheap), so that a rebuild or removal of that template
	// meanwhile takes nothing from under this build, and its layer is
	// this build's to keep.
	key := stepKey("", "template", t.ID)
	dir, err := b.ls.Make(ctx, key, func(layer string) error {
		if err := layerstore.Merge(layer, []string{rootfs}); err != nil {
			return fmt.Errorf("template %s: %w", ref, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	st := &stageState{shell: []string{"/bin/sh", "-c"}, args: map[string]string{}, key: key,
		layers: []stepLayer{{dir: dir, metaLayer: metaLayer{TemplateLayer: api.TemplateLayer{Digest: "template:" + t.ID}, Chain: key}}}}
	if t.Config != nil {
		st.cfg = *t.Config
	}
	if st.cfg.Labels == nil {
		st.cfg.Labels = map[string]string{}
	}
	return st, nil
}

// pull resolves an image and unpacks its layers into the store.
func (b *dockerBuild) pull(ctx context.Context, ref string, line int) ([]stepLayer, api.ImageConfig, error) {
	r, err := image.ParseRef(ref)
	if err != nil {
		return nil, api.ImageConfig{}, errdefs.Invalid("Dockerfile line %d: FROM %s: %v", line, ref, err)
	}
	res, err := image.Resolve(ctx, r, b.opt.Resolve)
	if err != nil {
		return nil, api.ImageConfig{}, atLine(line, "FROM %s: %w", ref, err)
	}
	cfg, warnings, err := imageConfig(res)
	if err != nil {
		return nil, api.ImageConfig{}, atLine(line, "FROM %s: %w", ref, err)
	}
	for _, w := range warnings {
		b.warnf(line, "%s", w)
	}
	var out []stepLayer
	dirs, err := pullLayers(ctx, b.ls, res, DefaultMaxLayerBytes, "  ", b.progress, b.opt.OnPull, func(i int, l image.Layer, made bool, _ time.Duration) {
		if made {
			fmt.Fprintf(b.progress, "  layer %d/%d %s: %d MB pulled and unpacked\n", i+1, len(res.Layers), short(l.Digest.String()), l.Size>>20)
		}
		out = append(out, stepLayer{metaLayer: metaLayer{TemplateLayer: api.TemplateLayer{Digest: l.Digest.String(), DiffID: l.DiffID.String(), Size: l.Size}, Chain: l.ChainID.String()}})
	})
	if err != nil {
		return nil, api.ImageConfig{}, atLine(line, "FROM %s: %w", ref, err)
	}
	for i := range out {
		out[i].dir = dirs[i]
	}
	return out, *cfg, nil
}

// step applies one instruction to st.
func (b *dockerBuild) step(ctx context.Context, st *stageState, c instructions.Command, label string) error {
	line := lineOf(c)
	global := b.global
	if ex, ok := c.(instructions.SupportsSingleWordExpansion); ok {
		env := st.env()
		if err := ex.Expand(func(w string) (string, error) { return b.expand(w, env) }); err != nil {
			return errdefs.Invalid("Dockerfile line %d: %v", line, err)
		}
	}
	switch c := c.(type) {
	case *instructions.EnvCommand:
		for _, kv := range c.Env {
			st.cfg.Env = setEnv(st.cfg.Env, kv.Key, kv.Value)
		}
	case *instructions.ArgCommand:
		for _, kv := range c.Args {
			v, set := "", false
			if bv, ok := b.opt.BuildArgs[kv.Key]; ok {
				v, set = bv, true
				b.usedArgs[kv.Key] = true
			} else if kv.Value != nil {
				v, set = *kv.Value, true
			} else if gv, ok := global[kv.Key]; ok {
				v, set = gv, true
			}
			if set {
				st.args[kv.Key] = v
			}
		}
	case *instructions.LabelCommand:
		for _, kv := range c.Labels {
			st.cfg.Labels[kv.Key] = kv.Value
		}
	case *instructions.ExposeCommand:
		for _, p := range c.Ports {
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			st.cfg.ExposedPorts = append(st.cfg.ExposedPorts, p)
		}
	case *instructions.UserCommand:
		st.cfg.User = c.User
	case *instructions.ShellCommand:
		st.shell = c.Shell
	case *instructions.CmdCommand:
		st.cfg.Cmd = b.cmdLine(st, c.ShellDependantCmdLine)
		st.cmdSet = true
	case *instructions.EntrypointCommand:
		st.cfg.Entrypoint = b.cmdLine(st, c.ShellDependantCmdLine)
		if !st.cmdSet {
			st.cfg.Cmd = nil // as Docker: a new ENTRYPOINT drops a CMD the base set
		}
	case *instructions.WorkdirCommand:
		wd := c.Path
		if !path.IsAbs(wd) {
			wd = path.Join("/", st.cfg.WorkingDir, wd)
		}
		st.cfg.WorkingDir = path.Clean(wd)
		// Made through the stage's symlinks (the config keeps the path as
		// written, as Docker's does).
		dir, err := resolveIn(st.topFirst(), st.cfg.WorkingDir)
		if err != nil {
			return errdefs.Invalid("Dockerfile line %d: WORKDIR %s: %v", line, st.cfg.WorkingDir, err)
		}
		return b.ensureDir(ctx, st, dir, "WORKDIR "+st.cfg.WorkingDir, label, line)
	case *instructions.RunCommand:
		return b.run(ctx, st, c, label, line)
	case *instructions.CopyCommand:
		if len(c.ExcludePatterns) > 0 || c.Parents {
			return errdefs.Invalid("Dockerfile line %d: COPY --exclude and --parents are not supported by nook yet: the copy would hold other files than asked", line)
		}
		from, err := b.expand(c.From, st.env()) // --from=$STAGE, as BuildKit
		if err != nil {
			return errdefs.Invalid("Dockerfile line %d: COPY --from=%s: %v", line, c.From, err)
		}
		return b.copy(ctx, st, c.SourcesAndDest, from, c.Chown, c.Chmod, false, c.String(), label, line)
	case *instructions.AddCommand:
		if len(c.ExcludePatterns) > 0 || c.Unpack != nil || c.Checksum != "" || c.KeepGitDir != nil {
			return errdefs.Invalid("Dockerfile line %d: ADD --exclude, --unpack, --checksum and --keep-git-dir are not supported by nook", line)
		}
		return b.copy(ctx, st, c.SourcesAndDest, "", c.Chown, c.Chmod, true, c.String(), label, line)
	case *instructions.OnbuildCommand:
		b.warnf(line, "ONBUILD is kept by no nook template: ignored")
	case *instructions.HealthCheckCommand:
		b.warnf(line, "HEALTHCHECK is not run by nook (use --ready): ignored")
	case *instructions.StopSignalCommand:
		b.warnf(line, "STOPSIGNAL is not used by nook: ignored")
	case *instructions.VolumeCommand:
		b.warnf(line, "VOLUME makes no volume in a nook sandbox (its files stay in the sandbox's disk): ignored")
	case *instructions.MaintainerCommand:
		st.cfg.Labels["maintainer"] = c.Maintainer
	default:
		return errdefs.Invalid("Dockerfile line %d: %s is not supported by nook", line, strings.ToUpper(c.Name()))
	}
	return nil
}

func (b *dockerBuild) cmdLine(st *stageState, c instructions.ShellDependantCmdLine) []string {
	if c.PrependShell {
		return append(append([]string(nil), st.shell...), strings.Join(c.CmdLine, " "))
	}
	return append([]string(nil), c.CmdLine...)
}

// cached reports whether the store has the layer of key, and adds it.
func (b *dockerBuild) cached(st *stageState, key, what, label string) bool {
	if !b.ls.Has(key) {
		return false
	}
	dir, _ := b.ls.Path(key)
	st.push(dir, key)
	fmt.Fprintf(b.progress, "[stage %s] %s: cached\n", label, what)
	return true
}

func (b *dockerBuild) run(ctx context.Context, st *stageState, c *instructions.RunCommand, label string, line int) error {
	var caches []CacheMount
	var secrets []SecretMount
	var mountKey []string
	for _, mt := range instructions.GetMounts(c) {
		switch mt.Type {
		case instructions.MountTypeCache:
			if mt.From != "" || mt.Source != "" {
				return errdefs.Invalid("Dockerfile line %d: RUN --mount=type=cache,from=...: a cache seeded from a stage is not supported by nook", line)
			}
			target := path.Clean("/" + mt.Target)
			if target == "/" {
				return errdefs.Invalid("Dockerfile line %d: RUN --mount=type=cache needs a target other than /", line)
			}
			id := mt.CacheID
			if id == "" {
				id = target
			}
			dir, err := b.s.cacheMountDir(id)
			if err != nil {
				return err
			}
			cm := CacheMount{Dir: dir, Target: target, Mode: 0o755, ReadOnly: mt.ReadOnly}
			for _, f := range []struct {
				v   *uint64
				to  *int
				max uint64
			}{{mt.UID, &cm.UID, 1<<31 - 1}, {mt.GID, &cm.GID, 1<<31 - 1}} {
				if f.v != nil {
					if *f.v > f.max {
						return errdefs.Invalid("Dockerfile line %d: RUN --mount=type=cache: uid and gid are at most %d", line, f.max)
					}
					*f.to = int(*f.v)
				}
			}
			if mt.Mode != nil {
				if *mt.Mode > 0o7777 {
					return errdefs.Invalid("Dockerfile line %d: RUN --mount=type=cache: mode %o is not a file mode", line, *mt.Mode)
				}
				cm.Mode = fs.FileMode(*mt.Mode & 0o777)
				if *mt.Mode&0o1000 != 0 {
					cm.Mode |= fs.ModeSticky
				}
			}
			caches = append(caches, cm)
			mountKey = append(mountKey, fmt.Sprintf("cache %s %s %d:%d %o %v", id, target, cm.UID, cm.GID, cm.Mode, cm.ReadOnly))
		case instructions.MountTypeSecret:
			id := mt.CacheID
			if id == "" && mt.Target != "" {
				id = path.Base(mt.Target)
			}
			target := mt.Target
			if target == "" {
				target = "/run/secrets/" + id
			}
			if !path.IsAbs(target) {
				target = path.Join("/", st.cfg.WorkingDir, target)
			}
			if mt.Env != nil {
				return errdefs.Invalid("Dockerfile line %d: RUN --mount=type=secret,env=...: nook gives secrets as files only", line)
			}
			src, ok := b.opt.Secrets[id]
			if !ok {
				if mt.Required {
					return errdefs.Invalid("Dockerfile line %d: the build has no secret %q (give it with --secret id=%s,src=FILE)", line, id, id)
				}
				continue // as Docker: an optional secret that is missing is not mounted
			}
			secrets = append(secrets, SecretMount{Src: src, Target: path.Clean(target)})
			mountKey = append(mountKey, "secret "+id+" "+target)
		default:
			return errdefs.Invalid("Dockerfile line %d: RUN --mount=type=%s is not supported by nook (cache and secret are)", line, mt.Type)
		}
	}
	for _, f := range c.FlagsUsed {
		switch f {
		case "mount", "network", "security":
		default:
			return errdefs.Invalid("Dockerfile line %d: RUN --%s is not supported by nook", line, f)
		}
	}
	if n := instructions.GetNetwork(c); n != "" && n != instructions.NetworkDefault {
		return errdefs.Invalid("Dockerfile line %d: RUN --network=%s is not supported: RUN steps run under the build's network policy (--allow)", line, n)
	}
	if s := instructions.GetSecurity(c); s != "" && s != instructions.SecuritySandbox {
		return errdefs.Invalid("Dockerfile line %d: RUN --security=%s is not supported", line, s)
	}
	argv := b.cmdLine(st, c.ShellDependantCmdLine)
	if len(c.Files) > 0 {
		// RUN <<EOF ... EOF: the here-document is the script.
		if len(c.Files) != 1 || !c.PrependShell || strings.TrimSpace(strings.Join(c.CmdLine, " ")) != "<<"+c.Files[0].Name && strings.TrimSpace(strings.Join(c.CmdLine, " ")) != "<<-"+c.Files[0].Name {
			return errdefs.Invalid("Dockerfile line %d: nook runs a RUN here-document only as the whole command (RUN <<EOF ... EOF)", line)
		}
		argv = append(append([]string(nil), st.shell...), c.Files[0].Data)
	}
	env := st.env()
	what := fmt.Sprintf("RUN %s", strings.Join(argv, " "))
	if len(c.Files) > 0 {
		what = fmt.Sprintf("RUN <<%s (%d lines)", c.Files[0].Name, strings.Count(strings.TrimSuffix(c.Files[0].Data, "\n"), "\n")+1)
	}
	key := stepKey(st.key, "RUN", strings.Join(argv, "\x00"), strings.Join(env, "\x00"), st.cfg.User, st.cfg.WorkingDir, strings.Join(mountKey, "\x00"))
	if b.cached(st, key, what, label) {
		return nil
	}
	fmt.Fprintf(b.progress, "[stage %s] %s\n", label, what)
	// The step's sandbox starts from a build of the stage so far: a
	// directory of this template the build removes after.
	// Its sandbox's lowers are the stage's layers themselves (Store.Layers
	// reads layers.json), over a layer of the directories every sandbox
	// mounts on: nothing is merged for a step.
	stepID := "step-" + newBuildID()
	stepDir := filepath.Join(b.s.dir, b.name, stepID)
	b.tmpDirs = append(b.tmpDirs, stepDir)
	if err := os.MkdirAll(filepath.Join(stepDir, "rootfs"), 0o755); err != nil {
		return err
	}
	baseLayer, err := b.baseDirsLayer(ctx)
	if err != nil {
		return err
	}
	if err := fsutil.WriteJSONAtomic(filepath.Join(stepDir, "layers.json"), append(st.topFirst(), baseLayer)); err != nil {
		return err
	}
	tmp, err := b.ls.NewTemp()
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	out := &prefixWriter{w: b.progress, prefix: "  "}
	var unlocks []func()
	defer func() {
		for _, u := range unlocks {
			u()
		}
	}()
	locked := map[string]bool{}
	for _, cm := range caches { // one step at a time per cache, across builds
		if locked[cm.Dir] {
			continue // one cache at two targets
		}
		unlock, err := fsutil.Flock(ctx, cm.Dir+".lock")
		if err != nil {
			return err
		}
		locked[cm.Dir] = true
		unlocks = append(unlocks, unlock)
	}
	err = b.opt.Runner.Run(ctx, b.name+"/"+stepID, RunStep{Argv: argv, Env: env, User: st.cfg.User, Cwd: st.cfg.WorkingDir, Line: line, Caches: caches, Secrets: secrets}, filepath.Join(tmp, "layer"), out)
	out.flush()
	os.RemoveAll(stepDir)
	if err != nil {
		return atLine(line, "%s: %w", c.String(), err)
	}
	// What the step's sandbox was given, not what the step made (Docker
	// mounts these over its RUN steps, and keeps none in a layer).
	drop := []string{"etc/hosts", "etc/hostname", "etc/resolv.conf"}
	// Nor what was mounted: a cache's files are the cache's, a secret
	// never leaves the step (nor its directory, where the stage lacks it).
	for _, cm := range caches {
		drop = append(drop, strings.TrimPrefix(cm.Target, "/"))
	}
	for _, sm := range secrets {
		drop = append(drop, strings.TrimPrefix(sm.Target, "/"))
	}
	for _, f := range drop {
		if err := dropEntry(filepath.Join(tmp, "layer"), f); err != nil {
			return err
		}
	}
	for _, sm := range secrets { // the directories made for it, once empty
		for d := path.Dir(sm.Target); d != "/"; d = path.Dir(d) {
			if _, _, found, err := layerstore.Lookup(st.topFirst(), d); err != nil || found {
				break
			}
			if os.Remove(filepath.Join(tmp, "layer", d)) != nil {
				break // not empty (the step wrote there too), or gone
			}
		}
	}
	dir, _, err := b.ls.Put(ctx, key, filepath.Join(tmp, "layer"))
	if err != nil {
		return err
	}
	st.push(dir, key)
	fmt.Fprintf(b.progress, "[stage %s] done in %s\n", label, time.Since(start).Round(time.Millisecond))
	return nil
}

// baseDirsLayer is the store's layer of the base directories (the
// bottom of every step's stack too); the build keeps it.
func (b *dockerBuild) baseDirsLayer(ctx context.Context) (string, error) {
	dir, key, err := b.s.baseDirsLayer(ctx, b.ls)
	if err == nil && !slices.Contains(b.extraKeys, key) {
		b.extraKeys = append(b.extraKeys, key)
	}
	return dir, err
}

// dropEntry removes name (a path below layer whose parents are
// directories of the layer, or absent) and what is below it.
func dropEntry(layer, name string) error {
	root, err := os.OpenRoot(layer)
	if err != nil {
		return err
	}
	defer root.Close()
	if dir := path.Dir(name); dir != "." {
		if fi, err := root.Lstat(dir); err != nil || !fi.IsDir() {
			return nil
		}
	}
	err = root.RemoveAll(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// ensureDir adds a layer that makes dir (and its parents) if the stage
// lacks it.
func (b *dockerBuild) ensureDir(ctx context.Context, st *stageState, dir, what, label string, line int) error {
	if _, s, found, err := layerstore.Lookup(st.topFirst(), dir); err != nil {
		return err
	} else if found && s.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil
	}
	key := stepKey(st.key, "MKDIR", dir)
	if b.cached(st, key, what, label) {
		return nil
	}
	d, err := b.ls.Make(ctx, key, func(layer string) error {
		if err := b.mkdirs(st, layer, dir); err != nil {
			return errdefs.Invalid("Dockerfile line %d: %s: %v", line, what, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	st.push(d, key)
	fmt.Fprintf(b.progress, "[stage %s] %s\n", label, what)
	return nil
}

// mkdirs makes dir's components in layer, each with the metadata the
// stage's lowers have for it (a new one: 0755 root's). A component that
// is not a directory below is an error.
func (b *dockerBuild) mkdirs(st *stageState, layer, dir string) error {
	root, err := os.OpenRoot(layer)
	if err != nil {
		return err
	}
	defer root.Close()
	cur := ""
	for _, c := range strings.Split(strings.Trim(path.Clean("/"+dir), "/"), "/") {
		if c == "" {
			continue
		}
		cur = path.Join(cur, c)
		if fi, err := root.Lstat(cur); err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("/%s is not a directory", cur)
			}
			continue
		}
		mode, uid, gid := fs.FileMode(0o755), 0, 0
		if _, s, found, err := layerstore.Lookup(st.topFirst(), cur); err != nil {
			return err
		} else if found {
			if s.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("/%s is not a directory in the stage", cur)
			}
			mode, uid, gid = fs.FileMode(s.Mode&0o777), int(s.Uid), int(s.Gid)
			if s.Mode&unix.S_ISVTX != 0 {
				mode |= fs.ModeSticky
			}
			if s.Mode&unix.S_ISGID != 0 {
				mode |= fs.ModeSetgid
			}
			if s.Mode&unix.S_ISUID != 0 {
				mode |= fs.ModeSetuid
			}
		}
		if err := root.Mkdir(cur, 0o700); err != nil {
			return err
		}
		if err := root.Lchown(cur, uid, gid); err != nil {
			return err
		}
		if err := root.Chmod(cur, mode); err != nil {
			return err
		}
	}
	return nil
}

// prefixWriter indents each line of a step's output.
type prefixWriter struct {
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i])
		p.buf = p.buf[i+1:]
	}
	if len(p.buf) > 64<<10 {
		p.flush()
	}
	return len(b), nil
}

func (p *prefixWriter) flush() {
	if len(p.buf) > 0 {
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf)
		p.buf = nil
	}
}
