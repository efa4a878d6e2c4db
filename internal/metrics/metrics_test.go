package metrics

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/poll"
	"github.com/nookhq/nook/internal/testutil"
)

type fakeSource struct {
	mu    sync.Mutex
	stats []api.SandboxStats
	pools []api.WarmPool
	err   error
	reads int           // AllStats calls
	slow  chan struct{} // if set, AllStats waits for it to close
}

func (f *fakeSource) AllStats(context.Context) ([]api.SandboxStats, error) {
	f.mu.Lock()
	f.reads++
	slow := f.slow
	f.mu.Unlock()
	if slow != nil {
		<-slow
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]api.SandboxStats(nil), f.stats...), f.err
}

// clock is a settable time for the collector's cache.
// serveMetrics serves the metrics of src on a test server, with a clock
// the test moves.
func serveMetrics(t *testing.T, src *fakeSource) (*Metrics, *clock, *httptest.Server) {
	t.Helper()
	m := New(nil)
	clk := &clock{t: time.Now()}
	m.now = clk.now
	m.Watch(src)
	srv := httptest.NewServer(m.Mux())
	t.Cleanup(srv.Close)
	return m, clk, srv
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func (f *fakeSource) WarmPools() []api.WarmPool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pools
}

// scrape fetches /metrics as a Prometheus server would and parses it
// with Prometheus's text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	return testutil.ScrapeMetrics(t, http.DefaultClient, url+"/metrics")
}

// find returns the metric of family name whose labels include want, or nil.
func find(fams map[string]*dto.MetricFamily, name string, want map[string]string) *dto.Metric {
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	return nil
}

func value(m *dto.Metric) float64 {
	switch {
	case m == nil:
		return -1
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	return -1
}

func TestMetrics(t *testing.T) {
	src := &fakeSource{
		stats: []api.SandboxStats{
			{Name: "a", ID: "id-a", State: api.StateRunning, Isolation: api.IsolationContainer, CPUSeconds: 1.5, MemoryBytes: 1 << 20, MemoryLimitBytes: 1 << 30,
				DiskBytes: 4096, DiskLimitBytes: 1 << 30, NetRxBytes: 10, NetTxBytes: 20, Pids: 3},
			{Name: "b", ID: "id-b", State: api.StatePaused, Isolation: api.IsolationVM},
		},
		pools: []api.WarmPool{{Isolation: api.IsolationContainer, Key: "base@1", Ready: 2, Target: 2, Hits: 5, Misses: 1}},
	}
	m, clk, srv := serveMetrics(t, src)

	m.Operation("create", 200*time.Millisecond, "")
	m.Operation("create", 3*time.Second, api.CodeLimitReached)
	m.Operation("exec", 10*time.Millisecond, "")
	m.Denied("connection", "private", 3)
	m.Denied("dns", "not-allowed", 1)
	m.Denied("dns", "not-allowed", 2)

	fams := scrape(t, srv.URL)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"nook_sandboxes", map[string]string{"state": "running", "isolation": "container"}, 1},
		{"nook_sandboxes", map[string]string{"state": "paused", "isolation": "vm"}, 1},
		{"nook_sandboxes", map[string]string{"state": "failed", "isolation": "container"}, 0},
		{"nook_sandbox_cpu_seconds_total", map[string]string{"name": "a", "id": "id-a", "isolation": "container"}, 1.5},
		{"nook_sandbox_memory_bytes", map[string]string{"name": "a"}, 1 << 20},
		{"nook_sandbox_memory_limit_bytes", map[string]string{"name": "a"}, 1 << 30},
		{"nook_sandbox_disk_bytes", map[string]string{"name": "a"}, 4096},
		{"nook_sandbox_disk_limit_bytes", map[string]string{"name": "a"}, 1 << 30},
		{"nook_sandbox_network_receive_bytes_total", map[string]string{"name": "a"}, 10},
		{"nook_sandbox_network_transmit_bytes_total", map[string]string{"name": "a"}, 20},
		{"nook_sandbox_pids", map[string]string{"name": "a"}, 3},
		{"nook_sandbox_pids", map[string]string{"name": "b", "isolation": "vm"}, 0},
		{"nook_operation_errors_total", map[string]string{"op": "create", "category": api.CodeLimitReached}, 1},
		{"nook_denied_connections_total", map[string]string{"reason": "private"}, 3},
		{"nook_dns_refusals_total", map[string]string{"reason": "not-allowed"}, 3},
		{"nook_warm_pool_hits_total", map[string]string{"isolation": "container", "key": "base@1"}, 5},
		{"nook_warm_pool_misses_total", map[string]string{"key": "base@1"}, 1},
		{"nook_warm_pool_ready", map[string]string{"key": "base@1"}, 2},
		{"nook_warm_pool_target", map[string]string{"key": "base@1"}, 2},
	} {
		if got := value(find(fams, c.name, c.labels)); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n := len(fams["nook_sandboxes"].GetMetric()); n != len(states)*len(backends) {
		t.Errorf("nook_sandboxes has %d series, want one per state and backend (%d)", n, len(states)*len(backends))
	}
	h := find(fams, "nook_operation_duration_seconds", map[string]string{"op": "create"}).GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() < 3.2 || h.GetSampleSum() > 3.21 {
		t.Errorf("create histogram: count %d sum %v, want 2 and 3.2", h.GetSampleCount(), h.GetSampleSum())
	}
	if h := find(fams, "nook_operation_duration_seconds", map[string]string{"op": "exec"}).GetHistogram(); h.GetSampleCount() != 1 {
		t.Errorf("exec histogram counted %d, want 1", h.GetSampleCount())
	}
	if fams["go_goroutines"] == nil || fams["process_cpu_seconds_total"] == nil {
		t.Error("the Go runtime's and the process's metrics are missing")
	}

	// A destroyed sandbox's series go with it.
	src.mu.Lock()
	src.stats = src.stats[:1]
	src.mu.Unlock()
	clk.add(readEvery)
	fams = scrape(t, srv.URL)
	if m := find(fams, "nook_sandbox_memory_bytes", map[string]string{"name": "b"}); m != nil {
		t.Errorf("sandbox b is gone but its series is still served: %v", m)
	}
	if got := value(find(fams, "nook_sandboxes", map[string]string{"state": "paused", "isolation": "vm"})); got != 0 {
		t.Errorf("paused vms = %v after b went, want 0", got)
	}

	// A failing source leaves the other metrics served.
	src.mu.Lock()
	src.err = errors.New("database is closed")
	src.mu.Unlock()
	clk.add(readEvery)
	fams = scrape(t, srv.URL)
	if fams["nook_sandboxes"] != nil || fams["nook_operation_duration_seconds"] == nil {
		t.Errorf("with a failing source: sandboxes served %v, operations served %v; want none and some",
			fams["nook_sandboxes"] != nil, fams["nook_operation_duration_seconds"] != nil)
	}
}

