package daemon

import (
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/volume"
)

// maxVolumeMounts bounds the volumes one sandbox mounts.
const maxVolumeMounts = 32

// parseVolumes checks a create's volumes ("NAME:/path" or
// "NAME:/path:ro") and host mounts ("/host/dir:/path[:ro]"): each names
// a volume there is, or a directory of the host under one the daemon
// allows (resolved: no symlink leads out of them), at an absolute path
// that is not the root, nor in /proc, /sys, /dev or nook's own /.nook,
// and none at or under another's path (it would be resolved through
// what a sandbox wrote in that one). Whether the volumes still exist is
// checked again under volMu (volumesExist).
func (m *Manager) parseVolumes(specs, mounts []string, isolation string) ([]core.VolumeMount, error) {
	if len(specs)+len(mounts) == 0 {
		return nil, nil
	}
	if len(specs)+len(mounts) > maxVolumeMounts {
		return nil, errdefs.Invalid("at most %d volumes and mounts per sandbox", maxVolumeMounts)
	}
	var out []core.VolumeMount
	seen := map[string]bool{}
	for i, spec := range append(append([]string{}, specs...), mounts...) {
		host := i >= len(specs)
		parts := strings.Split(spec, ":")
		if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && parts[2] != "ro" && parts[2] != "rw") {
			if host {
				return nil, errdefs.Invalid("mount %q: give /host/dir:/path or /host/dir:/path:ro", spec)
			}
			return nil, errdefs.Invalid("volume %q: give NAME:/path or NAME:/path:ro", spec)
		}
		src, target := parts[0], parts[1]
		vm := core.VolumeMount{ReadOnly: len(parts) == 3 && parts[2] == "ro"}
		if host {
			dir, err := m.hostMountDir(src)
			if err != nil {
				return nil, err
			}
			vm.HostPath = dir
		} else {
			if err := volume.CheckName(src); err != nil {
				return nil, err
			}
			if _, err := m.volumes.Get(src); err != nil {
				if errors.Is(err, errdefs.ErrNotFound) {
					return nil, errdefs.NotFound("volume %s not found: nook volume create %s makes it", src, src)
				}
				return nil, err
			}
			vm.Name = src
		}
		if !path.IsAbs(target) || strings.ContainsRune(target, 0) || len(target) > 4096 {
			return nil, errdefs.Invalid("%s: the path %q is not absolute", src, target)
		}
		target = path.Clean(target)
		if target == "/" {
			return nil, errdefs.Invalid("%s: it cannot be mounted over the root", src)
		}
		for _, sys := range []string{"/proc", "/sys", "/dev", "/.nook"} {
			if under(target, sys) {
				return nil, errdefs.Invalid("%s: it cannot be mounted in %s", src, sys)
			}
		}
		for other := range seen {
			if under(target, other) || under(other, target) {
				return nil, errdefs.Invalid("volumes at %s and %s: one is in the other", other, target)
			}
		}
		seen[target] = true
		vm.Target = target
		out = append(out, vm)
	}
	return out, nil
}

// hostMountDir is dir resolved (symlinks followed), if it is a directory
// under one the daemon allows for host mounts.
func (m *Manager) hostMountDir(dir string) (string, error) {
	if len(m.cfg.AllowHostMounts) == 0 {
		return "", errdefs.Denied("mount %s: this daemon allows no host directories (nook serve --allow-host-mounts DIR)", dir)
	}
	if !path.IsAbs(dir) {
		return "", errdefs.Invalid("mount %s: give an absolute directory of the host", dir)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", errdefs.Invalid("mount %s: %v", dir, err)
	}
	if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
		return "", errdefs.Invalid("mount %s: not a directory", dir)
	}
	for _, allowed := range m.cfg.AllowHostMounts {
		if a, err := filepath.EvalSymlinks(allowed); err == nil && under(real, a) {
			return real, nil
		}
	}
	return "", errdefs.Denied("mount %s: not under a directory this daemon allows (%s)", dir, strings.Join(m.cfg.AllowHostMounts, ", "))
}

// HostMountAllowed is whether dir (a recorded host mount, resolved) is
// still allowed: a sandbox that mounts one the daemon no longer allows
// does not get it when it starts again.
func (m *Manager) HostMountAllowed(dir string) (string, error) {
	real, err := m.hostMountDir(dir)
	if err != nil {
		return "", err
	}
	if real != dir {
		return "", errdefs.Denied("mount %s: it is now a link to %s", dir, real)
	}
	return real, nil
}

