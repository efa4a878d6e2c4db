package container

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/core"
)

var _ core.WarmPool = (*Backend)(nil)

// warm is a started container waiting to be claimed.
type warm struct {
	id         string
	templateID string
	st         state
}

// pool holds the backend's warm containers.
type pool struct {
	size int

	mu      sync.Mutex
	ready   map[string][]warm // by template build ID
	claimed map[string]warm   // taken by TakeWarm, not yet claimed by Create
	wanted  map[string]bool   // template builds to keep warm
	retired map[string]bool   // drained builds, never warmed again
	filling map[string]bool
	closed  bool
	wg      sync.WaitGroup
	ctx     context.Context
	cancel  context.CancelFunc
}

func newPool(size int) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	return &pool{size: size, ready: map[string][]warm{}, claimed: map[string]warm{}, wanted: map[string]bool{}, retired: map[string]bool{}, filling: map[string]bool{}, ctx: ctx, cancel: cancel}
}

// TakeWarm implements core.WarmPool.
func (b *Backend) TakeWarm(templateID string) (string, bool) {
	p := b.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	ws := p.ready[templateID]
	if len(ws) == 0 {
		return "", false
	}
	w := ws[len(ws)-1]
	p.ready[templateID] = ws[:len(ws)-1]
	p.claimed[w.id] = w
	b.fillLocked(templateID)
	return w.id, true
}

// Prewarm implements core.WarmPool.
func (b *Backend) Prewarm(templateID string) {
	p := b.pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.retired[templateID] {
		return // a create of a build a rebuild replaced
	}
	p.wanted[templateID] = true
	b.fillLocked(templateID)
}

func (b *Backend) fillLocked(templateID string) {
	p := b.pool
	if p.size <= 0 || p.closed || p.filling[templateID] || !p.wanted[templateID] || len(p.ready[templateID]) >= p.size {
		return
	}
	p.filling[templateID] = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			p.mu.Lock()
			if p.closed || !p.wanted[templateID] || len(p.ready[templateID]) >= p.size {
				p.filling[templateID] = false
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			w, err := b.startWarm(p.ctx, templateID)
			p.mu.Lock()
			if err != nil {
				p.filling[templateID] = false
				p.mu.Unlock()
				if p.ctx.Err() == nil {
					b.cfg.Log.Warn("warm pool: could not start a container", "template", templateID, "err", err)
				}
				return
			}
			if p.closed || !p.wanted[templateID] {
				p.mu.Unlock()
				b.Destroy(context.Background(), w.id)
				continue
			}
			p.ready[templateID] = append(p.ready[templateID], w)
			p.mu.Unlock()
		}
	}()
}

// startWarm starts a container with placeholder identity and the host's
// whole size as limits; Create narrows them when it claims the container.
func (b *Backend) startWarm(ctx context.Context, templateID string) (warm, error) {
	rnd := make([]byte, 8)
	rand.Read(rnd)
	cpus, mem := core.HostSize()
	sb := &core.Sandbox{ID: hex.EncodeToString(rnd), Name: "nook-warm", TemplateID: templateID, CPUs: float64(cpus), MemoryBytes: mem, PidsLimit: 4096}
	if err := b.createCold(ctx, sb); err != nil {
		return warm{}, err
	}
	var st state
	json.Unmarshal(sb.BackendState, &st)
	return warm{id: sb.ID, templateID: templateID, st: st}, nil
}

// claim gives a warm container a sandbox's limits and hostname.
func (b *Backend) claim(w warm, sb *core.Sandbox) error {
	if w.templateID != sb.TemplateID {
		return fmt.Errorf("warm container %s is of template %s, not %s", w.id, w.templateID, sb.TemplateID)
	}
	if procStartTime(w.st.PID) != w.st.StartTime {
		return fmt.Errorf("warm container %s is no longer running", w.id)
	}
	if err := b.applyLimits(sb); err != nil {
		return err
	}
	if err := setHostname(w.st.PID, sb.Name); err != nil {
		return err
	}
	sb.BackendState, _ = json.Marshal(w.st)
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

// Drain implements core.WarmPool.
func (b *Backend) Drain(ctx context.Context, template string) error {
	p := b.pool
	p.mu.Lock()
	var victims []warm
	// A build may be wanted with its first container still starting:
	// unwanted, that container is destroyed when it is ready.
	for id := range p.wanted {
		if strings.HasPrefix(id, template+"/") {
			delete(p.wanted, id)
			p.retired[id] = true
		}
	}
	for id, ws := range p.ready {
		if strings.HasPrefix(id, template+"/") {
			victims = append(victims, ws...)
			delete(p.ready, id)
		}
	}
	p.mu.Unlock()
	var errs []error
	for _, w := range victims {
		if err := b.Destroy(ctx, w.id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Shutdown implements core.WarmPool.
func (b *Backend) Shutdown(ctx context.Context) error {
	p := b.pool
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.cancel()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
	}
	p.mu.Lock()
	var victims []warm
	for _, ws := range p.ready {
		victims = append(victims, ws...)
	}
	for _, w := range p.claimed {
		victims = append(victims, w)
	}
	p.ready, p.claimed = map[string][]warm{}, map[string]warm{}
	p.mu.Unlock()
	var errs []error
	for _, w := range victims {
		if err := b.Destroy(ctx, w.id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
