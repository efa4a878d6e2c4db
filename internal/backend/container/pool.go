package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/procfs"
	"github.com/nookhq/nook/internal/warmpool"
)

var _ core.WarmPool = (*Backend)(nil)

// warm is a started container waiting to be claimed: its init process.
type warm = warmpool.Item[state]

// newPool keeps cfg.WarmPool containers per template build, more after
// bursts of creates, up to cfg.WarmPoolMax: a warm container holds only
// its init and agent (a few MB), and starts in parallel (one per CPU).
func newPool(b *Backend, cfg Config) *warmpool.Pool[state] {
	limit := func(string) int { return cfg.WarmPoolMax }
	return warmpool.New(warmpool.Options{Size: cfg.WarmPool, Max: limit, RefillDelay: warmpool.DefaultRefillDelay}, b.startWarm, b.Destroy, func(key string, err error) {
		b.cfg.Log.Warn("warm pool: could not start a container", "template", key, "err", err)
	})
}

// TakeWarm implements core.WarmPool. Warm containers have the default
// disk: a sandbox that asks for another size is made afresh.
func (b *Backend) TakeWarm(sb *core.Sandbox) (string, bool) {
	if diskSize(sb) != DefaultDisk {
		return "", false
	}
	return b.pool.Take(sb.TemplateID)
}

// Prewarm implements core.WarmPool.
func (b *Backend) Prewarm(sb *core.Sandbox) { b.pool.Want(sb.TemplateID) }

// Drain implements core.WarmPool.
func (b *Backend) Drain(ctx context.Context, template string) error {
	return b.pool.Drain(ctx, template+"/")
}

// Shutdown implements core.WarmPool.
func (b *Backend) Shutdown(ctx context.Context) error { return b.pool.Shutdown(ctx) }

// WarmPools implements core.WarmPool.
func (b *Backend) WarmPools() []api.WarmPool { return b.pool.Report(b.Isolation()) }

// startWarm starts a container with placeholder identity and the host's
// whole size as limits; Create narrows them when it claims the container.
func (b *Backend) startWarm(ctx context.Context, templateID string) (warm, error) {
	rnd := make([]byte, 8)
	rand.Read(rnd)
	cpus, mem := core.HostSize()
	sb := &core.Sandbox{ID: hex.EncodeToString(rnd), Name: "nook-warm", TemplateID: templateID, CPUs: float64(cpus), MemoryBytes: mem, DiskBytes: DefaultDisk, PidsLimit: 4096}
	if err := b.createCold(ctx, sb); err != nil {
		return warm{}, err
	}
	var st state
	json.Unmarshal(sb.BackendState, &st)
	return warm{ID: sb.ID, Key: templateID, Val: st}, nil
}

// claim gives a warm container a sandbox's limits and hostname.
func (b *Backend) claim(w warm, sb *core.Sandbox) error {
	if w.Key != sb.TemplateID {
		return fmt.Errorf("warm container %s is of template %s, not %s", w.ID, w.Key, sb.TemplateID)
	}
	if procfs.StartTime(w.Val.PID) != w.Val.StartTime {
		return fmt.Errorf("warm container %s is no longer running", w.ID)
	}
	if err := b.applyLimits(sb); err != nil {
		return err
	}
	if err := setHostname(w.Val.PID, sb.Name); err != nil {
		return err
	}
	sb.BackendState, _ = json.Marshal(w.Val)
	return nil
}

// applyLimits writes a sandbox's CPU, memory and pids limits into its cgroups.
func (b *Backend) applyLimits(sb *core.Sandbox) error {
	const period = 100000
	quota := int64(sb.CPUs * period)
	var files map[string]string
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil { // cgroup v2
		dir := filepath.Join("/sys/fs/cgroup", b.cfg.CgroupParent, sb.ID)
		files = map[string]string{
			filepath.Join(dir, "memory.max"): strconv.FormatInt(sb.MemoryBytes, 10),
			filepath.Join(dir, "cpu.max"):    fmt.Sprintf("%d %d", quota, period),
			filepath.Join(dir, "pids.max"):   strconv.FormatInt(sb.PidsLimit, 10),
		}
	} else {
		cg := func(ctrl, file string) string {
			return filepath.Join("/sys/fs/cgroup", ctrl, b.cfg.CgroupParent, sb.ID, file)
		}
		files = map[string]string{
			cg("memory", "memory.limit_in_bytes"): strconv.FormatInt(sb.MemoryBytes, 10),
			cg("cpu", "cpu.cfs_period_us"):        strconv.Itoa(period),
			cg("cpu", "cpu.cfs_quota_us"):         strconv.FormatInt(quota, 10),
			cg("pids", "pids.max"):                strconv.FormatInt(sb.PidsLimit, 10),
		}
	}
	for path, v := range files {
		if err := os.WriteFile(path, []byte(v), 0); err != nil {
			return fmt.Errorf("set limit %s: %w", path, err)
		}
	}
	return nil
}

// setHostname sets the hostname inside a container's UTS namespace from a
// thread that joins it and then returns to its own namespace. If the way
// back fails, the thread stays locked and Go discards it with the
// goroutine, so no other goroutine ever runs in the container's namespace.
func setHostname(pid int, name string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/uts", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/uts", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWUTS); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("join uts namespace: %w", err)
			return
		}
		errc <- unix.Sethostname([]byte(name))
		if unix.Setns(orig, unix.CLONE_NEWUTS) == nil {
			runtime.UnlockOSThread()
		}
	}()
	return <-errc
}