// under reports whether p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// volumesExist checks that every volume of vols is there still. The
// caller holds volMu (read).
func (m *Manager) volumesExist(vols []core.VolumeMount) error {
	for _, v := range vols {
		if v.HostPath != "" {
			continue
		}
		if _, err := m.volumes.Get(v.Name); err != nil {
			return err
		}
	}
	return nil
}

// CreateVolume makes a volume.
func (m *Manager) CreateVolume(ctx context.Context, req api.CreateVolumeRequest) (api.Volume, error) {
	var size int64
	if req.Size != "" {
		var err error
		if size, err = core.ParseSize(req.Size); err != nil {
			return api.Volume{}, errdefs.Invalid("size: %v", err)
		}
	}
	v, err := m.volumes.Create(ctx, req.Name, size)
	if err != nil {
		return api.Volume{}, err
	}
	return api.Volume{Name: v.Name, SizeBytes: v.SizeBytes, CreatedAt: v.CreatedAt}, nil
}

// volumeUsers maps each volume to the sandboxes that mount it.
func (m *Manager) volumeUsers(ctx context.Context) (map[string][]string, error) {
	sbs, err := m.store.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	users := map[string][]string{}
	for _, sb := range sbs {
		for _, v := range sb.Volumes {
			users[v.Name] = append(users[v.Name], sb.Name)
		}
	}
	return users, nil
}

func apiVolume(v volume.Volume, users map[string][]string) api.Volume {
	return api.Volume{Name: v.Name, SizeBytes: v.SizeBytes, UsedBytes: v.UsedBytes, CreatedAt: v.CreatedAt, MountedBy: users[v.Name]}
}

// ListVolumes lists the volumes, each with the sandboxes that mount it.
func (m *Manager) ListVolumes(ctx context.Context) ([]api.Volume, error) {
	vols, err := m.volumes.List()
	if err != nil {
		return nil, err
	}
	users, err := m.volumeUsers(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Volume, 0, len(vols))
	for _, v := range vols {
		out = append(out, apiVolume(v, users))
	}
	return out, nil
}

// GetVolume returns a volume and the sandboxes that mount it.
func (m *Manager) GetVolume(ctx context.Context, name string) (api.Volume, error) {
	v, err := m.volumes.Get(name)
	if err != nil {
		return api.Volume{}, err
	}
	users, err := m.volumeUsers(ctx)
	if err != nil {
		return api.Volume{}, err
	}
	return apiVolume(v, users), nil
}

// RemoveVolume deletes a volume and its files. One that a sandbox mounts
// is refused (remove the sandboxes first) unless force: then the
// sandboxes that mount it keep what they see until they are removed (the
// files go with the last of them), and cannot start again once stopped;
// a vm keeps it until its volume stream is opened again (a pause, a
// stop, a rollback, a daemon restart), and then gets EIO from it.
func (m *Manager) RemoveVolume(ctx context.Context, name string, force bool) error {
	m.volMu.Lock()
	defer m.volMu.Unlock()
	if _, err := m.volumes.Get(name); err != nil {
		return err
	}
	users, err := m.volumeUsers(ctx)
	if err != nil {
		return err
	}
	if u := users[name]; len(u) > 0 && !force {
		return errdefs.Precondition("volume %s is mounted by %s: remove them first (or force it)", name, strings.Join(u, ", "))
	}
	return m.volumes.Remove(ctx, name)
}

// VolumeFiles opens the files of volume name for the host's own file
// calls (volume.Stat, List, OpenFile, Write, WriteTar, ReadTar), which
// never leave it; release closes them. No lock is held meanwhile (a
// slow client must not hold back a removal): a volume removed during a
// call is detached from the host, and the call ends on its files.
func (m *Manager) VolumeFiles(ctx context.Context, name string) (root *os.Root, release func(), err error) {
	m.volMu.RLock()
	dir, err := m.volumes.Path(name)
	if err == nil {
		root, err = os.OpenRoot(dir)
	}
	m.volMu.RUnlock()
	if err != nil {
		return nil, nil, err
	}
	return root, func() { root.Close() }, nil
}
