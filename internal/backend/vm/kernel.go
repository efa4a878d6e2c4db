package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/nookhq/nook/internal/agent/guestinit"
	"github.com/nookhq/nook/internal/fsutil"
)

// guestModules are the modules the initramfs loads (with their
// dependencies): Debian's kernel builds virtio, its block, console, net
// and rng drivers, ext4 and the crc32c it needs, and FUSE (the vm's
// volumes) as modules.
var guestModules = []string{"virtio_mmio", "virtio_blk", "virtio_console", "virtio_net", "virtio_rng", "crc32c_generic", "ext4", "fuse"}

// initramfsLayout changes whenever what buildInitramfs writes does, so
// that caches of older initramfs images are not reused.
const initramfsLayout = 3

// Kernel is a guest kernel ready to boot: the uncompressed vmlinux (PVH
// boot) and an initramfs with nook-agent as /init and the modules it loads.
type Kernel struct {
	Release string // e.g. 6.1.0-56-amd64
	Vmlinux string
	Initrd  string
	Modules string // ext4 image of lib/modules/RELEASE, mounted read-only by every guest
	// Hash identifies the kernel, the initramfs and the agent in it: a
	// memory snapshot is only valid for the exact same guest.
	Hash string
}

// kernelSource is an unpacked Debian linux-image package (or the host's
// root): boot/vmlinuz-R and lib/modules/R.
type kernelSource struct {
	root, release, vmlinuz string
}

// findKernelSource looks for a Debian kernel under each root in order.
func findKernelSource(roots ...string) (*kernelSource, error) {
	for _, root := range roots {
		if root == "" {
			continue
		}
		matches, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
		sort.Sort(sort.Reverse(sort.StringSlice(matches)))
		for _, vmlinuz := range matches {
			release := strings.TrimPrefix(filepath.Base(vmlinuz), "vmlinuz-")
			if fi, err := os.Stat(filepath.Join(root, "lib", "modules", release, "kernel")); err == nil && fi.IsDir() {
				return &kernelSource{root: root, release: release, vmlinuz: vmlinuz}, nil
			}
		}
	}
	return nil, errors.New("no guest kernel found")
}

// fetchKernel downloads Debian's linux-image-amd64 package through apt and
// unpacks it (without installing it) under dir.
func fetchKernel(ctx context.Context, dir string) error {
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", "linux-image-amd64").Output()
	if err != nil || !bytes.Contains(out, []byte("Depends: linux-image-")) {
		// No package lists yet (a fresh machine): fetch them once.
		if uout, uerr := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return fmt.Errorf("apt-get update: %w: %s", uerr, lastLines(string(uout), 3))
		}
		if out, err = exec.CommandContext(ctx, "apt-cache", "depends", "linux-image-amd64").Output(); err != nil {
			return fmt.Errorf("apt-cache depends linux-image-amd64: %w", err)
		}
	}
	var pkg string
	for _, l := range strings.Split(string(out), "\n") {
		if p, ok := strings.CutPrefix(strings.TrimSpace(l), "Depends: "); ok && strings.HasPrefix(p, "linux-image-") {
			pkg = p
			break
		}
	}
	if pkg == "" {
		return fmt.Errorf("apt-cache depends linux-image-amd64 names no kernel package")
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".fetch-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, "apt-get", "download", "-q", pkg)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s: %w: %s", pkg, err, lastLines(string(out), 3))
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download %s left %d packages", pkg, len(debs))
	}
	unpacked := filepath.Join(tmp, "root")
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], unpacked).CombinedOutput(); err != nil {
		return fmt.Errorf("dpkg-deb -x: %w: %s", err, out)
	}
	return os.Rename(unpacked, dir)
}

