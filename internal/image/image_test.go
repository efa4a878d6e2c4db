package image

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/nookhq/nook/internal/errdefs"
)

// serve runs a registry (go-containerregistry's implementation of the
// distribution API) on a loopback port, behind wrap if given, and returns
// its host:port.
func serve(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

// platformImage is a random 2-layer image whose config says p.
func platformImage(t *testing.T, p v1.Platform) v1.Image {
	t.Helper()
	img, err := random.Image(256, 2)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"}
	cf.Config.User, cf.Config.WorkingDir = "app", "/srv"
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

var amd64 = v1.Platform{OS: "linux", Architecture: "amd64"}

func push(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
}

func resolve(t *testing.T, ref string, opt Options) (*Resolved, error) {
	t.Helper()
	r, err := ParseRef(ref)
	if err != nil {
		t.Fatal(err)
	}
	if opt.Platform == nil {
		opt.Platform = &amd64
	}
	return Resolve(context.Background(), r, opt)
}

// A tag resolves to the digest of what the registry serves, with the
// config and every layer's digests and chain ID; pushing a new image to
// the tag changes what it resolves to.
func TestResolveTag(t *testing.T) {
	host := serve(t, nil)
	img := platformImage(t, amd64)
	push(t, host+"/app:1", img)
	res, err := resolve(t, host+"/app:1", Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if res.Digest != want || res.Canonical != host+"/app@"+want.String() || res.IndexDigest != nil {
		t.Fatalf("resolved %s (%s), want %s", res.Digest, res.Canonical, want)
	}
	if res.Config.Config.User != "app" || res.Config.Config.WorkingDir != "/srv" || len(res.Layers) != 2 {
		t.Fatalf("config %+v, %d layers", res.Config.Config, len(res.Layers))
	}
	layers, _ := img.Layers()
	for i, l := range res.Layers {
		d, _ := layers[i].Digest()
		diff, _ := layers[i].DiffID()
		if l.Digest != d || l.DiffID != diff {
			t.Errorf("layer %d: %s %s, want %s %s", i, l.Digest, l.DiffID, d, diff)
		}
	}
	if res.Layers[0].ChainID != res.Layers[0].DiffID || res.Layers[1].ChainID == res.Layers[1].DiffID {
		t.Errorf("chain IDs %s %s", res.Layers[0].ChainID, res.Layers[1].ChainID)
	}
	push(t, host+"/app:1", platformImage(t, amd64))
	again, err := resolve(t, host+"/app:1", Options{})
	if err != nil || again.Digest == res.Digest {
		t.Fatalf("after a push to the tag: %v, %v", again.Digest, err)
	}
	// By digest: the first image still.
	byDigest, err := resolve(t, res.Canonical, Options{})
	if err != nil || byDigest.Digest != res.Digest {
		t.Fatalf("by digest: %v %v", byDigest, err)
	}
}

// ChainIDs follows image-spec config.md.
func TestChainIDs(t *testing.T) {
	a, _ := v1.NewHash("sha256:" + strings.Repeat("a", 64))
	b, _ := v1.NewHash("sha256:" + strings.Repeat("b", 64))
	got := ChainIDs([]v1.Hash{a, b})
	// sha256("sha256:aaa... sha256:bbb...")
	want, _, _ := v1.SHA256(strings.NewReader(a.String() + " " + b.String()))
	if got[0] != a || got[1] != want {
		t.Fatalf("chain IDs %v, want %v %v", got, a, want)
	}
}

// From a multi-platform index the host's platform is chosen, never an
// attestation; an index without it names what it has.
func TestResolveIndex(t *testing.T) {
	host := serve(t, nil)
	arm := v1.Platform{OS: "linux", Architecture: "arm64", Variant: "v8"}
	att, _ := random.Image(64, 1)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: platformImage(t, arm), Descriptor: v1.Descriptor{Platform: &arm}},
		mutate.IndexAddendum{Add: att, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "unknown", Architecture: "unknown"},
			Annotations: map[string]string{"vnd.docker.reference.type": "attestation-manifest"}}},
		mutate.IndexAddendum{Add: platformImage(t, amd64), Descriptor: v1.Descriptor{Platform: &amd64}},
	)
	r, _ := name.ParseReference(host + "/multi:latest")
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatal(err)
	}
	res, err := resolve(t, host+"/multi", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Platform.Architecture != "amd64" || res.IndexDigest == nil {
		t.Fatalf("chose %s (index %v)", res.Platform.String(), res.IndexDigest)
	}
	s390 := v1.Platform{OS: "linux", Architecture: "s390x"}
	_, err = resolve(t, host+"/multi", Options{Platform: &s390})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "no linux/s390x variant; it has linux/amd64, linux/arm64/v8") {
		t.Fatalf("missing platform: %v", err)
	}
}

// A single-platform image of another architecture is refused by name.
func TestResolveWrongArch(t *testing.T) {
	host := serve(t, nil)
	push(t, host+"/armonly:1", platformImage(t, v1.Platform{OS: "linux", Architecture: "arm64"}))
	_, err := resolve(t, host+"/armonly:1", Options{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "is for linux/arm64, this host runs linux/amd64") {
		t.Fatalf("wrong arch: %v", err)
	}
}

func TestResolveNotFound(t *testing.T) {
	host := serve(t, nil)
	push(t, host+"/app:1", platformImage(t, amd64))
	for _, ref := range []string{host + "/app:2", host + "/nope:1"} {
		if _, err := resolve(t, ref, Options{}); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("%s: %v, want not found", ref, err)
		}
	}
}

