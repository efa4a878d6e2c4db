package template

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/errdefs"
)

// fakeBuild lays out a build as build() would, without running mmdebstrap.
func fakeBuild(t *testing.T, dir, name, id string, current bool) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, name, id, "rootfs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(meta{Name: name, ID: name + "/" + id})
	os.WriteFile(filepath.Join(dir, name, id, "template.json"), b, 0o644)
	if current {
		os.WriteFile(filepath.Join(dir, name, "current"), []byte(id+"\n"), 0o644)
	}
}

func TestGetListRootfs(t *testing.T) {
	dir := t.TempDir()
	s := NewStore(dir, slog.New(slog.DiscardHandler))
	if _, err := s.Get("base"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "nook template build base") {
		t.Fatalf("missing base: %v", err)
	}
	if _, err := s.Get("other"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "can build: base") {
		t.Fatalf("missing other: %v", err)
	}
	fakeBuild(t, dir, "base", "b1", true)
	tpl, err := s.Get("base")
	if err != nil || tpl.ID != "base/b1" {
		t.Fatalf("get: %+v %v", tpl, err)
	}
	if p, err := s.Rootfs("base/b1"); err != nil || p != filepath.Join(dir, "base", "b1", "rootfs") {
		t.Fatalf("rootfs: %s %v", p, err)
	}
	for _, bad := range []string{"base/../../etc", "../x/y", "base", "base/", "/base/b1", "base/b1/../b1"} {
		if _, err := s.Rootfs(bad); err == nil {
			t.Errorf("rootfs(%q) accepted", bad)
		}
	}
	if l, err := s.List(); err != nil || len(l) != 1 {
		t.Fatalf("list: %v %v", l, err)
	}
	if err := CheckBuildable("nosuch"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatal(err)
	}
	if err := CheckBuildable("../base"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatal(err)
	}
}

func TestRemoveAndGC(t *testing.T) {
	dir := t.TempDir()
	s := NewStore(dir, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	fakeBuild(t, dir, "base", "old", false)
	fakeBuild(t, dir, "base", "unused", false)
	fakeBuild(t, dir, "base", "cur", true)
	used := map[string]int{"base/old": 1}
	inUse := func(id string) (int, error) { return used[id], nil }
	if err := s.GC(ctx, "base", inUse); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{"old": true, "unused": false, "cur": true} {
		if _, err := os.Stat(filepath.Join(dir, "base", id)); (err == nil) != want {
			t.Errorf("after gc, build %s present=%v", id, err == nil)
		}
	}
	used["base/cur"] = 2
	if err := s.Remove(ctx, "base", inUse); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "used by 2") {
		t.Fatalf("remove in use: %v", err)
	}
	delete(used, "base/cur")
	if err := s.Remove(ctx, "base", inUse); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("base"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatal("removed template still current")
	}
	// The build a sandbox still uses stays until it is released.
	if _, err := os.Stat(filepath.Join(dir, "base", "old", "rootfs")); err != nil {
		t.Fatal("removed a build in use")
	}
}

// A build of a built-in template whose recipe has changed since (a newer
// nook's dev has systemd) is stale: EnsureBuilt builds it again.
func TestStale(t *testing.T) {
	dev, _ := recipe("dev")
	for _, c := range []struct {
		tpl  api.Template
		want bool
	}{
		{api.Template{Name: "dev", Packages: dev.Packages}, false},
		{api.Template{Name: "dev", Packages: dev.Packages[:len(dev.Packages)-1]}, true},
		{api.Template{Name: "dev", Packages: append(slices.Clone(dev.Packages), "extra")}, true},
		{api.Template{Name: "mine", Packages: []string{"x"}}, false}, // not nook's recipe
	} {
		if got := stale(c.tpl); got != c.want {
			t.Errorf("stale(%s with %d packages) = %v, want %v", c.tpl.Name, len(c.tpl.Packages), got, c.want)
		}
	}
	if !slices.Contains(dev.Packages, "systemd") {
		t.Error("the dev template has no systemd")
	}
}
