package vm

import (
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/fsutil"
)

// A template may carry its own guest kernel: a Debian-style
// boot/vmlinuz-RELEASE with lib/modules/RELEASE in its root filesystem
// (a template that installed linux-image-amd64). Its vms boot that kernel
// instead of the daemon's. The kernel and its modules are copied out of
// the template once (stageTemplateKernel, through an os.Root: no symlink
// in the template leads the daemon outside it) and prepared like the
// daemon's own (prepareKernel); a kernel nook cannot boot is a clear
// error on create.

// kernelFor returns the kernel a template's vms boot: the template's own
// (own true), or the daemon's.
func (b *Backend) kernelFor(ctx context.Context, templateID string) (k *Kernel, own bool, err error) {
	if templateID == "" || b.cfg.TemplateRootfs == nil {
		k, err = b.ensureKernel(ctx)
		return k, false, err
	}
	b.kmu.Lock()
	k, known := b.tkernels[templateID]
	kerr := b.tkernelErr[templateID]
	b.kmu.Unlock()
	if kerr != nil {
		return nil, false, kerr
	}
	if known && k == nil {
		k, err = b.ensureKernel(ctx)
		return k, false, err
	}
	if k != nil {
		return k, true, nil
	}
	rootfs, err := b.cfg.TemplateRootfs(templateID)
	if err != nil {
		return nil, false, err
	}
	staged := filepath.Join(b.cfg.CacheDir, "kernel", "templates", strings.ReplaceAll(templateID, "/", "_"))
	ok, err := stageTemplateKernel(ctx, rootfs, staged)
	if err != nil {
		return nil, false, errdefs.Precondition("template %s's own kernel: %v", templateID, err)
	}
	if !ok {
		b.kmu.Lock()
		b.tkernels[templateID] = nil
		b.kmu.Unlock()
		k, err = b.ensureKernel(ctx)
		return k, false, err
	}
	k, err = prepareKernel(ctx, filepath.Join(b.cfg.CacheDir, "kernel"), staged, b.cfg.AgentBinary)
	if err == nil {
		err = publicKernel(k)
	}
	if err != nil {
		os.RemoveAll(staged)
		err = errdefs.Precondition("template %s carries a kernel nook cannot boot: %v", templateID, err)
		b.kmu.Lock()
		b.tkernelErr[templateID] = err
		b.kmu.Unlock()
		return nil, false, err
	}
	b.kmu.Lock()
	b.tkernels[templateID] = k
	b.kmu.Unlock()
	return k, true, nil
}

// stateKernel is the kernel a vm's record says it boots.
func (b *Backend) stateKernel(ctx context.Context, st state) (*Kernel, error) {
	k, _, err := b.kernelFor(ctx, st.KernelTemplate)
	return k, err
}

// publicKernel makes a kernel's files world-readable: QEMU, unprivileged,
// reopens them through the descriptors it is given (Debian's kernel,
// nook's agent: nothing secret).
func publicKernel(k *Kernel) error {
	for _, f := range []string{k.Vmlinux, k.Initrd} {
		if err := os.Chmod(f, 0o444); err != nil {
			return err
		}
	}
	return nil
}

// stageTemplateKernel copies the newest boot/vmlinuz-R of a root
// filesystem, with lib/modules/R, into dst (once: dst/.ok marks a
// finished copy). ok is false if the root filesystem has no kernel.
// Only regular files and directories are copied; the modules tree's
// symlinks (build, source) are left out.
func stageTemplateKernel(ctx context.Context, rootfs, dst string) (ok bool, err error) {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return false, err
	}
	defer root.Close()
	entries, err := fs.ReadDir(root.FS(), "boot")
	if err != nil {
		return false, nil // no /boot: no kernel
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "vmlinuz-") && e.Type().IsRegular() {
			names = append(names, e.Name())
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(names)))
	release := ""
	for _, n := range names {
		r := strings.TrimPrefix(n, "vmlinuz-")
		if !releaseRE.MatchString(r) {
			continue
		}
		if fi, err := root.Stat(filepath.Join("lib", "modules", r, "kernel")); err == nil && fi.IsDir() {
			release = r
			break
		}
	}
	if release == "" {
		return false, nil
	}
	if _, err := os.Stat(filepath.Join(dst, ".ok")); err == nil {
		return true, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return false, err
	}
	unlock, err := fsutil.Flock(ctx, dst+".lock")
	if err != nil {
		return false, err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(dst, ".ok")); err == nil {
		return true, nil
	}
	tmp := dst + ".tmp"
	os.RemoveAll(tmp)
	defer os.RemoveAll(tmp)
	if err := copyFromRoot(root, filepath.Join("boot", "vmlinuz-"+release), tmp); err != nil {
		return false, err
	}
	if err := copyFromRoot(root, filepath.Join("lib", "modules", release), tmp); err != nil {
		return false, err
	}
	if err := os.WriteFile(filepath.Join(tmp, ".ok"), nil, 0o600); err != nil {
		return false, err
	}
	os.RemoveAll(dst)
	return true, os.Rename(tmp, dst)
}

// copyFromRoot copies the file or tree at rel inside root to the same
// relative path under dst: regular files and directories only.
func copyFromRoot(root *os.Root, rel, dst string) error {
	return fs.WalkDir(root.FS(), rel, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		target := filepath.Join(dst, p)
		switch {
		case d.IsDir():
			return os.MkdirAll(target, 0o755)
		case !d.Type().IsRegular():
			return nil
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		src, err := root.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, src); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}

// checkPVH fails unless an uncompressed kernel has the PVH entry point
// (the Xen ELF note XEN_ELFNOTE_PHYS32_ENTRY): nook boots guests through
// PVH, which Debian's x86-64 kernels support.
func checkPVH(vmlinux string) error {
	f, err := elf.Open(vmlinux)
	if err != nil {
		return err
	}
	defer f.Close()
	const phys32Entry = 18
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(p.Open(), 1<<20))
		if err != nil {
			return err
		}
		for len(b) >= 12 {
			namesz, descsz, typ := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint32(b[8:])
			name := align4(uint64(namesz))
			desc := align4(uint64(descsz))
			if uint64(len(b)) < 12+name+desc {
				break
			}
			if typ == phys32Entry && strings.TrimRight(string(b[12:12+uint64(namesz)]), "\x00") == "Xen" {
				return nil
			}
			b = b[12+name+desc:]
		}
	}
	return errors.New("the kernel has no PVH entry point (XEN_ELFNOTE_PHYS32_ENTRY): nook boots x86-64 kernels built with CONFIG_PVH, as Debian's are")
}

func align4(n uint64) uint64 { return (n + 3) &^ 3 }

// releaseRE is a kernel release as a file name may carry it (no "..",
// no "/").
var releaseRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+~-]*$`)