// Credentials come from the Docker config, as for docker pull; without
// them the registry's refusal is a precondition naming docker login.
func TestResolveAuth(t *testing.T) {
	host := serve(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "agent" || p != "s3cret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	img := platformImage(t, amd64)
	r, _ := name.ParseReference(host + "/private:1")
	if err := remote.Write(r, img, remote.WithAuth(&authn.Basic{Username: "agent", Password: "s3cret"})); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	t.Setenv("DOCKER_CONFIG", dir)
	if _, err := resolve(t, host+"/private:1", Options{}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "docker login") {
		t.Fatalf("without credentials: %v", err)
	}
	// "agent:s3cret" in base64, as docker login writes it.
	cfg := `{"auths":{"` + host + `":{"auth":"YWdlbnQ6czNjcmV0"}}}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := resolve(t, host+"/private:1", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := img.Digest(); res.Digest != want {
		t.Fatalf("resolved %s, want %s", res.Digest, want)
	}
}

// oci:DIR and docker-archive:FILE resolve without a registry.
func TestResolveLayoutAndArchive(t *testing.T) {
	img := platformImage(t, amd64)
	want, _ := img.Digest()
	dir := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"oci:" + dir, "oci:" + dir + ":v1"} {
		res, err := resolve(t, ref, Options{})
		if err != nil || res.Digest != want || len(res.Layers) != 2 {
			t.Fatalf("%s: %v %v", ref, res, err)
		}
	}
	if _, err := resolve(t, "oci:"+dir+":v2", Options{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an absent tag: %v", err)
	}
	file := filepath.Join(t.TempDir(), "saved.tar")
	tag, _ := name.NewTag("example.com/app:v1")
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"docker-archive:" + file, "docker-archive:" + file + ":example.com/app:v1"} {
		res, err := resolve(t, ref, Options{})
		if err != nil || res.Digest != want {
			t.Fatalf("%s: %v %v", ref, res, err)
		}
	}
	if _, err := resolve(t, "docker-archive:"+filepath.Join(t.TempDir(), "none.tar"), Options{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a missing archive: %v", err)
	}
}

func TestParseRef(t *testing.T) {
	for _, c := range []struct {
		in   string
		kind Kind
		name string
		path string
	}{
		{"python:3.12-slim", Registry, "index.docker.io/library/python:3.12-slim", ""},
		{"ghcr.io/org/img@sha256:" + strings.Repeat("0", 64), Registry, "ghcr.io/org/img@sha256:" + strings.Repeat("0", 64), ""},
		{"oci:/tmp/l", OCILayout, "", "/tmp/l"},
		{"oci:/tmp/l:v1", OCILayout, "v1", "/tmp/l"},
		{"docker-archive:/tmp/a.tar", DockerArchive, "", "/tmp/a.tar"},
		{"docker-archive:/tmp/a.tar:repo/x:1", DockerArchive, "repo/x:1", "/tmp/a.tar"},
	} {
		r, err := ParseRef(c.in)
		if err != nil || r.Kind != c.kind || r.Name != c.name || r.Path != c.path {
			t.Errorf("%q: %+v %v", c.in, r, err)
		}
	}
	for _, bad := range []string{"", "oci:", "docker-archive:", "UPPER/case:1", "a b"} {
		if _, err := ParseRef(bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want invalid", bad, err)
		}
	}
}

// Plain HTTP goes to loopback registries only; the refusal comes before
// any connection.
func TestTLSOnly(t *testing.T) {
	rt := tlsOnly{http.DefaultTransport}
	for _, u := range []string{"http://10.1.2.3:5000/v2/", "http://registry.local/v2/", "http://192.168.1.9/v2/"} {
		req, _ := http.NewRequest("GET", u, nil)
		if _, err := rt.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "plain HTTP") {
			t.Errorf("%s: %v", u, err)
		}
	}
	host := serve(t, nil)
	req, _ := http.NewRequest("GET", "http://"+host+"/v2/", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("loopback: %v", err)
	}
	resp.Body.Close()
}

// A remote caller's pull dials no loopback or link-local address, even
// when a name (or a redirect) that is no literal loopback leads there.
func TestEscapeRemoteTransport(t *testing.T) {
	host := serve(t, nil)
	req, _ := http.NewRequest(http.MethodGet, "http://"+host+"/v2/", nil)
	if _, err := remoteTransport().RoundTrip(req); err == nil || !strings.Contains(err.Error(), "loopback or link-local") {
		t.Fatalf("a remote caller's transport reached %s: %v", host, err)
	}
	for _, a := range []string{"169.254.169.254:80", "[::1]:5000", "0.0.0.0:5000"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+a+"/v2/", nil)
		if _, err := remoteTransport().RoundTrip(req); err == nil || !strings.Contains(err.Error(), "loopback or link-local") {
			t.Errorf("%s: %v", a, err)
		}
	}
}
