package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nookhq/nook/api"
)

// inspect returns a sandbox as `nook inspect --json` shows it.
func (d *daemon) inspect(name string) api.Sandbox {
	d.t.Helper()
	var sb api.Sandbox
	if err := json.Unmarshal([]byte(d.must("inspect", "--json", name)), &sb); err != nil {
		d.t.Fatal(err)
	}
	return sb
}

// waitState waits until a sandbox is in state, or fails after timeout.
// inspect does not count as use, so watching does not keep it awake.
func (d *daemon) waitState(name, state string, timeout time.Duration) api.Sandbox {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		sb := d.inspect(name)
		if sb.State == state {
			return sb
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("sandbox %s is %s, not %s, after %s", name, sb.State, state, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestIdlePause: an idle sandbox pauses itself; one running a background
// command started through nook, one with an exec in progress and one
// burning CPU never do; a call on a paused one answers and restarts its
// idle clock; with --on-expire pause, the TTL pauses instead of destroying.
func TestIdlePause(t *testing.T) {
	d := newDaemon(t, "--min-idle-pause", "1s")
	// Created first: its TTL (at least 1m) runs out while the rest goes on.
	d.must("create", "--name", "idle-expire", "--ttl", "1m", "--on-expire", "pause")
	created := time.Now()
	for _, n := range []string{"idle-quiet", "idle-bg", "idle-fg", "idle-cpu"} {
		d.must("create", "--name", n, "--idle-pause", "2s")
	}
	d.must("create", "--name", "idle-never")
	d.must("exec", "-d", "idle-bg", "--", "sleep", "600")
	// A process that outlives the command that started it is not nook's,
	// but its CPU use keeps the sandbox awake.
	d.must("exec", "idle-cpu", "--", "sh", "-c", "setsid sh -c 'while :; do :; done' >/dev/null 2>&1 </dev/null & echo $! >/tmp/spin.pid")
	fg := exec.Command(d.bin, "exec", "idle-fg", "--", "sh", "-c", "sleep 6; echo done")
	fg.Env = append(fg.Environ(), "NOOK_HOST=unix://"+d.socket())
	var fgOut strings.Builder
	fg.Stdout = &fgOut
	if err := fg.Start(); err != nil {
		t.Fatal(err)
	}

	sb := d.waitState("idle-quiet", api.StatePaused, 15*time.Second)
	if sb.IdlePause != "2s" || sb.Reason != "idle for 2s" {
		t.Fatalf("idle-paused sandbox: idle_pause %q, reason %q", sb.IdlePause, sb.Reason)
	}
	if out := strings.Join(strings.Fields(d.must("inspect", "idle-quiet")), " "); !strings.Contains(out, "idle pause: 2s") || !strings.Contains(out, "reason: idle for 2s") || !strings.Contains(out, "on expire: destroy") {
		t.Fatalf("nook inspect:\n%s", out)
	}
	// The foreground exec runs 6s, three idle pauses: nothing else pauses meanwhile.
	if err := fg.Wait(); err != nil || fgOut.String() != "done\n" {
		t.Fatalf("foreground exec: %v, %q", err, fgOut.String())
	}
	for _, n := range []string{"idle-bg", "idle-fg", "idle-cpu", "idle-never"} {
		if n == "idle-fg" {
			continue // its exec just ended: it may be pausing by now
		}
		if sb := d.inspect(n); sb.State != api.StateRunning {
			t.Errorf("sandbox %s is %s: %s", n, sb.State, sb.Reason)
		}
	}
	// Once the exec is over, its sandbox is idle too.
	d.waitState("idle-fg", api.StatePaused, 15*time.Second)

	// A call on a paused sandbox answers, and restarts its idle clock, at
	// some point during the call: measure from its start.
	woke := time.Now()
	if out := d.must("exec", "idle-quiet", "--", "echo", "awake"); out != "awake\n" {
		t.Fatalf("exec on an idle-paused sandbox: %q", out)
	}
	if sb := d.inspect("idle-quiet"); sb.State != api.StateRunning || sb.Reason != "" {
		t.Fatalf("after exec: %s, reason %q", sb.State, sb.Reason)
	}
	d.waitState("idle-quiet", api.StatePaused, 15*time.Second)
	if since := time.Since(woke); since < 2*time.Second {
		t.Fatalf("paused again %s after a call, within its idle pause of 2s", since)
	}
	for _, n := range []string{"idle-bg", "idle-cpu", "idle-never"} {
		if sb := d.inspect(n); sb.State != api.StateRunning {
			t.Errorf("sandbox %s is %s: %s", n, sb.State, sb.Reason)
		}
	}
	if ps := d.must("ps", "idle-bg"); !strings.Contains(ps, "sleep 600") {
		t.Fatalf("nook ps after all that:\n%s", ps)
	}
	// Stop the CPU burner: the sandbox becomes idle.
	d.must("exec", "idle-cpu", "--", "sh", "-c", "kill $(cat /tmp/spin.pid)")
	d.waitState("idle-cpu", api.StatePaused, 15*time.Second)

	// The TTL of the on-expire pause sandbox runs out: paused, not destroyed.
	sb = d.waitState("idle-expire", api.StatePaused, time.Until(created.Add(90*time.Second)))
	// The pause is recorded first, then the expiry: wait for both.
	for deadline := time.Now().Add(10 * time.Second); !sb.Expired && time.Now().Before(deadline); sb = d.inspect("idle-expire") {
		time.Sleep(100 * time.Millisecond)
	}
	if !sb.Expired || sb.OnExpire != "pause" || !strings.Contains(sb.Reason, "TTL ran out") {
		t.Fatalf("expired sandbox: %+v", sb)
	}
	time.Sleep(time.Second) // reaper ticks: still there
	if out := d.must("exec", "idle-expire", "--", "echo", "still here"); out != "still here\n" {
		t.Fatalf("exec on an expired, paused sandbox: %q", out)
	}
	time.Sleep(time.Second)
	if sb := d.inspect("idle-expire"); sb.State != api.StateRunning || !sb.Expired {
		t.Fatalf("after exec: %s, expired %v", sb.State, sb.Expired)
	}
	d.must("ttl", "idle-expire", "1h")
	if sb := d.inspect("idle-expire"); sb.Expired || sb.State != api.StateRunning {
		t.Fatalf("after a new TTL: %s, expired %v", sb.State, sb.Expired)
	}
}
