package container

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/diskimg"
	"github.com/nookhq/nook/internal/fsutil"
)

// Volumes: each volume a sandbox mounts (volumes.json in its directory,
// written at its start) is cloned from its host directory (open_tree),
// idmapped to the sandbox's range when it has one, so that a volume's
// on-disk ids are the same in every sandbox whatever its range, made
// read-only if asked, nodev and nosuid, and attached at <dir>/vol/<i>
// (mountVolumes, with the root). runc bind-mounts that at the volume's
// target (the spec's mounts, resolved inside the root by runc), and
// gets it among the binds of its own mount namespace. Destroy unmounts
// them before anything under the sandbox's directory is removed: a
// volume's files are never walked.

func (b *Backend) volumesFile(id string) string { return filepath.Join(b.dir(id), "volumes.json") }
func (b *Backend) volDir(id string, i int) string {
	return filepath.Join(b.dir(id), "vol", strconv.Itoa(i))
}

// readVolumes is what sandbox id mounts (none for a sandbox made before volumes).
func (b *Backend) readVolumes(id string) ([]core.VolumeMount, error) {
	var vols []core.VolumeMount
	if err := fsutil.ReadJSON(b.volumesFile(id), &vols); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("sandbox %s's volumes: %w", id, err)
	}
	return vols, nil
}

// volumeMounts are the spec's bind mounts of vols.
func (b *Backend) volumeMounts(id string, vols []core.VolumeMount) []specs.Mount {
	var out []specs.Mount
	for i, v := range vols {
		opts := []string{"rbind", "nosuid", "nodev"}
		if v.ReadOnly {
			opts = append(opts, "ro")
		}
		out = append(out, specs.Mount{Destination: v.Target, Type: "bind", Source: b.volDir(id, i), Options: opts})
	}
	return out
}

// mountVolumes attaches sandbox id's volumes at their vol/<i>, those not
// attached yet.
func (b *Backend) mountVolumes(id string, m idmap) error {
	vols, err := b.readVolumes(id)
	if err != nil || len(vols) == 0 {
		return err
	}
	if b.cfg.VolumePath == nil || b.cfg.HostMountPath == nil {
		return errors.New("this daemon has no volumes")
	}
	top := filepath.Join(b.dir(id), "vol")
	if err := os.MkdirAll(top, 0o700); err != nil {
		return err
	}
	if m.enabled() { // runc's setup, the sandbox's root, passes it
		if err := sandboxDirMode(top, m); err != nil {
			return err
		}
	}
	for i, v := range vols {
		dst := b.volDir(id, i)
		if err := os.MkdirAll(dst, 0o700); err != nil {
			return err
		}
		if mounted, err := fsutil.IsMountPoint(dst); err != nil {
			return err
		} else if mounted {
			continue
		}
		what, src, err := "volume "+v.Name, "", error(nil)
		if v.HostPath != "" {
			what = "host directory " + v.HostPath
			src, err = b.cfg.HostMountPath(v.HostPath)
		} else {
			src, err = b.cfg.VolumePath(v.Name)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if err := attachVolume(src, dst, v.ReadOnly, m, b.usernsFile(id)); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

// attachVolume mounts a clone of src at dst: idmapped through userns
// when m has a range, read-only if ro.
func attachVolume(src, dst string, ro bool, m idmap, userns string) error {
	// Not through a symlink (a host directory swapped for one since it
	// was checked).
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return fmt.Errorf("clone %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_NOSUID}
	if ro {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if m.enabled() {
		uns, err := os.Open(userns)
		if err != nil {
			return err
		}
		defer uns.Close()
		attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = uint64(uns.Fd())
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("set the mount's attributes (idmapped: %v): %w", m.enabled(), err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach at %s: %w", dst, err)
	}
	return nil
}

// mountedVolumes are sandbox id's attached volume mounts.
func (b *Backend) mountedVolumes(id string) []string {
	entries, _ := os.ReadDir(filepath.Join(b.dir(id), "vol"))
	var out []string
	for _, e := range entries {
		p := filepath.Join(b.dir(id), "vol", e.Name())
		if mounted, err := fsutil.IsMountPoint(p); err == nil && mounted {
			out = append(out, p)
		}
	}
	return out
}

// unmountVolumes detaches sandbox id's volumes (their files stay: they
// are the volumes').
func (b *Backend) unmountVolumes(id string) error {
	top := filepath.Join(b.dir(id), "vol")
	entries, err := os.ReadDir(top)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(top, e.Name())
		if err := diskimg.Unmount(p); err != nil {
			return fmt.Errorf("the sandbox's volume mount %s: %w", p, err)
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return os.Remove(top)
}
