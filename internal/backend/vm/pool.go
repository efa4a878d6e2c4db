package vm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/procfs"
	"github.com/nookhq/nook/internal/warmpool"
)

var _ core.WarmPool = (*Backend)(nil)

// A warm vm is restored from its template's snapshot and has run one
// command, so that QEMU's translated-code cache already holds the agent's
// and the kernel's exec path (under TCG the first exec after a restore
// costs about 300 ms, later ones about 30 ms).
type warm = warmpool.Item[state]

// poolKey is a template build, a machine shape and an init: a warm vm
// fits only a sandbox of the same, which its snapshot fixed.
func poolKey(sb *core.Sandbox) string {
	return sb.TemplateID + "@" + strconv.FormatFloat(sb.CPUs, 'g', -1, 64) + "," + strconv.FormatInt(sb.MemoryBytes, 10) + "," + sb.Init
}

func parsePoolKey(key string) (*core.Sandbox, error) {
	tpl, shape, ok := strings.Cut(key, "@")
	parts := strings.Split(shape, ",")
	if !ok || len(parts) != 3 {
		return nil, fmt.Errorf("bad warm pool key %q", key)
	}
	c, err1 := strconv.ParseFloat(parts[0], 64)
	m, err2 := strconv.ParseInt(parts[1], 10, 64)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("bad warm pool key %q", key)
	}
	return &core.Sandbox{TemplateID: tpl, CPUs: c, MemoryBytes: m, Init: parts[2]}, nil
}

// newPool keeps size vms per key, whatever the demand: a warm vm holds its
// guest's RAM, so the pool does not grow after bursts, and it starts one
// vm at a time (a restore and its warm-up are heavy).
func newPool(b *Backend, size int) *warmpool.Pool[state] {
	return warmpool.New(warmpool.Options{Size: size, Parallel: 1, RefillDelay: warmpool.DefaultRefillDelay}, b.startWarm, b.Destroy, func(key string, err error) {
		b.cfg.Log.Warn("warm pool: could not start a vm", "key", key, "err", err)
	})
}

// TakeWarm implements core.WarmPool.
func (b *Backend) TakeWarm(sb *core.Sandbox) (string, bool) { return b.pool.Take(poolKey(sb)) }

// Prewarm implements core.WarmPool: only for a shape (a create's), since
// every shape has its own snapshot.
func (b *Backend) Prewarm(sb *core.Sandbox) {
	if sb.CPUs > 0 && sb.MemoryBytes > 0 && !b.cfg.ColdBoot {
		b.pool.Want(poolKey(sb))
	}
}

// Drain implements core.WarmPool.
func (b *Backend) Drain(ctx context.Context, template string) error {
	b.dropTemplateRAM(b.templateDir(template) + string(filepath.Separator))
	return b.pool.Drain(ctx, template+"/")
}

// Shutdown implements core.WarmPool.
func (b *Backend) Shutdown(ctx context.Context) error {
	err := b.pool.Shutdown(ctx)
	// The templates' RAM copies go too (each is the whole RAM of a
	// shape); running vms keep the copy they map, and a later start
	// makes one again.
	b.dropTemplateRAM("")
	return err
}

// WarmPools implements core.WarmPool.
func (b *Backend) WarmPools() []api.WarmPool { return b.pool.Report(b.Isolation()) }

func (b *Backend) startWarm(ctx context.Context, key string) (warm, error) {
	sb, err := parsePoolKey(key)
	if err != nil {
		return warm{}, err
	}
	rnd := make([]byte, 8)
	rand.Read(rnd)
	sb.ID = hex.EncodeToString(rnd)
	if err := b.createNew(ctx, sb); err != nil {
		return warm{}, err
	}
	if err := b.warmUp(ctx, sb.ID); err != nil {
		b.Destroy(context.WithoutCancel(ctx), sb.ID)
		return warm{}, err
	}
	var st state
	json.Unmarshal(sb.BackendState, &st)
	return warm{ID: sb.ID, Key: key, Val: st}, nil
}

// warmUp runs what a claim runs (configure, then a command) in a fresh
// vm, so that QEMU's translated-code cache holds those paths, and leaves
// a new agent connection open, its handshake done, for the daemon's
// first dial (DialAgent): a claim then costs no reconnect.
func (b *Backend) warmUp(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	sock := filepath.Join(b.dir(id), "agent.sock")
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return dialAgent(ctx, sock) })
	err := c.Configure(ctx, &agent.ConfigureRequest{Hostname: "nook-warm", TimeUnixNano: time.Now().UnixNano()})
	c.Close()
	if err != nil {
		return fmt.Errorf("warm up: %w", err)
	}
	if err := b.guestRun(ctx, id, "true"); err != nil {
		return fmt.Errorf("warm up: %w", err)
	}
	conn, err := dialAgent(ctx, sock)
	if err != nil {
		return fmt.Errorf("warm up: %w", err)
	}
	if old, loaded := b.ready.Swap(id, conn); loaded {
		old.(net.Conn).Close()
	}
	return nil
}

// guestRun runs a shell command in a vm through its agent (on a
// connection of its own, closed after) and fails unless it exits 0.
func (b *Backend) guestRun(ctx context.Context, id, script string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	_, stderr, code, err := guestOutput(ctx, filepath.Join(b.dir(id), "agent.sock"), script)
	if err == nil && code != 0 {
		err = fmt.Errorf("%s: exit %d: %s", script, code, strings.TrimSpace(stderr))
	}
	return err
}

// claim takes over a warm vm for a sandbox.
func (b *Backend) claim(w warm, sb *core.Sandbox) error {
	if w.Key != poolKey(sb) {
		return fmt.Errorf("warm vm %s is a %s, not a %s", w.ID, w.Key, poolKey(sb))
	}
	if procfs.StartTime(w.Val.PID) != w.Val.StartTime {
		return fmt.Errorf("warm vm %s is no longer running", w.ID)
	}
	sb.BackendState, _ = json.Marshal(w.Val)
	return nil
}
