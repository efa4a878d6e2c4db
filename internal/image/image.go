// Package image resolves an image reference to one image of the host's
// platform (issue 14: templates from OCI images): its digest, its config
// and its layers, whose tars internal/layerstore unpacks.
//
// A reference is one of
//   - a registry image, as Docker writes it: python:3.12-slim,
//     ghcr.io/org/img@sha256:..., 127.0.0.1:5000/app:1;
//   - oci:DIR[:TAG], an OCI image layout;
//   - docker-archive:FILE[:REPO:TAG], what `docker save` writes.
//
// Tags resolve to the digest of the manifest the registry serves now;
// the caller records it. A multi-platform index yields the manifest of
// the wanted platform (linux and the host's architecture unless told
// otherwise); one without it is an error naming the platforms it has.
// Attestation manifests (unknown/unknown) are never chosen.
//
// A registry on a loopback address may speak plain HTTP; any other is
// spoken to over TLS only.
//
// Registry credentials come from a keychain, by default the usual
// Docker configuration (~/.docker/config.json, $DOCKER_CONFIG, and
// its credential helpers).
//
// The registry client is github.com/google/go-containerregistry: the
// distribution protocol, authentication, and the OCI layout and Docker
// archive formats, kept by Google and used by ko, crane and kaniko. A
// layer's digest is checked only once its stream has been read to the
// end (and not at all for layouts and archives): layerstore reads every
// byte and checks the digests before it keeps a layer.
package image

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/layerstore"
)

// Kind is where a reference points.
type Kind int

const (
	Registry      Kind = iota // a registry image
	OCILayout                 // oci:DIR[:TAG]
	DockerArchive             // docker-archive:FILE[:REPO:TAG]
)

// Ref is a parsed reference.
type Ref struct {
	Kind Kind
	// Name is the registry reference, fully qualified
	// (index.docker.io/library/python:3.12-slim), or the tag asked of a
	// layout or an archive ("" for its only image).
	Name string
	// Path is the layout's directory or the archive's file.
	Path string

	ref name.Reference // Registry
}

func (r Ref) String() string {
	switch r.Kind {
	case OCILayout:
		return "oci:" + r.Path + suffix(r.Name)
	case DockerArchive:
		return "docker-archive:" + r.Path + suffix(r.Name)
	}
	return r.Name
}

func suffix(tag string) string {
	if tag == "" {
		return ""
	}
	return ":" + tag
}

// ParseRef parses a reference (see the package doc).
func ParseRef(s string) (Ref, error) {
	if rest, ok := strings.CutPrefix(s, "oci:"); ok {
		dir, tag, _ := strings.Cut(rest, ":")
		if dir == "" {
			return Ref{}, errdefs.Invalid("image %q: oci: needs a directory (oci:DIR or oci:DIR:TAG)", s)
		}
		return Ref{Kind: OCILayout, Path: dir, Name: tag}, nil
	}
	if rest, ok := strings.CutPrefix(s, "docker-archive:"); ok {
		file, tag, _ := strings.Cut(rest, ":")
		if file == "" {
			return Ref{}, errdefs.Invalid("image %q: docker-archive: needs a file (docker-archive:FILE or docker-archive:FILE:REPO:TAG)", s)
		}
		if tag != "" {
			if _, err := name.NewTag(tag); err != nil {
				return Ref{}, errdefs.Invalid("image %q: %q is not a REPO:TAG: %v", s, tag, err)
			}
		}
		return Ref{Kind: DockerArchive, Path: file, Name: tag}, nil
	}
	ref, err := name.ParseReference(s)
	if err != nil {
		return Ref{}, errdefs.Invalid("image %q: %v", s, err)
	}
	return Ref{Kind: Registry, Name: ref.Name(), ref: ref}, nil
}

// RemoteDenied says why a caller other than the daemon's host may not
// use ref, or "": files on the host (oci:, docker-archive:) and
// registries on its loopback or link-local addresses are the host's
// alone, lest a remote token read the host's files or its local
// services through the daemon.
func RemoteDenied(ref Ref) string {
	switch {
	case ref.Kind == OCILayout || ref.Kind == DockerArchive:
		return "oci: and docker-archive: images are files on the daemon's host: build them there, over the unix socket (or push the image to a registry)"
	case LocalRegistry(ref):
		return "a registry on the daemon's loopback or link-local address is the host's: build from it there, over the unix socket"
	}
	return ""
}

