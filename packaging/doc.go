// Package packaging holds no code: its directory holds what installs nook
// as a service, and its tests check those files as systemd and dpkg read
// them.
//
//   - nook.service: the systemd unit (Type=notify: nook serve sends
//     READY=1 through internal/sdnotify once sandboxes are re-adopted and
//     the API answers; KillMode=process and Delegate=yes, so that
//     sandboxes outlive a stop or restart of the daemon). Every line's
//     reason is in its comments.
//   - deb/postinst, deb/prerm, deb/postrm: the Debian package's
//     maintainer scripts, which scripts/deb.sh (make deb) puts in the
//     package beside the binaries, the unit and the runc that
//     scripts/runc.sh builds.
//
// make install copies the binaries into BINDIR and the unit into UNITDIR
// with its ExecStart naming BINDIR/nook (default /usr/local/bin, where
// the unit as written points); the .deb uses /usr/bin and passes its own
// runc with --runc. The daemon finds nook-agent beside nook in both.
package packaging
