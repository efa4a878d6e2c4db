package template

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/nookhq/nook/internal/errdefs"
)

// noRunner fails a build that reaches a RUN: these tests have none
// (RUN steps are the daemon's, tested end to end).
type noRunner struct{ t *testing.T }

func (r noRunner) Run(context.Context, string, RunStep, string, io.Writer) error {
	r.t.Error("a RUN step ran")
	return errors.New("no runner")
}

func writeContext(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A Dockerfile without RUN steps, against an image in a registry:
// multi-stage with COPY --from, ARG in FROM and in a stage, ENV, WORKDIR
// (made when missing), USER, LABEL, EXPOSE, CMD, COPY with --chown and
// --chmod, a .dockerignore, a warning for HEALTHCHECK; the config is
// the template's, the files are in its rootfs, and a rebuild with the
// last line changed reuses every earlier layer.
func TestBuildDockerfile(t *testing.T) {
	requireRoot(t)
	host := serveRegistry(t, nil)
	base := tarLayer(t, compression.GZip,
		tfile{name: "etc/", typ: tar.TypeDir},
		tfile{name: "etc/passwd", data: "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n"},
		tfile{name: "etc/group", data: "root:x:0:\napp:x:1000:\n"},
		tfile{name: "srv/", typ: tar.TypeDir},
		tfile{name: "tmp/", typ: tar.TypeDir, mode: 0o1777})
	pushImage(t, host+"/base:1", testImage(t, v1.Config{Env: []string{"PATH=/usr/bin:/bin"}}, base))
	df := `ARG TAG=1
FROM ` + host + `/base:${TAG} AS build
COPY tool.sh /out/tool.sh
FROM ` + host + `/base:${TAG}
ARG MODE=dev
ENV APP_MODE=$MODE GREETING="hello world"
LABEL org=nook
WORKDIR /srv/app
COPY --chown=app:app --chmod=750 src/ ./
COPY --from=build /out/tool.sh /usr/local/bin/
COPY tool.sh /srv
WORKDIR /tmp/w
WORKDIR /srv/app
HEALTHCHECK CMD true
EXPOSE 8000
USER app
CMD ["python3", "main.py"]
`
	ctxDir := writeContext(t, map[string]string{"Dockerfile": df, "tool.sh": "#!/bin/sh\n", "src/main.py": "print(1)\n",
		"src/secret.env": "KEY=1\n", ".dockerignore": "src/*.env\n"})
	s := NewStore(t.TempDir(), slog.New(slog.DiscardHandler))
	var progress bytes.Buffer
	opt := DockerfileOptions{Context: ctxDir, BuildArgs: map[string]string{"MODE": "prod"}, Runner: noRunner{t}}
	tpl, err := s.BuildDockerfile(context.Background(), "app", opt, &progress)
	if err != nil {
		t.Fatalf("%v\n%s", err, progress.String())
	}
	c := tpl.Config
	if tpl.Source != SourceDockerfile || c.User != "app" || c.WorkingDir != "/srv/app" || c.Labels["org"] != "nook" || c.ExposedPorts[0] != "8000/tcp" ||
		strings.Join(c.Cmd, " ") != "python3 main.py" || strings.Join(c.Env, ",") != "PATH=/usr/bin:/bin,APP_MODE=prod,GREETING=hello world" {
		t.Fatalf("template: %+v config %+v", tpl, c)
	}
	if tpl.Service == nil || strings.Join(tpl.Service.Cmd, " ") != "python3 main.py" {
		t.Errorf("service: %+v", tpl.Service)
	}
	if !strings.Contains(progress.String(), "line 14: HEALTHCHECK") {
		t.Errorf("no warning for HEALTHCHECK:\n%s", progress.String())
	}
	rootfs, _ := s.Rootfs(tpl.ID)
	fi, err := os.Stat(filepath.Join(rootfs, "srv/app/main.py"))
	if err != nil || fi.Mode().Perm() != 0o750 || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("COPY --chown --chmod: %v %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, "srv/app/secret.env")); !os.IsNotExist(err) {
		t.Errorf(".dockerignore'd file copied: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "usr/local/bin/tool.sh")); err != nil || string(b) != "#!/bin/sh\n" {
		t.Errorf("COPY --from: %q %v", b, err)
	}
	// Into a directory the stage has, without a trailing slash; a
	// directory made below /tmp keeps /tmp's sticky bit.
	if b, err := os.ReadFile(filepath.Join(rootfs, "srv/tool.sh")); err != nil || string(b) != "#!/bin/sh\n" {
		t.Errorf("COPY into an existing directory: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp after WORKDIR below it: %v %v", fi.Mode(), err)
	}
	// One changed last line: every layer but none new is reused.
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(strings.Replace(df, `CMD ["python3", "main.py"]`, `CMD ["python3", "other.py"]`, 1)), 0o644)
	progress.Reset()
	again, err := s.BuildDockerfile(context.Background(), "app", opt, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Layers) != len(tpl.Layers) || strings.Count(progress.String(), ": cached") != 6 || again.Config.Cmd[1] != "other.py" {
		t.Errorf("rebuild: %d layers (was %d), cached:\n%s", len(again.Layers), len(tpl.Layers), progress.String())
	}
	// A changed source file: its COPY and what follows are made again.
	os.WriteFile(filepath.Join(ctxDir, "src/main.py"), []byte("print(2)\n"), 0o644)
	progress.Reset()
	if _, err := s.BuildDockerfile(context.Background(), "app", opt, &progress); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(progress.String(), ": cached"); n != 2 {
		t.Errorf("after a source changed, %d steps cached, want 2:\n%s", n, progress.String())
	}
}

// Bad Dockerfiles are clear errors naming the line, and leave no template.
func TestBuildDockerfileBadInput(t *testing.T) {
	requireRoot(t)
	s := NewStore(t.TempDir(), slog.New(slog.DiscardHandler))
	for _, tc := range []struct{ df, want string }{
		{"FROM scratch\nRUN --mount=type=bind,target=/src true\n", "line 2: RUN --mount=type=bind is not supported"},
		{"FROM scratch\nRUN --mount=type=secret,id=tok,required true\n", `line 2: the build has no secret "tok"`},
		{"FROM scratch\nRUN --mount=type=cache,target=/ true\n", "needs a target other than /"},
		{"FROM scratch\nCOPY missing.txt /\n", "line 2: COPY missing.txt /: missing.txt: no such file"},
		{"FROM scratch\nADD https://example.com/x /x\n", "ADD of a URL is not supported"},
		{"FROM scratch\nCOPY ../outside /x\n", "no such file"},
		{"FROM scratch\nFROBNICATE x\n", "line 2"},
		{"FROM scratch AS a\nCOPY --from=a /x /x\n", "a cycle"},
		{"FROM scratch\nCOPY --exclude=*.env . /x\n", "line 2: COPY --exclude and --parents are not supported"},
		{"FROM scratch\nRUN --device=/dev/kvm true\n", "line 2: RUN --device is not supported"},
	} {
		ctxDir := writeContext(t, map[string]string{"Dockerfile": tc.df})
		_, err := s.BuildDockerfile(context.Background(), "bad", DockerfileOptions{Context: ctxDir, Runner: noRunner{t}}, nil)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.df, err, tc.want)
		}
		if _, err := s.Get("bad"); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%q left a template: %v", tc.df, err)
		}
	}
	ctxDir := writeContext(t, map[string]string{"Dockerfile": "FROM scratch\n"})
	if _, err := s.BuildDockerfile(context.Background(), "bad", DockerfileOptions{Context: ctxDir, Target: "nope", Runner: noRunner{t}}, nil); err == nil || !strings.Contains(err.Error(), `target stage "nope"`) {
		t.Errorf("unknown target: %v", err)
	}
}

