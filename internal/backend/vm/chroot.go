package vm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/fsutil"
)

// QEMU runs chrooted into a directory that holds only what it opens by
// name (qemuRoot): its binary, the libraries it loads, the two firmware
// files a microvm boot reads, TCG's module, /dev/null, and a /proc that shows no process but its
// own (hidepid=invisible, subset=pid) through which it reopens the
// descriptors it is given (/proc/self/fd/N: kernel, initramfs, template
// RAM). No /etc, /home, /tmp, /run, /var, /sys, no other device: a guest that
// escapes into its QEMU sees none of the host's files. The directory is
// built once per QEMU binary in CacheDir (hard links, or copies across
// filesystems) and its /proc stays mounted, since sandboxes outlive the
// daemon; the next daemon reuses it.

// qemuRootLayout changes whenever what buildQEMURoot puts in changes.
const qemuRootLayout = 2

// qemuFirmware is what QEMU reads beside its binary for a microvm with a
// PVH kernel under TCG (Debian builds TCG as a module).
var qemuFirmware = []string{"share/qemu/bios-microvm.bin", "share/qemu/pvh.bin", "lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so"}

// qemuRoot returns the directory QEMU is chrooted into, building it (and
// mounting its /proc) if needed. Under KVM there is none (""): QEMU opens
// /dev/kvm by name.
func (b *Backend) qemuRoot(ctx context.Context) (string, error) {
	if b.accel == "kvm" {
		return "", nil
	}
	b.rootMu.Lock()
	defer b.rootMu.Unlock()
	if b.root != "" {
		return b.root, nil
	}
	bin, err := exec.LookPath(b.cfg.QEMU)
	if err != nil {
		return "", err
	}
	if bin, err = filepath.Abs(bin); err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(bin)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(b.cfg.CacheDir, "qemu-root-"+hashStrings(strconv.Itoa(qemuRootLayout), bin, real, strconv.FormatInt(fi.Size(), 10), fi.ModTime().String()))
	if err := os.MkdirAll(b.cfg.CacheDir, 0o700); err != nil {
		return "", err
	}
	unlock, err := fsutil.Flock(ctx, dir+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if !exists(filepath.Join(dir, "ok")) {
		tmp := dir + ".tmp"
		os.RemoveAll(tmp)
		if err := buildQEMURoot(ctx, tmp, bin); err != nil {
			os.RemoveAll(tmp)
			return "", fmt.Errorf("QEMU's root directory: %w", err)
		}
		if err := os.Rename(tmp, dir); err != nil {
			return "", err
		}
	}
	if err := mountProc(filepath.Join(dir, "proc")); err != nil {
		return "", fmt.Errorf("QEMU's root directory: %w", err)
	}
	b.root = dir
	return dir, nil
}

// buildQEMURoot makes dir with QEMU's binary, its libraries (as ldd
// finds them), its firmware and an empty proc.
func buildQEMURoot(ctx context.Context, dir, bin string) error {
	files := []string{bin}
	out, err := exec.CommandContext(ctx, "ldd", bin).Output()
	if err != nil {
		return fmt.Errorf("ldd %s: %w", bin, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[1] == "=>" && filepath.IsAbs(f[2]):
			files = append(files, f[2])
		case len(f) >= 1 && filepath.IsAbs(f[0]):
			files = append(files, f[0])
		}
	}
	for _, fw := range qemuFirmware {
		files = append(files, filepath.Join(filepath.Dir(filepath.Dir(bin)), fw))
	}
	for _, f := range files {
		if err := placeFile(dir, f); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "proc"), 0o555); err != nil {
		return err
	}
	// QEMU's block layer probes for OFD locks on /dev/null.
	if err := os.MkdirAll(filepath.Join(dir, "dev"), 0o755); err != nil {
		return err
	}
	if err := unix.Mknod(filepath.Join(dir, "dev", "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		return fmt.Errorf("mknod dev/null: %w", err)
	}
	if err := os.Chmod(filepath.Join(dir, "dev", "null"), 0o666); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "ok"), nil, 0o400)
}

// placeFile puts the file path names (its symlinks followed) at the same
// path under dir: a hard link, or a copy across filesystems.
func placeFile(dir, path string) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	dst := filepath.Join(dir, path)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.Link(real, dst); err == nil {
		return nil
	}
	fi, err := os.Stat(real)
	if err != nil {
		return err
	}
	if err := copyFile(real, dst); err != nil {
		return err
	}
	return os.Chmod(dst, fi.Mode().Perm()&0o555)
}

// mountProc mounts a procfs at dir that shows each process only itself
// (hidepid=invisible) and no system files (subset=pid), unless one is
// mounted there already.
func mountProc(dir string) error {
	if mounted, err := fsutil.IsMountPoint(dir); err != nil || mounted {
		return err // mounted already, or an error
	}
	if err := unix.Mount("proc", dir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "hidepid=invisible,subset=pid"); err != nil {
		return fmt.Errorf("mount proc at %s: %w", dir, err)
	}
	return nil
}
