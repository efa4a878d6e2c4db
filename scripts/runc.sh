#!/usr/bin/env bash
# Builds runc from its Go module at a pinned version into
# ${NOOK_RUNC_PREFIX:-/usr/local/lib/nook/runc}/runc, which nook prefers
# to the runc in PATH (internal/runcbin). Run by scripts/deps.sh on every
# `make test`, so when the right version is already there it exits at
# once, without apt, Go or the network.
#
# Debian bookworm's runc (1.1.5+ds1-1+deb12u1) lacks the fixes for the
# November 2025 advisories (CVE-2025-31133, CVE-2025-52565,
# CVE-2025-52881: container escapes through mount races; fixed in 1.2.8,
# 1.3.3, 1.4.0-rc.3) and for CVE-2026-41579 (1.3.6, 1.4.3, 1.5.0-rc.3).
# The module comes from the Go module proxy, checked against the Go
# checksum database like any module; it is built as runc's Makefile
# does (cgo, seccomp through libseccomp), without the libpathrs tag (a
# Rust library Debian does not ship; runc then uses its Go fallback).
set -euo pipefail

RUNC_VERSION=1.5.2
RUNC_MODULE=github.com/opencontainers/runc

PREFIX="${NOOK_RUNC_PREFIX:-/usr/local/lib/nook/runc}"
RUNC="$PREFIX/runc"
# What `runc --version` prints as its commit: the module version (the
# module zip has no git history for runc's Makefile's `git describe`).
COMMIT="v$RUNC_VERSION-gomod"

# has_version reports whether $RUNC exists and is the build this script makes.
has_version() {
	[ -x "$RUNC" ] || return 1
	local out
	out="$("$RUNC" --version 2>/dev/null)" || return 1
	grep -qx "runc version $RUNC_VERSION" <<<"$out" && grep -qx "commit: $COMMIT" <<<"$out"
}

. "$(dirname "$0")/lib.sh"
build_lock "runc $RUNC_VERSION at $RUNC"

start=$SECONDS

GO="$(command -v go || true)"
[ -n "$GO" ] || GO=/usr/local/go/bin/go
if [ ! -x "$GO" ]; then
	echo "Go is not installed: building runc $RUNC_VERSION needs it" >&2
	exit 1
fi

# cgo: a C compiler, libseccomp's headers (found through pkg-config).
apt_need "runc build dependencies" gcc libc6-dev pkg-config libseccomp-dev

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"; rm -f "$RUNC.tmp"' EXIT
log="$tmp/build.log"
# `go install module@version` builds outside any module of ours; the
# project's GOFLAGS (e.g. -mod=vendor) must not apply to it.
if ! (cd "$tmp" && env -u GOFLAGS GOBIN="$tmp/bin" CGO_ENABLED=1 GOTOOLCHAIN=auto \
	"$GO" install -trimpath -tags "seccomp urfave_cli_no_docs" \
	-ldflags "-X main.gitCommit=$COMMIT" "$RUNC_MODULE@v$RUNC_VERSION") >"$log" 2>&1; then
	echo "building runc $RUNC_VERSION failed; the end of the build log:" >&2
	tail -n 30 "$log" >&2
	exit 1
fi
install -m 755 "$tmp/bin/runc" "$RUNC.tmp"
mv -f "$RUNC.tmp" "$RUNC"

if ! has_version; then
	echo "built $RUNC, but \`$RUNC --version\` does not say runc version $RUNC_VERSION, commit $COMMIT:" >&2
	"$RUNC" --version >&2 || true
	exit 1
fi
echo "built runc $RUNC_VERSION into $PREFIX ($((SECONDS - start)) s)" >&2
