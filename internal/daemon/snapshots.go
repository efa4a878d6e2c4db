package daemon

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/network/policy"
	"github.com/nookhq/nook/internal/store"
)

// MaxForks bounds one fork request.
const MaxForks = 20

// snapshotter returns the sandbox's backend as a core.Snapshotter, or a
// clear error when its backend cannot take snapshots.
func (m *Manager) snapshotter(sb *core.Sandbox) (core.Snapshotter, error) {
	b, err := m.backend(sb.Isolation)
	if err != nil {
		return nil, err
	}
	s, ok := b.(core.Snapshotter)
	if !ok || !b.Capabilities().Snapshot {
		return nil, errdefs.Precondition("the %s backend cannot take snapshots yet: create the sandbox with --isolation vm", sb.Isolation)
	}
	return s, nil
}

// Snapshot takes a snapshot of a running or paused sandbox; label names it
// (default snap-N).
func (m *Manager) Snapshot(ctx context.Context, name, label string) (_ *core.Snapshot, err error) {
	defer m.observe(opSnapshot, time.Now(), &err)
	if err := core.ValidateName(name); err != nil {
		return nil, err
	}
	if label != "" {
		if err := core.ValidateName(label); err != nil {
			return nil, fmt.Errorf("snapshot name: %w", err)
		}
	}
	unlock := m.lockName(name)
	defer unlock()
	sb, err := m.store.GetSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	return m.snapshotLocked(context.WithoutCancel(ctx), sb, label)
}

