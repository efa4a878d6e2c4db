package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/nsthread"
	"github.com/nookhq/nook/internal/poll"

	"github.com/nookhq/nook/internal/fsutil"
	"github.com/nookhq/nook/internal/idclaim"
)

// Every container sandbox made by this nook runs in a user namespace of
// its own: its root is root inside, and on the host an unprivileged uid
// that owns nothing.
//
//   - A sandbox owns a range of idRangeSize host uids and gids, from
//     idBase on: uid 0..65535 inside is base..base+65535 outside. The range
//     is chosen when the sandbox is made, recorded in its directory
//     (idmap.json) for its whole life, and claimed host-wide by a file in
//     Config.IDClaimDir, so that two daemons (a test's beside the real
//     one) never hand out the same range.
//   - The user namespace and the sandbox's network namespace are made
//     together by one unshare(CLONE_NEWUSER|CLONE_NEWNET) in a short-lived
//     child (util-linux's unshare, started as a vfork: a Go clone with
//     CLONE_NEWUSER would copy the daemon's page tables), whose id maps
//     the daemon writes from outside; both are held by bind mounts in
//     the sandbox's directory.
//     The network namespace is so owned by the sandbox's user namespace:
//     the container may mount its sysfs and set its own net sysctls, and
//     CRIU can checkpoint it (every namespace of a user-namespaced
//     process must belong to its user namespace).
//   - The template's and snapshots' layers stay shared, owned by uid 0 on
//     disk: each is given to the overlay as an idmapped mount (a detached
//     clone, so no mount point is ever left to clean up). The upper
//     directory is not idmapped (overlay cannot make its work directory
//     in an idmapped upper: EOVERFLOW, and mounts read-only): it holds
//     host uids (base+n), and a snapshot shifts them back to 0-based as it
//     copies them into a layer (copyLayer), so that any sandbox's range
//     can map the layer (shifted twice, a fork's files would be unmapped).
//   - The sandbox's root must reach its rootfs: the state directory (and
//     every directory above it) is searchable, the sandbox's directory is
//     0710 with the sandbox's root group, and what it holds is root's
//     alone (the disk's root directory is 0700).
//   - CRIU (checkpoint.go) restores the processes into the sandbox's user
//     namespace (runc passes it as --join-ns user) and network namespace
//     (external). Upstream CRIU creates a new user namespace for the
//     restored tree whatever --join-ns says, from which the network
//     namespace cannot be joined: scripts/criu-userns-join.patch makes the
//     root task be born in the joined one. The restored processes open
//     some of their images as the sandbox's root: readableImages.
//   - The restored processes' credentials are the ones inside the
//     namespace (CRIU records them so), so a fork restored into another
//     range runs as that range's uids.

const (
	// idRangeSize is how many uids (and gids) a sandbox owns.
	idRangeSize = 65536
	// idBase is the first host uid given to sandboxes: 2^31, above any
	// real user's, the vm backend's QEMU users (0x70000000 + n) and the
	// ranges systemd hands to containers (0x00080000-0x6FFFFFFF) and to
	// nsresourced (0x7FFE0000-0x7FFEFFFF).
	idBase = 1 << 31
	// idSlots is how many ranges fit below 2^32-1 (the invalid uid).
	idSlots = (1<<32-idBase)/idRangeSize - 1
)

// idmap is a sandbox's range. Legacy (base 0): the sandbox was made by a
// nook without user namespaces and runs without one, as root on the
// host (markLegacy).
type idmap struct {
	Base   uint32 `json:"base"`
	Legacy bool   `json:"legacy,omitempty"`
}

func (m idmap) enabled() bool { return m.Base != 0 }

// slot is the range's index in the host-wide claim directory.
func (m idmap) slot() int { return int((m.Base - idBase) / idRangeSize) }

func (b *Backend) idmapFile(id string) string  { return filepath.Join(b.dir(id), "idmap.json") }
func (b *Backend) usernsFile(id string) string { return filepath.Join(b.dir(id), "userns") }

