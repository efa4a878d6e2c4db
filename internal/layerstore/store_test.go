package layerstore

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"compress/gzip"

	"github.com/nookhq/nook/internal/errdefs"
)

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// blob is a layer of ents stored with compression comp ("gzip", "zstd"
// or ""), with its true digests; chain is its diff ID (a bottom layer).
func blob(t *testing.T, comp string, ents ...ent) (Blob, []byte) {
	t.Helper()
	raw := layerTar(t, ents...)
	var stored bytes.Buffer
	switch comp {
	case "gzip":
		zw := gzip.NewWriter(&stored)
		zw.Write(raw)
		zw.Close()
	case "zstd":
		zw, _ := zstd.NewWriter(&stored)
		zw.Write(raw)
		zw.Close()
	default:
		stored.Write(raw)
	}
	data := stored.Bytes()
	return Blob{Digest: digest(data), DiffID: digest(raw), Chain: digest(raw),
		Open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }}, data
}

// Each compression is unpacked and checked; a second Ensure finds the
// layer there; concurrent Ensures of one layer unpack it once.
func TestEnsure(t *testing.T) {
	requireRoot(t)
	s, err := Open(filepath.Join(t.TempDir(), "layers"))
	if err != nil {
		t.Fatal(err)
	}
	for _, comp := range []string{"gzip", "zstd", ""} {
		b, _ := blob(t, comp, ent{name: "etc/os-release", data: "ID=" + comp + "\n"})
		var wg sync.WaitGroup
		var mu sync.Mutex
		made := 0
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dir, m, err := s.Ensure(context.Background(), b, nil, Options{})
				if err != nil {
					t.Error(err)
					return
				}
				if got, _ := os.ReadFile(filepath.Join(dir, "etc/os-release")); string(got) != "ID="+comp+"\n" {
					t.Errorf("%s: read %q", comp, got)
				}
				mu.Lock()
				if m {
					made++
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
		if made != 1 || !s.Has(b.Chain) {
			t.Errorf("%q: made %d times, has %v", comp, made, s.Has(b.Chain))
		}
	}
}

// A layer whose bytes or tar do not have the digests the image names, or
// that Unpack refuses, leaves nothing behind.
func TestEnsureRefuses(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "layers")
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	good, data := blob(t, "gzip", ent{name: "a", data: "a"})
	flipped := bytes.Clone(data)
	flipped[len(flipped)-5] ^= 0xff // in gzip's trailer: the tar still reads
	for _, c := range []struct {
		name string
		b    Blob
	}{
		{"stored digest", Blob{Digest: digest([]byte("other")), DiffID: good.DiffID, Chain: good.Chain, Open: good.Open}},
		{"diff ID", Blob{Digest: good.Digest, DiffID: digest([]byte("other")), Chain: good.Chain, Open: good.Open}},
		{"corrupt bytes", Blob{Digest: good.Digest, DiffID: good.DiffID, Chain: good.Chain,
			Open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(flipped)), nil }}},
	} {
		if _, _, err := s.Ensure(context.Background(), c.b, nil, Options{}); err == nil {
			t.Errorf("%s: no error", c.name)
		} else if c.name != "corrupt bytes" && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want invalid", c.name, err)
		}
	}
	evil, _ := blob(t, "", ent{name: "../evil", data: "x"})
	if _, _, err := s.Ensure(context.Background(), evil, nil, Options{}); !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.Is(err, ErrUnsafe) {
		t.Errorf("unsafe layer: %v", err)
	}
	if _, _, err := s.Ensure(context.Background(), Blob{Chain: "sha256:../../x"}, nil, Options{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a chain that is not hex: %v", err)
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if filepath.Ext(e.Name()) != ".lock" {
			t.Errorf("left in the store: %s", e.Name())
		}
	}
}

// A Batch's layers are unpacked over the ones before them while those
// are still under their temporary names (a hard link to a file of the
// layer below is copied up from it), named together at Commit, and held
// locked until then; a batch closed before its Commit leaves nothing.
func TestBatch(t *testing.T) {
	requireRoot(t)
	root := filepath.Join(t.TempDir(), "layers")
	s, err := Open(root)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	bottom, _ := blob(t, "gzip", ent{name: "bin/tool", data: "tool"})
	top, _ := blob(t, "", ent{name: "bin/alias", typ: tar.TypeLink, link: "bin/tool"})
	top.Chain = digest([]byte(bottom.Chain + " " + top.DiffID))

	bt := s.NewBatch()
	low, made, err := bt.Ensure(ctx, bottom, nil, Options{})
	if err != nil || !made {
		t.Fatalf("bottom: made %v, %v", made, err)
	}
	if s.Has(bottom.Chain) {
		t.Error("the bottom layer is named before Commit")
	}
	// Another Ensure of it waits for the batch.
	locked, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if _, _, err := s.Ensure(locked, bottom, nil, Options{}); err == nil {
		t.Error("a layer in a batch was ensured beside it")
	}
	cancel()
	high, made, err := bt.Ensure(ctx, top, []string{low}, Options{})
	if err != nil || !made {
		t.Fatalf("top: made %v, %v", made, err)
	}
	if err := bt.Commit(); err != nil {
		t.Fatal(err)
	}
	bt.Close()
	for _, c := range []struct{ dir, chain, file string }{{low, bottom.Chain, "bin/tool"}, {high, top.Chain, "bin/alias"}} {
		want, _ := s.Path(c.chain)
		if got := bt.Final(c.dir); got != want {
			t.Errorf("Final(%s) = %s, want %s", c.dir, got, want)
		}
		if b, err := os.ReadFile(filepath.Join(want, c.file)); err != nil || string(b) != "tool" {
			t.Errorf("%s: %q, %v", c.file, b, err)
		}
	}
	if _, made, err := s.Ensure(ctx, bottom, nil, Options{}); err != nil || made {
		t.Errorf("after Commit: made %v, %v", made, err)
	}

	// Closed without a Commit: nothing named, nothing left, unlocked.
	other, _ := blob(t, "", ent{name: "other", data: "x"})
	bt = s.NewBatch()
	if _, _, err := bt.Ensure(ctx, other, nil, Options{}); err != nil {
		t.Fatal(err)
	}
	bt.Close()
	if s.Has(other.Chain) {
		t.Error("a layer of a batch closed without Commit is named")
	}
	if left, _ := filepath.Glob(filepath.Join(root, ".tmp-*")); len(left) > 0 {
		t.Errorf("left in the store: %v", left)
	}
	if _, made, err := s.Ensure(ctx, other, nil, Options{}); err != nil || !made {
		t.Errorf("after Close: made %v, %v", made, err)
	}
}