func (m *Manager) snapshotLocked(ctx context.Context, sb *core.Sandbox, label string) (*core.Snapshot, error) {
	if sb.State != core.StateRunning && sb.State != core.StatePaused {
		return nil, errdefs.Precondition("sandbox %s is %s: only a running or paused sandbox can be snapshotted", sb.Name, sb.State)
	}
	sn, err := m.snapshotter(sb)
	if err != nil {
		return nil, err
	}
	existing, err := m.store.ListSnapshots(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	if label == "" {
		label = fmt.Sprintf("snap-%d", len(existing)+1)
	}
	for _, e := range existing {
		if e.Name == label {
			return nil, errdefs.Exists("sandbox %s already has a snapshot named %s: choose another --name", sb.Name, label)
		}
	}
	parent, err := m.store.SnapshotHead(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	rec := &core.Snapshot{ID: "snap-" + newID()[:12], SandboxID: sb.ID, Sandbox: sb.Name, Name: label, Parent: parent, CreatedAt: time.Now().UTC()}
	// A snapshot counts against the token that owns the sandbox (quotas.go).
	owner, err := m.store.SandboxOwner(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	share, err := m.reserveQuota(ctx, owner, store.Usage{Snapshots: 1}, "this snapshot")
	if err != nil {
		return nil, err
	}
	defer share.release()
	if err := m.linkIdempotent(ctx, idemSnapshot, rec.ID); err != nil {
		return nil, err
	}
	// The backend's files first, then the record: a crash in between
	// leaves files no record names, which GC removes once nothing uses them.
	// A backend that cannot save the host's connections to the agent
	// closes them first, unless requests are in flight.
	opts := core.SnapshotOptions{Quiesce: func() (func(), bool) {
		c, err := m.agentFor(sb)
		if err != nil {
			return func() {}, true // no agent client: nothing connected
		}
		return c.Quiesce()
	}}
	info, err := sn.Snapshot(ctx, sb, rec.ID, opts)
	if err != nil {
		// What a failed snapshot left of its files, no record names: the
		// sandbox's destroy would not look for it (refersToSnapshots).
		m.gcSnapshots(ctx)
		return nil, fmt.Errorf("snapshot sandbox %s: %w", sb.Name, err)
	}
	rec.Memory, rec.SizeBytes = info.Memory, info.SizeBytes
	if err := share.commit(func() error { return m.store.InsertSnapshot(ctx, rec) }); err != nil {
		m.gcSnapshots(ctx)
		return nil, err
	}
	switch {
	case info.Restarted:
		m.restarted(ctx, sb)
	case sb.State == core.StateRunning && sb.Isolation == api.IsolationVM:
		// Its guest stood still for the save: give it the time again, on
		// the same session (streams in flight go on).
		if err := m.configureAgent(ctx, sb, true); err != nil {
			m.log.Warn("set the clock of a vm after its snapshot", "sandbox", sb.Name, "err", err)
		}
	}
	m.log.Info("snapshot taken", "sandbox", sb.Name, "snapshot", rec.Name, "id", rec.ID, "bytes", rec.SizeBytes)
	m.emit(ctx, api.EventSnapshotTaken, sb, rec.Name)
	return rec, nil
}

// restarted gives a sandbox started again from saved state (a vm's
// snapshot or rollback, a container's rollback) a new agent session, its
// identity and the time.
func (m *Manager) restarted(ctx context.Context, sb *core.Sandbox) {
	m.dropAgent(sb.ID)
	if err := m.waitAgent(ctx, sb); err != nil {
		m.log.Warn("configure the sandbox after a restart from saved state", "sandbox", sb.Name, "err", err)
	}
}

// Snapshots lists a sandbox's snapshots, oldest first, with what each
// really uses on disk now.
func (m *Manager) Snapshots(ctx context.Context, name string) ([]*core.Snapshot, error) {
	sb, err := m.Get(ctx, name)
	if err != nil {
		return nil, err
	}
	list, err := m.store.ListSnapshots(ctx, sb.ID)
	if err != nil {
		return nil, err
	}
	if s, ok := m.backends[sb.Isolation].(core.Snapshotter); ok {
		for _, sn := range list {
			sn.Sandbox = sb.Name
			sn.SizeBytes = s.SnapshotUsage(sn.ID)
		}
	}
	return list, nil
}

// snapshotOf finds a sandbox's snapshot by name or ID; a snapshot of
// another sandbox is refused with a pointer to fork.
func (m *Manager) snapshotOf(ctx context.Context, sb *core.Sandbox, ref string) (*core.Snapshot, error) {
	if ref == "" {
		return nil, errdefs.Invalid("no snapshot given: name one from `nook snapshots %s`", sb.Name)
	}
	sn, err := m.store.GetSnapshot(ctx, sb.ID, ref)
	if err != nil {
		return nil, err
	}
	if sn.SandboxID != sb.ID {
		owner := sn.SandboxID
		if o, err := m.store.GetSandboxByID(ctx, sn.SandboxID); err == nil {
			owner = o.Name
		}
		return nil, errdefs.Precondition("snapshot %s belongs to sandbox %s, not %s: fork it into a new sandbox instead", ref, owner, sb.Name)
	}
	return sn, nil
}

// DeleteSnapshot removes a snapshot; its files go once nothing uses them
// (a later snapshot's layers and forks keep what they build on).
func (m *Manager) DeleteSnapshot(ctx context.Context, name, ref string) error {
	sb, unlock, err := m.lockSandbox(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	sn, err := m.snapshotOf(ctx, sb, ref)
	if err != nil {
		return err
	}
	if err := m.store.DeleteSnapshot(ctx, sn); err != nil {
		return err
	}
	m.gcSnapshots(ctx)
	return nil
}

// refersToSnapshots reports whether destroying sb may leave snapshot
// files unused: it has snapshots, or its backend says its files name
// some (or cannot say).
func (m *Manager) refersToSnapshots(ctx context.Context, sb *core.Sandbox) bool {
	if snaps, err := m.store.ListSnapshots(ctx, sb.ID); err != nil || len(snaps) > 0 {
		return true
	}
	r, ok := m.backends[sb.Isolation].(core.SnapshotReferrer)
	return !ok || r.RefersToSnapshots(sb.ID)
}

// gcSnapshots lets every backend remove snapshot files no record keeps
// and no sandbox uses.
func (m *Manager) gcSnapshots(ctx context.Context) {
	all, err := m.store.ListSnapshots(ctx, "")
	if err != nil {
		m.log.Warn("list snapshots for GC", "err", err)
		return
	}
	keep := make([]string, 0, len(all))
	for _, sn := range all {
		keep = append(keep, sn.ID)
	}
	for _, b := range m.backends {
		if s, ok := b.(core.Snapshotter); ok {
			if err := s.GC(context.WithoutCancel(ctx), keep); err != nil {
				m.log.Warn("remove unused snapshot files", "err", err)
			}
		}
	}
}

// Rollback puts a sandbox back to one of its snapshots: its disk, and its
// memory (processes, open files) where the snapshot has it. It is running after.
func (m *Manager) Rollback(ctx context.Context, name, ref string) (*core.Sandbox, error) {
	sb, unlock, err := m.lockSandbox(ctx, name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if sb.State != core.StateRunning && sb.State != core.StatePaused {
		return nil, errdefs.Precondition("sandbox %s is %s: only a running or paused sandbox can be rolled back", name, sb.State)
	}
	s, err := m.snapshotter(sb)
	if err != nil {
		return nil, err
	}
	sn, err := m.snapshotOf(ctx, sb, ref)
	if err != nil {
		return nil, err
	}
	// Paused to disk, it runs after: its memory needs room.
	room, err := m.reserveRAM(sb, "rolling back")
	if err != nil {
		return nil, err
	}
	defer room.release()
	cctx := context.WithoutCancel(ctx)
	m.dropAgent(sb.ID)
	if err := s.Rollback(cctx, sb, sn.ID); err != nil {
		// A backend that put the sandbox back as it was, running again:
		// record that, and give its agent its configuration.
		if b, berr := m.backend(sb.Isolation); berr == nil {
			if rs, serr := b.Status(cctx, sb); serr == nil && rs.State == core.RuntimeRunning {
				sb.State, sb.Reason = core.StateRunning, ""
				if uerr := m.commitSandbox(cctx, sb, room); uerr != nil {
					m.log.Error("record sandbox after a failed rollback", "sandbox", name, "err", uerr)
				}
				m.restarted(cctx, sb)
			}
		}
		return nil, fmt.Errorf("roll back sandbox %s to %s: %w", name, sn.Name, err)
	}
	if err := m.store.SetSnapshotHead(cctx, sb.ID, sn.ID); err != nil {
		return nil, err
	}
	sb.State, sb.Reason = core.StateRunning, ""
	if err := m.commitSandbox(cctx, sb, room); err != nil {
		return nil, err
	}
	m.markRestored(sb)
	m.restarted(cctx, sb)
	m.idle.touch(sb.ID)
	m.log.Info("sandbox rolled back", "sandbox", name, "snapshot", sn.Name)
	m.emit(ctx, api.EventRolledBack, sb, "to snapshot "+sn.Name)
	return sb, nil
}

// Fork makes count new sandboxes from a sandbox: from one of its
// snapshots (ref), or from an implicit snapshot of it now (ref empty).
// Each fork gets its own name (prefix-1, prefix-2...; prefix alone for one
// fork), ID, hostname, address and records; it inherits the source's
// limits, template and network policy.
func (m *Manager) Fork(ctx context.Context, name, ref string, count int, prefix string) (_ []*core.Sandbox, err error) {
	defer m.observe(opFork, time.Now(), &err)
	if err := core.ValidateName(name); err != nil {
		return nil, err
	}
	if count == 0 {
		count = 1
	}
	if count < 1 || count > MaxForks {
		return nil, errdefs.Invalid("count %d is out of range: fork 1 to %d sandboxes at a time", count, MaxForks)
	}
	if prefix == "" {
		prefix = name + "-fork"
	}
	names := []string{prefix}
	if count > 1 {
		names = names[:0]
		for i := 1; i <= count; i++ {
			names = append(names, fmt.Sprintf("%s-%d", prefix, i))
		}
	}
	for _, n := range names {
		if err := core.ValidateName(n); err != nil {
			return nil, fmt.Errorf("fork name: %w", err)
		}
	}
	cctx := context.WithoutCancel(ctx)
	// Room for them all in the caller's quotas, before anything is made
	// (each fork reserves its own again as it is made).
	if src, err := m.store.GetSandbox(ctx, name); err == nil {
		one := store.Usage{Sandboxes: 1, CPUs: src.CPUs, MemoryBytes: src.MemoryBytes, DiskBytes: m.diskOf(src)}
		all := store.Usage{Sandboxes: count, CPUs: one.CPUs * float64(count), MemoryBytes: one.MemoryBytes * int64(count), DiskBytes: one.DiskBytes * int64(count)}
		share, err := m.reserveQuota(ctx, tokenIDFrom(ctx), all, fmt.Sprintf("forking %d sandboxes", count))
		if err != nil {
			return nil, err
		}
		share.release()
	}
	// The source: take the snapshot (or find it) under its lock.
	unlock := m.lockName(name)
	src, err := m.store.GetSandbox(ctx, name)
	if err != nil {
		unlock()
		return nil, err
	}
	s, err := m.snapshotter(src)
	if err != nil {
		unlock()
		return nil, err
	}
	var sn *core.Snapshot
	if ref == "" {
		sn, err = m.snapshotLocked(cctx, src, fmt.Sprintf("fork-%d", time.Now().UnixMilli()))
	} else {
		sn, err = m.snapshotOf(ctx, src, ref)
	}
	unlock()
	if err != nil {
		return nil, err
	}
	b, _ := m.backend(src.Isolation)
	var pol *policy.Policy
	if m.net != nil {
		if st, ok := m.net.get(src.ID); ok {
			pol = &st.policy
		} else if def, err := m.createPolicy(api.CreateSandboxRequest{}); err == nil {
			pol = &def // a source without a network record: the default policy
		}
	}
	var out []*core.Sandbox
	for _, n := range names {
		sb, err := m.forkOne(cctx, b, s, src, sn, n, pol)
		if err != nil {
			return out, err
		}
		out = append(out, sb)
	}
	return out, nil
}

func (m *Manager) forkOne(ctx context.Context, b core.Backend, s core.Snapshotter, src *core.Sandbox, sn *core.Snapshot, name string, pol *policy.Policy) (*core.Sandbox, error) {
	unlock := m.lockName(name)
	defer unlock()
	if _, err := m.store.GetSandbox(ctx, name); err == nil {
		return nil, store.ErrNameTaken(name)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	// New placeholders for the bindings it inherits; the others' go.
	env, bound, ca, err := m.secrets.forkBindings(ctx, src)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	sb := &core.Sandbox{
		ID: newID(), Name: name, Template: src.Template, TemplateID: src.TemplateID, Isolation: src.Isolation,
		State: core.StateCreating, CPUs: src.CPUs, MemoryBytes: src.MemoryBytes, DiskBytes: m.diskOf(src), PidsLimit: src.PidsLimit,
		Env: env, Repo: src.Repo, CreatedAt: now, ExpiresAt: now.Add(src.ExpiresAt.Sub(src.CreatedAt)), IdlePause: src.IdlePause, OnExpire: src.OnExpire,
		Volumes: src.Volumes, // a fork mounts the same volumes (they are in no snapshot)
		Labels:  src.Labels,
		// A new identity: its own subject, its parent's line.
		Creator: creatorFrom(ctx), ParentID: src.ID, LineageID: lineageOf(src), IdentityAudience: src.IdentityAudience,
	}
	if sb.ExpiresAt.Before(now.Add(time.Minute)) {
		sb.ExpiresAt = now.Add(time.Hour)
	}
	// The caller's --max-ttl caps the TTL it inherits (quotas.go).
	ttl, err := m.capTTL(ctx, sb.ExpiresAt.Sub(now), false, "")
	if err != nil {
		return nil, err
	}
	sb.ExpiresAt = now.Add(ttl)
	room, err := m.limits.reserve(1, sb.MemoryBytes, "forking")
	if err != nil {
		return nil, err
	}
	defer room.release()
	share, err := m.reserveQuota(ctx, tokenIDFrom(ctx), store.Usage{Sandboxes: 1, CPUs: sb.CPUs, MemoryBytes: sb.MemoryBytes, DiskBytes: sb.DiskBytes}, "forking this sandbox")
	if err != nil {
		return nil, err
	}
	defer share.release()
	if err := m.linkIdempotent(ctx, idemFork, sb.ID); err != nil {
		return nil, err
	}
	// Its volumes must still be there when its record names them.
	m.volMu.RLock()
	err = m.volumesExist(sb.Volumes)
	if err == nil {
		err = m.insertSandbox(ctx, sb, room)
	}
	m.volMu.RUnlock()
	if err != nil {
		return nil, err
	}
	if err := m.recordOwner(ctx, share, sb.ID); err != nil {
		m.abandonCreate(ctx, b, sb)
		return nil, fmt.Errorf("fork %s: record its token: %w", name, err)
	}
	if len(bound) > 0 {
		err = m.secrets.record(ctx, sb.ID, bound, ca)
	}
	if err == nil {
		err = s.Fork(ctx, sb, sn.ID)
	}
	if err == nil && m.net != nil && pol != nil {
		// Forks inherit the policy, on an address of their own.
		err = m.net.setup(ctx, sb, *pol)
	}
	if err == nil {
		m.markRestored(sb)
		// Its parent's variables it does not have (the secret bindings
		// it did not inherit) go from its processes' environment.
		var unset []string
		for k := range src.Env {
			if _, ok := sb.Env[k]; !ok {
				unset = append(unset, k)
			}
		}
		err = m.configureAgentUnset(ctx, sb, false, unset)
	}
	if err == nil {
		err = m.store.SetSnapshotHead(ctx, sb.ID, sn.ID)
	}
	if err == nil {
		sb.State = core.StateRunning
		err = m.updateSandbox(ctx, sb)
	}
	if err != nil {
		m.abandonCreate(ctx, b, sb)
		return nil, fmt.Errorf("fork %s from %s: %w", name, sn.Name, err)
	}
	m.idle.touch(sb.ID)
	m.log.Info("sandbox forked", "sandbox", name, "from", src.Name, "snapshot", sn.Name)
	m.emit(ctx, api.EventForked, sb, "from "+src.Name+" at snapshot "+sn.Name) // under its lock: before any call on it
	return sb, nil
}

// SnapshotsUsage is the disk every recorded snapshot of a sandbox really
// uses (its own layers and memory), for inspect and info.
func (m *Manager) SnapshotsUsage(ctx context.Context, sandboxID string) int64 {
	var n int64
	list, err := m.store.ListSnapshots(ctx, sandboxID)
	if err != nil {
		return 0
	}
	for _, sn := range list {
		for _, b := range m.backends {
			if s, ok := b.(core.Snapshotter); ok {
				n += s.SnapshotUsage(sn.ID)
			}
		}
	}
	return n
}

// ParseForkSource splits NAME[:SNAPSHOT].
func ParseForkSource(s string) (name, snapshot string) {
	name, snapshot, _ = strings.Cut(s, ":")
	return name, snapshot
}
