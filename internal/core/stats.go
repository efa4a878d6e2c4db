package core

import "time"

// StatsReader is an optional Backend feature: what a sandbox uses on the
// host now, for `nook stats`, the API's stats and the daemon's metrics.
// ReadStats is cheap (a few small files; no lock, no agent): it is called
// for every sandbox at each metrics scrape and each second of a stats
// stream. A sandbox with nothing running (stopped, paused to disk) reads
// as zeros where nothing is held. The sandbox's network is the daemon's
// (internal/network), not the backend's: it is read there.
type StatsReader interface {
	ReadStats(sb *Sandbox) (Stats, error)
}

// Stats is what a sandbox uses, as its backend reads it.
type Stats struct {
	CPU         time.Duration // CPU time used so far, in every process of the sandbox (a vm: its QEMU)
	MemoryBytes int64         // memory held now (its cgroup's usage)
	DiskBytes   int64         // its disk's space in use
	DiskLimit   int64         // its disk's size (0: unlimited)
	Pids        int64         // processes (tasks) running now; 0 where the backend cannot see them
}