// readIDMap is sandbox id's range. One without a record is refused: it
// would run as root on the host.
func (b *Backend) readIDMap(id string) (idmap, error) {
	if err := b.markLegacy(); err != nil {
		return idmap{}, err
	}
	var m idmap
	err := fsutil.ReadJSON(b.idmapFile(id), &m)
	if errors.Is(err, os.ErrNotExist) {
		err = errors.New("no uid range is recorded: refusing to run the sandbox as root on the host")
	}
	if err == nil && !m.Legacy && (m.Base < idBase || (m.Base-idBase)%idRangeSize != 0 || m.slot() >= idSlots) {
		err = fmt.Errorf("bad uid range base %d", m.Base)
	}
	if err != nil {
		return idmap{}, fmt.Errorf("sandbox %s: %s: %w", id, b.idmapFile(id), err)
	}
	return m, nil
}

// markLegacy records, once per state directory (a file beside it says
// it was done), every sandbox made by a
// nook without user namespaces (a directory without idmap.json) as
// legacy: they run on as before. From then on a sandbox without a record
// is refused (a crash between its directory and its record, a lost
// file), never run as root. The caller makes no sandbox directory before.
func (b *Backend) markLegacy() error {
	b.legacyOnce.Do(func() {
		// Beside the state directory, which holds sandboxes alone.
		done := filepath.Clean(b.cfg.StateDir) + ".userns"
		if _, err := os.Stat(done); err == nil {
			return
		}
		entries, err := os.ReadDir(b.cfg.StateDir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			b.legacyErr = err
			return
		}
		var legacy []string
		for _, e := range entries {
			if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
				continue
			}
			if _, err := os.Stat(b.idmapFile(e.Name())); !errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err := fsutil.WriteJSONAtomic(b.idmapFile(e.Name()), idmap{Legacy: true}); err != nil {
				b.legacyErr = err
				return
			}
			legacy = append(legacy, e.Name())
		}
		if len(legacy) > 0 {
			b.cfg.Log.Warn("container sandboxes made before user namespaces run as root on the host until they are made again (a fork of one runs in a user namespace of its own)", "sandboxes", legacy)
		}
		if err := os.MkdirAll(b.cfg.StateDir, 0o711); err != nil {
			b.legacyErr = err
			return
		}
		b.legacyErr = fsutil.WriteFileAtomic(done, nil)
	})
	return b.legacyErr
}

// claims is the host-wide directory of claims on ranges: a claim holds
// the sandbox's directory, and is the sandbox's while that directory's
// idmap.json names the range.
func (b *Backend) claims() idclaim.Dir {
	return idclaim.Dir{Path: b.cfg.IDClaimDir, Slots: idSlots, Owns: func(owner string, slot int) bool {
		var m idmap
		rec := filepath.Join(owner, "idmap.json")
		return idclaim.RootOwned(rec) && fsutil.ReadJSON(rec, &m) == nil && m.enabled() && m.slot() == slot
	}}
}

// newIDMap claims a free range for sandbox id and records it beside its
// files.
func (b *Backend) newIDMap(id string) (idmap, error) {
	slot, err := b.claims().Claim(b.dir(id))
	if err != nil {
		return idmap{}, fmt.Errorf("claim a uid range: %w", err)
	}
	m := idmap{Base: uint32(idBase + slot*idRangeSize)}
	if err := fsutil.WriteJSONAtomic(b.idmapFile(id), m); err != nil {
		b.claims().Release(slot, b.dir(id))
		return idmap{}, fmt.Errorf("record the sandbox's uid range: %w", err)
	}
	return m, nil
}

// ownIDMap is sandbox id's recorded range, its claim made sure of (the
// claims may have been lost since: another daemon's data, a wiped
// directory); a range another sandbox holds now is refused.
func (b *Backend) ownIDMap(id string) (idmap, error) {
	m, err := b.readIDMap(id)
	if err != nil || !m.enabled() {
		return m, err
	}
	if err := b.claims().Ensure(m.slot(), b.dir(id)); err != nil {
		return idmap{}, fmt.Errorf("sandbox %s's uid range %d: %w", id, m.Base, err)
	}
	return m, nil
}

