package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nookhq/nook/api"
)

// Source is what the metrics read from the daemon at each scrape (the
// daemon's Manager).
type Source interface {
	// AllStats reads what every sandbox uses now.
	AllStats(ctx context.Context) ([]api.SandboxStats, error)
	// WarmPools reports every backend's warm pools.
	WarmPools() []api.WarmPool
}

// scrapeTimeout bounds the reading of a Source at one scrape.
const scrapeTimeout = 10 * time.Second

// readEvery is how long one reading of the Source serves: the scrapes
// within it (and those waiting on it) share it, so that scraping often,
// or many at once, does not read every sandbox each time.
const readEvery = time.Second

// Metrics holds the daemon's metrics in a registry of its own (not
// Prometheus's global one). Its Operation and Denied methods make it a
// daemon.Observer.
type Metrics struct {
	reg    *prometheus.Registry
	log    *slog.Logger
	ops    *prometheus.HistogramVec
	errs   *prometheus.CounterVec
	denied *prometheus.CounterVec
	dns    *prometheus.CounterVec
	now    func() time.Time // the clock of Watch's cache, replaceable in tests
}

// New makes the metrics, with the Go runtime's and the daemon process's.
func New(log *slog.Logger) *Metrics {
	if log == nil {
		log = slog.Default()
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		log: log,
		now: time.Now,
		ops: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nook_operation_duration_seconds",
			Help:    "How long sandbox operations took (create, exec: until the process started, pause, resume, snapshot, fork), failed ones included.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"op"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nook_operation_errors_total",
			Help: "Sandbox operations that failed, by operation and error category (the API's error codes; internal: none).",
		}, []string{"op", "category"}),
		denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nook_denied_connections_total",
			Help: "Connections from sandboxes the network policy refused (packets the kernel dropped, and connections the egress proxy refused), by reason.",
		}, []string{"reason"}),
		dns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nook_dns_refusals_total",
			Help: "DNS queries of sandboxes their resolver refused (or whose answers it dropped), by reason.",
		}, []string{"reason"}),
	}
	m.reg.MustRegister(m.ops, m.errs, m.denied, m.dns,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Operation records an operation's latency and, if category is not "",
// its failure (daemon.Observer).
func (m *Metrics) Operation(op string, d time.Duration, category string) {
	m.ops.WithLabelValues(op).Observe(d.Seconds())
	if category != "" {
		m.errs.WithLabelValues(op, category).Inc()
	}
}

// Denied counts n refusals of kind "connection" or "dns" (daemon.Observer).
func (m *Metrics) Denied(kind, reason string, n int) {
	switch kind {
	case "connection":
		m.denied.WithLabelValues(reason).Add(float64(n))
	case "dns":
		m.dns.WithLabelValues(reason).Add(float64(n))
	}
}

// Watch reads src at scrape time: sandboxes by state and backend, each
// sandbox's resources, the warm pools; one reading of the sandboxes
// serves every scrape within readEvery of it. Call it once.
func (m *Metrics) Watch(src Source) {
	m.reg.MustRegister(&sourceCollector{src: src, log: m.log, now: m.now})
}

// Gatherer is the registry, for tests.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

// Handler serves the metrics in Prometheus's text format (or
// OpenMetrics, as the scraper asks), on any path it is mounted at.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:          slog.NewLogLogger(m.log.Handler(), slog.LevelWarn),
		ErrorHandling:     promhttp.ContinueOnError,
		Registry:          m.reg,
		EnableOpenMetrics: true,
	})
}

// Mux serves Handler at /metrics and nothing else.
func (m *Metrics) Mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	return mux
}

// The states and backends every nook_sandboxes series is reported for
// (0 when none), so that a state's series does not come and go.
var (
	states   = []string{api.StateCreating, api.StateRunning, api.StatePaused, api.StateStopped, api.StateFailed, api.StateDestroying}
	backends = []string{api.IsolationContainer, api.IsolationVM}
)

