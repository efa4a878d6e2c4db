package daemon

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
)

// TestReapCost measures the reaper's tick with NOOK_REAP_COST=N idle
// containers (skipped without it): the whole reapOnce, the store's list,
// and the per-sandbox health check, each per sandbox.
func TestReapCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("NOOK_REAP_COST"))
	if n <= 0 {
		t.Skip("set NOOK_REAP_COST=N to measure the reaper with N idle containers")
	}
	m, _ := newManagerWith(t, func(c *Config) { c.WarmPool = -1 })
	ctx := context.Background()
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("idle-%d", i)
		if _, err := m.Create(ctx, api.CreateSandboxRequest{Name: name, Memory: "64M"}, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Destroy(ctx, name) })
		// NOOK_REAP_COST_STATE=paused or stopped measures those instead.
		switch os.Getenv("NOOK_REAP_COST_STATE") {
		case "paused":
			if _, err := m.Pause(ctx, name); err != nil {
				t.Fatal(err)
			}
		case "stopped":
			if _, err := m.Stop(ctx, name); err != nil {
				t.Fatal(err)
			}
		}
	}
	const rounds = 20
	m.reapOnce(ctx) // warm caches
	start := time.Now()
	for i := 0; i < rounds; i++ {
		m.reapOnce(ctx)
	}
	tick := time.Since(start) / rounds
	start = time.Now()
	for i := 0; i < rounds; i++ {
		if _, err := m.store.ListSandboxes(ctx); err != nil {
			t.Fatal(err)
		}
	}
	list := time.Since(start) / rounds
	sbs, _ := m.store.ListSandboxes(ctx)
	start = time.Now()
	for i := 0; i < rounds; i++ {
		for _, sb := range sbs {
			m.checkHealth(ctx, sb)
		}
	}
	full := time.Since(start) / rounds
	start = time.Now()
	fast := time.Duration(0)
	if lv, ok := m.backends[api.IsolationContainer].(core.Liveness); ok {
		for i := 0; i < rounds; i++ {
			for _, sb := range sbs {
				lv.Alive(sb)
			}
		}
		fast = time.Since(start) / rounds
	}
	per := func(d time.Duration) string { return fmt.Sprintf("%.1f µs", float64(d.Nanoseconds())/float64(n)/1e3) }
	t.Logf("%d idle containers (%s): reapOnce %v (%s per sandbox; at a 5 s interval %.2f%% of one core), ListSandboxes %v (%s per sandbox), checkHealth %s per sandbox, Alive %s per sandbox",
		n, cmp.Or(os.Getenv("NOOK_REAP_COST_STATE"), "running"), tick, per(tick), float64(tick)/float64(5*time.Second)*100, list, per(list), per(full), per(fast))
}
