package daemon

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/agent/safetar"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/image"
	"github.com/nookhq/nook/internal/template"
)

// stepRunner runs a Dockerfile build's RUN steps in the daemon's own
// container sandboxes (template.Runner): each step is a sandbox of its
// own, recorded like any other (it counts against the host's limits,
// not against the quotas of the token that asked for the build; shows in
// nook ls as build-..., and a daemon killed meanwhile finds it on
// restart), made from the build of the stage so far under the
// build's network policy, destroyed once its changes are copied out.
type stepRunner struct {
	m     *Manager
	tpl   string   // the template being built
	allow []string // the build's network policy
	n     int
}

// stepTTL bounds a step sandbox a crashed daemon left behind.
const stepTTL = 6 * time.Hour

func (r *stepRunner) Run(ctx context.Context, templateID string, step template.RunStep, changes string, out io.Writer) error {
	b, err := r.m.backend(api.IsolationContainer)
	if err != nil {
		return err
	}
	exp, ok := b.(core.ChangesExporter)
	if !ok {
		return errdefs.Unavailable("the container backend cannot keep a step's changes: RUN steps cannot run here")
	}
	r.n++
	suffix := fmt.Sprintf("-%d-%s", r.n, generateName())
	tpl := r.tpl
	if len(tpl) > 63-len("build-")-len(suffix) { // the template's part is cut, never the unique suffix
		tpl = strings.TrimRight(tpl[:63-len("build-")-len(suffix)], "-")
	}
	name := "build-" + tpl + suffix
	req := api.CreateSandboxRequest{Name: name, Template: r.tpl, TTL: stepTTL.String(), Allow: r.allow}
	if r.m.net == nil {
		req.Allow = nil
	}
	// The daemon's own sandbox, not the caller's: made without its token,
	// it counts against none of its quotas (nor takes its --max-ttl), and
	// only the host's limits hold it.
	sb, err := r.m.create(WithTokenID(ctx, ""), req, io.Discard, templateID)
	if err != nil {
		return fmt.Errorf("the step's sandbox: %w", err)
	}
	defer func() {
		if err := r.m.Destroy(context.WithoutCancel(ctx), sb.Name); err != nil {
			r.m.log.Error("destroy a build step's sandbox", "sandbox", sb.Name, "err", err)
		}
	}()
	c, err := r.m.agentFor(sb)
	if err != nil {
		return err
	}
	env := map[string]string{}
	for _, kv := range step.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			env[k] = v
		}
	}
	for _, cm := range step.Caches { // the build holds each cache's lock
		if err := os.Lchown(cm.Dir, cm.UID, cm.GID); err != nil {
			return err
		}
		if err := os.Chmod(cm.Dir, cm.Mode); err != nil {
			return err
		}
		if err := uploadDir(ctx, c, cm.Dir, cm.Target); err != nil {
			return fmt.Errorf("the cache at %s: %w", cm.Target, err)
		}
	}
	for _, sm := range step.Secrets {
		f, err := os.Open(sm.Src)
		if err != nil {
			return err
		}
		mode := uint32(0o400)
		_, err = c.WriteFile(ctx, &agent.FileRequest{Path: sm.Target, Parents: true, Mode: &mode}, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("the secret at %s: %w", sm.Target, err)
		}
	}
	st, err := execTo(ctx, c, &agent.ExecRequest{Argv: step.Argv, Env: env, User: step.User, Cwd: step.Cwd}, out)
	if err != nil {
		return fmt.Errorf("the step: %w", err)
	}
	if st.Signal != "" {
		return errdefs.Invalid("killed by SIG%s (see its output above)%s", st.Signal, r.denied(ctx, sb))
	}
	if st.ExitCode != 0 {
		return errdefs.Invalid("exited with code %d (see its output above)%s", st.ExitCode, r.denied(ctx, sb))
	}
	for _, cm := range step.Caches {
		if cm.ReadOnly {
			continue
		}
		if err := downloadDir(ctx, c, cm.Target, cm.Dir); err != nil {
			return fmt.Errorf("keep the cache at %s: %w", cm.Target, err)
		}
	}
	r.m.dropAgent(sb.ID)
	return exp.ExportChanges(ctx, sb.ID, changes)
}

// denied says what the build's network policy refused the step, if
// anything: the likeliest reason a step that downloads fails.
func (r *stepRunner) denied(ctx context.Context, sb *core.Sandbox) string {
	if r.m.net == nil {
		return ""
	}
	l, err := r.m.NetLog(ctx, sb.Name)
	if err != nil || len(l.Entries) == 0 {
		return ""
	}
	var ds []string
	seen := map[string]bool{}
	for _, e := range l.Entries {
		d := fmt.Sprintf("%s (%s)", e.Destination, e.Reason)
		if !seen[d] && len(ds) < 5 {
			seen[d] = true
			ds = append(ds, d)
		}
	}
	return fmt.Sprintf("; the build's network policy (%s) denied: %s: allow what it needs with --allow", strings.Join(r.allow, " "), strings.Join(ds, ", "))
}

// uploadDir puts the files of the host directory dir at target in a
// sandbox (through its agent: the sandbox's paths resolve inside it).
func uploadDir(ctx context.Context, c *agent.Client, dir, target string) error {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := writeTree(tw, dir)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	_, err := c.UploadTree(ctx, target, pr)
	pr.CloseWithError(errors.New("upload ended"))
	return err
}

