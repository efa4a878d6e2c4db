package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/testutil"
)

// debianImage pushes to a registry on a loopback port an image of two
// layers: a realistic Debian root (the base template's mmdebstrap root,
// tarred by GNU tar, uncompressed) and an app layer (gzip) that adds a
// user, a directory it owns with a file, and whites out /etc/motd; its
// config sets ENV, WORKDIR, USER and CMD. It returns the reference.
func debianImage(t *testing.T) string {
	t.Helper()
	st, id := testutil.BaseTemplate(t)
	rootfs, err := st.Rootfs(id)
	if err != nil {
		t.Fatal(err)
	}
	tarFile := filepath.Join(t.TempDir(), "base.tar")
	if out, err := exec.Command("tar", "--xattrs", "--numeric-owner", "-C", rootfs, "-cf", tarFile, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar the base rootfs: %v: %s", err, out)
	}
	raw, err := os.ReadFile(tarFile)
	if err != nil {
		t.Fatal(err)
	}
	base := static.NewLayer(raw, types.OCIUncompressedLayer)
	passwd, err := os.ReadFile(filepath.Join(rootfs, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	group, _ := os.ReadFile(filepath.Join(rootfs, "etc/group"))
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	add := func(h *tar.Header, data string) {
		h.ModTime = time.Unix(1700000000, 0)
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(data))
	}
	add(&tar.Header{Name: "etc/.wh.motd", Typeflag: tar.TypeReg, Mode: 0o644}, "")
	add(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, string(passwd)+"app:x:1000:1000::/home/app:/bin/sh\n")
	add(&tar.Header{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644}, string(group)+"app:x:1000:\n")
	add(&tar.Header{Name: "home/app/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 1000, Gid: 1000}, "")
	add(&tar.Header{Name: "srv/app/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: 1000, Gid: 1000}, "")
	add(&tar.Header{Name: "srv/app/hello.txt", Typeflag: tar.TypeReg, Mode: 0o600, Uid: 1000, Gid: 1000}, "hello from the image\n")
	tw.Close()
	appData := b.Bytes()
	app, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(appData)), nil }, tarball.WithCompression(compression.GZip))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, base, app)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "APP_MODE=image"},
		WorkingDir: "/srv/app", User: "app", Cmd: []string{"sh"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	ref := strings.TrimPrefix(srv.URL, "http://") + "/app:1"
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

// A template from an image in a registry: built with the CLI (progress,
// ls, inspect), then container and vm sandboxes from it run as the
// image's USER in its WORKDIR with its ENV (each overridable), see its
// files and not what it whited out; so do those of templates of the same
// image as an OCI layout and a docker archive. Removing them leaves none
// of their layers and no vm cache. Bad input is a clear error.
func TestImageTemplate(t *testing.T) {
	requireVM(t)
	d := newDaemon(t)
	ref := debianImage(t)
	tpl := testutil.RandomName("img")
	t.Cleanup(func() { d.nook("template", "rm", tpl) })
	r, err := d.nookWithin(5*time.Minute, []string{"NOOK_HOST=unix://" + d.socket()}, "template", "build", tpl, "--from", ref)
	if err != nil || r.code != 0 || !strings.HasPrefix(r.stdout, tpl+"/") || !strings.Contains(r.stderr, "layer 2/2") {
		t.Fatalf("template build --from: %+v %v", r, err)
	}
	if ls := d.must("template", "ls"); !strings.Contains(ls, tpl) || !strings.Contains(ls, ref+" (") {
		t.Fatalf("template ls:\n%s", ls)
	}
	var info api.Template
	if err := json.Unmarshal([]byte(d.must("template", "inspect", tpl, "--json")), &info); err != nil {
		t.Fatal(err)
	}
	if info.Source != "image" || info.Image != ref || len(info.Layers) != 2 || info.Config == nil || info.Config.User != "app" || info.Config.WorkingDir != "/srv/app" {
		t.Fatalf("template inspect: %+v", info)
	}
	if out := d.must("template", "inspect", tpl); !strings.Contains(out, "workdir:") || !strings.Contains(out, "layer 2:") {
		t.Fatalf("template inspect:\n%s", out)
	}

	check := func(sandbox string) {
		t.Helper()
		want := "app\n/srv/app\nimage\nhello from the image\nno motd\n"
		if got := d.must("exec", sandbox, "--", "sh", "-c", `id -un; pwd; echo $APP_MODE; cat hello.txt; test -e /etc/motd || echo no motd`); got != want {
			t.Errorf("%s: exec as the image says: %q, want %q", sandbox, got, want)
		}
		if got := d.must("exec", "--user", "root", "--cwd", "/", "--env", "APP_MODE=call", sandbox, "--", "sh", "-c", `id -u; pwd; echo $APP_MODE`); got != "0\n/\ncall\n" {
			t.Errorf("%s: exec with its own user, cwd and env: %q", sandbox, got)
		}
	}
	d.must("create", "--name", "img-ctr", "--template", tpl)
	check("img-ctr")
	d.must("create", "--name", "img-env", "--template", tpl, "--env", "APP_MODE=sandbox")
	if got := d.must("exec", "img-env", "--", "sh", "-c", "echo $APP_MODE"); got != "sandbox\n" {
		t.Errorf("a sandbox's --env wins over the image's: %q", got)
	}
	d.must("create", "--name", "img-vm", "--isolation", "vm", "--template", tpl, "--cpus", "1", "--memory", "512M")
	check("img-vm")
	d.must("rm", "img-vm")
	// The same image as an OCI layout and as `docker save` output: their
	// templates give container and vm sandboxes the same machine.
	imgRef, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(imgRef)
	if err != nil {
		t.Fatal(err)
	}
	layoutDir := t.TempDir()
	lp, err := layout.Write(layoutDir, empty.Index)
	if err == nil {
		err = lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"}))
	}
	archive := filepath.Join(t.TempDir(), "app.tar")
	if err == nil {
		err = tarball.WriteToFile(archive, name.MustParseReference("example.com/app:v1"), img)
	}
	if err != nil {
		t.Fatal(err)
	}
	for suffix, src := range map[string]string{"-oci": "oci:" + layoutDir + ":v1", "-archive": "docker-archive:" + archive} {
		other := tpl + suffix
		t.Cleanup(func() { d.nook("template", "rm", other) })
		d.must("template", "build", other, "--from", src)
		d.must("create", "--name", "img"+suffix, "--template", other)
		d.must("create", "--name", "img-vm"+suffix, "--isolation", "vm", "--template", other, "--cpus", "1", "--memory", "512M")
		check("img" + suffix)
		check("img-vm" + suffix)
		d.must("rm", "img"+suffix, "img-vm"+suffix)
		d.must("template", "rm", other)
	}
	// A service: started as the image's user when the sandbox comes up,
	// the create returning once it listens; one that exits first fails
	// the create with its output, leaving no sandbox.
	svc := tpl + "-svc"
	t.Cleanup(func() { d.nook("template", "rm", svc) })
	// A vm has it running in its template's snapshot, started before the
	// sandbox existed (on the template boot's hostname), and not twice.
	d.must("template", "build", svc, "--from", ref, "--start", "hostname >/tmp/started-on; exec python3 -m http.server 8000", "--ready", "port:8000")
	d.must("create", "--name", "img-svc", "--template", svc)
	d.must("create", "--name", "img-svc-vm", "--isolation", "vm", "--template", svc, "--cpus", "1", "--memory", "512M")
	for sandbox, startedOn := range map[string]string{"img-svc": "img-svc", "img-svc-vm": "the template boot"} {
		if got := d.must("exec", sandbox, "--", "sh", "-c", "curl -s http://127.0.0.1:8000/ | grep -c hello.txt; ps -o user= -C python3"); got != "1\napp\n" {
			t.Errorf("%s: the service: %q", sandbox, got)
		}
		if ps := d.must("ps", sandbox); strings.Count(ps, "http.server") != 1 {
			t.Errorf("%s: nook ps does not show the service once:\n%s", sandbox, ps)
		}
		got := strings.TrimSpace(d.must("exec", sandbox, "--", "cat", "/tmp/started-on"))
		if (startedOn == sandbox) != (got == sandbox) {
			t.Errorf("%s: the service started on host %q, want it started on %s", sandbox, got, startedOn)
		}
	}
	d.must("rm", "img-svc", "img-svc-vm")
	// A service the template boot cannot make ready (it needs the
	// sandbox's env) fails that snapshot once; vms then get one without
	// it and start the service themselves.
	d.must("template", "build", svc, "--from", ref, "--start", `test -n "$NOOK_SANDBOX" || exit 1; exec python3 -m http.server 8000`, "--ready", "port:8000")
	for _, vm := range []string{"img-svc-vm1", "img-svc-vm2"} {
		d.must("create", "--name", vm, "--isolation", "vm", "--template", svc, "--cpus", "1", "--memory", "512M")
		if got := d.must("exec", vm, "--", "sh", "-c", "curl -s http://127.0.0.1:8000/ | grep -c hello.txt"); got != "1\n" {
			t.Errorf("%s: the service: %q", vm, got)
		}
	}
	d.must("rm", "img-svc-vm1", "img-svc-vm2")
	d.must("template", "build", svc, "--from", ref, "--start", "echo broken >&2; exit 3", "--ready", "port:9")
	if r, _ := d.nook("create", "--name", "img-bad", "--template", svc); r.code != 1 || !strings.Contains(r.stderr, "exited with code 3") || !strings.Contains(r.stderr, "broken") {
		t.Errorf("a service that exits before it is ready: %+v", r)
	}
	if r, _ := d.nook("inspect", "img-bad"); r.code != 1 {
		t.Errorf("a failed create left its sandbox: %+v", r)
	}
	d.must("template", "rm", svc)

	if r, _ := d.nook("template", "rm", tpl); r.code != 1 || !strings.Contains(r.stderr, "used by") {
		t.Errorf("template rm while in use: %+v", r)
	}
	d.must("rm", "img-ctr", "img-env")
	d.must("template", "rm", tpl)
	for _, name := range []string{tpl, svc} {
		if _, err := os.Stat(filepath.Join(testutil.TemplatesDir(), name)); !os.IsNotExist(err) {
			t.Errorf("the directory of template %s is left: %v", name, err)
		}
		// Its vms' root images and snapshots went with it.
		if _, err := os.Stat(filepath.Join(vmCacheDir(), "templates", name)); !os.IsNotExist(err) {
			t.Errorf("the vm cache of template %s is left: %v", name, err)
		}
	}
	// What a vm cache keeps of a build the store no longer has (removed
	// while no daemon ran) goes when a daemon starts.
	gone := filepath.Join(vmCacheDir(), "templates", tpl+"-gone", "20260101t000000-000000")
	if err := os.MkdirAll(gone, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(gone, "rootfs.ext4"), []byte("x"), 0o400)
	os.WriteFile(filepath.Join(gone, "store"), []byte(testutil.TemplatesDir()), 0o400)
	// One another store made: not this daemon's to remove.
	other := filepath.Join(vmCacheDir(), "templates", tpl+"-other", "20260101t000000-000000")
	os.MkdirAll(other, 0o700)
	os.WriteFile(filepath.Join(other, "store"), []byte("/another/store"), 0o400)
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(other)) })
	d.stop(syscall.SIGTERM)
	d.start()
	if _, err := os.Stat(filepath.Dir(gone)); !os.IsNotExist(err) {
		t.Errorf("the vm cache of a build the store does not have is left after a restart: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("the vm cache of another store's build was removed: %v", err)
	}
	d.expectCLI(t, []cliCase{
		{[]string{"template", "build", "x", "--pull"}, 2, "need --from"},
		{[]string{"template", "build", "x", "--start", "true"}, 2, "need --from"},
		{[]string{"template", "build", "x", "--from", ref, "--ready", "port:0"}, 1, "ready \"port:0\" is not valid"},
		{[]string{"template", "build", "x", "--from", ref, "--start", "none", "--ready", "file:/x"}, 1, "ready needs a service"},
		{[]string{"template", "build", "Bad", "--from", ref}, 1, "is not valid"},
		{[]string{"template", "build", tpl + "-nope", "--from", "oci:"}, 1, "needs a directory"},
	})
	// A build that began says what it did on stderr, then the error.
	r, _ = d.nook("template", "build", tpl+"-nope", "--from", strings.TrimSuffix(ref, "/app:1")+"/missing:1")
	if lines := strings.Split(strings.TrimSpace(r.stderr), "\n"); r.code != 1 || !strings.Contains(lines[len(lines)-1], "not found") {
		t.Errorf("an unknown image: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(testutil.TemplatesDir(), tpl+"-nope")); !os.IsNotExist(err) {
		t.Errorf("a failed build left the template's directory: %v", err)
	}
}

// A template from a Dockerfile through the CLI: two stages FROM nook's
// base, RUN steps in the daemon's own sandboxes (a here-document among
// them, a file removed from base, output shown), COPY --from and from
// the context, ARG from --build-arg, WORKDIR, USER, ENV; its sandboxes
// see all of it. A rebuild runs no step again; a failing RUN shows its
// output and line and leaves no template and no step sandbox.
func TestDockerfileTemplate(t *testing.T) {
	d := newDaemon(t)
	ctxDir := t.TempDir()
	df := "FROM base AS build\n" +
		"RUN echo built > /artifact && echo step output here\n" +
		"FROM base\n" +
		"ARG GREETING=hi\n" +
		"COPY --from=build /artifact /opt/artifact\n" +
		"COPY app/ /srv/app/\n" +
		"WORKDIR /srv/app\n" +
		"RUN <<EOF\nset -e\necho \"$GREETING\" > greeting.txt\nrm /etc/motd\nEOF\n" +
		"USER nobody\n" +
		"ENV MODE=built\n"
	os.MkdirAll(filepath.Join(ctxDir, "app"), 0o755)
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(df), 0o644)
	os.WriteFile(filepath.Join(ctxDir, "app", "main.py"), []byte("print('hi')\n"), 0o644)
	tpl := testutil.RandomName("df")
	t.Cleanup(func() { d.nook("template", "rm", tpl) })
	env := []string{"NOOK_HOST=unix://" + d.socket()}
	r, err := d.nookWithin(5*time.Minute, env, "template", "build", tpl, ctxDir, "--build-arg", "GREETING=hello")
	if err != nil || r.code != 0 || !strings.Contains(r.stderr, "\n  step output here") {
		t.Fatalf("template build from a Dockerfile: %+v %v", r, err)
	}
	if ls := d.must("template", "ls"); !strings.Contains(ls, "Dockerfile (Dockerfile)") {
		t.Errorf("template ls does not say the template came from a Dockerfile:\n%s", ls)
	}
	d.must("create", "--name", "df-one", "--template", tpl)
	want := "built\nhello\nnobody\n/srv/app\nbuilt\nno motd\nprint('hi')\n"
	if got := d.must("exec", "df-one", "--", "sh", "-c", `cat /opt/artifact greeting.txt; id -un; pwd; echo $MODE; test -e /etc/motd || echo no motd; cat main.py`); got != want {
		t.Errorf("the Dockerfile's template: %q, want %q", got, want)
	}
	d.must("rm", "df-one")
	r, _ = d.nookWithin(5*time.Minute, env, "template", "build", tpl, ctxDir, "--build-arg", "GREETING=hello")
	if r.code != 0 || strings.Contains(r.stderr, "\n  step output here") || strings.Count(r.stderr, ": cached") != 4 {
		t.Errorf("a rebuild ran steps again: %+v", r)
	}
	bad := t.TempDir()
	os.WriteFile(filepath.Join(bad, "Dockerfile"), []byte("FROM base\nRUN echo oops >&2; exit 7\n"), 0o644)
	r, _ = d.nookWithin(5*time.Minute, env, "template", "build", tpl+"-bad", bad)
	if r.code != 1 || !strings.Contains(r.stderr, "oops") || !strings.Contains(r.stderr, "line 2") || !strings.Contains(r.stderr, "exited with code 7") {
		t.Errorf("a failing RUN: %+v", r)
	}
	if _, err := os.Stat(filepath.Join(testutil.TemplatesDir(), tpl+"-bad")); !os.IsNotExist(err) {
		t.Errorf("a failed build left the template's directory: %v", err)
	}
	if out := d.must("ls", "--json"); strings.Contains(out, "build-") {
		t.Errorf("a step's sandbox is left: %s", out)
	}
	d.must("template", "rm", tpl)

	// A cache mount the next build finds again, a secret the step reads
	// and no layer keeps; a cache a non-root user owns (uid=, gid=) keeps
	// the owners of what it wrote, so that the next build's step can
	// write there again.
	mounts := t.TempDir()
	cacheID := testutil.RandomName("cache")
	t.Cleanup(func() {
		for _, id := range []string{cacheID, cacheID + "-user"} {
			sum := sha256.Sum256([]byte(id))
			dir := filepath.Join(testutil.TemplatesDir(), ".cache-mounts", hex.EncodeToString(sum[:16]))
			os.RemoveAll(dir)
			os.Remove(dir + ".lock")
		}
	})
	os.WriteFile(filepath.Join(mounts, "Dockerfile"), []byte("FROM base\nARG N\nARG CACHE\n"+
		"RUN --mount=type=cache,id=$CACHE,target=/var/cache/t sh -c 'n=$(cat /var/cache/t/n 2>/dev/null || echo 0); echo $((n+1)) > /var/cache/t/n; echo $((n+1)) > /seen'\n"+
		"RUN --mount=type=secret,id=tok sh -c 'test \"$(cat /run/secrets/tok)\" = s3cr3t-value && echo ok > /secret-ok'\n"+
		"RUN useradd -u 1000 -m builder\nUSER builder\n"+
		"RUN --mount=type=cache,id=$CACHE-user,target=/home/builder/.cache,uid=1000,gid=1000,mode=0700 sh -ec 'mkdir -p ~/.cache/sub; n=$(cat ~/.cache/sub/n 2>/dev/null || echo 0); echo $((n+1)) > ~/.cache/sub/n; echo $((n+1)) $(stat -c \"%U %a\" ~/.cache) > ~/seen'\n"), 0o644)
	secretFile := filepath.Join(t.TempDir(), "tok")
	os.WriteFile(secretFile, []byte("s3cr3t-value"), 0o600)
	mt := tpl + "-mounts"
	t.Cleanup(func() { d.nook("template", "rm", mt) })
	for n := 1; n <= 2; n++ {
		r, _ := d.nookWithin(5*time.Minute, env, "template", "build", mt, mounts, "--build-arg", fmt.Sprintf("N=%d", n), "--build-arg", "CACHE="+cacheID, "--secret", "id=tok,src="+secretFile)
		if r.code != 0 {
			t.Fatalf("build %d with mounts: %+v", n, r)
		}
		d.must("create", "--name", "df-mounts", "--template", mt)
		want := fmt.Sprintf("%d\nok\nno secret\nno cache files\n%d builder 700\n", n, n)
		if got := d.must("exec", "df-mounts", "--", "sh", "-c", "cat /seen /secret-ok; test -e /run/secrets/tok || echo no secret; test -e /var/cache/t/n || echo no cache files; cat /home/builder/seen"); got != want {
			t.Errorf("build %d: %q, want %q", n, got, want)
		}
		d.must("rm", "df-mounts")
	}
	var info api.Template
	json.Unmarshal([]byte(d.must("template", "inspect", mt, "--json")), &info)
	rootfs := filepath.Join(testutil.TemplatesDir(), info.ID, "rootfs")
	if out, _ := exec.Command("grep", "-rl", "s3cr3t-value", rootfs, filepath.Join(testutil.TemplatesDir(), ".layers")).Output(); len(out) > 0 {
		t.Errorf("the secret is in the template or its layers: %s", out)
	}
	r, _ = d.nook("template", "build", mt+"-x", bad, "--secret", "nonsense")
	if r.code != 2 {
		t.Errorf("--secret without id and src: %+v", r)
	}
	d.must("template", "rm", mt)
}