// extractVmlinux writes the uncompressed kernel inside a bzImage: Debian
// compresses it with xz, and the ELF it holds has the PVH entry note.
func extractVmlinux(ctx context.Context, vmlinuz, dst string) error {
	img, err := os.ReadFile(vmlinuz)
	if err != nil {
		return err
	}
	off := bytes.Index(img, []byte("\xfd7zXZ\x00"))
	if off < 0 {
		return fmt.Errorf("%s: no xz payload (only xz-compressed Debian kernels are supported)", vmlinuz)
	}
	tmp := dst + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	cmd := exec.CommandContext(ctx, "xz", "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(img[off:])
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	f.Close()
	if err != nil {
		return fmt.Errorf("decompress %s: %w: %s", vmlinuz, err, stderr.String())
	}
	e, err := elf.Open(tmp)
	if err != nil {
		return fmt.Errorf("%s: payload is not an ELF kernel: %w", vmlinuz, err)
	}
	e.Close()
	return os.Rename(tmp, dst)
}

// moduleIndex maps module names (with underscores) to their files.
func moduleIndex(modDir string) (map[string]string, error) {
	idx := map[string]string{}
	err := filepath.WalkDir(filepath.Join(modDir, "kernel"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".ko") {
			idx[strings.ReplaceAll(strings.TrimSuffix(d.Name(), ".ko"), "-", "_")] = p
		}
		return nil
	})
	return idx, err
}

// modinfoDepends reads the "depends=" entry of a module's .modinfo section.
func modinfoDepends(path string) ([]string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("%s: no .modinfo", path)
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			var deps []string
			for _, d := range strings.Split(string(v), ",") {
				if d != "" {
					deps = append(deps, strings.ReplaceAll(d, "-", "_"))
				}
			}
			return deps, nil
		}
	}
	return nil, nil
}