// writeTree writes dir to tw: itself as "./" (its owner and mode), then
// its directories, files and symlinks with their owners (no names: the
// host's account names are not the sandbox's business, and looking one
// up per file costs), each file's hard links after the first as links.
// What a sandbox made a cache of is never followed out of dir.
func writeTree(tw *tar.Writer, dir string) error {
	seen := map[[2]uint64]string{} // device and inode -> the name written
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.IsDir(), fi.Mode().IsRegular():
		default:
			return nil // devices, fifos, sockets: never carried
		}
		h, err := tar.FileInfoHeader(nameless{fi}, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		if st != nil && fi.Mode().IsRegular() && st.Nlink > 1 {
			id := [2]uint64{st.Dev, st.Ino}
			if first, ok := seen[id]; ok {
				h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
				return tw.WriteHeader(h)
			}
			seen[id] = h.Name
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, h.Size)
		return err
	})
}

// nameless is a file's info with no owner names (tar.FileInfoNames).
type nameless struct{ fs.FileInfo }

func (nameless) Uname() (string, error) { return "", nil }
func (nameless) Gname() (string, error) { return "", nil }

// downloadDir replaces the host directory dir with the files at target
// in a sandbox, extracted through safetar (nothing the sandbox sent lands
// outside dir; setuid and setgid bits are dropped).
func downloadDir(ctx context.Context, c *agent.Client, target, dir string) error {
	_, rc, err := c.DownloadTar(ctx, target)
	if err != nil {
		return err
	}
	defer rc.Close()
	tmp := dir + ".new"
	os.RemoveAll(tmp)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	// Owners are kept (the sandbox's users write the cache; it is under
	// the template store, which only root can enter).
	if err := safetar.Extract(io.LimitReader(rc, MaxContextBytes), tmp, safetar.Options{Top: ".", NoSetID: true, Owners: true}); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	old := dir + ".old"
	os.RemoveAll(old)
	if err := os.Rename(dir, old); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, dir); err != nil {
		os.Rename(old, dir)
		return err
	}
	return os.RemoveAll(old)
}

// MaxContextBytes bounds a Dockerfile build's context.
const MaxContextBytes = 8 << 30

// BuildDockerfile builds template name from a Dockerfile in the build
// context ctxTar (a tar stream, extracted through safetar: no entry
// lands outside the context's directory); its RUN steps run in
// sandboxes of the daemon's under the policy req.Allow names (default
// @registries).
func (m *Manager) BuildDockerfile(ctx context.Context, name string, req api.DockerfileBuild, ctxTar io.Reader, opt BuildOptions) (api.Template, error) {
	if err := template.CheckName(name); err != nil {
		return api.Template{}, err
	}
	allow := req.Allow
	if len(allow) == 0 {
		allow = []string{"@registries"}
	}
	if m.net != nil {
		if _, err := m.net.parsePolicy("", allow, nil); err != nil {
			return api.Template{}, err
		}
	} else if len(req.Allow) > 0 {
		return api.Template{}, errNoNetworking()
	}
	dir, err := m.templates.ContextDir()
	if err != nil {
		return api.Template{}, err
	}
	defer os.RemoveAll(dir)
	lr := &limitedReader{r: ctxTar, left: MaxContextBytes}
	if err := safetar.Extract(lr, dir, safetar.Options{}); err != nil {
		if lr.left < 0 {
			return api.Template{}, errdefs.Invalid("the build context is more than %s", core.FormatBytes(MaxContextBytes))
		}
		return api.Template{}, errdefs.Invalid("the build context is not a tar nook takes: %v", err)
	}
	// The build's secrets come in the context tar under SecretsDir: out
	// of the context before anything reads it (no COPY sees them).
	secrets := map[string]string{}
	sdir := dir + ".secrets"
	defer os.RemoveAll(sdir)
	if fi, err := os.Lstat(filepath.Join(dir, api.SecretsDir)); err == nil && fi.IsDir() {
		if err := os.Rename(filepath.Join(dir, api.SecretsDir), sdir); err != nil {
			return api.Template{}, err
		}
		entries, err := os.ReadDir(sdir)
		if err != nil {
			return api.Template{}, err
		}
		for _, e := range entries {
			if !e.Type().IsRegular() || !secretIDRE.MatchString(e.Name()) {
				return api.Template{}, errdefs.Invalid("secret %q in %s is not a file with an id of letters, digits, '.', '_' and '-'", e.Name(), api.SecretsDir)
			}
			secrets[e.Name()] = filepath.Join(sdir, e.Name())
		}
	}
	topt := template.DockerfileOptions{Context: dir, Dockerfile: req.Dockerfile, BuildArgs: req.BuildArgs, Target: req.Target, Secrets: secrets,
		Resolve: image.Options{Remote: !opt.HostCredentials}, Start: req.Start, Ready: req.Ready, OnPull: opt.OnPull,
		Runner: &stepRunner{m: m, tpl: name, allow: allow}}
	if m.net == nil {
		topt.Runner = &stepRunner{m: m, tpl: name}
	}
	t, err := m.templates.BuildDockerfile(ctx, name, topt, opt.Progress)
	if err != nil {
		return t, err
	}
	m.afterBuild(ctx, name, t)
	return t, nil
}

var secretIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// limitedReader fails past its bound (left goes negative).
type limitedReader struct {
	r    io.Reader
	left int64
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.left < 0 {
		return 0, errdefs.Invalid("too large")
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		return n, errdefs.Invalid("too large")
	}
	return n, err
}
