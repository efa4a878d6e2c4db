#!/usr/bin/env bash
# Builds nook's Debian package from make build's binaries and packaging/:
# $BUILDDIR/nook_VERSION_ARCH.deb, with dpkg-deb (no debhelper, no source
# package). Run by `make deb`.
#
#   /usr/bin/nook, /usr/bin/nook-agent   the daemon finds the agent beside nook
#   /usr/lib/nook/runc/runc              runc as scripts/runc.sh builds it
#   /lib/systemd/system/nook.service     packaging/nook.service, ExecStart
#                                        naming the two above
#   /etc/nook/                           for the daemon's configuration
#   DEBIAN/postinst, prerm, postrm       packaging/deb/
#
# The runc is the one scripts/runc.sh builds (built first if it is not
# there; that needs root): bookworm's runc 1.1.5 lacks the fixes for
# container escapes nook's own `nook info` warns of, so the package does
# not depend on it. Its shared libraries' packages (libseccomp2, libc6)
# are read from the build host's dpkg database into Depends, beside the
# packages the daemon runs (mmdebstrap, QEMU, ...). CRIU is not shipped:
# without it pauses freeze containers in RAM (make deps builds it).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILDDIR="${BUILDDIR:-bin}"
VERSION="${VERSION:-dev}"
RUNC="${NOOK_RUNC_PREFIX:-/usr/local/lib/nook/runc}/runc"

for f in "$BUILDDIR/nook" "$BUILDDIR/nook-agent"; do
	[ -x "$f" ] || { echo "$f is missing: run make build (make deb does)" >&2; exit 1; }
done
scripts/runc.sh

# A Debian version: a release tag (v1.2.3...) as it is, anything else
# (a commit, "dev") as a snapshot that sorts below every release.
v="${VERSION#v}"
if ! [[ $v =~ ^[0-9]+\.[0-9]+ ]]; then
	when="$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S 2>/dev/null || date -u +%Y%m%d%H%M%S)"
	v="0~git$when.$v"
fi
v="$(tr -c 'A-Za-z0-9.+~\n' '.' <<<"$v")"
arch="$(dpkg --print-architecture)"

# libpkgs FILE: the Debian packages that hold the shared libraries FILE
# needs, as the dynamic loader resolves them here.
libpkgs() {
	local lib pkg libs
	libs="$(ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')" || true
	for lib in $libs; do
		pkg="$({ dpkg -S "$lib" 2>/dev/null || dpkg -S "$(realpath "$lib")" 2>/dev/null || true; } | head -n1)"
		pkg="${pkg%%:*}"
		[ -n "$pkg" ] || { echo "no Debian package holds $lib, which $1 needs" >&2; return 1; }
		echo "$pkg"
	done | sort -u
}

# What the daemon runs on the host: mmdebstrap (templates from recipes),
# e2fsprogs (mkfs.ext4: container disks, volumes, vm images), QEMU and
# qemu-img (vm sandboxes), kmod (depmod, the guest kernel's modules),
# xz-utils (the guest kernel), ca-certificates (image pulls, the secrets
# proxy's upstream TLS).
depends=(mmdebstrap e2fsprogs qemu-system-x86 qemu-utils kmod xz-utils ca-certificates)
runcdeps="$(libpkgs "$RUNC")"
if [ -n "$runcdeps" ]; then
	mapfile -t -O "${#depends[@]}" depends <<<"$runcdeps"
fi
# nft reads the rules the daemon writes (an operator's tool); ssh is what
# nook ssh runs.
recommends=(nftables openssh-client)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
root="$tmp/root"
install -d "$root/DEBIAN" "$root/usr/bin" "$root/usr/lib/nook/runc" "$root/lib/systemd/system" "$root/etc/nook"
install -m 755 "$BUILDDIR/nook" "$BUILDDIR/nook-agent" "$root/usr/bin/"
install -m 755 "$RUNC" "$root/usr/lib/nook/runc/runc"
sed 's|^ExecStart=/usr/local/bin/nook serve|ExecStart=/usr/bin/nook serve --runc /usr/lib/nook/runc/runc|' \
	packaging/nook.service >"$root/lib/systemd/system/nook.service"
chmod 644 "$root/lib/systemd/system/nook.service"
grep -q '^ExecStart=/usr/bin/nook serve --runc /usr/lib/nook/runc/runc$' "$root/lib/systemd/system/nook.service" ||
	{ echo "packaging/nook.service: no ExecStart=/usr/local/bin/nook serve line to rewrite" >&2; exit 1; }
install -m 644 packaging/config.toml "$root/etc/nook/config.toml"
install -m 755 packaging/deb/postinst packaging/deb/prerm packaging/deb/postrm "$root/DEBIAN/"

# Files under /etc are conffiles: dpkg keeps an administrator's
# changes across upgrades.
(cd "$root" && find etc -type f -printf '/%p\n') >"$root/DEBIAN/conffiles"
[ -s "$root/DEBIAN/conffiles" ] || rm "$root/DEBIAN/conffiles"
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"

join() { local IFS=,; sed 's/,/, /g' <<<"$*"; }
cat >"$root/DEBIAN/control" <<CONTROL
Package: nook
Version: $v
Architecture: $arch
Maintainer: nook maintainers <maintainers@users.noreply.a-seed-d73e5b40.example>
Section: admin
Priority: optional
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: $(join "${depends[@]}")
Recommends: $(join "${recommends[@]}")
Homepage: https://github.com/nookhq/nook
Description: sandboxes for AI agents: containers and microVMs on one host
 nook turns a Linux host into a platform of fast, isolated, persistent
 sandboxes (runc containers and QEMU microVMs) that agents drive through a
 CLI, a REST API, a Go SDK and an MCP server. The daemon runs as the
 systemd service nook.service; its sandboxes outlive a restart of it.
CONTROL

out="$BUILDDIR/nook_${v}_${arch}.deb"
rm -f "$BUILDDIR"/nook_*_"$arch".deb # one package in BUILDDIR: apt install ./bin/nook_*.deb
# gzip: every dpkg and apt reads it, and it builds in a few seconds where
# xz takes about a minute on two cores, for 30% more size.
dpkg-deb --root-owner-group -Zgzip --build "$root" "$out" >/dev/null
echo "$out"
