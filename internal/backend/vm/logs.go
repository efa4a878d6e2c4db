package vm

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/errdefs"
)

var _ core.LogOpener = (*Backend)(nil)

// MainLog implements core.LogOpener: a vm's guest kernel, init and agent
// all write to its serial console.
func (b *Backend) MainLog() string { return core.LogConsole }

// OpenLog implements core.LogOpener: the console is console.log in the
// vm's directory, which QEMU appends to and the reaper empties past
// maxConsole.
func (b *Backend) OpenLog(id, log string) (*os.File, error) {
	if id == "" || strings.ContainsAny(id, "/.") {
		return nil, errdefs.Invalid("bad sandbox id %q", id)
	}
	switch log {
	case core.LogAgent:
		return nil, errdefs.NotFound("a vm's agent has no log of its own: it writes to the vm's console (--log console), or under systemd to the guest's journal")
	case core.LogConsole:
	default:
		return nil, errdefs.Invalid("log %q is not valid: use agent or console", log)
	}
	f, err := os.Open(filepath.Join(b.dir(id), "console.log"))
	if os.IsNotExist(err) {
		return nil, errdefs.NotFound("the vm has no console log yet")
	}
	return f, err
}
