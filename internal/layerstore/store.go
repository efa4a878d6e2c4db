package layerstore

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
)

// Store keeps unpacked layers, each in DIR/<chain>/layer where chain is
// the hex of its chain ID: a layer unpacked over its lowers is shared by
// every image whose stack up to it is the same.
type Store struct {
	dir string
}

// Open opens (making it if needed) the store in dir, root's alone, and
// removes what an unpack a crash cut short left: the caller must be the
// store's only user meanwhile (see Attach).
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	if err := fsutil.MarkTopDir(dir); err != nil {
		return nil, err
	}
	left, _ := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	for _, p := range left {
		if err := os.RemoveAll(p); err != nil {
			return nil, err
		}
	}
	return &Store{dir: dir}, nil
}

// Attach opens the store in dir (making it if needed) without removing
// anything: for a caller that may share the store with other writers
// (an image build holding a shared lock); Open, which removes what a
// crash left, needs the store to itself.
func Attach(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	if err := fsutil.MarkTopDir(dir); err != nil {
		return nil, err
	}
	return &Store{dir: dir}, nil
}

// Blob is a layer to unpack: the digests it must have and how to read it
// as stored (gzip, zstd or plain tar).
type Blob struct {
	Digest string // sha256:HEX of the stored bytes
	DiffID string // sha256:HEX of the uncompressed tar
	Chain  string // sha256:HEX of it and everything below it: the key
	Open   func() (io.ReadCloser, error)
	// Verified says that what Open returns fails a Read, at the latest
	// at its end, unless its bytes have Digest (a registry client's
	// blob): they are not hashed again, and a read that fails once Size
	// bytes came is taken for that check failing.
	Verified bool
	Size     int64 // of the stored bytes, if known (> 0)
}

// Path is where layer chain is, unpacked.
func (s *Store) Path(chain string) (string, error) {
	h, err := hexOf(chain)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.dir, h, "layer"), nil
}

// Has reports whether layer chain is unpacked.
func (s *Store) Has(chain string) bool {
	p, err := s.Path(chain)
	if err != nil {
		return false
	}
	_, err = os.Lstat(p)
	return err == nil
}

func hexOf(d string) (string, error) {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		return "", errdefs.Invalid("layer digest %q is not sha256:HEX", d)
	}
	return h, nil
}

// Ensure unpacks b over lowers (the directories of the layers below it,
// topmost first) unless it is there already, and returns its directory
// and whether this call made it. The stored bytes and the tar must have
// the blob's digests, checked over every byte: a layer that does not, or
// that Unpack refuses, leaves nothing. Two Ensures of one layer, in this
// process or another, unpack it once. It is a Batch of one layer.
func (s *Store) Ensure(ctx context.Context, b Blob, lowers []string, opt Options) (dir string, made bool, err error) {
	bt := s.NewBatch()
	defer bt.Close()
	if dir, made, err = bt.Ensure(ctx, b, lowers, opt); err != nil {
		return "", false, err
	}
	if err := bt.Commit(); err != nil {
		return "", false, err
	}
	return bt.Final(dir), made, nil
}

// A Batch makes the layers of one stack, each over those before it, and
// names the ones it made all at once at Commit, after one sync of their
// bytes: an image's layers wait for the disk once, not once each. Until
// then a layer it made is under a temporary name (which Ensure returns,
// to be given as a lower of the next) and its lock is held, so that no
// other build unpacks it meanwhile. Layers are locked bottom first, in
// every build alike (a chain ID names its whole stack), so two batches
// never wait for each other in a circle.
type Batch struct {
	s         *Store
	pending   []batched // made, not named yet
	committed []batched
	unlocks   []func()
}

type batched struct{ tmp, final string }

// NewBatch starts a batch; Close ends it.
func (s *Store) NewBatch() *Batch { return &Batch{s: s} }

// Ensure is Store.Ensure in the batch: a layer it makes is named only at
// Commit; the directory returned is where it is until then.
func (bt *Batch) Ensure(ctx context.Context, b Blob, lowers []string, opt Options) (dir string, made bool, err error) {
	h, err := hexOf(b.Chain)
	if err != nil {
		return "", false, err
	}
	final := filepath.Join(bt.s.dir, h)
	unlock, err := fsutil.Flock(ctx, final+".lock")
	if err != nil {
		return "", false, err
	}
	if _, err := os.Lstat(final); err == nil {
		unlock()
		return filepath.Join(final, "layer"), false, nil
	}
	rnd := make([]byte, 6)
	rand.Read(rnd)
	tmp := filepath.Join(bt.s.dir, ".tmp-"+h[:16]+"-"+hex.EncodeToString(rnd))
	opt.Lowers = lowers
	err = os.MkdirAll(filepath.Join(tmp, "layer"), 0o755)
	if err == nil {
		err = unpackBlob(ctx, b, filepath.Join(tmp, "layer"), opt)
	}
	if err != nil {
		os.RemoveAll(tmp)
		unlock()
		return "", false, err
	}
	bt.pending = append(bt.pending, batched{tmp: tmp, final: final})
	bt.unlocks = append(bt.unlocks, unlock)
	return filepath.Join(tmp, "layer"), true, nil
}