// COPY and WORKDIR go through the symlinks of the stage's own tree as
// Docker's do (a merged-/usr Debian's /bin -> usr/bin, an /app that
// links to /srv/app): a copy into /bin/ lands in /usr/bin beside what
// is there, and the links stay links. A link that leads out of the
// tree is followed inside it, never out.
func TestBuildDockerfileThroughSymlinks(t *testing.T) {
	requireRoot(t)
	host := serveRegistry(t, nil)
	base := tarLayer(t, compression.GZip,
		tfile{name: "usr/", typ: tar.TypeDir},
		tfile{name: "usr/bin/", typ: tar.TypeDir},
		tfile{name: "usr/bin/sh", data: "#!sh\n"},
		tfile{name: "bin", typ: tar.TypeSymlink, link: "usr/bin"},
		tfile{name: "srv/", typ: tar.TypeDir},
		tfile{name: "srv/app/", typ: tar.TypeDir},
		tfile{name: "app", typ: tar.TypeSymlink, link: "/srv/app"},
		tfile{name: "escape", typ: tar.TypeSymlink, link: "../../../../tmp/nook-escape-test"},
		tfile{name: "loop", typ: tar.TypeSymlink, link: "/loop"},
		tfile{name: "etc/", typ: tar.TypeDir},
		tfile{name: "etc/passwd", data: "root:x:0:0:root:/root:/bin/sh\n"},
		tfile{name: "etc/group", data: "root:x:0:\n"})
	pushImage(t, host+"/merged:1", testImage(t, v1.Config{}, base))
	df := "FROM " + host + "/merged:1\nCOPY tool.sh /bin/\nWORKDIR /app/sub\nCOPY data.txt ./\nCOPY data.txt /escape/x\n"
	ctxDir := writeContext(t, map[string]string{"Dockerfile": df, "tool.sh": "#!/bin/sh\n", "data.txt": "data\n"})
	os.RemoveAll("/tmp/nook-escape-test")
	s := NewStore(t.TempDir(), slog.New(slog.DiscardHandler))
	tpl, err := s.BuildDockerfile(context.Background(), "links", DockerfileOptions{Context: ctxDir, Runner: noRunner{t}}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat("/tmp/nook-escape-test"); !os.IsNotExist(err) {
		t.Fatalf("a COPY through a link out of the tree wrote on the host: %v", err)
	}
	rootfs, err := s.Rootfs(tpl.ID)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"bin": "usr/bin", "app": "/srv/app"} {
		if got, err := os.Readlink(filepath.Join(rootfs, name)); err != nil || got != want {
			t.Errorf("/%s is no longer the link to %s: %q %v", name, want, got, err)
		}
	}
	for _, f := range []string{"usr/bin/sh", "usr/bin/tool.sh", "srv/app/sub/data.txt", "tmp/nook-escape-test/x"} {
		if _, err := os.Lstat(filepath.Join(rootfs, f)); err != nil {
			t.Errorf("/%s: %v", f, err)
		}
	}
	if tpl.Config.WorkingDir != "/app/sub" {
		t.Errorf("workdir %q", tpl.Config.WorkingDir)
	}
	// COPY --from names its stage with an ARG.
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM "+host+"/merged:1 AS one\nCOPY data.txt /made-in-one\n"+
		"FROM "+host+"/merged:1\nARG SRC=one\nCOPY --from=$SRC /made-in-one /got\n"), 0o644)
	byArg, err := s.BuildDockerfile(context.Background(), "byarg", DockerfileOptions{Context: ctxDir, Runner: noRunner{t}}, io.Discard)
	if err != nil {
		t.Fatalf("COPY --from=$SRC: %v", err)
	}
	if rootfs, err := s.Rootfs(byArg.ID); err != nil {
		t.Fatal(err)
	} else if b, err := os.ReadFile(filepath.Join(rootfs, "got")); err != nil || string(b) != "data\n" {
		t.Errorf("COPY --from=$SRC: %q %v", b, err)
	}
	// A link to itself is a clear error, not a hang.
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte("FROM "+host+"/merged:1\nCOPY data.txt /loop/\n"), 0o644)
	if _, err := s.BuildDockerfile(context.Background(), "loop", DockerfileOptions{Context: ctxDir, Runner: noRunner{t}}, io.Discard); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "too many levels of symbolic links") {
		t.Errorf("COPY into a link loop: %v", err)
	}
}
