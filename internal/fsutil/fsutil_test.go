package fsutil

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFlock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	unlock, err := Flock(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	if _, err := Flock(ctx, path); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second lock while held: %v", err)
	}
	unlock()
	unlock2, err := Flock(context.Background(), path)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	unlock2()
}

func TestWriteFileAtomic(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	for _, v := range []string{"one", "two"} {
		if err := WriteFileAtomic(path, []byte(v)); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(path); string(b) != v {
			t.Fatalf("read %q, want %q", b, v)
		}
	}
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Fatal("temporary file left behind")
	}
}

func TestJSONRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.json")
	var v struct{ A int }
	if err := ReadJSON(path, &v); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := WriteJSONAtomic(path, struct{ A int }{7}); err != nil {
		t.Fatal(err)
	}
	if err := ReadJSON(path, &v); err != nil || v.A != 7 {
		t.Fatalf("read back: %+v %v", v, err)
	}
	os.WriteFile(path, []byte("{"), 0o600)
	if err := ReadJSON(path, &v); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("bad JSON: %v", err)
	}
}
