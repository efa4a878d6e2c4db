// Package sshd is nook's SSH endpoint (nook serve --ssh-listen): one SSH
// server, built on golang.org/x/crypto/ssh, for every sandbox of the
// daemon. No sshd runs in any sandbox and templates need nothing: a
// session is an exec through the sandbox's agent, SFTP is the agent's own
// binary run as an SFTP server (github.com/pkg/sftp) as the login user,
// and a local forward is a connection the agent makes to the sandbox's
// own loopback.
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
//     expired token's keys stop working (revoking deletes them); a key a
//     token registered for one sandbox ends with that token too;
//   - a key the host's socket registered without a sandbox: every sandbox;
//   - a user certificate signed by nook's SSH CA (DATA/ssh/user_ca_ed25519_key),
//     minted by POST /v1/sandboxes/{name}/ssh-cert for one login (nook ssh
//     NAME: ten minutes by default, at most a day). Its one principal is
//     the sandbox's ID (and +USER): it is good for that sandbox only, not
//     for a later one of the same name, and only as that user; its
//     extension nook-token@nook names the API token that minted it, and it
//     logs in only while that token is valid.
//
// What admitted a login is checked again for every new channel (a
// session, a forward): the name must still be the sandbox logged in to
// (not a later one of the same name) and the key, token or certificate's
// token must still admit it; otherwise the connection closes.
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
//   - subsystem sftp (and OpenSSH's scp, which speaks SFTP): the agent's
//     binary as an SFTP server (agent.SFTPServerMain) exec'd as the login
//     user, in its home: the kernel checks every operation against that
//     user, the whole protocol works on the real file system (random
//     access, symlinks, setstat, posix-rename, statvfs), and the client's
//     packets are parsed in the sandbox, under its limits, not by the
//     daemon;
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
// connection. A shell's, SFTP's and a forward's agent streams (and the
// shell's process) are Passive: open but silent, they are no use of the
// sandbox; their traffic is (at most one idle-clock restart a second), so
// an idle shell lets the sandbox's idle pause happen, which ends the
// session (the client is told why on stderr, exit status 255). A command
// (ssh NAME cmd) is use while it runs, as nook exec's. Passive streams
// are not cut by a container snapshot's quiesce: with an SSH session
// open, a container's snapshot keeps the disk only, as with an exec in
// flight.
//
// # Limits
//
// At most 1024 connections, 16 from one address that have not logged in
// yet (silent connections cannot hold every slot), 32 per sandbox, 64
// channels per connection,
// 6 authentication attempts, 30 s to finish the handshake, 64
// environment variables (names of at most 256 bytes, 64 KiB in all), a
// terminal type of at most 256 bytes; a request the client malformed is
// refused, never a panic (FuzzDecodeRequest).
//
// # Speed
//
// Ciphers are AES-GCM only: the client's preference picks the cipher,
// OpenSSH lists chacha20-poly1305 and AES-CTR first, and Go runs those at
// about half AES-GCM's speed with AES-NI (1 GiB: 4.6 s and 4.3 s against
// 3.4 s, measured). Reads of each connection ask for quick ACKs
// (internal/quickack): OpenSSH's client writes without TCP_NODELAY
// outside interactive sessions, and delayed ACKs held two of its
// handshake packets 40 ms each.
package sshd
