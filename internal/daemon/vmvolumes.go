package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/volume"
)

// A vm's volumes are FUSE mounts in its guest that its agent serves by
// calling the daemon (the agent package's volume.go): while the daemon
// has an agent client for a running vm with volumes, a volServe keeps
// the volume stream open, serving the calls with a volume.Remote on the
// volumes' directories, and opens it again when it ends (the session
// was closed, the vm was restored). dropAgent ends it with the client.

type volServe struct {
	c        *agent.Client
	prev     *volServe // the loop it replaced, which it waits for
	restored bool      // the vm was rolled back or forked: see agent.VolumesRequest.Restored
	cancel   context.CancelFunc
	done     chan struct{} // closed once runVolumes has returned and closed the volumes
	mu       sync.Mutex
	ready    chan struct{} // closed once the guest has mounted them (or err is set)
	err      error         // why they could not be mounted
}

// serveVolumesLocked starts the volume server of sb for client c unless
// one runs for it. m.mu is held.
func (m *Manager) serveVolumesLocked(sb *core.Sandbox, c *agent.Client) *volServe {
	if sb.Isolation != api.IsolationVM || len(sb.Volumes) == 0 {
		return nil
	}
	if m.agents[sb.ID] != c {
		return nil // a client dropped meanwhile: the current one serves
	}
	prev := m.volServes[sb.ID]
	if prev != nil && prev.c == c {
		return prev
	}
	if prev != nil {
		prev.cancel() // the old client's: the new loop waits for it to end
	}
	ctx, cancel := context.WithCancel(context.Background())
	vs := &volServe{c: c, prev: prev, restored: m.volRestored[sb.ID], cancel: cancel, ready: make(chan struct{}), done: make(chan struct{})}
	delete(m.volRestored, sb.ID)
	m.volServes[sb.ID] = vs
	sbCopy := *sb
	go m.runVolumes(ctx, &sbCopy, vs)
	return vs
}

// stopVolumesLocked ends sandbox id's volume server and returns it (nil
// if there was none): wait for it to be done, without m.mu, before
// counting the volumes' directories closed. m.mu is held.
func (m *Manager) stopVolumesLocked(id string) *volServe {
	vs := m.volServes[id]
	if vs != nil {
		vs.cancel()
		delete(m.volServes, id)
	}
	return vs
}

// wait waits until the server has closed the volumes (nil: none ran).
func (vs *volServe) wait() {
	if vs != nil {
		<-vs.done
	}
}

// markRestored says that vm sb now runs from a snapshot (rolled back, or
// a fork): the next volume stream tells its guest to fail the calls that
// were in flight in the snapshot, not send them again.
func (m *Manager) markRestored(sb *core.Sandbox) {
	if sb.Isolation != api.IsolationVM || len(sb.Volumes) == 0 {
		return
	}
	m.mu.Lock()
	m.volRestored[sb.ID] = true
	m.mu.Unlock()
}

// volumesMounted waits until the guest of vm sb has mounted its volumes.
func (m *Manager) volumesMounted(ctx context.Context, sb *core.Sandbox) error {
	if sb.Isolation != api.IsolationVM || len(sb.Volumes) == 0 {
		return nil
	}
	m.mu.Lock()
	var vs *volServe
	if c := m.agents[sb.ID]; c != nil {
		vs = m.serveVolumesLocked(sb, c)
	}
	m.mu.Unlock()
	if vs == nil {
		return fmt.Errorf("mount the volumes of %s: its agent session was dropped", sb.Name)
	}
	select {
	case <-vs.ready:
		vs.mu.Lock()
		defer vs.mu.Unlock()
		return vs.err
	case <-ctx.Done():
		return fmt.Errorf("mount the volumes of %s: %w", sb.Name, ctx.Err())
	}
}

func (vs *volServe) mounted(err error) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	select {
	case <-vs.ready:
		return
	default:
	}
	vs.err = err
	close(vs.ready)
}

// runVolumes serves sb's volume stream until ctx ends or the sandbox is
// no longer running.
func (m *Manager) runVolumes(ctx context.Context, sb *core.Sandbox, vs *volServe) {
	defer close(vs.done) // after the volumes are closed (deferred below)
	defer func() {
		m.mu.Lock()
		if m.volServes[sb.ID] == vs {
			delete(m.volServes, sb.ID)
		}
		m.mu.Unlock()
		vs.mounted(errors.New("the sandbox stopped before its volumes were mounted"))
	}()
	if vs.prev != nil {
		select {
		case <-vs.prev.done: // its calls are over: none runs beside this loop's
		case <-ctx.Done():
			return
		}
		vs.prev = nil // no chain of every loop the sandbox had
	}
	remote, req, err := m.openRemote(sb)
	if err != nil {
		m.log.Error("open the volumes of a vm", "sandbox", sb.Name, "err", err)
		vs.mounted(err)
		return
	}
	defer remote.Close()
	req.Restored = vs.restored
	backoff := 20 * time.Millisecond
	for {
		start := time.Now()
		err := vs.c.ServeVolumes(ctx, req, remote, func() { vs.mounted(nil); req.Restored = false })
		if ctx.Err() != nil {
			return
		}
		var ae *agent.AgentError
		if errors.As(err, &ae) {
			// The guest cannot mount them (no FUSE in its kernel): not
			// something trying again mends.
			m.log.Error("a vm's guest could not mount its volumes", "sandbox", sb.Name, "err", err)
			vs.mounted(fmt.Errorf("the guest could not mount the volumes: %w", err))
			return
		}
		// Only a sandbox that is gone ends the loop here: one starting,
		// waking or being rolled back is recorded stopped or paused until
		// it runs, and dropAgent ends the loop of one that stops.
		if cur, gerr := m.store.GetSandbox(ctx, sb.Name); errors.Is(gerr, errdefs.ErrNotFound) || gerr == nil && (cur.ID != sb.ID || cur.State == core.StateDestroying || cur.State == core.StateFailed) {
			return
		}
		if time.Since(start) > 10*time.Second {
			backoff = 20 * time.Millisecond
		}
		m.log.Debug("a vm's volume stream ended; opening it again", "sandbox", sb.Name, "err", err, "in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// openRemote opens the directories sb's volumes are.
func (m *Manager) openRemote(sb *core.Sandbox) (*volume.Remote, *agent.VolumesRequest, error) {
	req := &agent.VolumesRequest{}
	var dirs []volume.RemoteMount
	for _, v := range sb.Volumes {
		var dir, name string
		var err error
		if v.HostPath != "" {
			dir, err = m.HostMountAllowed(v.HostPath)
			name = strings.ReplaceAll(v.HostPath, ",", "_")
		} else {
			dir, err = m.volumes.Path(v.Name)
			name = v.Name
		}
		gone := false
		if err != nil {
			// Removed by force (or no longer allowed) since the vm mounted
			// it: its calls fail with EIO, the vm and its other volumes go on.
			m.log.Warn("a vm's volume is gone: its files are unreachable in the vm", "sandbox", sb.Name, "volume", name, "err", err)
			gone = true
		}
		dirs = append(dirs, volume.RemoteMount{Dir: dir, ReadOnly: v.ReadOnly, HostDir: v.HostPath != "", Gone: gone})
		req.Mounts = append(req.Mounts, agent.VolumeMountSpec{Name: name, Path: v.Target, ReadOnly: v.ReadOnly})
	}
	r, err := volume.OpenRemote(dirs)
	return r, req, err
}
