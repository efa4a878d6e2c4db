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

// runVolume measures a volume beside the sandbox's own root, in one
// sandbox that has both, for a container (its root an overlay on its own
// disk) and a vm (its root its virtio disk; the volume a FUSE mount its
// agent serves): a sequential write (1 GiB in a container, 256 MiB in a
// vm under TCG; fsync'd at the end), its sequential read with the page
// caches dropped first (the host's, and a vm guest's), and the shape of
// a pip install (10,000 files of 1 KiB in 100 directories in a
// container, 2,000 in 20 in a vm; written, then removed).
func runVolume(ctx context.Context, cfg Config, root string) error {
	fmt.Fprintln(cfg.Out, "volumes: a big file written and read, many small files, on a volume and on the sandbox's root, in a container and a vm...")
	cl, stop, err := serve(ctx, cfg, root, -1)
	if err != nil {
		return err
	}
	defer stop()
	if _, err := cl.CreateVolume(ctx, "bench-vol", "4G"); err != nil {
		return err
	}
	defer cl.DeleteVolume(context.WithoutCancel(ctx), "bench-vol", true)
	tw := tabwriter.NewWriter(cfg.Out, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "volume (4G)	p50 on the volume	baseline	baseline p50	ratio p50	target")
	for _, k := range []volumeKind{
		{name: "container", req: api.CreateSandboxRequest{Name: "bench-vol", Disk: "4G"}, mib: 1024, dirs: 100},
		{name: "vm", req: api.CreateSandboxRequest{Name: "bench-vol", Isolation: api.IsolationVM, CPUs: 1, Memory: "1G"}, mib: 256, dirs: 20},
	} {
		if err := k.run(ctx, cl, tw); err != nil {
			return fmt.Errorf("%s: %w", k.name, err)
		}
	}
	return nil
}

type volumeKind struct {
	name      string
	req       api.CreateSandboxRequest
	mib, dirs int // the big file's size; 100 files of 1 KiB per directory
}

func (k volumeKind) run(ctx context.Context, cl *sdk.Client, tw io.Writer) error {
	req := k.req
	req.Volumes = []string{"bench-vol:/vol"}
	if _, err := cl.CreateSandbox(ctx, req); err != nil {
		return err
	}
	defer cl.DeleteSandbox(context.WithoutCancel(ctx), "bench-vol")
	dropGuest := ""
	if k.req.Isolation == api.IsolationVM {
		dropGuest = "sync && echo 3 > /proc/sys/vm/drop_caches && "
	}
	type figure struct{ vol, root []time.Duration }
	var write, read, small figure
	for range volumeRounds {
		for _, dir := range []string{"/vol", "/root"} {
			w, err := timedSh(ctx, cl, fmt.Sprintf("dd if=/dev/zero of=%s/big bs=1M count=%d conv=fsync status=none", dir, k.mib))
			if err != nil {
				return err
			}
			if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
				return fmt.Errorf("drop the page cache: %w", err)
			}
			if dropGuest != "" {
				if _, err := timedSh(ctx, cl, dropGuest+"true"); err != nil {
					return err
				}
			}
			r, err := timedSh(ctx, cl, fmt.Sprintf("cat %s/big > /dev/null && rm %s/big", dir, dir))
			if err != nil {
				return err
			}
			s, err := timedSh(ctx, cl, fmt.Sprintf(`python3 -c '
import os
for d in range(%[2]d):
    os.makedirs("%[1]s/site/p%%d" %% d)
    for f in range(100):
        with open("%[1]s/site/p%%d/f%%d.py" %% (d, f), "w") as o:
            o.write("x" * 1024)
' && rm -rf %[1]s/site`, dir, k.dirs))
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
	size := fmt.Sprintf("%d MiB", k.mib)
	if k.mib >= 1024 {
		size = fmt.Sprintf("%d GiB", k.mib/1024)
	}
	for _, f := range []struct {
		name string
		fig  figure
	}{
		{"sequential write of " + size + " (fsync)", write},
		{"sequential read of " + size + " (cold page cache)", read},
		{fmt.Sprintf("%d files of 1 KiB written and removed", k.dirs*100), small},
	} {
		fmt.Fprintf(tw, "%s: %s\t%s\tthe same on the sandbox's root\t%s\t%.2fx\t-\n", k.name, f.name, ms(pct(f.fig.vol, .5)), ms(pct(f.fig.root, .5)),
			float64(pct(f.fig.vol, .5))/float64(pct(f.fig.root, .5)))
	}
	return nil
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
