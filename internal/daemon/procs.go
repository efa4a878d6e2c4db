package daemon

import (
	"context"
	"net"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/cgroups"
	"github.com/nookhq/nook/internal/errdefs"
)

// Processes lists the commands started through nook in a sandbox.
func (m *Manager) Processes(ctx context.Context, name string) ([]api.Process, error) {
	sb, c, err := m.runningAgent(ctx, name)
	if err != nil {
		return nil, err
	}
	ps, err := c.Processes(ctx)
	if err != nil {
		return nil, m.agentError(ctx, sb, err)
	}
	out := make([]api.Process, 0, len(ps))
	for _, p := range ps {
		out = append(out, api.Process{PID: p.PID, Cmd: p.Argv, TTY: p.TTY, Running: p.Running, StartedAt: p.StartedAt.UTC(),
			Exit: p.Exit, OutputFrom: p.OutputFrom, OutputTo: p.OutputTo})
	}
	return out, nil
}

// Attach follows a process's output from a byte offset until it exits;
// with input, the caller may send it stdin, signals and resizes. Closing
// the returned stream detaches without stopping the process.
func (m *Manager) Attach(ctx context.Context, name string, pid int, offset int64, input bool) (*agent.Process, error) {
	if pid <= 0 || offset < 0 {
		return nil, errdefs.Invalid("process id must be positive and offset at least 0")
	}
	sb, c, err := m.runningAgent(ctx, name)
	if err != nil {
		return nil, err
	}
	p, err := c.Attach(ctx, &agent.AttachRequest{PID: pid, Offset: offset, Input: input})
	if err != nil {
		return nil, m.agentError(ctx, sb, err)
	}
	return p, nil
}

// Signal sends a signal to a process's group.
func (m *Manager) Signal(ctx context.Context, name string, pid int, sig string) error {
	if pid <= 0 {
		return errdefs.Invalid("process id must be positive")
	}
	if sig == "" {
		sig = "TERM"
	}
	sb, c, err := m.runningAgent(ctx, name)
	if err != nil {
		return err
	}
	if err := c.SignalProcess(ctx, pid, sig); err != nil {
		return m.agentError(ctx, sb, err)
	}
	return nil
}

// DialPort connects to a TCP port on a sandbox's loopback through its
// agent (a server in the sandbox listening on any address takes it): for
// the edges that proxy to sandbox ports without a sandbox network.
func (m *Manager) DialPort(ctx context.Context, name string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, errdefs.Invalid("port %d is not a TCP port", port)
	}
	sb, c, err := m.runningAgent(ctx, name)
	if err != nil {
		return nil, err
	}
	conn, err := c.Dial(ctx, port)
	if err != nil {
		return nil, m.agentError(ctx, sb, err)
	}
	return conn, nil
}

// Usage is what a sandbox uses now: the CPU time its processes used so
// far and the memory its cgroup holds.
func (m *Manager) Usage(ctx context.Context, name string) (cpu time.Duration, mem int64, err error) {
	sb, err := m.Get(ctx, name)
	if err != nil {
		return 0, 0, err
	}
	cpu, err = cgroups.CPUUsage(m.cfg.CgroupParent, sb.ID)
	if err != nil {
		return 0, 0, err
	}
	return cpu, cgroups.MemoryUsage(m.cfg.CgroupParent, sb.ID), nil
}
