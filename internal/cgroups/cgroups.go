// Package cgroups creates, limits and removes the per-sandbox cgroups
// that hold processes the daemon starts outside an OCI runtime (a vm
// sandbox's QEMU), on cgroup v1, hybrid and v2 hosts, and removes any
// sandbox's cgroups, killing stragglers.
package cgroups

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nookhq/nook/internal/poll"
	"github.com/nookhq/nook/internal/procfs"
)

const root = "/sys/fs/cgroup"

// Limits are what a sandbox's cgroup enforces.
type Limits struct {
	CPUs        float64 // CPU time, in CPUs
	MemoryBytes int64
	Pids        int64
}

// unified reports whether the host runs cgroup v2 only.
func unified() bool {
	_, err := os.Stat(filepath.Join(root, "cgroup.controllers"))
	return err == nil
}

// Dirs lists a sandbox's cgroup directories that exist, in every hierarchy.
func Dirs(parent, id string) []string {
	roots, _ := filepath.Glob(root + "/*")
	roots = append(roots, root)
	var dirs []string
	for _, r := range roots {
		d := filepath.Join(r, parent, id)
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// Create makes the sandbox's cgroups with its limits and moves pid into them.
func Create(parent, id string, lim Limits, pid int) error {
	quota := int64(lim.CPUs * 100000)
	type file struct{ name, value string }
	var groups map[string][]file
	if unified() {
		groups = map[string][]file{"": {
			{"cpu.max", fmt.Sprintf("%d 100000", quota)},
			{"memory.max", strconv.FormatInt(lim.MemoryBytes, 10)},
			{"memory.swap.max", "0"},
			{"pids.max", strconv.FormatInt(lim.Pids, 10)},
		}}
		// Controllers must be enabled down the tree. (On v1 hosts "cpu" is the
		// hierarchy or a symlink to "cpu,cpuacct".)
		for _, d := range []string{root, filepath.Join(root, parent)} {
			os.MkdirAll(d, 0o755)
			os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte("+cpu +memory +pids"), 0)
		}
	} else {
		groups = map[string][]file{
			"cpu":    {{"cpu.cfs_period_us", "100000"}, {"cpu.cfs_quota_us", strconv.FormatInt(quota, 10)}},
			"memory": {{"memory.limit_in_bytes", strconv.FormatInt(lim.MemoryBytes, 10)}},
			"pids":   {{"pids.max", strconv.FormatInt(lim.Pids, 10)}},
		}
	}
	for ctrl, files := range groups {
		if _, err := os.Stat(filepath.Join(root, ctrl)); err != nil {
			if len(files) == 0 {
				continue // optional (cpuacct)
			}
			return fmt.Errorf("cgroup controller %s is not mounted at %s", ctrl, filepath.Join(root, ctrl))
		}
		dir := filepath.Join(root, ctrl, parent, id)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		for _, f := range files {
			if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.value), 0); err != nil && f.name != "memory.swap.max" {
				return fmt.Errorf("cgroup %s: write %s: %w", dir, f.name, err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("move process %d into cgroup %s: %w", pid, dir, err)
		}
	}
	return nil
}

// Kill sends SIGKILL to every process in a sandbox's cgroups without
// letting a frozen one run again first: through cgroup.kill where the
// kernel has it (5.14 on; it kills frozen tasks and the groups below),
// else to each process listed. A task of a frozen v1 cgroup then dies
// when it is thawed, before it returns to user space. (runc's own kill
// of a paused container signals its init and thaws the cgroup, so the
// other processes run for a moment: after a checkpoint, long enough to
// change a file the images describe.)
func Kill(parent, id string) {
	for _, d := range Dirs(parent, id) {
		if f, err := os.OpenFile(filepath.Join(d, "cgroup.kill"), os.O_WRONLY, 0); err == nil {
			_, err = f.WriteString("1")
			f.Close()
			if err == nil {
				continue
			}
		}
		filepath.WalkDir(d, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				for _, pid := range listed(path, "cgroup.procs") {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
	}
}

// listed is the IDs (PIDs, TIDs) in the first of files that cgroup
// directory dir has.
func listed(dir string, files ...string) []int {
	for _, f := range files {
		list, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		var ids []int
		for _, l := range strings.Fields(string(list)) {
			if id, err := strconv.Atoi(l); err == nil && id > 0 {
				ids = append(ids, id)
			}
		}
		return ids
	}
	return nil
}

// Threads lists the threads (TIDs) in a sandbox's cgroups, in every
// hierarchy and the groups below.
func Threads(parent, id string) []int {
	seen := map[int]bool{}
	var tids []int
	for _, d := range Dirs(parent, id) {
		filepath.WalkDir(d, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				for _, tid := range listed(path, "tasks", "cgroup.threads") { // v1, v2
					if !seen[tid] {
						seen[tid] = true
						tids = append(tids, tid)
					}
				}
			}
			return nil
		})
	}
	return tids
}

// MemoryUsage is the memory a sandbox's cgroup holds now:
// memory.usage_in_bytes (v1) or memory.current (v2); 0 if unknown.
func MemoryUsage(parent, id string) int64 {
	for _, d := range Dirs(parent, id) {
		for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil {
				n, _ := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
				return n
			}
		}
	}
	return 0
}