// moduleOrder returns the files of the wanted modules and everything they
// depend on, dependencies first.
func moduleOrder(modDir string, want []string) ([]string, error) {
	idx, err := moduleIndex(modDir)
	if err != nil {
		return nil, err
	}
	var order []string
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name string) error
	visit = func(name string) error {
		switch state[name] {
		case 1:
			return fmt.Errorf("module dependency cycle at %s", name)
		case 2:
			return nil
		}
		path, ok := idx[name]
		if !ok {
			return fmt.Errorf("module %s not found under %s (built into the kernel?)", name, modDir)
		}
		state[name] = 1
		deps, err := modinfoDepends(path)
		if err != nil {
			return err
		}
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, path)
		return nil
	}
	for _, w := range want {
		if err := visit(w); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// buildInitramfs writes a newc cpio archive: /init (nook-agent), the
// initramfs marker, /dev/console, and the modules with their load order.
func buildInitramfs(dst, agentBinary string, modules []string) error {
	tmp := dst + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	w := newCpioWriter(f)
	for _, d := range []string{"dev", "proc", "sys", "newroot", "modules"} {
		w.dir(d)
	}
	w.charDev("dev/console", 0o600, 5, 1)
	agent, err := os.ReadFile(agentBinary)
	if err != nil {
		f.Close()
		return fmt.Errorf("nook-agent: %w", err)
	}
	w.file("nook-agent", 0o755, agent)
	w.file(strings.TrimPrefix(guestinit.Marker, "/"), 0o644, nil)
	var names []string
	for _, m := range modules {
		b, err := os.ReadFile(m)
		if err != nil {
			f.Close()
			return err
		}
		w.file("modules/"+filepath.Base(m), 0o644, b)
		names = append(names, filepath.Base(m))
	}
	w.file("modules/order", 0o644, []byte(strings.Join(names, "\n")+"\n"))
	if err := w.close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// FetchKernel makes sure the guest kernel of Debian's linux-image-amd64
// is in cacheDir (a vm backend's CacheDir), downloading it if it is not:
// for a caller whose daemon runs where Debian's mirror is out of reach
// (in a network namespace of its own, as the density benchmark's).
func FetchKernel(ctx context.Context, cacheDir string) error {
	dir := filepath.Join(cacheDir, "kernel")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	unlock, err := fsutil.Flock(ctx, filepath.Join(dir, ".lock"))
	if err != nil {
		return err
	}
	defer unlock()
	_, err = fetchedKernel(ctx, dir)
	return err
}

// fetchedKernel is the kernel downloaded into dir (the kernel cache,
// whose lock the caller holds), downloaded now if it is not there.
func fetchedKernel(ctx context.Context, dir string) (*kernelSource, error) {
	fetched := filepath.Join(dir, "linux-image")
	if src, err := findKernelSource(fetched); err == nil {
		return src, nil
	}
	if err := fetchKernel(ctx, fetched); err != nil {
		return nil, fmt.Errorf("no guest kernel, and fetching Debian's linux-image-amd64 failed: %w", err)
	}
	src, err := findKernelSource(fetched)
	if err != nil {
		return nil, fmt.Errorf("the fetched linux-image package has no kernel: %w", err)
	}
	return src, nil
}

// prepareKernel finds (or downloads) the guest kernel and builds what
// booting it needs under cacheDir, reusing an earlier build of the same
// kernel and agent.
func prepareKernel(ctx context.Context, cacheDir, kernelRoot, agentBinary string) (*Kernel, error) {
	// Daemons and test binaries share the cache: one prepares at a time.
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return nil, err
	}
	unlock, err := fsutil.Flock(ctx, filepath.Join(cacheDir, ".lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()
	var src *kernelSource
	if kernelRoot != "" { // given: use it or fail
		if src, err = findKernelSource(kernelRoot); err != nil {
			return nil, fmt.Errorf("no Debian kernel (boot/vmlinuz-* with lib/modules) under %s", kernelRoot)
		}
	} else if src, err = fetchedKernel(ctx, cacheDir); err != nil {
		return nil, err
	}
	fileHash := func(p string) ([]byte, error) {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return nil, err
		}
		return h.Sum(nil), nil
	}
	kernelSum, err := fileHash(src.vmlinuz)
	if err != nil {
		return nil, err
	}
	agentSum, err := fileHash(agentBinary)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	h.Write(kernelSum)
	h.Write(agentSum)
	fmt.Fprintln(h, initramfsLayout, guestModules)
	hash := hex.EncodeToString(h.Sum(nil))[:16]
	dir := filepath.Join(cacheDir, src.release+"-"+hash)
	// The modules disk depends on the kernel alone: every agent build of
	// the same kernel shares it.
	modDir := filepath.Join(cacheDir, src.release+"-modules-"+hex.EncodeToString(kernelSum)[:16])
	k := &Kernel{Release: src.release, Vmlinux: filepath.Join(dir, "vmlinux"), Initrd: filepath.Join(dir, "initrd.cpio"),
		Modules: filepath.Join(modDir, "modules.ext4"), Hash: hash}
	if _, err := os.Stat(k.Initrd); err != nil {
		// A kernel that turns out not to boot leaves nothing in the cache.
		if err := buildKernelDir(ctx, src, k, agentBinary); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if _, err := os.Stat(k.Modules); err != nil {
		if err := os.MkdirAll(modDir, 0o700); err != nil {
			return nil, err
		}
		if err := buildModulesImage(ctx, src, k.Modules); err != nil {
			os.RemoveAll(modDir)
			return nil, err
		}
	}
	return k, nil
}

// buildKernelDir extracts a kernel's vmlinux (refusing one without the
// PVH entry point) and writes its initramfs, the last file it makes.
func buildKernelDir(ctx context.Context, src *kernelSource, k *Kernel, agentBinary string) error {
	if err := os.MkdirAll(filepath.Dir(k.Vmlinux), 0o700); err != nil {
		return err
	}
	if err := extractVmlinux(ctx, src.vmlinuz, k.Vmlinux); err != nil {
		return err
	}
	if err := checkPVH(k.Vmlinux); err != nil {
		return err
	}
	mods, err := moduleOrder(filepath.Join(src.root, "lib", "modules", src.release), guestModules)
	if err != nil {
		return err
	}
	return buildInitramfs(k.Initrd, agentBinary, mods)
}

// buildModulesImage makes the read-only disk of the kernel's modules, with
// the modules.dep that modprobe needs (depmod writes it if the package
// came without one, as a downloaded one does).
func buildModulesImage(ctx context.Context, src *kernelSource, dst string) error {
	modDir := filepath.Join(src.root, "lib", "modules", src.release)
	if _, err := os.Stat(filepath.Join(modDir, "modules.dep")); err != nil {
		if out, err := exec.CommandContext(ctx, "depmod", "-b", src.root, src.release).CombinedOutput(); err != nil {
			return fmt.Errorf("depmod (apt-get install kmod): %w: %s", err, lastLines(string(out), 3))
		}
	}
	var size int64
	filepath.WalkDir(modDir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size() + 4096
			}
		}
		return nil
	})
	tmp := dst + ".tmp"
	os.Remove(tmp)
	defer os.Remove(tmp)
	out, err := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-L", guestinit.ModulesLabel, "-O", "^has_journal",
		"-E", "root_owner=0:0", "-d", modDir, tmp, strconv.FormatInt((size*5/4+(64<<20))>>20, 10)+"M").CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4 of the kernel modules: %w: %s", err, bytes.TrimSpace(out))
	}
	if err := os.Chmod(tmp, 0o400); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
