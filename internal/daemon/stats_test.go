package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/store"
)

// halfBusy is a backend whose one sandbox uses half a CPU, by the clock.
type halfBusy struct {
	core.Backend // only ReadStats is called
	start        time.Time
}

func (b *halfBusy) ReadStats(sb *core.Sandbox) (core.Stats, error) {
	return core.Stats{CPU: time.Since(b.start) / 2, MemoryBytes: 5 << 20, DiskBytes: 1 << 20, DiskLimit: 1 << 30, Pids: 3}, nil
}

func TestSampleStats(t *testing.T) {
	m := &Manager{log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		backends: map[string]core.Backend{api.IsolationContainer: &halfBusy{start: time.Now()}}}
	sb := &core.Sandbox{ID: "id1", Name: "one", Isolation: api.IsolationContainer, State: core.StateRunning, CPUs: 2, MemoryBytes: 1 << 30}
	list := func(context.Context) ([]*core.Sandbox, error) { return []*core.Sandbox{sb}, nil }

	var samples [][]api.SandboxStats
	start := time.Now()
	err := m.SampleStats(context.Background(), list, 100*time.Millisecond, true, func(s []api.SandboxStats) error {
		samples = append(samples, s)
		return nil
	})
	if err != nil || len(samples) != 1 || len(samples[0]) != 1 {
		t.Fatalf("once: %v, %d samples", err, len(samples))
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("one sample came after %v: CPU needs an interval", d)
	}
	s := samples[0][0]
	if math.Abs(s.CPUPercent-50) > 5 {
		t.Errorf("cpu_percent %.1f, want 50", s.CPUPercent)
	}
	if s.Name != "one" || s.ID != "id1" || s.State != api.StateRunning || s.CPUs != 2 || s.MemoryBytes != 5<<20 || s.MemoryLimitBytes != 1<<30 ||
		s.DiskBytes != 1<<20 || s.DiskLimitBytes != 1<<30 || s.Pids != 3 || s.CPUSeconds <= 0 {
		t.Errorf("sample %+v", s)
	}

	// A stream goes on until emit fails, and ends with the context.
	stop := errors.New("enough")
	n := 0
	err = m.SampleStats(context.Background(), list, 10*time.Millisecond, false, func([]api.SandboxStats) error {
		if n++; n == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || n != 3 {
		t.Errorf("stream: %v after %d samples, want the emit's error after 3", err, n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.SampleStats(ctx, list, time.Hour, false, func([]api.SandboxStats) error { return nil }); err != nil {
		t.Errorf("stream with its context done: %v", err)
	}
	gone := errdefs.NotFound("sandbox one not found")
	if err := m.SampleStats(context.Background(), func(context.Context) ([]*core.Sandbox, error) { return nil, gone }, time.Millisecond, true,
		func([]api.SandboxStats) error { return nil }); !errors.Is(err, gone) {
		t.Errorf("stream of a sandbox gone: %v", err)
	}
}

type recordingObserver struct {
	mu  sync.Mutex
	ops []string
}

func (o *recordingObserver) Operation(op string, d time.Duration, category string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ops = append(o.ops, op+":"+category)
}

func (o *recordingObserver) Denied(kind, reason string, n int) {}

func TestObserveCategories(t *testing.T) {
	obs := &recordingObserver{}
	m := &Manager{cfg: Config{Observer: obs}}
	for _, err := range []error{
		nil,
		fmt.Errorf("create: %w", errdefs.Limit("too many")),
		errdefs.NotFound("no sandbox x"),
		context.DeadlineExceeded,
		errors.New("disk on fire"),
	} {
		m.observe(opCreate, time.Now(), &err)
	}
	want := []string{"create:", "create:" + api.CodeLimitReached, "create:" + api.CodeNotFound, "create:" + api.CodeUnavailable, "create:internal"}
	if fmt.Sprint(obs.ops) != fmt.Sprint(want) {
		t.Errorf("observed %v, want %v", obs.ops, want)
	}
	// No observer: nothing to do, nothing breaks.
	var err error
	(&Manager{}).observe(opExec, time.Now(), &err)
}

// cancelling is a backend whose ReadStats ends a context after reading
// a given number of sandboxes, counting its reads.
type cancelling struct {
	core.Backend // only ReadStats is called
	after        int
	cancel       context.CancelFunc
	mu           sync.Mutex
	reads        int
}

func (b *cancelling) ReadStats(*core.Sandbox) (core.Stats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reads++; b.reads == b.after {
		b.cancel()
	}
	return core.Stats{}, nil
}

// A sample stops between sandboxes once its context ends (the client
// went, the scrape timed out): it does not read the rest.
func TestStatsStopWithContext(t *testing.T) {
	var sbs []*core.Sandbox
	for i := range 50 {
		sbs = append(sbs, &core.Sandbox{ID: fmt.Sprint("id", i), Name: fmt.Sprint("s", i), Isolation: api.IsolationContainer})
	}
	list := func(context.Context) ([]*core.Sandbox, error) { return sbs, nil }

	ctx, cancel := context.WithCancel(context.Background())
	b := &cancelling{after: 3, cancel: cancel}
	m := &Manager{log: slog.New(slog.DiscardHandler), backends: map[string]core.Backend{api.IsolationContainer: b}}
	emitted := false
	err := m.SampleStats(ctx, list, time.Hour, true, func([]api.SandboxStats) error { emitted = true; return nil })
	if err != nil || emitted || b.reads != 3 {
		t.Errorf("SampleStats with its context ended after 3 sandboxes: %v, emitted %v, %d read; want nil, nothing, 3", err, emitted, b.reads)
	}

	// AllStats (the metrics' reading) stops as well, with the context's error.
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "nook.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, sb := range sbs {
		sb.State = core.StateRunning
		if err := st.InsertSandbox(context.Background(), sb); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel = context.WithCancel(context.Background())
	b = &cancelling{after: 5, cancel: cancel}
	m = &Manager{store: st, log: slog.New(slog.DiscardHandler), backends: map[string]core.Backend{api.IsolationContainer: b}}
	out, err := m.AllStats(ctx)
	if !errors.Is(err, context.Canceled) || out != nil || b.reads != 5 {
		t.Errorf("AllStats with its context ended after 5 sandboxes: %d stats, %v, %d read; want none, canceled, 5", len(out), err, b.reads)
	}
}
