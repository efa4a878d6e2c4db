package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/network/nettest"
	"github.com/nookhq/nook/internal/testutil"
	"github.com/nookhq/nook/sdk"
)

// The daemon's metrics and stats end to end, with sandbox networking (a
// daemon in a simulated host): a container sandbox burns CPU, holds
// memory, writes a file, talks to an allowed host and is refused a
// denied one and a denied name; /metrics, scraped as Prometheus does and
// parsed with its text parser, shows the sandbox's series, the
// operations' histograms and errors, the refusals and the warm pool, and
// drops the sandbox's series once it is destroyed; `nook stats` and the
// SDK's stream show the same figures.
func TestMetricsAndStats(t *testing.T) {
	w := newWorld(t)
	const addr = "127.0.0.1:9464" // in the simulated host's namespace
	d := newDaemonIn(t, w.hostPath(), netDaemonArgs("--metrics-listen", addr)...)
	scrape := func() map[string]*dto.MetricFamily {
		t.Helper()
		cl := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, a string) (net.Conn, error) {
				return nettest.DialNS(ctx, w.topo.Host, a, 5*time.Second)
			},
		}}
		defer cl.CloseIdleConnections()
		return testutil.ScrapeMetrics(t, cl, "http://"+addr+"/metrics")
	}

	d.must("create", "--name", "mx", "--allow", "allowed.test")
	// CPU, memory and a 20 MiB file.
	if r := d.sh("mx", `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; a=$(head -c 20000000 /dev/zero | tr '\0' x); echo ${#a}; dd if=/dev/zero of=/root/big bs=1M count=20 conv=fsync 2>/dev/null`); r.code != 0 || strings.TrimSpace(r.stdout) != "20000000" {
		t.Fatalf("exec: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	d.mustReach("mx", "http://allowed.test/", "allowed-web")
	d.mustRefuse("mx", "http://"+webDenied+"/", 7) // never resolved through nook: the kernel refuses it
	d.mustRefuse("mx", "http://denied.test/", 6)   // the resolver refuses the name
	if r, _ := d.nook("pause", "no-such-sandbox"); r.code == 0 {
		t.Fatal("nook pause of a missing sandbox succeeded")
	}

	find := func(fams map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	next:
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			return m
		}
		return nil
	}
	val := func(m *dto.Metric) float64 {
		if m == nil {
			return -1
		}
		return m.GetGauge().GetValue() + m.GetCounter().GetValue()
	}
	sum := func(fams map[string]*dto.MetricFamily, name string) float64 {
		var s float64
		for _, m := range fams[name].GetMetric() {
			s += val(m)
		}
		return s
	}

	mx := map[string]string{"name": "mx", "isolation": "container"}
	fams := scrape()
	for _, c := range []struct {
		metric string
		min    float64
	}{
		{"nook_sandbox_cpu_seconds_total", 0.01},
		{"nook_sandbox_memory_bytes", 1 << 20},
		{"nook_sandbox_memory_limit_bytes", 1 << 20},
		{"nook_sandbox_disk_bytes", 20 << 20},
		{"nook_sandbox_disk_limit_bytes", 64 << 20},
		{"nook_sandbox_network_receive_bytes_total", 100},
		{"nook_sandbox_network_transmit_bytes_total", 100},
		{"nook_sandbox_pids", 1},
	} {
		if got := val(find(fams, c.metric, mx)); got < c.min {
			t.Errorf("%s{name=mx} = %v, want at least %v", c.metric, got, c.min)
		}
	}
	if got := val(find(fams, "nook_sandboxes", map[string]string{"state": "running", "isolation": "container"})); got != 1 {
		t.Errorf("nook_sandboxes{running,container} = %v, want 1", got)
	}
	if got := val(find(fams, "nook_sandboxes", map[string]string{"state": "paused", "isolation": "vm"})); got != 0 {
		t.Errorf("nook_sandboxes{paused,vm} = %v, want 0", got)
	}
	hist := func(op string) uint64 {
		return find(fams, "nook_operation_duration_seconds", map[string]string{"op": op}).GetHistogram().GetSampleCount()
	}
	// One create; an exec for the work, and one per curl.
	if hist("create") != 1 || hist("exec") < 4 {
		t.Errorf("operation histograms counted %d creates and %d execs, want 1 and at least 4", hist("create"), hist("exec"))
	}
	if got := val(find(fams, "nook_operation_errors_total", map[string]string{"op": "pause", "category": api.CodeNotFound})); got != 1 {
		t.Errorf("nook_operation_errors_total{pause,not_found} = %v, want 1", got)
	}
	if got := sum(fams, "nook_warm_pool_hits_total") + sum(fams, "nook_warm_pool_misses_total"); got < 1 {
		t.Errorf("warm pool hits + misses = %v, want the create counted", got)
	}
	// The kernel's denials come through NFLOG, a moment later.
	waitWithin(t, "the refusals counted", 10*time.Second, func() bool {
		fams = scrape()
		return sum(fams, "nook_denied_connections_total") >= 1 && sum(fams, "nook_dns_refusals_total") >= 1
	})

	// nook stats: one sample, CPU over a second of a busy loop.
	pid := strings.TrimSpace(d.must("exec", "-d", "mx", "--", "sh", "-c", "while :; do :; done"))
	var sample []api.SandboxStats
	if err := json.Unmarshal([]byte(d.must("stats", "mx", "--no-stream", "--json")), &sample); err != nil {
		t.Fatal(err)
	}
	d.must("kill", "mx", pid, "-s", "KILL")
	if len(sample) != 1 {
		t.Fatalf("nook stats mx: %d samples", len(sample))
	}
	s := sample[0]
	t.Logf("nook stats mx: %+v", s)
	if s.Name != "mx" || s.State != api.StateRunning || s.CPUPercent < 5 || s.CPUSeconds <= 0 || s.MemoryBytes <= 0 || s.Pids < 2 ||
		s.DiskBytes < 20<<20 || s.NetRxBytes <= 0 || s.NetTxBytes <= 0 {
		t.Errorf("nook stats mx: %+v", s)
	}
	if out := d.must("stats", "--no-stream"); !strings.Contains(out, "CPU %") || !strings.Contains(out, "mx ") {
		t.Errorf("nook stats --no-stream:\n%s", out)
	}
	d.expectCLI(t, []cliCase{{args: []string{"stats", "nope", "--no-stream"}, code: 1, msg: "nope"}})

	// The SDK's stream: a sample a second.
	cl, err := sdk.New("unix://"+d.socket(), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []time.Time
	err = cl.StreamStats(ctx, "", func(st []api.SandboxStats) error {
		if len(st) != 1 || st[0].Name != "mx" {
			return fmt.Errorf("stream sample %+v", st)
		}
		if got = append(got, st[0].Time); len(got) == 2 {
			cancel()
		}
		return nil
	})
	if err != nil || len(got) != 2 || got[1].Sub(got[0]) < 500*time.Millisecond {
		t.Fatalf("stats stream: %v, samples at %v", err, got)
	}

	// A destroyed sandbox's series go.
	d.must("rm", "mx")
	fams = scrape()
	if m := find(fams, "nook_sandbox_memory_bytes", mx); m != nil {
		t.Errorf("mx is destroyed but /metrics still has its series: %v", m)
	}
	if got := val(find(fams, "nook_sandboxes", map[string]string{"state": "running", "isolation": "container"})); got != 0 {
		t.Errorf("nook_sandboxes{running,container} = %v after rm, want 0", got)
	}
}
