package vm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core/conformance"
)

// fakeKernelTemplate makes a template build (its ID and root filesystem)
// from the base template with a copy of the daemon's kernel package in
// it, its vmlinuz changed by trailing bytes (so that its hash, and every
// cache of it, is its own), or replaced by vmlinuz if that is not nil.
func fakeKernelTemplate(t *testing.T, b *Backend, baseID string, vmlinuz []byte) (id, rootfs, release string) {
	t.Helper()
	if _, err := b.ensureKernel(context.Background()); err != nil {
		t.Fatal(err)
	}
	src, err := findKernelSource(filepath.Join(b.cfg.CacheDir, "kernel", "linux-image"))
	if err != nil {
		t.Skipf("no unpacked kernel package in the cache to copy: %v", err)
	}
	base, err := b.cfg.TemplateRootfs(baseID)
	if err != nil {
		t.Fatal(err)
	}
	rnd := make([]byte, 4)
	rand.Read(rnd)
	id = "tkern/" + hex.EncodeToString(rnd)
	rootfs = filepath.Join(t.TempDir(), "rootfs")
	// Hard links: the copy's new files go into new directories, nothing
	// of the base template changes.
	if out, err := exec.Command("cp", "-al", base, rootfs).CombinedOutput(); err != nil {
		t.Fatalf("cp -al: %v: %s", err, out)
	}
	mods := filepath.Join(rootfs, "usr", "lib", "modules")
	os.MkdirAll(mods, 0o755)
	if out, err := exec.Command("cp", "-al", filepath.Join(src.root, "lib", "modules", src.release), mods).CombinedOutput(); err != nil {
		t.Fatalf("cp -al modules: %v: %s", err, out)
	}
	if vmlinuz == nil {
		if vmlinuz, err = os.ReadFile(src.vmlinuz); err != nil {
			t.Fatal(err)
		}
		vmlinuz = append(vmlinuz, rnd...)
	}
	os.MkdirAll(filepath.Join(rootfs, "boot"), 0o755)
	if err := os.WriteFile(filepath.Join(rootfs, "boot", "vmlinuz-"+src.release), vmlinuz, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.RemoveAll(filepath.Join(b.cfg.CacheDir, "templates", id))
		os.RemoveAll(filepath.Join(b.cfg.CacheDir, "templates", "tkern"))
		staged := filepath.Join(b.cfg.CacheDir, "kernel", "templates", strings.ReplaceAll(id, "/", "_"))
		os.RemoveAll(staged)
		os.Remove(staged + ".lock")
		if k := b.tkernels[id]; k != nil {
			os.RemoveAll(filepath.Dir(k.Vmlinux))
			os.RemoveAll(filepath.Dir(k.Modules))
		}
		os.Remove(filepath.Dir(staged)) // if no other template's kernel is staged
	})
	orig := b.cfg.TemplateRootfs
	b.cfg.TemplateRootfs = func(tid string) (string, error) {
		if tid == id {
			return rootfs, nil
		}
		return orig(tid)
	}
	return id, rootfs, src.release
}

// TestTemplateKernel: a template that carries its own kernel boots it
// (from its template snapshot, and cold on a start), inspect says so; a
// kernel nook cannot boot is a clear error on create; a template's
// symlinks never have the daemon read a kernel from outside it.
func TestTemplateKernel(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	ctx := context.Background()
	id, rootfs, release := fakeKernelTemplate(t, b, h.TemplateID, nil)
	sb := conformance.NewSandbox("vm-tk", id)
	if err := b.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	s := conformance.Adopt(t, h, sb)
	if got := s.Sh(t, "uname -r"); got != release+"\n" {
		t.Fatalf("uname -r: %q", got)
	}
	var v api.Sandbox
	b.Describe(sb, &v)
	own, _ := b.ensureKernel(ctx)
	st, _ := decodeState(sb)
	if v.GuestKernelFrom != "template" || v.GuestKernel != release || st.KernelHash == own.Hash || st.KernelTemplate != id {
		t.Fatalf("inspect: kernel %q from %q; state %+v (the daemon's kernel %s)", v.GuestKernel, v.GuestKernelFrom, st, own.Hash)
	}
	// A start boots it cold, with the template's kernel again.
	if err := b.Stop(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if st2, _ := decodeState(sb); st2.KernelHash != st.KernelHash {
		t.Fatalf("after a start the vm boots kernel %s, not the template's %s", st2.KernelHash, st.KernelHash)
	}
	if got := s.Sh(t, "uname -r"); got != release+"\n" {
		t.Fatalf("uname -r after a start: %q", got)
	}

	// Not a kernel: refused with the reason, nothing left.
	badID, _, _ := fakeKernelTemplate(t, b, h.TemplateID, []byte("MZ not a kernel at all"))
	bad := conformance.NewSandbox("vm-badk", badID)
	if err := b.Create(ctx, bad); err == nil || !strings.Contains(err.Error(), "carries a kernel nook cannot boot") {
		t.Fatalf("create from a template with a broken kernel: %v", err)
	}
	if leaks := h.Leaks(bad.ID); len(leaks) > 0 {
		t.Fatalf("failed create left %v", leaks)
	}

	// A vmlinuz that is a symlink (to a host file) is not a kernel of the
	// template's: nothing is read through it.
	vmlinuz := filepath.Join(rootfs, "boot", "vmlinuz-"+release)
	os.Remove(vmlinuz)
	if err := os.Symlink("/etc/shadow", vmlinuz); err != nil {
		t.Fatal(err)
	}
	staged := filepath.Join(t.TempDir(), "staged")
	if ok, err := stageTemplateKernel(ctx, rootfs, staged); ok || err != nil {
		t.Fatalf("a symlinked vmlinuz was taken as the template's kernel: %v %v", ok, err)
	}
	// A modules tree that leads outside the root filesystem is refused.
	os.Remove(vmlinuz)
	os.WriteFile(vmlinuz, []byte("x"), 0o644)
	os.RemoveAll(filepath.Join(rootfs, "usr", "lib", "modules"))
	os.Symlink("/usr/lib/modules", filepath.Join(rootfs, "usr", "lib", "modules"))
	if ok, err := stageTemplateKernel(ctx, rootfs, staged); ok && err == nil {
		t.Fatal("a modules tree outside the template was copied")
	}
}
