package daemon

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"strings"

	"github.com/nookhq/nook/internal/errdefs"
)

// elfMachines is the ELF machine of each architecture nook builds for.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// checkAgentBinary refuses, at daemon start, an agent binary no sandbox
// could run: one that is not an ELF executable for this architecture, or
// one that is dynamically linked (a vm's kernel panics when its init
// needs a loader the initramfs does not have). A missing binary is left to
// the backends, which report themselves unavailable.
func checkAgentBinary(p string) error {
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("agent binary: %w", err)
	}
	defer f.Close()
	return checkAgentELF(p, f)
}

// checkAgentELF is checkAgentBinary on the file's contents.
func checkAgentELF(p string, r io.ReaderAt) error {
	ef, err := elf.NewFile(r)
	if err != nil {
		return errdefs.Precondition("%s is not an ELF executable (%v): give --agent the nook-agent that make build writes to bin/", p, err)
	}
	defer ef.Close()
	if want, ok := elfMachines[runtime.GOARCH]; ok && ef.Machine != want {
		return errdefs.Precondition("%s is built for %s, not for this host's %s: build it with make build", p, ef.Machine, want)
	}
	var needs []string
	for _, prog := range ef.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(prog.Open(), 256))
		interp := strings.TrimRight(string(b), "\x00")
		if interp == "" {
			interp = "a program interpreter"
		}
		needs = append(needs, interp)
		break
	}
	if len(needs) == 0 {
		// DT_NEEDED without an interpreter: still nothing a bare initramfs can load.
		libs, _ := ef.ImportedLibraries()
		needs = append(needs, libs...)
	}
	if len(needs) > 0 {
		return errdefs.Precondition("%s is dynamically linked (it needs %s); build it with CGO_ENABLED=0 (make build does)", p, strings.Join(needs, ", "))
	}
	return nil
}