var (
	sandboxLabels = []string{"name", "id", "isolation"}
	descSandboxes = prometheus.NewDesc("nook_sandboxes", "Sandboxes by state and backend.", []string{"state", "isolation"}, nil)
	descCPU       = prometheus.NewDesc("nook_sandbox_cpu_seconds_total", "CPU time a sandbox's processes (a vm's QEMU) used since it started on this host.", sandboxLabels, nil)
	descMem       = prometheus.NewDesc("nook_sandbox_memory_bytes", "Memory a sandbox's cgroup holds now.", sandboxLabels, nil)
	descMemLimit  = prometheus.NewDesc("nook_sandbox_memory_limit_bytes", "A sandbox's memory limit.", sandboxLabels, nil)
	descDisk      = prometheus.NewDesc("nook_sandbox_disk_bytes", "Space in use on a sandbox's disk (a container's filesystem; a vm's top disk layer on the host).", sandboxLabels, nil)
	descDiskLimit = prometheus.NewDesc("nook_sandbox_disk_limit_bytes", "A sandbox's disk size.", sandboxLabels, nil)
	descRx        = prometheus.NewDesc("nook_sandbox_network_receive_bytes_total", "Bytes a sandbox received on its network interface.", sandboxLabels, nil)
	descTx        = prometheus.NewDesc("nook_sandbox_network_transmit_bytes_total", "Bytes a sandbox sent on its network interface.", sandboxLabels, nil)
	descPids      = prometheus.NewDesc("nook_sandbox_pids", "Processes (tasks) in a container sandbox's cgroup (vms: not counted, 0).", sandboxLabels, nil)
	poolLabels    = []string{"isolation", "key"}
	descPoolHits  = prometheus.NewDesc("nook_warm_pool_hits_total", "Creates that found a warm sandbox in a pool, since the daemon started.", poolLabels, nil)
	descPoolMiss  = prometheus.NewDesc("nook_warm_pool_misses_total", "Creates that found no warm sandbox in a pool, since the daemon started.", poolLabels, nil)
	descPoolReady = prometheus.NewDesc("nook_warm_pool_ready", "Warm sandboxes ready to be claimed in a pool.", poolLabels, nil)
	descPoolTgt   = prometheus.NewDesc("nook_warm_pool_target", "Warm sandboxes a pool aims to keep ready.", poolLabels, nil)
)

// sourceCollector reports what a Source says at scrape time: a
// destroyed sandbox's series go with it.
type sourceCollector struct {
	src Source
	log *slog.Logger
	now func() time.Time

	mu    sync.Mutex // held while reading: concurrent scrapes wait and share
	at    time.Time  // when stats and err were read (zero: never)
	stats []api.SandboxStats
	err   error
}

// allStats reads the Source's sandboxes, or returns the last reading if
// it is less than readEvery old. The reading is bounded by
// scrapeTimeout (the Source stops between sandboxes when it ends).
func (c *sourceCollector) allStats() ([]api.SandboxStats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && c.now().Sub(c.at) < readEvery {
		return c.stats, c.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	c.stats, c.err = c.src.AllStats(ctx)
	c.at = c.now()
	return c.stats, c.err
}

func (c *sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSandboxes, descCPU, descMem, descMemLimit, descDisk, descDiskLimit, descRx, descTx, descPids, descPoolHits, descPoolMiss, descPoolReady, descPoolTgt} {
		ch <- d
	}
}

func (c *sourceCollector) Collect(ch chan<- prometheus.Metric) {
	stats, err := c.allStats()
	if err != nil {
		c.log.Warn("metrics: list sandboxes", "err", err)
		ch <- prometheus.NewInvalidMetric(descSandboxes, err)
	} else {
		counts := map[[2]string]int{}
		for _, iso := range backends {
			for _, st := range states {
				counts[[2]string{st, iso}] = 0
			}
		}
		for _, s := range stats {
			counts[[2]string{s.State, s.Isolation}]++
			l := []string{s.Name, s.ID, s.Isolation}
			ch <- prometheus.MustNewConstMetric(descCPU, prometheus.CounterValue, s.CPUSeconds, l...)
			ch <- prometheus.MustNewConstMetric(descMem, prometheus.GaugeValue, float64(s.MemoryBytes), l...)
			ch <- prometheus.MustNewConstMetric(descMemLimit, prometheus.GaugeValue, float64(s.MemoryLimitBytes), l...)
			ch <- prometheus.MustNewConstMetric(descDisk, prometheus.GaugeValue, float64(s.DiskBytes), l...)
			ch <- prometheus.MustNewConstMetric(descDiskLimit, prometheus.GaugeValue, float64(s.DiskLimitBytes), l...)
			ch <- prometheus.MustNewConstMetric(descRx, prometheus.CounterValue, float64(s.NetRxBytes), l...)
			ch <- prometheus.MustNewConstMetric(descTx, prometheus.CounterValue, float64(s.NetTxBytes), l...)
			ch <- prometheus.MustNewConstMetric(descPids, prometheus.GaugeValue, float64(s.Pids), l...)
		}
		for k, n := range counts {
			ch <- prometheus.MustNewConstMetric(descSandboxes, prometheus.GaugeValue, float64(n), k[0], k[1])
		}
	}
	for _, p := range c.src.WarmPools() {
		l := []string{p.Isolation, p.Key}
		ch <- prometheus.MustNewConstMetric(descPoolHits, prometheus.CounterValue, float64(p.Hits), l...)
		ch <- prometheus.MustNewConstMetric(descPoolMiss, prometheus.CounterValue, float64(p.Misses), l...)
		ch <- prometheus.MustNewConstMetric(descPoolReady, prometheus.GaugeValue, float64(p.Ready), l...)
		ch <- prometheus.MustNewConstMetric(descPoolTgt, prometheus.GaugeValue, float64(p.Target), l...)
	}
}
