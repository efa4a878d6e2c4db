// Command nook-bench prints nook's performance figures beside baselines
// measured in the same run (make bench).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nookhq/nook/internal/bench"
)

func main() {
	var cfg bench.Config
	flag.IntVar(&cfg.Creates, "creates", 30, "sandboxes to create (at least 20)")
	flag.IntVar(&cfg.Execs, "execs", 300, "exec round trips")
	flag.StringVar(&cfg.AgentBinary, "agent", "bin/nook-agent", "nook-agent binary")
	flag.StringVar(&cfg.TemplatesDir, "templates-dir", "/var/lib/nook/templates", "template store")
	flag.StringVar(&cfg.VMCacheDir, "vm-cache-dir", "/var/lib/nook/vm", "vm guest kernel, template images and snapshots")
	flag.BoolVar(&cfg.VM, "vm", true, "also measure the vm backend (QEMU)")
	flag.BoolVar(&cfg.OnlyVM, "only-vm", false, "measure only the vm backend")
	flag.BoolVar(&cfg.OnlyVMShape, "only-vm-shape", false, "measure only vms at the default shape (snapshot, pause, fork) and systemd against agent init")
	flag.BoolVar(&cfg.OnlyNet, "only-net", false, "measure only sandbox networking (SSH and preview URLs included)")
	flag.BoolVar(&cfg.OnlyRemote, "only-remote", false, "measure only the SSH endpoint and preview URLs")
	flag.BoolVar(&cfg.OnlyImage, "only-image", false, "measure only templates from images (a local registry)")
	flag.BoolVar(&cfg.OnlyVolume, "only-volume", false, "measure only volumes (beside the sandbox's own root)")
	flag.BoolVar(&cfg.OnlyE2B, "only-e2b", false, "measure only E2B's JS SDK against nook (beside nook's Go SDK doing the same)")
	flag.BoolVar(&cfg.OnlySnapshots, "only-snapshots", false, "measure only snapshots, rollbacks and forks (containers and vms) and vm pause/resume")
	flag.IntVar(&cfg.SnapshotRounds, "snapshot-rounds", 20, "vm pause/resume rounds (forks: half as many)")
	flag.IntVar(&cfg.PausedVMs, "paused-vms", 100, "paused vms whose CPU and RSS are measured")
	flag.IntVar(&cfg.SnapshotChain, "snapshot-chain", 20, "snapshots in the chain whose disk use is measured")
	density := flag.Int("density", 0, "measure only density: every per-sandbox operation with 10 and with N container sandboxes alive (and -density-vms vms)")
	flag.IntVar(&cfg.DensityN, "density-n", 200, "container sandboxes alive in the full run's density figures (0: none)")
	flag.IntVar(&cfg.DensityVMs, "density-vms", 4, "vms held through the density figures (one running, the rest paused) besides the containers, and probed at 10 and at N (0: none)")
	flag.Parse()
	if !cfg.VM {
		cfg.DensityVMs = 0
	}
	cfg.Out = os.Stdout
	if cfg.Creates < 20 {
		cfg.Creates = 20
	}
	// A closed stdout (| head) must not kill the run before it cleans
	// up; an interrupt ends it through its context, which cleans up too.
	signal.Ignore(syscall.SIGPIPE)
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if *density > 0 {
		if _, err := bench.RunDensity(ctx, cfg, *density); err != nil {
			fmt.Fprintln(os.Stderr, "nook-bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := bench.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "nook-bench:", err)
		os.Exit(1)
	}
}
