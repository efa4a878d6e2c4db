//go:build linux

// Package guestinit is the first thing nook-agent does as PID 1 of a vm
// sandbox, while it still runs from the initramfs: load the kernel modules
// the initramfs carries (Debian's kernel has virtio and ext4 as modules),
// mount the sandbox's root disk, move into it, and set up the mounts a
// Linux userland expects. Then the agent serves over virtio-serial, or,
// in a vm that boots systemd (systemd.go), hands PID 1 to systemd, which
// starts the agent again as a unit that serves.
package guestinit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Marker is a file only the initramfs has: nook-agent started as PID 1
// with it present is a vm guest's init.
const Marker = "/nook-initramfs"

// ModulesDir holds the modules and their load order ("order", one file
// name per line) inside the initramfs.
const ModulesDir = "/modules"

// PortName is the virtio-serial port the daemon talks to the agent on.
const PortName = "nook.agent"

// IsGuest reports whether this process is a vm guest's init.
func IsGuest() bool {
	if os.Getpid() != 1 {
		return false
	}
	_, err := os.Stat(Marker)
	return err == nil
}

// UpMarker is what a guest booted with UpAndOffArg on its kernel command
// line prints on its console as soon as its init runs, before powering
// off: the benchmark's "bare boot to userspace" baseline.
const (
	UpMarker    = "nook-guest-userspace-up"
	UpAndOffArg = "nook.up_and_off"
)

// UpAndOff prints UpMarker and powers the guest off if the kernel command
// line asks for it; otherwise it returns.
func UpAndOff() {
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		os.MkdirAll("/proc", 0o755)
		if unix.Mount("proc", "/proc", "proc", 0, "") == nil {
			cmdline, _ = os.ReadFile("/proc/cmdline")
			unix.Unmount("/proc", 0)
		}
	}
	for _, f := range strings.Fields(string(cmdline)) {
		if f == UpAndOffArg {
			fmt.Fprintln(os.Stderr, UpMarker)
			unix.Sync()
			unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		}
	}
}

// Boot prepares the guest and switches to its root disk. Errors are fatal
// for the guest; the daemon sees them on the console log.
func Boot() error {
	for _, m := range []struct{ src, dst, fstype string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, unix.MS_NOSUID, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if err := loadModules(); err != nil {
		return err
	}
	root, err := findByLabel(RootLabel, 10*time.Second)
	if err != nil {
		return fmt.Errorf("root disk: %w", err)
	}
	if err := os.MkdirAll("/newroot", 0o755); err != nil {
		return err
	}
	if err := unix.Mount(root, "/newroot", "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount root disk %s: %w", root, err)
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		target := "/newroot" + d
		os.MkdirAll(target, 0o755)
		if err := unix.Mount(d, target, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", d, err)
		}
	}
	// Free the initramfs (it is RAM) before leaving it; /newroot is a
	// different filesystem and is left alone.
	entries, _ := os.ReadDir("/")
	for _, e := range entries {
		if e.Name() != "newroot" {
			os.RemoveAll("/" + e.Name())
		}
	}
	if err := unix.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := mountModules(); err != nil {
		return err
	}
	return setupRoot()
}

// The disks' ext4 labels: the guest tells them apart by label, not by the
// order the kernel found them in.
const (
	RootLabel    = "nookroot"
	ModulesLabel = "nookmods"
)

// mountModules mounts the kernel's modules disk (read-only, shared by
// every vm) at /lib/modules/RELEASE, so that modprobe works in the guest
// (dockerd needs overlay, bridge and netfilter modules).
func mountModules() error {
	dev, err := findByLabel(ModulesLabel, 0)
	if err != nil {
		return nil // a guest without the modules disk
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return err
	}
	dir := "/lib/modules/" + unix.ByteSliceToString(uts.Release[:])
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, dir, "ext4", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, "noload"); err != nil {
		return fmt.Errorf("mount kernel modules: %w", err)
	}
	return nil
}

// findByLabel finds the virtio disk whose ext4 volume label is label,
// waiting up to timeout for it to appear.
func findByLabel(label string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		devs, _ := filepath.Glob("/dev/vd[a-z]")
		for _, d := range devs {
			if ext4Label(d) == label {
				return d, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no disk labelled %s (found %v)", label, devs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ext4Label reads the volume name from an ext4 superblock (at byte 1024;
// the name at 0x78, 16 bytes), "" if the device has none.
func ext4Label(dev string) string {
	f, err := os.Open(dev)
	if err != nil {
		return ""
	}
	defer f.Close()
	sb := make([]byte, 0x88)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return ""
	}
	if sb[0x38] != 0x53 || sb[0x39] != 0xef { // s_magic
		return ""
	}
	return unix.ByteSliceToString(sb[0x78:0x88])
}

// setupRoot mounts what a Debian userland (and dockerd) expects.
func setupRoot() error {
	for _, m := range []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if _, err := os.Lstat("/dev/ptmx"); err == nil {
		os.Remove("/dev/ptmx")
	}
	if err := os.Symlink("pts/ptmx", "/dev/ptmx"); err != nil {
		return err
	}
	for _, l := range [][2]string{{"/proc/self/fd", "/dev/fd"}, {"/proc/self/fd/0", "/dev/stdin"}, {"/proc/self/fd/1", "/dev/stdout"}, {"/proc/self/fd/2", "/dev/stderr"}} {
		os.Symlink(l[0], l[1])
	}
	return linkUp("lo")
}

// linkUp sets an interface up.
func linkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("%s up: %w", name, err)
	}
	return nil
}

// loadModules loads the initramfs's modules in order, with the parameters
// the kernel command line gives them (module.param=value: modprobe's job,
// which the kernel leaves to user space for loadable modules).
func loadModules() error {
	order, err := os.ReadFile(filepath.Join(ModulesDir, "order"))
	if err != nil {
		return fmt.Errorf("module list: %w", err)
	}
	cmdline, _ := os.ReadFile("/proc/cmdline")
	for _, file := range strings.Fields(string(order)) {
		name := strings.ReplaceAll(strings.TrimSuffix(file, ".ko"), "-", "_")
		if err := loadModule(filepath.Join(ModulesDir, file), ModuleParams(string(cmdline), name)); err != nil {
			return err
		}
	}
	return nil
}

func loadModule(path, params string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), params, 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", filepath.Base(path), err)
	}
	return nil
}

// ModuleParams returns the parameters a kernel command line gives a module
// ("virtio_mmio.device=512@0xfeb00e00:12 x=1" -> "device=512@0xfeb00e00:12").
func ModuleParams(cmdline, module string) string {
	var out []string
	for _, f := range strings.Fields(cmdline) {
		mod, param, ok := strings.Cut(f, ".")
		if ok && strings.ReplaceAll(mod, "-", "_") == module && param != "" && !strings.HasPrefix(param, "=") {
			out = append(out, param)
		}
	}
	return strings.Join(out, " ")
}

// FindPort returns the device of the virtio-serial port with the given name.
func FindPort(name string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		ports, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, p := range ports {
			b, err := os.ReadFile(p)
			if err == nil && strings.TrimSpace(string(b)) == name {
				dev := "/dev/" + filepath.Base(filepath.Dir(p))
				if _, err := os.Stat(dev); err == nil {
					return dev, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("virtio-serial port %q did not appear within %s", name, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