// Renew removes a sandbox's cgroups that no process is in any more, so
// that the next Create makes them afresh: memory charged to the old
// ones by processes gone (shared memory they faulted in, which outlives
// them) does not count against the next process's limit. A process
// killed just before (a rollback's old QEMU) leaves them a moment after
// its kill: Renew waits for that, a second at most; a cgroup a process
// is still in after that stays, and is reused.
func Renew(parent, id string) {
	dirs := Dirs(parent, id)
	poll.Until(context.Background(), poll.Options{Timeout: time.Second, Max: 10 * time.Millisecond}, func() (bool, error) {
		left := dirs[:0]
		for _, d := range dirs {
			if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
				left = append(left, d)
			}
		}
		dirs = left
		return len(dirs) == 0, nil
	})
}

// Remove kills whatever is left in a sandbox's cgroups and removes them.
// thaw, if not nil, is called once every process has been sent SIGKILL
// (a task of a frozen v1 cgroup dies only once thawed).
func Remove(parent, id string, thaw func()) error {
	var errs []error
	Kill(parent, id)
	if thaw != nil {
		thaw()
	}
	for _, d := range Dirs(parent, id) {
		// A killed process leaves its cgroup a moment after the kill.
		var last error
		if poll.Until(context.Background(), poll.Options{Timeout: time.Second, Max: 10 * time.Millisecond}, func() (bool, error) {
			last = os.Remove(d)
			return last == nil || errors.Is(last, os.ErrNotExist), nil
		}) != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, last))
		}
	}
	return errors.Join(errs...)
}

// CPUUsage returns the CPU time a sandbox's processes have used, from its
// cgroups: cpuacct.usage (v1), else cpu.stat's usage_usec (v2, and the
// unified hierarchy of hybrid hosts), else the sum of the CPU times of
// the processes in them now (a v1 host whose cpuacct hierarchy holds no
// group for the sandbox, e.g. a vm's QEMU).
func CPUUsage(parent, id string) (time.Duration, error) {
	dirs := Dirs(parent, id)
	if len(dirs) == 0 {
		return 0, fmt.Errorf("sandbox %s has no cgroup under %s", id, parent)
	}
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, "cpuacct.usage")); err == nil {
			if ns, err := strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64); err == nil {
				return time.Duration(ns), nil
			}
		}
	}
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, "cpu.stat")); err == nil {
			sc := bufio.NewScanner(bytes.NewReader(b))
			for sc.Scan() {
				if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("usage_usec ")); ok {
					if us, err := strconv.ParseInt(string(v), 10, 64); err == nil {
						return time.Duration(us) * time.Microsecond, nil
					}
				}
			}
		}
	}
	// Fall back to the processes' own CPU times.
	seen := map[int]bool{}
	var ticks int64
	for _, d := range dirs {
		for _, pid := range listed(d, "cgroup.procs") {
			if !seen[pid] {
				seen[pid] = true
				ticks += procfs.CPUTicks(pid)
			}
		}
	}
	// USER_HZ is 100 on every Linux architecture nook runs on.
	return time.Duration(ticks) * (time.Second / 100), nil
}

// Read returns the content of the first of a sandbox's cgroup files that
// exists, in any hierarchy, trimmed: name it by its v1 and v2 names
// ("memory.limit_in_bytes", "memory.max") to read it on any host.
func Read(parent, id string, names ...string) (string, error) {
	for _, d := range Dirs(parent, id) {
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(d, n))
			if err == nil {
				return string(bytes.TrimSpace(b)), nil
			}
			if !errors.Is(err, os.ErrNotExist) {
				return "", err
			}
		}
	}
	return "", fmt.Errorf("sandbox %s has none of %s under %s: %w", id, strings.Join(names, ", "), parent, os.ErrNotExist)
}

// FreezerState reads a sandbox's freezer: FROZEN, FREEZING or THAWED
// (v1's freezer.state; on v2, cgroup.freeze, which says what was asked:
// FROZEN while freezing too).
func FreezerState(parent, id string) (string, error) {
	st, err := os.ReadFile(filepath.Join(root, "freezer", parent, id, "freezer.state"))
	if err == nil {
		return strings.TrimSpace(string(st)), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	fr, err := os.ReadFile(filepath.Join(root, parent, id, "cgroup.freeze"))
	if err != nil {
		return "", fmt.Errorf("sandbox %s has no freezer cgroup: %w", id, err)
	}
	if bytes.Equal(bytes.TrimSpace(fr), []byte("1")) {
		return "FROZEN", nil
	}
	return "THAWED", nil
}

// Thaw unfreezes a sandbox's cgroup directly (v1 and v2), for when its
// runtime no longer knows it.
func Thaw(parent, id string) {
	writeExisting(filepath.Join(root, "freezer", parent, id, "freezer.state"), "THAWED")
	writeExisting(filepath.Join(root, parent, id, "cgroup.freeze"), "0")
}

// writeExisting writes to a cgroup file that exists; it never creates one
// (on a hybrid host /sys/fs/cgroup itself is a tmpfs).
func writeExisting(path, v string) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return
	}
	f.WriteString(v)
	f.Close()
}
