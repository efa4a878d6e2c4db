package container

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// A file capability the sandbox's bounding set lacks makes its file
// unexecutable there: the kernel refuses the exec (EPERM) rather than run
// a program without the capabilities it was marked to need. Debian marks
// /usr/bin/ping cap_net_raw=ep, and sandboxes have no CAP_NET_RAW (see
// defaultCaps). So the backend lists, once per template build, the files
// marked with capabilities a sandbox cannot have, and removes the mark in
// each sandbox's overlay when it starts (a copy-up of those few files into
// its upper directory; the template is never written). ping then runs
// without privilege and uses an unprivileged ICMP socket
// (net.ipv4.ping_group_range).

const xattrCaps = "security.capability"

// capNumbers are the kernel's numbers of the capabilities defaultCaps
// may name (Docker's default set).
var capNumbers = map[string]uint{
	"CAP_NET_RAW": unix.CAP_NET_RAW, "CAP_MKNOD": unix.CAP_MKNOD, "CAP_AUDIT_WRITE": unix.CAP_AUDIT_WRITE, "CAP_SETFCAP": unix.CAP_SETFCAP,
	"CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE, "CAP_FOWNER": unix.CAP_FOWNER,
	"CAP_FSETID": unix.CAP_FSETID, "CAP_KILL": unix.CAP_KILL, "CAP_SETGID": unix.CAP_SETGID,
	"CAP_SETUID": unix.CAP_SETUID, "CAP_SETPCAP": unix.CAP_SETPCAP, "CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE,
	"CAP_SYS_CHROOT": unix.CAP_SYS_CHROOT,
}

// bounding is defaultCaps as a bit mask.
var bounding = boundingMask()

func boundingMask() uint64 {
	var m uint64
	for _, c := range defaultCaps {
		n, ok := capNumbers[c]
		if !ok {
			panic("capNumbers lacks " + c)
		}
		m |= 1 << n
	}
	return m
}

// fileCapsExcess parses a security.capability value (struct
// vfs_cap_data, revisions 1 to 3) and returns the permitted capabilities
// it grants outside bounding. A value it cannot parse counts as excess
// (the kernel refuses it too).
func fileCapsExcess(v []byte, bounding uint64) (uint64, error) {
	if len(v) < 4 {
		return ^bounding, fmt.Errorf("file capabilities of %d bytes", len(v))
	}
	magic := binary.LittleEndian.Uint32(v)
	var permitted uint64
	switch rev, n := magic&0xff000000, len(v); {
	case rev == 0x01000000 && n == 12:
		permitted = uint64(binary.LittleEndian.Uint32(v[4:]))
	case rev == 0x02000000 && n == 20, rev == 0x03000000 && n == 24:
		permitted = uint64(binary.LittleEndian.Uint32(v[4:])) | uint64(binary.LittleEndian.Uint32(v[12:]))<<32
	default:
		return ^bounding, fmt.Errorf("file capabilities revision %#x of %d bytes", rev, n)
	}
	return permitted &^ bounding, nil
}

// capFiles caches, by template rootfs, the files with capabilities a
// sandbox cannot have (paths relative to the rootfs). Template builds never change.
var capFiles sync.Map // string -> []string

// templateCapFiles lists (once per template build) rootfs's files whose
// file capabilities exceed the sandbox's bounding set.
func templateCapFiles(rootfs string) ([]string, error) {
	if v, ok := capFiles.Load(rootfs); ok {
		return v.([]string), nil
	}
	var files []string
	buf := make([]byte, 64)
	err := filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		n, err := unix.Lgetxattr(path, xattrCaps, buf)
		if err != nil {
			if errors.Is(err, unix.ENODATA) || errors.Is(err, unix.ENOTSUP) {
				return nil
			}
			if errors.Is(err, unix.ERANGE) {
				n = len(buf) + 1 // too long to be valid
			} else {
				return fmt.Errorf("read file capabilities of %s: %w", path, err)
			}
		}
		if excess, _ := fileCapsExcess(buf[:min(n, len(buf))], bounding); excess != 0 || n > len(buf) {
			rel, err := filepath.Rel(rootfs, path)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list file capabilities of template %s: %w", rootfs, err)
	}
	capFiles.Store(rootfs, files)
	return files, nil
}

// dropFileCaps removes, in a sandbox's mounted root, the file capabilities
// its bounding set lacks from the files the template has them on. The
// files are opened inside root (no link followed): the sandbox may have
// replaced them.
func dropFileCaps(root string, files []string) error {
	buf := make([]byte, 64)
	for _, name := range files {
		f, err := openInRoot(root, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK)
		if err != nil {
			continue // gone or replaced by a link: nothing to run
		}
		fd := int(f.Fd())
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			f.Close()
			continue
		}
		n, err := unix.Fgetxattr(fd, xattrCaps, buf)
		if errors.Is(err, unix.ENODATA) {
			f.Close()
			continue // dropped already (copied up without it)
		}
		if err == nil {
			if excess, _ := fileCapsExcess(buf[:n], bounding); excess == 0 {
				f.Close()
				continue
			}
		}
		err = unix.Fremovexattr(fd, xattrCaps)
		f.Close()
		if err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("drop the file capabilities of %s in the sandbox: %w", name, err)
		}
	}
	return nil
}
