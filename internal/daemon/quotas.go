package daemon

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/store"
)

// Token quotas (nook token create --max-sandboxes, --max-cpus,
// --max-memory, --max-disk, --max-snapshots, --max-ttl): a request that
// would take a token over one is refused (errdefs.ErrLimit, HTTP 429),
// saying what is in use and what is allowed.
//
// What counts against a token is the sandboxes recorded as its (the
// store's sandbox_owners, by token ID: a token made again under the same
// name starts from nothing), in any state (a stopped sandbox can be
// started at any time, so it keeps its share), with their CPUs, memory
// and disk as created, and their snapshots. A create or fork counts
// against the token that asks; a snapshot against the token that owns the
// sandbox. A sandbox made without a token (the host's Unix socket) counts
// against none. The use is read from the store at each check, plus what
// requests under way have reserved: check and reserve happen under one
// mutex, so parallel requests of one token never go over together, and a
// reservation becomes the record's (the sandbox's owner row, the snapshot
// row is written) under the same mutex, so nothing is counted twice.
//
// A refusal names the token and its figures only to the token itself; a
// caller charged on another token's behalf (a snapshot of a sandbox it
// does not own, a fork's implicit snapshot) is told only which quota the
// sandbox's owner has reached.
//
// --max-ttl caps the time a sandbox has left, whenever it is set (capTTL):
// a create, `nook ttl` or E2B timeout asking for more is refused; a
// create without a TTL, or a fork (which inherits its source's), gets at
// most --max-ttl. Both the caller's and the sandbox owner's cap hold.
//
// What counts is what the sandbox gets: a create without --disk counts
// the backend's default disk (Capabilities.DefaultDiskBytes). Volumes
// (nook volume create) belong to no token and count against none. The
// daemon's own sandboxes (a Dockerfile build's RUN steps) are made
// without the caller's token: they count against no quota, and only the
// host's limits hold them.
type quotaLedger struct {
	mu      sync.Mutex
	pending map[string]store.Usage // by token ID: reserved, not yet recorded
}

func newQuotaLedger() *quotaLedger {
	return &quotaLedger{pending: map[string]store.Usage{}}
}

// quotaReservation is room a request under way took in a token's quotas;
// nil holds nothing (the host's requests; a token without quotas still
// gets one, so that its sandboxes are recorded as its).
type quotaReservation struct {
	q     *quotaLedger
	token string
	u     store.Usage
	done  bool
}

func addUsage(a, b store.Usage, sign int) store.Usage {
	s := float64(sign)
	return store.Usage{
		Sandboxes:   a.Sandboxes + sign*b.Sandboxes,
		CPUs:        a.CPUs + s*b.CPUs,
		MemoryBytes: a.MemoryBytes + int64(sign)*b.MemoryBytes,
		DiskBytes:   a.DiskBytes + int64(sign)*b.DiskBytes,
		Snapshots:   a.Snapshots + sign*b.Snapshots,
	}
}

// reserveQuota takes room for add in token's quotas, or refuses with an
// ErrLimit naming the quota and the figures. what says what the request
// does ("creating this sandbox"). token "" (no token) reserves nothing.
func (m *Manager) reserveQuota(ctx context.Context, token string, add store.Usage, what string) (*quotaReservation, error) {
	if token == "" {
		return nil, nil
	}
	q := m.quotas
	q.mu.Lock()
	defer q.mu.Unlock()
	lim, err := m.store.TokenQuotas(ctx, token)
	if err != nil {
		return nil, err
	}
	if !lim.IsZero() {
		used, err := m.store.TokenUsage(ctx, token)
		if err != nil {
			return nil, err
		}
		used = addUsage(used, q.pending[token], 1)
		if flag, detail := overQuota(lim, used, add, what); flag != "" {
			if token != tokenIDFrom(ctx) {
				// Charged to another token (a snapshot of its sandbox):
				// neither its name nor its figures are the caller's to see.
				return nil, errdefs.Limit("the sandbox's owner has reached its %s quota", flag)
			}
			return nil, errdefs.Limit("token %s: %s", m.tokenName(ctx, token), detail)
		}
	}
	q.pending[token] = addUsage(q.pending[token], add, 1)
	return &quotaReservation{q: q, token: token, u: add}, nil
}

