package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/nookhq/nook/api"
	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/agent/guestinit"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

var _ core.InitChooser = (*Backend)(nil)

// ChooseInit implements core.InitChooser: systemd where the template has
// it (its rootfs has /lib/systemd/systemd), the agent otherwise.
func (b *Backend) ChooseInit(sb *core.Sandbox, requested string) (string, error) {
	if requested == api.InitAgent {
		return api.InitAgent, nil
	}
	has, err := b.hasSystemd(sb.TemplateID)
	if err != nil {
		return "", err
	}
	switch {
	case has:
		return api.InitSystemd, nil
	case requested == api.InitSystemd:
		return "", errdefs.Invalid("template %s has no systemd (%s): use a template that installs systemd and systemd-sysv, such as dev, or --init agent", sb.Template, guestinit.SystemdPath)
	}
	return api.InitAgent, nil
}

// hasSystemd reports whether a template build's root filesystem has
// systemd, looked up through an os.Root (a template's symlinks never lead
// the daemon outside it; Debian's /lib is a relative link to usr/lib).
func (b *Backend) hasSystemd(templateID string) (bool, error) {
	rootfs, err := b.cfg.TemplateRootfs(templateID)
	if err != nil {
		return false, err
	}
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return false, err
	}
	defer root.Close()
	fi, err := root.Lstat(strings.TrimPrefix(guestinit.SystemdPath, "/"))
	return err == nil && fi.Mode().IsRegular(), nil
}

// systemdTimeout bounds how long a template boot waits for systemd to
// reach its default target (dockerd and containerd under TCG: seconds).
const systemdTimeout = 3 * time.Minute

// waitSystemd waits, through the agent on sock, until the guest's
// systemd has finished starting up (is-system-running: running, or
// degraded with the failed units logged).
func (b *Backend) waitSystemd(ctx context.Context, sock string) error {
	ctx, cancel := context.WithTimeout(ctx, systemdTimeout)
	defer cancel()
	out, _, code, err := guestOutput(ctx, sock, "systemctl is-system-running --wait; echo; systemctl --failed --no-legend --plain")
	if err != nil {
		return fmt.Errorf("wait for systemd: %w", err)
	}
	state, failed, _ := strings.Cut(strings.TrimSpace(out), "\n")
	switch state {
	case "running":
		return nil
	case "degraded":
		b.cfg.Log.Warn("vm guest's systemd is degraded: some units failed", "failed", strings.Join(strings.Fields(failed), " "))
		return nil
	}
	return fmt.Errorf("the guest's systemd did not start up (is-system-running: %q, exit %d): failed units: %s", state, code, strings.TrimSpace(failed))
}

// servicesUp waits, after a systemd guest's cold boot (a start, a
// reboot, a create without a template snapshot), until systemd has
// started its services, so that what the machine runs at boot answers
// when the call returns. A guest that does not get there is logged, not
// failed: its agent answers, and the user can look.
func (b *Backend) servicesUp(ctx context.Context, id, sock string, m machine) {
	if m.Init != api.InitSystemd {
		return
	}
	if err := b.waitSystemd(ctx, sock); err != nil {
		b.cfg.Log.Warn("vm guest's systemd did not finish starting up", "sandbox", id, "err", err)
	}
}

// guestOutput runs a shell script in a vm through the agent on sock (on
// a connection of its own, closed after) and returns its standard output
// (up to 64 KiB), its standard error (up to 4 KiB) and its exit code.
func guestOutput(ctx context.Context, sock, script string) (stdout, stderr string, code int, err error) {
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) { return dialAgent(ctx, sock) })
	defer c.Close()
	p, err := c.Exec(ctx, &agent.ExecRequest{Argv: []string{"sh", "-c", script}})
	if err != nil {
		return "", "", 0, err
	}
	defer p.Close()
	// The stream's reads do not see ctx: closing it ends a read that a
	// guest never answers (a sync stuck on a dead mount, a hung unit).
	defer context.AfterFunc(ctx, func() { p.Close() })()
	var out, errOut []byte
	for {
		kind, data, err := p.Next()
		if err != nil {
			if ctx.Err() != nil {
				return "", "", 0, fmt.Errorf("%s: %w", script, ctx.Err())
			}
			return "", "", 0, err
		}
		switch kind {
		case api.FrameStdout:
			if len(out) < 64<<10 {
				out = append(out, data...)
			}
		case api.FrameStderr:
			if len(errOut) < 4096 {
				errOut = append(errOut, data...)
			}
		case api.FrameExit:
			var st api.ExitStatus
			if err := json.Unmarshal(data, &st); err != nil {
				return "", "", 0, err
			}
			if st.Signal != "" {
				return string(out), string(errOut), -1, fmt.Errorf("%s: killed by %s: %s", script, st.Signal, strings.TrimSpace(string(errOut)))
			}
			return string(out), string(errOut), st.ExitCode, nil
		}
	}
}
