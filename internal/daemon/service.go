package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
	"github.com/nookhq/nook/internal/template"
)

// startService starts the service of the template a sandbox was made
// from (the image's ENTRYPOINT and CMD, or the build's --start) in the
// background of a sandbox that just booted (a create, a start), as the
// image's user in its working directory, and waits, if the template says
// what ready is, until it is or MaxReadyWait passes. A service that does
// not start, exits before it is ready or is not ready in time is the
// create's (or start's) error, with the service's last output. A vm
// restored from its template's snapshot has the service running already
// (prepareTemplate started it before the snapshot was saved): it is not
// started twice.
func (m *Manager) startService(ctx context.Context, sb *core.Sandbox) error {
	if sb.TemplateID == "" {
		return nil
	}
	t, err := m.templates.ByID(sb.TemplateID)
	if err != nil || t.Service == nil {
		return nil
	}
	c, err := m.agentFor(sb)
	if err != nil {
		return err
	}
	return m.runService(ctx, c, t, nil, sb.Name)
}

// prepareTemplate is what a vm template's boot runs before its snapshot
// is saved: the template's service, started and ready, so that every vm
// restored from the snapshot has it running when its create returns,
// without waiting for it. It starts before any sandbox exists: it has
// the image's environment, not a sandbox's --env, and the template boot's
// hostname.
func (m *Manager) prepareTemplate(ctx context.Context, templateID string, c *agent.Client) error {
	t, err := m.templates.ByID(templateID)
	if err != nil || t.Service == nil {
		return nil
	}
	env := map[string]string{}
	if t.Config != nil {
		for _, kv := range t.Config.Env {
			if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
				env[k] = v
			}
		}
	}
	return m.runService(ctx, c, t, env, "the snapshot of "+templateID)
}

// runService starts t's service through c, unless it runs there already,
// and waits until it is ready; where names the machine for the log.
func (m *Manager) runService(ctx context.Context, c *agent.Client, t api.Template, env map[string]string, where string) error {
	svc := t.Service
	req := &agent.ExecRequest{Argv: svc.Cmd, Env: env, Background: true}
	if cfg := t.Config; cfg != nil {
		req.User, req.Cwd = cfg.User, cfg.WorkingDir
	}
	pid, err := serviceSession(ctx, c, svc.Cmd)
	if err != nil {
		return fmt.Errorf("the service of template %s: %w", t.Name, err)
	}
	if pid != 0 {
		m.log.Info("template service running from the template's snapshot", "sandbox", where, "pid", pid)
	} else {
		if pid, err = c.Start(ctx, req); err != nil {
			return errdefs.Precondition("the service of template %s (%s) did not start: %v; build the template again with another --start, or --start none", t.Name, strings.Join(svc.Cmd, " "), err)
		}
		m.log.Info("template service started", "sandbox", where, "pid", pid, "cmd", strings.Join(svc.Cmd, " "))
	}
	if svc.Ready == "" {
		return nil
	}
	kind, arg, err := template.ParseReady(svc.Ready)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, template.MaxReadyWait)
	defer cancel()
	start := time.Now()
	for delay := 10 * time.Millisecond; ; delay = min(delay*2, 500*time.Millisecond) {
		ready, err := m.serviceReady(ctx, c, req, kind, arg)
		if err != nil {
			return fmt.Errorf("the service of template %s: check %s: %w", t.Name, svc.Ready, err)
		}
		if ready {
			m.log.Info("template service ready", "sandbox", where, "ready", svc.Ready, "after", time.Since(start))
			return nil
		}
		if exit, out := serviceExited(ctx, c, pid); exit != nil {
			return errdefs.Precondition("the service of template %s (%s) exited with code %d before %s: %s", t.Name, strings.Join(svc.Cmd, " "), exit.ExitCode, svc.Ready, out)
		}
		select {
		case <-ctx.Done():
			_, out := serviceExited(context.WithoutCancel(ctx), c, pid)
			return errdefs.Precondition("the service of template %s (%s) was not ready (%s) within %s: %s", t.Name, strings.Join(svc.Cmd, " "), svc.Ready, template.MaxReadyWait, out)
		case <-time.After(delay):
		}
	}
}