// overQuota says which quota used+add would go over, if any: its flag
// (--max-snapshots) and what is in use and allowed.
func overQuota(lim store.Quotas, used, add store.Usage, what string) (flag, detail string) {
	const eps = 1e-9
	switch {
	case add.Sandboxes > 1 && lim.MaxSandboxes > 0 && used.Sandboxes+add.Sandboxes > lim.MaxSandboxes:
		return "--max-sandboxes", fmt.Sprintf("%d of %d sandboxes in use; %s needs %d (--max-sandboxes %d)", used.Sandboxes, lim.MaxSandboxes, what, add.Sandboxes, lim.MaxSandboxes)
	case add.Sandboxes > 0 && lim.MaxSandboxes > 0 && used.Sandboxes+add.Sandboxes > lim.MaxSandboxes:
		return "--max-sandboxes", fmt.Sprintf("%d of %d sandboxes in use (--max-sandboxes %d)", used.Sandboxes, lim.MaxSandboxes, lim.MaxSandboxes)
	case add.CPUs > 0 && lim.MaxCPUs > 0 && used.CPUs+add.CPUs > lim.MaxCPUs+eps:
		return "--max-cpus", fmt.Sprintf("%s of %s cpus in use; %s needs %s more (--max-cpus %s)",
			fmtCPUs(used.CPUs), fmtCPUs(lim.MaxCPUs), what, fmtCPUs(add.CPUs), fmtCPUs(lim.MaxCPUs))
	case add.MemoryBytes > 0 && lim.MaxMemory > 0 && used.MemoryBytes+add.MemoryBytes > lim.MaxMemory:
		return "--max-memory", fmt.Sprintf("%s of %s memory in use; %s needs %s more (--max-memory %s)",
			core.FormatBytes(used.MemoryBytes), core.FormatBytes(lim.MaxMemory), what, core.FormatBytes(add.MemoryBytes), core.FormatBytes(lim.MaxMemory))
	case add.DiskBytes > 0 && lim.MaxDisk > 0 && used.DiskBytes+add.DiskBytes > lim.MaxDisk:
		return "--max-disk", fmt.Sprintf("%s of %s disk in use; %s needs %s more (--max-disk %s)",
			core.FormatBytes(used.DiskBytes), core.FormatBytes(lim.MaxDisk), what, core.FormatBytes(add.DiskBytes), core.FormatBytes(lim.MaxDisk))
	case add.Snapshots > 0 && lim.MaxSnapshots > 0 && used.Snapshots+add.Snapshots > lim.MaxSnapshots:
		return "--max-snapshots", fmt.Sprintf("%d of %d snapshots in use (--max-snapshots %d)", used.Snapshots, lim.MaxSnapshots, lim.MaxSnapshots)
	}
	return "", ""
}