// Commit makes the layers made so far durable (one sync) and names them.
func (bt *Batch) Commit() error {
	if len(bt.pending) == 0 {
		return nil
	}
	if err := syncDir(bt.s.dir); err != nil {
		return err
	}
	for len(bt.pending) > 0 {
		p := bt.pending[0]
		if err := os.Rename(p.tmp, p.final); err != nil {
			return err
		}
		bt.pending = bt.pending[1:]
		bt.committed = append(bt.committed, p)
	}
	fsutil.SyncDir(bt.s.dir) // the renames
	return nil
}

// Final is where dir, a directory this batch's Ensure returned, is once
// committed.
func (bt *Batch) Final(dir string) string {
	for _, p := range bt.committed {
		if dir == filepath.Join(p.tmp, "layer") {
			return filepath.Join(p.final, "layer")
		}
	}
	return dir
}

// Close removes the layers made and not committed, and unlocks.
func (bt *Batch) Close() {
	for _, p := range bt.pending {
		os.RemoveAll(p.tmp)
	}
	bt.pending = nil
	for _, unlock := range bt.unlocks {
		unlock()
	}
	bt.unlocks = nil
}

// unpackBlob reads b, checks both digests over every byte, and unpacks
// it to dst. A goroutine of its own reads, decompresses and hashes the
// layer (its stored bytes and its tar) a few chunks ahead of the one
// applying its tar: on two cores the hashing and the writes to disk
// overlap.
func unpackBlob(ctx context.Context, b Blob, dst string, opt Options) error {
	rc, err := b.Open()
	if err != nil {
		return fmt.Errorf("layer %s: %w", b.Digest, err)
	}
	pipe := newChunkPipe(4, 1<<20)
	// The feed owns rc: an unpack that fails returns without waiting for
	// a read the registry does not answer; the feed ends at that read's
	// end (its next write finds the pipe closed).
	fed := make(chan error, 1)
	diff := sha256.New() // the feed's until it ends
	go func() {
		defer rc.Close()
		err := feed(b, rc, pipe, diff)
		fed <- err // before the reader can see the end
		pipe.CloseWrite(err)
	}()
	defer pipe.CloseRead()
	_, err = Unpack(ctx, pipe, dst, opt)
	if err == nil {
		// The digests cover every byte: what follows the tar's end too.
		_, err = io.Copy(io.Discard, pipe)
	}
	var ferr error
	if err == nil {
		ferr = <-fed // the pipe ended: the feed is done
	} else {
		select {
		case ferr = <-fed:
		default:
		}
	}
	// What the feed found (a digest that does not match, a stream that
	// does not decompress, the registry's connection lost) says more
	// than what an unpack of its bytes did.
	if ferr != nil && !errors.Is(ferr, errReaderGone) {
		return fmt.Errorf("layer %s: %w", b.Digest, ferr)
	}
	if err != nil {
		return fmt.Errorf("layer %s: %w", b.Digest, err)
	}
	if got := sum(diff); got != b.DiffID {
		return errdefs.Invalid("layer %s: its tar has digest %s, the image's config says %s", b.Digest, got, b.DiffID)
	}
	return nil
}

// feed decompresses b, read from rc, into w, hashing the tar into diff,
// and checks the digest of every byte rc gives, unless its source checks
// them itself (b.Verified).
func feed(b Blob, rc io.Reader, w io.ReaderFrom, diff hash.Hash) error {
	src := &source{r: rc, verified: b.Verified, size: b.Size}
	rc = src
	var stored hash.Hash
	if !b.Verified {
		stored = sha256.New()
		rc = io.TeeReader(rc, stored)
	}
	br := bufio.NewReaderSize(rc, 1<<20)
	tarStream, closeDec, err := decompress(br)
	if err != nil {
		if src.err != nil && errors.Is(err, src.err) {
			return err // the source failed, not its bytes
		}
		return errdefs.Invalid("%v", err)
	}
	defer closeDec()
	if _, err := w.ReadFrom(io.TeeReader(tarStream, diff)); err != nil {
		if errors.Is(err, errReaderGone) || src.err != nil && errors.Is(err, src.err) {
			return err
		}
		return errdefs.Invalid("its bytes do not decompress: %v", err)
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return err
	}
	if stored != nil {
		if got := sum(stored); got != b.Digest {
			return errdefs.Invalid("the bytes received have digest %s", got)
		}
	}
	return nil
}