func TestOnlyMetricsPath(t *testing.T) {
	srv := httptest.NewServer(New(nil).Mux())
	defer srv.Close()
	for _, path := range []string{"/", "/v1/info", "/metrics/x"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %s, want 404", path, resp.Status)
		}
	}
}

// Scrapes within readEvery of a reading share it, those at once too:
// the sandboxes are read once, not once a scrape.
func TestScrapesShareReading(t *testing.T) {
	src := &fakeSource{stats: []api.SandboxStats{{Name: "a", ID: "id-a", State: api.StateRunning, Isolation: api.IsolationContainer, MemoryBytes: 7}}}
	_, clk, srv := serveMetrics(t, src)
	reads := func() int {
		src.mu.Lock()
		defer src.mu.Unlock()
		return src.reads
	}

	// Four scrapes at once, the reading held up until all have come.
	src.slow = make(chan struct{})
	var wg sync.WaitGroup
	results := make(chan string, 4)
	for range 4 {
		wg.Go(func() { // no t.Fatal off the test's goroutine
			resp, err := http.Get(srv.URL + "/metrics")
			if err != nil {
				results <- err.Error()
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			results <- string(b)
		})
	}
	if err := poll.Until(context.Background(), poll.Options{Timeout: 10 * time.Second}, func() (bool, error) { return reads() > 0, nil }); err != nil {
		t.Fatalf("no scrape read the sandboxes: %v", err)
	}
	close(src.slow)
	wg.Wait()
	close(results)
	for page := range results {
		if !strings.Contains(page, `nook_sandbox_memory_bytes{id="id-a",isolation="container",name="a"} 7`+"\n") {
			t.Errorf("a scrape served no memory 7 for a:\n%.500s", page)
		}
	}
	if n := reads(); n != 1 {
		t.Errorf("4 scrapes at once read the sandboxes %d times, want 1", n)
	}
	scrape(t, srv.URL)
	if n := reads(); n != 1 {
		t.Errorf("a scrape within %v of the reading read again (%d reads)", readEvery, n)
	}
	clk.add(readEvery)
	scrape(t, srv.URL)
	if n := reads(); n != 2 {
		t.Errorf("a scrape %v after the reading: %d reads, want 2", readEvery, n)
	}
}
