package container

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

var _ core.LogOpener = (*Backend)(nil)

// MainLog implements core.LogOpener: a container's init is its agent,
// whose output is the agent's log.
func (b *Backend) MainLog() string { return core.LogAgent }

// OpenLog implements core.LogOpener. The agent's log is in the sandbox's
// own root (/.nook/agent.log, inroot.go), opened without following any
// link the sandbox made; only a regular file is read.
func (b *Backend) OpenLog(id, log string) (*os.File, error) {
	if err := validID(id); err != nil {
		return nil, err
	}
	switch log {
	case core.LogConsole:
		return nil, errdefs.NotFound("a container has no console: its init is nook-agent, whose output is the agent log (--log agent)")
	case core.LogAgent:
	default:
		return nil, errdefs.Invalid("log %q is not valid: use agent or console", log)
	}
	f, err := openInRoot(b.rootfs(id), agentLogInSandbox, unix.O_RDONLY|unix.O_NONBLOCK)
	if err != nil {
		return nil, errdefs.NotFound("the sandbox's agent log cannot be opened (%v): a stopped or paused container's files are not mounted", err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("the sandbox's %s is not a regular file", agentLogInSandbox)
	}
	return f, nil
}
