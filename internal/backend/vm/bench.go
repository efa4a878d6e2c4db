package vm

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/nookhq/nook/internal/agent/guestinit"
)

// BareBoot is the benchmarks' baseline: a plain QEMU boot of the guest
// kernel with the same machine and initramfs, timed from launch until its
// init's first words on the serial console (then it powers off).
func (b *Backend) BareBoot(ctx context.Context, cpus int, memMiB int64) (time.Duration, error) {
	k, err := b.ensureKernel(ctx)
	if err != nil {
		return 0, err
	}
	l := launch{machine: machine{Accel: b.accel, CPUs: cpus, MemoryMiB: memMiB, Kernel: k, TSCKHz: tscKHz()},
		ExtraCmdline: guestinit.UpAndOffArg}
	uid, release, err := b.reserveUID()
	if err != nil {
		return 0, err
	}
	defer release()
	var fds fdTable
	defer fds.close()
	args, err := l.args(&fds)
	if err != nil {
		return 0, err
	}
	root, err := b.qemuRoot(ctx)
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, b.cfg.QEMU, args...)
	cmd.ExtraFiles = fds.files
	cmd.Dir = "/"
	cmd.SysProcAttr = b.qemuAttr(uid, root)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.Contains(sc.Text(), guestinit.UpMarker) {
			return time.Since(start), nil
		}
	}
	return 0, fmt.Errorf("the guest never reached userspace")
}