// releaseIDMap gives sandbox id's range back (its files are gone).
func (b *Backend) releaseIDMap(id string, m idmap) error {
	if !m.enabled() {
		return nil
	}
	return b.claims().Release(m.slot(), b.dir(id))
}

// mountRoot mounts sandbox id's root filesystem: its upper directory
// over lowers (topmost first), which are idmapped to its range if it has
// one.
func (b *Backend) mountRoot(id string, lowers []string, m idmap) error {
	base := b.upperBase(id)
	layers := lowers
	if m.enabled() {
		var err error
		var closeLayers func()
		if layers, closeLayers, err = idmappedLayers(lowers, b.usernsFile(id)); err != nil {
			return err
		}
		defer closeLayers()
	}
	if err := mountOverlay(layers, filepath.Join(base, "upper"), filepath.Join(base, "work"), b.rootfs(id)); err != nil {
		return err
	}
	return b.mountVolumes(id, m)
}

// ensureNamespaces makes sandbox id's network namespace (loopback up),
// and with a range its user namespace, which the network one then
// belongs to, unless they are held already. made: they are new, and the
// network needs attaching.
func (b *Backend) ensureNamespaces(id string, m idmap) (made bool, err error) {
	userns, netns := b.usernsFile(id), b.netnsFile(id)
	if !m.enabled() {
		return ensureNetns(netns)
	}
	if isNetns(userns) && isNetns(netns) {
		return false, nil
	}
	// One without the other (a crash between the two mounts): both anew.
	if err := errors.Join(removeNetns(userns), removeNetns(netns)); err != nil {
		return false, err
	}
	for _, p := range []string{userns, netns} {
		f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return false, err
		}
		f.Close()
	}
	fail := func(err error) (bool, error) {
		removeNetns(netns)
		removeNetns(userns)
		return false, err
	}
	// The child does nothing but wait for its stdin to close: it lives
	// just long enough for its namespaces to be bind-mounted. It makes
	// them itself (util-linux's unshare, then cat), and the daemon maps
	// its user namespace from outside: started that way it is a vfork,
	// which copies nothing of the daemon. A clone(CLONE_NEWUSER) from Go
	// is a full fork instead, which write-protects the daemon's whole
	// heap: at 1,000 sandboxes (130 MiB) its threads then took a
	// copy-on-write fault on every page they wrote, a fifth of the
	// host's CPU through a burst of cold creates.
	cat, err := exec.LookPath("cat")
	if err != nil {
		return fail(fmt.Errorf("sandbox namespaces: %w", err))
	}
	unsh, err := exec.LookPath("unshare")
	if err != nil {
		return fail(fmt.Errorf("sandbox namespaces: util-linux's unshare is not installed: %w", err))
	}
	self, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		return fail(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	defer pw.Close()
	cmd := exec.Command(unsh, "--user", "--net", "--", cat)
	cmd.Stdin = pr
	if err := cmd.Start(); err != nil {
		pr.Close()
		return fail(fmt.Errorf("sandbox namespaces: %w", err))
	}
	pr.Close()
	defer func() {
		pw.Close()
		cmd.Wait()
	}()
	pid := cmd.Process.Pid
	// unshare(2) switches the namespaces before the credentials that
	// name the new user namespace: once the user namespace shows, both
	// are there.
	err = poll.Until(context.Background(), poll.Options{Timeout: 10 * time.Second}, func() (bool, error) {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", pid))
		if err != nil {
			return false, fmt.Errorf("the namespaces' process ended: %w", err)
		}
		return l != self, nil
	})
	if err == nil {
		// Set once, by a writer with the capabilities in the parent
		// namespace: setgroups stays allowed, as for any user's root.
		mapping := fmt.Sprintf("0 %d %d\n", m.Base, idRangeSize)
		for _, f := range []string{"uid_map", "gid_map"} {
			if err = os.WriteFile(fmt.Sprintf("/proc/%d/%s", pid, f), []byte(mapping), 0); err != nil {
				break
			}
		}
	}
	if err != nil {
		cmd.Process.Kill()
		return fail(fmt.Errorf("sandbox namespaces: %w", err))
	}
	for _, ns := range []struct{ kind, path string }{{"user", userns}, {"net", netns}} {
		if err := unix.Mount(fmt.Sprintf("/proc/%d/ns/%s", cmd.Process.Pid, ns.kind), ns.path, "", unix.MS_BIND, ""); err != nil {
			cmd.Process.Kill()
			return fail(fmt.Errorf("hold the sandbox's %s namespace at %s: %w", ns.kind, ns.path, err))
		}
	}
	if err := loopbackUp(netns); err != nil {
		return fail(err)
	}
	return true, nil
}