// source reads a layer's stored bytes and keeps the error it gave. A
// read of a verified blob (one whose source checks its digest at its
// end) that fails once every byte came is that check failing: the
// layer's fault (invalid), not the network's.
type source struct {
	r        io.Reader
	verified bool
	n, size  int64
	err      error
}

func (s *source) Read(p []byte) (int, error) {
	k, err := s.r.Read(p)
	s.n += int64(k)
	if err != nil && err != io.EOF {
		if s.verified && s.size > 0 && s.n >= s.size {
			err = errdefs.Invalid("the bytes received do not have the layer's digest: %v", err)
		}
		s.err = err
	}
	return k, err
}

func sum(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

// decompress returns the tar inside r: gzip and zstd by their magic
// numbers, anything else as it is.
func decompress(r *bufio.Reader) (io.Reader, func(), error) {
	magic, _ := r.Peek(4)
	switch {
	case bytes.HasPrefix(magic, []byte{0x1f, 0x8b}):
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		zr.Multistream(true)
		return zr, func() { zr.Close() }, nil
	case bytes.HasPrefix(magic, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, nil, err
		}
		return zr, zr.Close, nil
	}
	return r, func() {}, nil
}

func syncDir(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// NewTemp makes an empty directory in the store, on its filesystem, for
// a layer to be made in and then given to Put (or removed by the caller).
func (s *Store) NewTemp() (string, error) {
	rnd := make([]byte, 8)
	rand.Read(rnd)
	dir := filepath.Join(s.dir, ".tmp-put-"+hex.EncodeToString(rnd))
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// NewLayer makes an empty layer directory (0755) in a NewTemp directory,
// to be filled and given to Put; the caller removes filepath.Dir(layer)
// if it does not.
func (s *Store) NewLayer() (string, error) {
	tmp, err := s.NewTemp()
	if err != nil {
		return "", err
	}
	layer := filepath.Join(tmp, "layer")
	if err := os.Mkdir(layer, 0o755); err != nil {
		os.RemoveAll(tmp)
		return "", err
	}
	return layer, nil
}

// Make returns the directory of layer key, made first by fill (into an
// empty directory) unless the store has it.
func (s *Store) Make(ctx context.Context, key string, fill func(layer string) error) (string, error) {
	if s.Has(key) {
		return s.Path(key)
	}
	layer, err := s.NewLayer()
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(filepath.Dir(layer))
	if err := fill(layer); err != nil {
		return "", err
	}
	dir, _, err := s.Put(ctx, key, layer)
	return dir, err
}

// Put keeps layer, a directory made in a NewTemp directory in the
// store's format (a build step's changes), as layer key, unless the
// store has it already (then layer is removed): it returns the stored
// layer's directory and whether this call stored it. key is sha256:HEX
// of what made the layer (a build step's cache key).
func (s *Store) Put(ctx context.Context, key, layer string) (dir string, made bool, err error) {
	h, err := hexOf(key)
	if err != nil {
		return "", false, err
	}
	tmp := filepath.Dir(layer)
	if filepath.Dir(tmp) != s.dir || filepath.Base(layer) != "layer" {
		return "", false, fmt.Errorf("layer %s is not a NewTemp directory's layer", layer)
	}
	defer os.RemoveAll(tmp) // gone once renamed
	final := filepath.Join(s.dir, h)
	unlock, err := fsutil.Flock(ctx, final+".lock")
	if err != nil {
		return "", false, err
	}
	defer unlock()
	if _, err := os.Lstat(final); err == nil {
		return filepath.Join(final, "layer"), false, nil
	}
	if err := syncDir(tmp); err != nil {
		return "", false, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return "", false, err
	}
	return filepath.Join(final, "layer"), true, nil
}

// Lookup finds path (absolute, or relative to the root) in the merged
// view of layers (topmost first), as overlay resolves it: a whiteout or a
// non-directory in a higher layer hides the lower ones, an opaque
// directory hides what is below it. It returns the layer directory that
// has it and its Lstat there, or found false. No symlink is followed.
func Lookup(layers []string, path string) (layer string, st unix.Stat_t, found bool, err error) {
	var comps []string
	for _, c := range strings.Split(filepath.Clean("/"+path), "/") {
		if c != "" {
			comps = append(comps, c)
		}
	}
	if len(comps) == 0 {
		if len(layers) == 0 {
			return "", st, false, nil
		}
		err := unix.Lstat(layers[0], &st)
		return layers[0], st, err == nil, err
	}
	for _, l := range layers {
		fd, hidden, err := lookupLower(l, comps)
		if err != nil {
			return "", st, false, err
		}
		if fd >= 0 {
			err := unix.Fstat(fd, &st)
			unix.Close(fd)
			return l, st, err == nil, err
		}
		if hidden {
			return "", st, false, nil
		}
	}
	return "", st, false, nil
}
