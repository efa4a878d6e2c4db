// Package sshd is nook's SSH endpoint (nook serve --ssh-listen): one SSH
// server, built on golang.org/x/crypto/ssh, for every sandbox of the
// daemon. No sshd runs in any sandbox and templates need nothing: a
// session is an exec through the sandbox's agent, SFTP is served by the
// daemon over the sandbox's file API (github.com/pkg/sftp), and a local
// forward is a connection the agent makes to the sandbox's own loopback.
//
// # Logging in
//
// The SSH user name selects the sandbox: NAME, or NAME+USER to log in as
// another user of the sandbox (default: the sandbox's default user, the
// image's USER or root). Authentication is by public key only:
//
//   - a key registered for the sandbox (nook create --ssh-key, nook
//     ssh-key add NAME FILE), stored in the daemon's database;
//   - a key registered for a token (nook ssh-key add FILE): it logs in to
//     every sandbox the token may run commands in (admin: all; a
//     sandbox token: its one), checked at each login, so a revoked or
//     expired token's keys stop working (revoking deletes them);
//   - a key the host's socket registered without a sandbox: every sandbox;
//   - a user certificate signed by nook's SSH CA (DATA/ssh/user_ca_ed25519_key),
//     minted by POST /v1/sandboxes/{name}/ssh-cert for one login (nook ssh
//     NAME: ten minutes by default, at most a day). Its one principal is
//     the sandbox's ID (and +USER): it is good for that sandbox only, not
//     for a later one of the same name, and only as that user.
//
// Every refusal answers the same "permission denied", whether the sandbox
// exists or not. The host key (DATA/ssh/host_ed25519_key, made on first
// start, written whole then renamed) is printed by nook info;
// nook ssh-config prints ~/.ssh/config blocks that check it with
// KnownHostsCommand.
//
// # Sessions
//
//   - shell: the user's login shell (from the sandbox's /etc/passwd, read
//     once per connection) with -l, on a PTY when the client asked for one
//     (pty-req: TERM, size; window-change resizes);
//   - exec: SHELL -c COMMAND; its exit status (or signal) is returned;
//     without a PTY stdout and stderr stay apart;
//   - subsystem sftp (and OpenSSH's scp, which speaks SFTP): sftp.go. Files
//     it creates are the login user's; the file API writes whole files
//     atomically, so a write that is not sequential from the start of a
//     new or truncated file is refused;
//   - env: only the names --ssh-accept-env lists (default LANG, LC_*);
//   - signal: passed to the process group;
//   - agent forwarding, X11, remote forwarding (-R): refused.
//
// A direct-tcpip channel (ssh -L) reaches only the sandbox's own loopback
// (localhost, 127.0.0.1, ::1): the daemon never dials from the host, so
// a forward reaches nothing the sandbox itself could not.
//
// # Idle and paused sandboxes
//
// A paused sandbox wakes on the first session, exec, SFTP or forward of a
// connection. The agent streams a connection holds open are Passive: an
// open but silent session is no use of the sandbox; its traffic is (at
// most one idle-clock restart a second), so an idle SSH session lets the
// sandbox's idle pause happen, which ends the session (the client is told
// why on stderr, exit status 255).
//
// # Limits
//
// At most 1024 connections, 64 channels per connection, 6 authentication
// attempts, 30 s to finish the handshake, 64 environment variables of at
// most 32 KiB each; a request the client malformed is refused, never a
// panic (FuzzDecodeRequest).
package sshd