func fmtCPUs(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// commit runs record (which writes what makes the reserved room count in
// the store) and ends r in the same step; with r nil it only runs record.
func (r *quotaReservation) commit(record func() error) error {
	if r == nil {
		return record()
	}
	r.q.mu.Lock()
	defer r.q.mu.Unlock()
	err := record()
	if err == nil {
		r.releaseLocked()
	}
	return err
}

func (r *quotaReservation) releaseLocked() {
	if r.done {
		return
	}
	r.done = true
	if p := addUsage(r.q.pending[r.token], r.u, -1); p == (store.Usage{}) {
		delete(r.q.pending, r.token)
	} else {
		r.q.pending[r.token] = p
	}
}

// release gives back the room of a request that failed; after a commit
// it does nothing.
func (r *quotaReservation) release() {
	if r == nil {
		return
	}
	r.q.mu.Lock()
	defer r.q.mu.Unlock()
	r.releaseLocked()
}

// recordOwner records sandbox id as r's token's, ending r.
func (m *Manager) recordOwner(ctx context.Context, r *quotaReservation, id string) error {
	if r == nil {
		return nil
	}
	return r.commit(func() error { return m.store.SetSandboxOwner(ctx, id, r.token) })
}

// diskOf is the disk a sandbox has: its own size, or, for a record that
// names none (a vm made before its backend stated its default), its
// backend's default, which is what it got. A fork inherits this, and
// it is what the fork counts against a quota.
func (m *Manager) diskOf(sb *core.Sandbox) int64 {
	if sb.DiskBytes > 0 {
		return sb.DiskBytes
	}
	if b, err := m.backend(sb.Isolation); err == nil {
		return b.Capabilities().DefaultDiskBytes
	}
	return 0
}

// capTTL applies --max-ttl to a TTL that ctx's caller sets on a
// sandbox that counts against owner ("": none, or the caller itself, as
// for a create or fork): the smaller of the caller's and the owner's, so
// the owner's cap holds whoever asks. A TTL the caller gave over it is
// refused, a default one is lowered to it. --max-ttl caps the time left
// from now, not the lifetime since creation: an allowed caller may
// extend a sandbox again and again (TTLs are extendable by design).
func (m *Manager) capTTL(ctx context.Context, ttl time.Duration, given bool, owner string) (time.Duration, error) {
	caller := tokenIDFrom(ctx)
	if owner == caller {
		owner = ""
	}
	var limit time.Duration
	var by string
	for _, token := range []string{caller, owner} {
		if token == "" {
			continue
		}
		lim, err := m.store.TokenQuotas(ctx, token)
		if err != nil {
			return 0, err
		}
		if lim.MaxTTL > 0 && (limit == 0 || lim.MaxTTL < limit) {
			limit, by = lim.MaxTTL, token
		}
	}
	switch {
	case limit == 0 || ttl <= limit:
		return ttl, nil
	case !given:
		return limit, nil
	case by != caller:
		// The owner's cap: neither its name nor its figure are the
		// caller's to see.
		return 0, errdefs.Limit("ttl %s is over the --max-ttl of the sandbox's owner", core.FormatDuration(ttl))
	}
	return 0, errdefs.Limit("token %s: ttl %s is over its --max-ttl %s", m.tokenName(ctx, caller), core.FormatDuration(ttl), core.FormatDuration(limit))
}

// tokenName is a token's name, else its ID.
func (m *Manager) tokenName(ctx context.Context, id string) string {
	if id == tokenIDFrom(ctx) {
		if c := creatorFrom(ctx); c != "host" {
			return c
		}
	}
	ts, _ := m.store.ListTokens(ctx)
	for _, t := range ts {
		if t.ID == id && t.Name != "" {
			return t.Name
		}
	}
	return id
}

// parseQuotas checks a token's quotas as the API gives them.
func parseQuotas(q *api.TokenQuotas) (store.Quotas, error) {
	var out store.Quotas
	if q == nil {
		return out, nil
	}
	if q.MaxSandboxes < 0 || q.MaxCPUs < 0 || q.MaxSnapshots < 0 {
		return out, errdefs.Invalid("token quotas cannot be negative (0: no limit)")
	}
	out.MaxSandboxes, out.MaxCPUs, out.MaxSnapshots = q.MaxSandboxes, q.MaxCPUs, q.MaxSnapshots
	var err error
	if q.MaxMemory != "" {
		if out.MaxMemory, err = core.ParseSize(q.MaxMemory); err != nil {
			return out, fmt.Errorf("max memory: %w", err)
		}
	}
	if q.MaxDisk != "" {
		if out.MaxDisk, err = core.ParseSize(q.MaxDisk); err != nil {
			return out, fmt.Errorf("max disk: %w", err)
		}
	}
	if q.MaxTTL != "" {
		if out.MaxTTL, err = core.ValidateTTL(q.MaxTTL); err != nil {
			return out, fmt.Errorf("max %w", err)
		}
	}
	return out, nil
}

// quotasView is the API's form of a token's quotas (nil: none).
func quotasView(q store.Quotas) *api.TokenQuotas {
	if q.IsZero() {
		return nil
	}
	out := &api.TokenQuotas{MaxSandboxes: q.MaxSandboxes, MaxCPUs: q.MaxCPUs, MaxSnapshots: q.MaxSnapshots}
	if q.MaxMemory > 0 {
		out.MaxMemory = core.FormatBytes(q.MaxMemory)
	}
	if q.MaxDisk > 0 {
		out.MaxDisk = core.FormatBytes(q.MaxDisk)
	}
	if q.MaxTTL > 0 {
		out.MaxTTL = core.FormatDuration(q.MaxTTL)
	}
	return out
}

func usageView(u store.Usage) *api.TokenUsage {
	return &api.TokenUsage{Sandboxes: u.Sandboxes, CPUs: u.CPUs, MemoryBytes: u.MemoryBytes, DiskBytes: u.DiskBytes, Snapshots: u.Snapshots}
}
