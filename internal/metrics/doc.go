// Package metrics holds the daemon's Prometheus metrics, served at
// /metrics by `nook serve --metrics-listen ADDR` (plain HTTP, off by
// default). The page carries no secrets but names every sandbox: bind it
// to loopback or a private network. The metrics live in a registry of
// their own, never Prometheus's global one.
//
// Two kinds of figure:
//
//   - observed where they happen: the daemon's Manager reports each
//     operation's latency and error through daemon.Observer (Operation),
//     which Metrics implements, and its network hooks report refusals
//     (Denied: the kernel's NFLOG denials and the egress proxy's refused
//     connections, each counting the events its rate limit suppressed; the
//     resolver's refused queries);
//   - read at scrape time from a Source (the Manager): sandboxes by state
//     and backend, each sandbox's resources (the backends'
//     core.StatsReader and the network manager's interface counters, the
//     figures `nook stats` shows), the warm pools. A destroyed sandbox's
//     series go at the next scrape.
//
// Reading every sandbox costs the daemon work for each, and /metrics
// asks no token, so the reading is bounded: one reading serves every
// scrape within a second of it (scrapes that come while it is under way
// wait for it and share it, rather than each reading again), and it is
// given 10 seconds, the Source stopping between sandboxes when they are
// up (the scrape then reports an invalid nook_sandboxes and the rest).
// The API's stats (GET /v1/stats, `nook stats`) are bounded apart: at
// most 16 served at once, each stopping between sandboxes when its
// client goes.
//
// The metrics, with their labels:
//
//	nook_operation_duration_seconds{op}            histogram: create, exec (until the process started), pause, resume, snapshot, fork
//	nook_operation_errors_total{op,category}       counter: failures by the API's error code (invalid_argument, not_found, ..., internal)
//	nook_denied_connections_total{reason}          counter: connections the network policy refused (network.Reason*, egress.Reason*)
//	nook_dns_refusals_total{reason}                counter: DNS queries the sandboxes' resolver refused (dns.Reason*)
//	nook_sandboxes{state,isolation}                gauge: sandboxes by state and backend (every state and backend, 0 when none)
//	nook_sandbox_cpu_seconds_total{name,id,isolation}          counter: CPU time (a vm: its QEMU's)
//	nook_sandbox_memory_bytes{name,id,isolation}               gauge: memory its cgroup holds
//	nook_sandbox_memory_limit_bytes{name,id,isolation}         gauge
//	nook_sandbox_disk_bytes{name,id,isolation}                 gauge: space in use on its disk (a vm: its top disk layer on the host)
//	nook_sandbox_disk_limit_bytes{name,id,isolation}           gauge
//	nook_sandbox_network_receive_bytes_total{name,id,isolation}   counter
//	nook_sandbox_network_transmit_bytes_total{name,id,isolation}  counter
//	nook_sandbox_pids{name,id,isolation}                       gauge: a container's tasks (vms: 0)
//	nook_warm_pool_hits_total{isolation,key}       counter: creates that claimed a warm sandbox
//	nook_warm_pool_misses_total{isolation,key}     counter: creates that found none
//	nook_warm_pool_ready{isolation,key}            gauge
//	nook_warm_pool_target{isolation,key}           gauge
//
// plus the Go runtime's (go_*) and the daemon process's (process_*).
package metrics
