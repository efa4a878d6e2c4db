#!/usr/bin/env bash
# Installs CRIU, built from source, into ${NOOK_CRIU_PREFIX:-/usr/local/lib/nook/criu}
# (binary at $PREFIX/sbin/criu). Run by scripts/deps.sh on every `make test`, so
# when the right version is already there it exits at once, without apt or the
# network.
#
# The source is Debian sid's upstream tarball from deb.debian.org, pinned by
# sha256 (the value sid's source index, dists/sid/main/source/Sources.xz, lists
# for criu_4.2.1.orig.tar.xz). 4.2 is the first CRIU that dumps TCP sockets on
# kernels from 6.16 on (SO_PASSSEC, checkpoint-restore/criu#2705); bookworm's
# 3.17 fails on these kernels altogether. Only the criu binary is built and
# installed, with nftables as the default network-lock method (the hosts have
# no iptables-restore) and without GnuTLS (the same build on every host).
#
# One patch is applied, scripts/criu-userns-join.patch: with --join-ns
# user:PATH (what runc passes to restore a container into the user namespace
# its spec names), the restored root task is born in that user namespace
# instead of a new one, so that the network namespace nook made in it can be
# joined as an external one. Upstream CRIU creates a new user namespace
# whatever --join-ns says ("join-ns with user-namespace is not fully tested"),
# and the restore of every user-namespaced container sandbox fails. The
# installed build records the patch's sha256 beside the binary
# ($PREFIX/sbin/criu.patch), which is how nook (and this script) tell it.
set -euo pipefail

CRIU_VERSION=4.2.1
CRIU_URL="http://deb.debian.org/debian/pool/main/c/criu/criu_${CRIU_VERSION}.orig.tar.xz"
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9

PREFIX="${NOOK_CRIU_PREFIX:-/usr/local/lib/nook/criu}"
CRIU="$PREFIX/sbin/criu"
PATCH="$(cd "$(dirname "$0")" && pwd)/criu-userns-join.patch"
PATCH_SHA256="$(sha256sum "$PATCH" | cut -d' ' -f1)"

# has_version reports whether $CRIU exists, says it is $CRIU_VERSION and was
# built with this patch.
has_version() {
	[ -x "$CRIU" ] || return 1
	[ "$(cat "$CRIU.patch" 2>/dev/null)" = "$PATCH_SHA256" ] || return 1
	local out
	out="$("$CRIU" --version 2>/dev/null)" || return 1
	grep -qx "Version: $CRIU_VERSION" <<<"$out"
}

. "$(dirname "$0")/lib.sh"
build_lock "CRIU $CRIU_VERSION at $CRIU"

start=$SECONDS

# Build dependencies for `make criu` on Debian bookworm (4.2 runs protoc with
# protobuf-c's plugin; no python3 or asciidoc for the binary alone). libbsd-dev and libnftables-dev are
# optional to CRIU's build but wanted: without libnftables-dev the nftables
# network lock is compiled out.
pkgs=(
	build-essential pkg-config xz-utils patch
	libprotobuf-c-dev protobuf-c-compiler libprotobuf-dev protobuf-compiler
	libnl-3-dev libcap-dev libnet1-dev uuid-dev
	libbsd-dev libnftables-dev
)
# A downloader: curl if present, else wget, else install curl.
if command -v curl >/dev/null 2>&1; then
	fetch() { curl -fsSL --retry 3 -o "$2" "$1"; }
elif command -v wget >/dev/null 2>&1; then
	fetch() { wget -q --tries=3 -O "$2" "$1"; }
else
	pkgs+=(curl)
	fetch() { curl -fsSL --retry 3 -o "$2" "$1"; }
fi

apt_need "CRIU build dependencies" "${pkgs[@]}"

tmp="$(mktemp -d)"
cleanup() {
	rm -rf "$tmp"
	rm -f "$CRIU.tmp"
}
trap cleanup EXIT

tarball="$tmp/criu_${CRIU_VERSION}.orig.tar.xz"
if ! fetch "$CRIU_URL" "$tarball"; then
	echo "could not download $CRIU_URL" >&2
	exit 1
fi
got="$(sha256sum "$tarball" | cut -d' ' -f1)"
if [ "$got" != "$CRIU_SHA256" ]; then
	echo "refusing to build CRIU: $CRIU_URL has sha256 $got, expected $CRIU_SHA256" >&2
	exit 1
fi

log="$tmp/build.log"
fail() {
	echo "$1; the end of the build log:" >&2
	tail -n 40 "$log" >&2
	exit 1
}
tar -xJf "$tarball" -C "$tmp" >"$log" 2>&1 || fail "could not unpack $tarball"
src="$tmp/criu-$CRIU_VERSION"
[ -d "$src" ] || fail "$tarball did not unpack into criu-$CRIU_VERSION"
patch -d "$src" -p1 <"$PATCH" >>"$log" 2>&1 || fail "could not apply $PATCH"
make -C "$src" -j"$(nproc)" criu NETWORK_LOCK_DEFAULT=NETWORK_LOCK_NFTABLES NO_GNUTLS=1 >>"$log" 2>&1 ||
	fail "building CRIU $CRIU_VERSION failed"
# CRIU's build quietly leaves nftables out when it cannot find libnftables (via
# pkg-config); a binary whose default lock method is compiled out is no use.
if grep -q "without nftables support" "$log"; then
	echo "refusing to install CRIU $CRIU_VERSION built without nftables support (is libnftables-dev installed?):" >&2
	grep -E "^(Note|Warn|      )" "$log" >&2 || true
	exit 1
fi

mkdir -p "$PREFIX/sbin"
cp "$src/criu/criu" "$CRIU.tmp"
chmod 755 "$CRIU.tmp"
mv -f "$CRIU.tmp" "$CRIU"
echo "$PATCH_SHA256" >"$CRIU.patch"

if ! has_version; then
	echo "built $CRIU, but \`$CRIU --version\` does not say Version: $CRIU_VERSION:" >&2
	"$CRIU" --version >&2 || true
	exit 1
fi
# criu check warns about kernel features it cannot use here; show, don't fail.
"$CRIU" check 2>&1 | tail -n 1 >&2 || true
echo "built CRIU $CRIU_VERSION into $PREFIX ($((SECONDS - start)) s)" >&2
