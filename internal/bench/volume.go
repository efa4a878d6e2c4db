package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/sdk"
)

// volumeRounds is how many times each volume figure is taken.
const volumeRounds = 3

// runVolume measures a volume in a container sandbox beside the
// sandbox's own root (its overlay on its own disk), in one sandbox that
// has both: a sequential write of 1 GiB (fsync'd at the end), its
// sequential read with the host's page cache dropped first, and the
// shape of a pip install (10,000 files of 1 KiB in 100 directories,
// written, then removed). vm sandboxes cannot mount volumes yet.
func runVolume(ctx context.Context, cfg Config, root string) error {
	fmt.Fprintln(cfg.Out, "volumes: 1 GiB written and read, 10,000 small files, on a volume and on the sandbox's root...")
	cl, stop, err := serve(ctx, cfg, root, -1)
	if err != nil {
		return err
	}
	defer stop()
	if _, err := cl.CreateVolume(ctx, "bench-vol", "4G"); err != nil {
		return err
	}
	defer cl.DeleteVolume(context.WithoutCancel(ctx), "bench-vol", true)
	if _, err := cl.CreateSandbox(ctx, api.CreateSandboxRequest{Name: "bench-vol", Disk: "4G", Volumes: []string{"bench-vol:/vol"}}); err != nil {
		return err
	}
	defer cl.DeleteSandbox(context.WithoutCancel(ctx), "bench-vol")
	type figure struct{ vol, root []time.Duration }
	var write, read, small figure
	for range volumeRounds {
		for _, dir := range []string{"/vol", "/root"} {
			w, err := timedSh(ctx, cl, fmt.Sprintf("dd if=/dev/zero of=%s/big bs=1M count=1024 conv=fsync status=none", dir))
			if err != nil {
				return err
			}
			if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
				return fmt.Errorf("drop the page cache: %w", err)
			}
			r, err := timedSh(ctx, cl, fmt.Sprintf("cat %s/big > /dev/null && rm %s/big", dir, dir))
			if err != nil {
				return err
			}
			s, err := timedSh(ctx, cl, fmt.Sprintf(`python3 -c '
import os
for d in range(100):
    os.makedirs("%[1]s/site/p%%d" %% d)
    for f in range(100):
        with open("%[1]s/site/p%%d/f%%d.py" %% (d, f), "w") as o:
            o.write("x" * 1024)
' && rm -rf %[1]s/site`, dir))
			if err != nil {
				return err
			}
			if dir == "/vol" {
				write.vol, read.vol, small.vol = append(write.vol, w), append(read.vol, r), append(small.vol, s)
			} else {
				write.root, read.root, small.root = append(write.root, w), append(read.root, r), append(small.root, s)
			}
		}
	}
	fmt.Fprintln(cfg.Out)
	tw := tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "volume (container sandbox, 4G volume)\tp50 on the volume\tbaseline\tbaseline p50\tratio p50\ttarget")
	for _, f := range []struct {
		name string
		fig  figure
	}{{"sequential write of 1 GiB (fsync)", write}, {"sequential read of 1 GiB (cold page cache)", read}, {"10,000 files of 1 KiB written and removed", small}} {
		fmt.Fprintf(tw, "%s\t%s\tthe same on the sandbox's root\t%s\t%.2fx\t-\n", f.name, ms(pct(f.fig.vol, .5)), ms(pct(f.fig.root, .5)),
			float64(pct(f.fig.vol, .5))/float64(pct(f.fig.root, .5)))
	}
	fmt.Fprintln(tw, "vm sandboxes\tcannot mount volumes yet\t\t\t\t")
	return tw.Flush()
}

// timedSh runs a shell command in the bench's volume sandbox and says how long it took.
func timedSh(ctx context.Context, cl *sdk.Client, script string) (time.Duration, error) {
	var stderr bytes.Buffer
	start := time.Now()
	st, err := cl.Exec(ctx, "bench-vol", api.ExecRequest{Cmd: []string{"sh", "-c", script}}, io.Discard, &stderr)
	took := time.Since(start)
	if err == nil && st.ExitCode != 0 {
		err = fmt.Errorf("%s: exit %d: %s", script, st.ExitCode, stderr.String())
	}
	return took, err
}
