// Package sdnotify is the daemon's side of systemd's readiness protocol
// (sd_notify(3)), for `nook serve` run by a unit of Type=notify
// (packaging/nook.service).
//
// systemd names a datagram socket in $NOTIFY_SOCKET: a path, or, with a
// leading '@', a name in the abstract namespace. The service sends it
// newline-separated VARIABLE=value assignments, one datagram each
// message: READY=1 once it answers (systemctl start returns then, and
// units ordered after it start), STATUS= for systemctl status,
// MAINPID= for the process systemd watches, STOPPING=1 when it begins to
// shut down. Nothing comes back.
//
// FromEnv reads the variable and unsets it, so that the processes the
// daemon starts (runc, QEMU, CRIU, mkfs) do not inherit a socket that is
// not theirs to write. Without the variable (make run, a shell, the
// tests) it returns a nil *Notifier, whose Send does nothing.
//
// The watchdog (WATCHDOG=1) and EXTEND_TIMEOUT_USEC are not used: the
// unit gives the start a fixed TimeoutStartSec instead.
package sdnotify