// remoteTransport is the registry transport of a remote caller's pull:
// it dials no loopback, link-local or unspecified address, whatever
// name (or redirect) led there, so that a registry name that resolves to
// the host itself reaches none of its local services.
func remoteTransport() http.RoundTripper {
	t := remote.DefaultTransport.(*http.Transport).Clone()
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, Control: func(_, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return err
		}
		if ip := net.ParseIP(host); ip == nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsLinkLocalMulticast() {
			return errdefs.Denied("a registry on the daemon's own loopback or link-local address (%s) is the host's: build from it there, over the unix socket", host)
		}
		return nil
	}}
	t.DialContext = d.DialContext
	t.Proxy = nil // the dial check sees the registry's own address
	return t
}

// LocalRegistry reports whether a registry reference names a registry
// on a loopback or link-local address of this host (localhost, 127/8,
// ::1, 169.254/16, fe80::/10), or a name that is one.
func LocalRegistry(r Ref) bool {
	if r.Kind != Registry || r.ref == nil {
		return false
	}
	host := r.ref.Context().RegistryStr()
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && (ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified())
}

// Options tune Resolve.
type Options struct {
	// Platform is the one to pick from an index; default linux and the
	// host's architecture.
	Platform *v1.Platform
	// Keychain gives registry credentials; default the Docker config.
	Keychain authn.Keychain
	// Remote says the caller is not the daemon's host: the pull uses no
	// registry credentials of the host, and a reference to the host's
	// files (oci:, docker-archive:) or to a registry on its loopback or
	// link-local addresses is refused (RemoteDenied).
	Remote bool
	// Transport carries registry requests; default http.DefaultTransport.
	Transport http.RoundTripper
}

// Resolved is the image a reference names now.
type Resolved struct {
	Ref Ref
	// Digest is the image manifest's; IndexDigest the index's it was
	// chosen from, if any.
	Digest      v1.Hash
	IndexDigest *v1.Hash
	// Canonical is REPO@DIGEST for a registry image, what a later build
	// pulls to get exactly this image.
	Canonical string
	Platform  v1.Platform
	Config    *v1.ConfigFile
	Layers    []Layer // bottom first
	Image     v1.Image
}

// Layer is one layer of a resolved image.
type Layer struct {
	Digest    v1.Hash // of the blob, as stored (compressed)
	DiffID    v1.Hash // of the uncompressed tar
	ChainID   v1.Hash // of this layer and all below it (OCI config.md)
	Size      int64
	MediaType types.MediaType
	Layer     v1.Layer
	// Verified: Layer.Compressed fails a read, at its end at the latest,
	// unless its bytes have Digest (the registry client checks what it
	// fetches; layouts and archives are read as they are).
	Verified bool
}

// Blob is the layer as layerstore unpacks it: read as stored, checked
// against its digest and diff ID, keyed by its chain ID.
func (l Layer) Blob() layerstore.Blob {
	return layerstore.Blob{Digest: l.Digest.String(), DiffID: l.DiffID.String(), Chain: l.ChainID.String(), Open: l.Layer.Compressed, Verified: l.Verified, Size: l.Size}
}

// Resolve finds the image ref names, for the wanted platform.
func Resolve(ctx context.Context, ref Ref, opt Options) (*Resolved, error) {
	want := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if opt.Platform != nil {
		want = *opt.Platform
	}
	if opt.Remote {
		if msg := RemoteDenied(ref); msg != "" {
			return nil, errdefs.Denied("image %s: %s", ref, msg)
		}
	}
	res := &Resolved{Ref: ref}
	var err error
	switch ref.Kind {
	case Registry:
		err = res.fromRegistry(ctx, opt, want)
	case OCILayout:
		err = res.fromLayout(want)
	case DockerArchive:
		err = res.fromArchive()
	default:
		err = errdefs.Invalid("image %s: unknown kind", ref)
	}
	if err != nil {
		return nil, err
	}
	if err := res.fill(want); err != nil {
		return nil, err
	}
	return res, nil
}