// serviceSession returns the PID of the session of argv the machine has
// (running, or ended: a one-shot service ran in the template's snapshot
// and is not run twice), or 0.
func serviceSession(ctx context.Context, c *agent.Client, argv []string) (int, error) {
	procs, err := c.Processes(ctx)
	if err != nil {
		return 0, err
	}
	for _, p := range procs {
		if slices.Equal(p.Argv, argv) {
			return p.PID, nil
		}
	}
	return 0, nil
}

// serviceReady runs one readiness check of a service.
func (m *Manager) serviceReady(ctx context.Context, c *agent.Client, svc *agent.ExecRequest, kind, arg string) (bool, error) {
	switch kind {
	case "port":
		port, _ := strconv.Atoi(arg)
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			_, rc, err := c.ReadFile(ctx, f, 0, 0)
			if err != nil {
				continue // no IPv6, say
			}
			ok := listening(io.LimitReader(rc, 8<<20), port)
			rc.Close()
			if ok {
				return true, nil
			}
		}
		return false, nil
	case "file":
		_, err := c.Stat(ctx, arg)
		return err == nil, nil
	case "cmd":
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		p, err := c.Exec(cctx, &agent.ExecRequest{Argv: []string{"sh", "-c", arg}, User: svc.User, Cwd: svc.Cwd, TimeoutMS: 10000})
		if err != nil {
			return false, err
		}
		defer p.Close()
		for {
			kind, data, err := p.Next()
			if err != nil {
				return false, err
			}
			if kind == api.FrameExit {
				var st api.ExitStatus
				err := json.Unmarshal(data, &st)
				return err == nil && st.Signal == "" && st.ExitCode == 0, nil
			}
		}
	}
	return false, errors.New("unknown check")
}

// listening reports whether /proc/net/tcp{,6} text r shows a socket
// listening (state 0A) on TCP port. The text comes from the sandbox.
func listening(r io.Reader, port int) bool {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 4096)
	want := fmt.Sprintf(":%04X", port)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 3 && f[3] == "0A" && strings.HasSuffix(f[1], want) {
			return true
		}
	}
	return false
}

// serviceExited returns a service's exit status once it ended, and the
// end of its output (for an error message either way).
func serviceExited(ctx context.Context, c *agent.Client, pid int) (*api.ExitStatus, string) {
	procs, err := c.Processes(ctx)
	if err != nil {
		return nil, ""
	}
	for _, p := range procs {
		if p.PID != pid {
			continue
		}
		if p.Running {
			return nil, outputTail(ctx, c, pid, p.OutputFrom, p.OutputTo)
		}
		return p.Exit, outputTail(ctx, c, pid, p.OutputFrom, p.OutputTo)
	}
	return nil, ""
}

// outputTail reads the last 2 KiB of a process's output.
func outputTail(ctx context.Context, c *agent.Client, pid int, from, to int64) string {
	off := max(from, to-2048)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p, err := c.Attach(ctx, &agent.AttachRequest{PID: pid, Offset: off})
	if err != nil {
		return ""
	}
	defer p.Close()
	defer context.AfterFunc(ctx, func() { p.Close() })()
	var out []byte
	for int64(len(out)) < to-off {
		kind, data, err := p.Next()
		if err != nil || kind == api.FrameExit {
			break
		}
		if kind == api.FrameStdout || kind == api.FrameStderr {
			out = append(out, data...)
		}
	}
	s := strings.TrimSpace(string(out))
	if s == "" {
		return "(no output)"
	}
	return "its output ends: " + strings.ReplaceAll(s, "\n", " | ")
}