// loopbackUp brings up lo in the network namespace held at path.
func loopbackUp(path string) error {
	ns, err := os.Open(path)
	if err != nil {
		return err
	}
	defer ns.Close()
	// The thread enters the namespace and is never used again (nsthread).
	return nsthread.Run(func() error {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("enter the sandbox's network namespace: %w", err)
		}
		return setLoopbackUp()
	})
}

// idmappedLayers opens each layer as a detached idmapped mount (on-disk
// uid n is the sandbox's base+n) and returns paths the overlay can take
// for them (/proc/self/fd/N). close drops the detached mounts: once the
// overlay is mounted it holds its own references.
func idmappedLayers(layers []string, userns string) (paths []string, close func(), err error) {
	uns, err := os.Open(userns)
	if err != nil {
		return nil, nil, err
	}
	defer uns.Close()
	var fds []int
	close = func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	for _, l := range layers {
		fd, err := unix.OpenTree(unix.AT_FDCWD, l, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			close()
			return nil, nil, fmt.Errorf("clone layer %s: %w", l, err)
		}
		fds = append(fds, fd)
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID, Userns_fd: uint64(uns.Fd())}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
			close()
			return nil, nil, fmt.Errorf("idmap layer %s (the kernel needs idmapped mounts of its filesystem): %w", l, err)
		}
		paths = append(paths, fmt.Sprintf("/proc/self/fd/%d", fd))
	}
	return paths, close, nil
}

// shiftedID is the 0-based id a layer records for host id v of a sandbox
// whose range starts at base: v-base inside the range; an id outside it
// (a file the host itself wrote, an overlay whiteout) is kept.
func shiftedID(v, base uint32) uint32 {
	if base != 0 && v >= base && v-base < idRangeSize {
		return v - base
	}
	return v
}

// reachable checks that every directory above dir is searchable by
// other users: a user-namespaced sandbox's root, an unprivileged uid on
// the host, passes them on the way to its rootfs.
func reachable(dir string) error {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("a sandbox's root (an unprivileged uid on the host) cannot reach its files: %s is not searchable by other users (chmod o+x it, or choose a data directory whose parents are)", d)
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// sandboxDirMode gives a sandbox's directory to root, with search
// permission for the sandbox's root group (host gid m.Base) alone: the
// sandbox's root reaches its rootfs, no other user of the host does (its
// setuid files are the sandbox's uids, which another user must not get).
func sandboxDirMode(dir string, m idmap) error {
	if err := os.Chown(dir, 0, int(m.Base)); err != nil {
		return err
	}
	return os.Chmod(dir, 0o710)
}

// searchable makes dir searchable (not listable) by every user.
func searchable(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o011 == 0o011 {
		return nil
	}
	if err := os.Chmod(dir, fi.Mode().Perm()|0o011); err != nil {
		return fmt.Errorf("make %s searchable for the sandboxes' roots: %w", dir, err)
	}
	return nil
}

// kernelAtLeast reports whether the running kernel is major.minor or
// later, and its release.
func kernelAtLeast(major, minor int) (bool, string) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return true, "" // unknown: let the first create say
	}
	release := unix.ByteSliceToString(u.Release[:])
	var maj, min int
	if _, err := fmt.Sscanf(release, "%d.%d", &maj, &min); err != nil {
		return true, release
	}
	return maj > major || maj == major && min >= minor, release
}