func (res *Resolved) fromRegistry(ctx context.Context, opt Options, want v1.Platform) error {
	kc := opt.Keychain
	switch {
	case opt.Remote:
		kc = authn.NewMultiKeychain() // every registry: anonymous
	case kc == nil:
		kc = authn.DefaultKeychain
	}
	rt := opt.Transport
	if rt == nil {
		rt = remote.DefaultTransport
	}
	if opt.Remote {
		rt = remoteTransport()
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc), remote.WithTransport(tlsOnly{rt})}
	desc, err := remote.Get(res.Ref.ref, ropts...)
	if err != nil {
		return registryError(res.Ref, err)
	}
	repo := res.Ref.ref.Context()
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return registryError(res.Ref, err)
		}
		h := desc.Digest
		res.IndexDigest = &h
		if res.Image, err = pickFromIndex(res.Ref, idx, want); err != nil {
			return err
		}
	} else if desc.MediaType.IsImage() {
		if res.Image, err = desc.Image(); err != nil {
			return registryError(res.Ref, err)
		}
	} else {
		return errdefs.Invalid("image %s: %s is not an image (media type %s)", res.Ref, desc.Digest, desc.MediaType)
	}
	if res.Digest, err = res.Image.Digest(); err != nil {
		return registryError(res.Ref, err)
	}
	res.Canonical = repo.Digest(res.Digest.String()).String()
	return nil
}

// tlsOnly refuses plain HTTP but to a loopback address. The registry
// client tries plain HTTP for hosts on private networks and *.local
// names too, where credentials and layers would cross the network in the
// clear, and a man in the middle could serve any image.
type tlsOnly struct{ rt http.RoundTripper }

func (t tlsOnly) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Scheme != "https" && !isLoopback(r.URL.Hostname()) {
		return nil, fmt.Errorf("plain HTTP to %s refused: a registry not on a loopback address is spoken to over TLS", r.URL.Host)
	}
	return t.rt.RoundTrip(r)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// registryError gives a registry's refusal its category.
func registryError(ref Ref, err error) error {
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch {
		case terr.StatusCode == http.StatusNotFound || hasCode(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode):
			return errdefs.NotFound("image %s not found: %v", ref, err)
		case terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden:
			// Never a 401 of nook's own: the client would read it as its token's.
			return errdefs.Precondition("image %s: the registry refused the credentials (docker login to it, or check ~/.docker/config.json): %v", ref, err)
		}
	}
	var nerr net.Error
	var operr *net.OpError
	if errors.As(err, &operr) || errors.As(err, &nerr) {
		return errdefs.Unavailable("image %s: the registry cannot be reached (check the name, and the network of the daemon's host): %v", ref, err)
	}
	return fmt.Errorf("image %s: %w", ref, err)
}

func hasCode(terr *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range terr.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

func (res *Resolved) fromLayout(want v1.Platform) error {
	idx, err := layout.ImageIndexFromPath(res.Ref.Path)
	if err != nil {
		return errdefs.Invalid("image %s: not an OCI image layout: %v", res.Ref, err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return errdefs.Invalid("image %s: %v", res.Ref, err)
	}
	// A tag names one entry (org.opencontainers.image.ref.name); without
	// one, the layout must hold a single entry.
	var cands []v1.Descriptor
	for _, d := range m.Manifests {
		if res.Ref.Name == "" || d.Annotations["org.opencontainers.image.ref.name"] == res.Ref.Name {
			cands = append(cands, d)
		}
	}
	switch {
	case len(cands) == 0 && res.Ref.Name != "":
		return errdefs.NotFound("image %s: the layout has no image tagged %q", res.Ref, res.Ref.Name)
	case len(cands) == 0:
		return errdefs.Invalid("image %s: the layout is empty", res.Ref)
	case len(cands) > 1 && res.Ref.Name == "":
		return errdefs.Invalid("image %s: the layout holds %d images: name one, oci:%s:TAG", res.Ref, len(cands), res.Ref.Path)
	}
	d := cands[0]
	switch {
	case d.MediaType.IsIndex():
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return errdefs.Invalid("image %s: %v", res.Ref, err)
		}
		h := d.Digest
		res.IndexDigest = &h
		res.Image, err = pickFromIndex(res.Ref, child, want)
		if err != nil {
			return err
		}
	case d.MediaType.IsImage():
		if res.Image, err = idx.Image(d.Digest); err != nil {
			return errdefs.Invalid("image %s: %v", res.Ref, err)
		}
	default:
		return errdefs.Invalid("image %s: %s is not an image (media type %s)", res.Ref, d.Digest, d.MediaType)
	}
	res.Digest, err = res.Image.Digest()
	return err
}

func (res *Resolved) fromArchive() error {
	var tag *name.Tag
	if res.Ref.Name != "" {
		t, err := name.NewTag(res.Ref.Name)
		if err != nil {
			return errdefs.Invalid("image %s: %v", res.Ref, err)
		}
		tag = &t
	}
	img, err := tarball.ImageFromPath(res.Ref.Path, tag)
	if err != nil {
		return errdefs.Invalid("image %s: not a docker save archive, or no such image in it: %v", res.Ref, err)
	}
	res.Image = img
	res.Digest, err = img.Digest()
	if err != nil {
		return errdefs.Invalid("image %s: %v", res.Ref, err)
	}
	return nil
}

// pickFromIndex returns idx's image for want.
func pickFromIndex(ref Ref, idx v1.ImageIndex, want v1.Platform) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", ref, err)
	}
	d, err := SelectPlatform(m, want)
	if err != nil {
		return nil, errdefs.Precondition("image %s: %v", ref, err)
	}
	if d.MediaType.IsIndex() {
		return nil, errdefs.Invalid("image %s: the entry for %s is itself an index", ref, want.String())
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", ref, err)
	}
	return img, nil
}

