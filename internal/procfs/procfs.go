// Package procfs reads what nook needs of /proc/PID/stat: a process's
// start time (to tell a reused PID apart) and its CPU time.
package procfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// fields returns /proc/PID/stat's fields from field 3 (state) on: the
// command name (field 2) may hold spaces and parentheses, so fields are
// counted after its last ')'.
func fields(pid int) [][]byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return bytes.Fields(b[i+1:])
}

// StartTime is a process's start time in clock ticks after boot (field
// 22), or 0 if it is gone or a zombie waiting to be reaped.
func StartTime(pid int) uint64 {
	f := fields(pid)
	if len(f) < 20 || string(f[0]) == "Z" || string(f[0]) == "X" {
		return 0
	}
	v, _ := strconv.ParseUint(string(f[19]), 10, 64)
	return v
}

// CPUTicks is a process's user plus system CPU time in clock ticks
// (fields 14 and 15), 0 if it is gone.
func CPUTicks(pid int) int64 {
	f := fields(pid)
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseInt(string(f[11]), 10, 64)
	s, _ := strconv.ParseInt(string(f[12]), 10, 64)
	return u + s
}
