package vm

import (
	"context"
	"testing"
	"time"

	"github.com/nookhq/nook/internal/agent"
	"github.com/nookhq/nook/internal/core"
	"github.com/nookhq/nook/internal/core/conformance"
)

// What a guest asks for is told from what it ends with: a power off
// (sysrq o), a halt (reboot(2) with RB_HALT_SYSTEM: QEMU would run on with
// nothing to run, so it is ended) and a reboot (sysrq b, reboot(2)) each
// read as such, and a start boots the machine again on its files.
func TestGuestHalts(t *testing.T) {
	b, h := newTestBackend(t, testConfig{})
	s := conformance.Create(t, h, "vm-halts")
	ctx := context.Background()
	s.Sh(t, "echo kept > /root/kept && sync")
	for _, c := range []struct {
		name, script, want string
	}{
		{"sysrq poweroff", "echo o > /proc/sysrq-trigger", core.HaltPoweroff},
		{"halt", `python3 -c 'import ctypes; ctypes.CDLL(None).reboot(0xcdef0123)'`, core.HaltPoweroff},
		{"sysrq reboot", "echo b > /proc/sysrq-trigger", core.HaltReboot},
		{"reboot", `python3 -c 'import ctypes; ctypes.CDLL(None).reboot(0x01234567)'`, core.HaltReboot},
	} {
		// The command does not come back: the machine goes down under it.
		go s.Exec(t, &agent.ExecRequest{Argv: []string{"sh", "-c", "sync; " + c.script}})
		deadline := time.Now().Add(30 * time.Second)
		var rs core.RuntimeStatus
		for {
			var err error
			rs, err = b.Status(ctx, s.Sandbox)
			if err != nil {
				t.Fatal(err)
			}
			if rs.State != core.RuntimeRunning || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if rs.State != core.RuntimeStopped || rs.Halt != c.want {
			t.Fatalf("%s: status %+v, want stopped by %s", c.name, rs, c.want)
		}
		if pid := qemuPID(b.dir(s.ID)); pid > 0 {
			t.Fatalf("%s: QEMU %d runs on", c.name, pid)
		}
		s.Agent.Close()
		if err := b.Start(ctx, s.Sandbox); err != nil {
			t.Fatalf("%s: start: %v", c.name, err)
		}
		if rs, err := b.Status(ctx, s.Sandbox); err != nil || rs.State != core.RuntimeRunning || rs.Halt != "" {
			t.Fatalf("%s: after a start: %+v %v", c.name, rs, err)
		}
		if err := s.Agent.Configure(ctx, &agent.ConfigureRequest{Hostname: s.Name}); err != nil {
			t.Fatalf("%s: the agent after a start: %v", c.name, err)
		}
		if got := s.Sh(t, "cat /root/kept"); got != "kept\n" {
			t.Fatalf("%s: /root/kept reads %q after a start", c.name, got)
		}
	}
}

func TestGuestHaltFromConsole(t *testing.T) {
	for console, want := range map[string]string{
		"":                "",
		"[ 1.0] booted\n": "",
		"[ 8.0] sysrq: Power Off\n[ 8.1] reboot: Power down": core.HaltPoweroff,
		"[ 8.1] reboot: System halted\n":                     core.HaltPoweroff,
		"[ 9.0] reboot: Restarting system\n":                 core.HaltReboot,
		"[ 9.0] sysrq: Resetting\n":                          core.HaltReboot,
		// An earlier boot's words do not count.
		"[ 9.0] reboot: Power down\n\n" + bootMark + "\n[ 0.5] booting\n":                   "",
		"[ 9.0] reboot: Power down\n\n" + bootMark + "\n[ 3.0] reboot: Restarting system\n": core.HaltReboot,
	} {
		if got := guestHalt(console); got != want {
			t.Errorf("guestHalt(%q) = %q, want %q", console, got, want)
		}
	}
}