// SelectPlatform returns the entry of m for want: the same OS and
// architecture, and variant when want has one (the first such entry),
// never an attestation. The error names the platforms m has.
func SelectPlatform(m *v1.IndexManifest, want v1.Platform) (v1.Descriptor, error) {
	var have []string
	for _, d := range m.Manifests {
		if d.Annotations["vnd.docker.reference.type"] != "" {
			continue // an attestation
		}
		p := d.Platform
		if p == nil || p.OS == "unknown" || p.Architecture == "unknown" {
			continue
		}
		if p.OS == want.OS && p.Architecture == want.Architecture && (want.Variant == "" || p.Variant == want.Variant) {
			return d, nil
		}
		have = append(have, p.String())
	}
	sort.Strings(have)
	if len(have) == 0 {
		return v1.Descriptor{}, fmt.Errorf("no %s variant: the index names no platform", want.String())
	}
	return v1.Descriptor{}, fmt.Errorf("no %s variant; it has %s", want.String(), strings.Join(have, ", "))
}

// fill reads the image's config and layers and checks it runs on want.
func (res *Resolved) fill(want v1.Platform) error {
	cfg, err := res.Image.ConfigFile()
	if err != nil {
		return errdefs.Invalid("image %s: its config: %v", res.Ref, err)
	}
	if cfg.OS != "" && cfg.OS != want.OS || cfg.Architecture != "" && cfg.Architecture != want.Architecture {
		return errdefs.Precondition("image %s is for %s/%s, this host runs %s", res.Ref, cfg.OS, cfg.Architecture, want.String())
	}
	res.Config = cfg
	res.Platform = v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
	layers, err := res.Image.Layers()
	if err != nil {
		return errdefs.Invalid("image %s: its layers: %v", res.Ref, err)
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) {
		return errdefs.Invalid("image %s: %d layers but %d diff IDs in its config", res.Ref, len(layers), len(cfg.RootFS.DiffIDs))
	}
	chains := ChainIDs(cfg.RootFS.DiffIDs)
	for i, l := range layers {
		mt, err := l.MediaType()
		if err != nil {
			return errdefs.Invalid("image %s: layer %d: %v", res.Ref, i, err)
		}
		if !mt.IsLayer() {
			return errdefs.Invalid("image %s: layer %d has media type %s, not a layer", res.Ref, i, mt)
		}
		if !mt.IsDistributable() {
			return errdefs.Invalid("image %s: layer %d is a foreign layer (%s), which is never pulled", res.Ref, i, mt)
		}
		dg, err := l.Digest()
		if err != nil {
			return errdefs.Invalid("image %s: layer %d: %v", res.Ref, i, err)
		}
		size, err := l.Size()
		if err != nil {
			return errdefs.Invalid("image %s: layer %d: %v", res.Ref, i, err)
		}
		res.Layers = append(res.Layers, Layer{Digest: dg, DiffID: cfg.RootFS.DiffIDs[i], ChainID: chains[i], Size: size, MediaType: mt, Layer: l, Verified: res.Ref.Kind == Registry})
	}
	return nil
}

// ChainIDs are the chain IDs of a stack of layers, bottom first (OCI
// image-spec config.md): the first is its diff ID, each next one
// sha256(previous + " " + diff ID).
func ChainIDs(diffIDs []v1.Hash) []v1.Hash {
	out := make([]v1.Hash, len(diffIDs))
	for i, d := range diffIDs {
		if i == 0 {
			out[i] = d
			continue
		}
		sum := sha256.Sum256([]byte(out[i-1].String() + " " + d.String()))
		out[i] = v1.Hash{Algorithm: "sha256", Hex: fmt.Sprintf("%x", sum)}
	}
	return out
}
