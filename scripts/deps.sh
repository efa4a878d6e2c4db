#!/usr/bin/env bash
# Installs the host packages nook needs, from Debian's mirror. Idempotent:
# it touches apt only when something is missing.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have runc       || need+=(runc)
have mmdebstrap || need+=(mmdebstrap)
have mount      || need+=(mount)
# The vm backend: QEMU's microvm, qemu-img for copy-on-write disks, mkfs.ext4
# for template images, xz for the guest kernel. (The guest kernel itself,
# Debian's linux-image-amd64, is downloaded and unpacked on first use, not
# installed.)
have qemu-system-x86_64 || need+=(qemu-system-x86)
have qemu-img   || need+=(qemu-utils)
have mkfs.ext4  || need+=(e2fsprogs)
have xz         || need+=(xz-utils)
have depmod     || need+=(kmod)
# nft, to read the rules the daemon writes over netlink (operators, and the
# network tests' failure messages); npm, to install the MCP Inspector the
# MCP tests drive.
have nft        || need+=(nftables)
have npm        || need+=(npm)
# PyJWT and its crypto, to verify sandboxes' identity tokens in the tests
# with a library nook does not use (internal/identity).
/usr/bin/python3 -c 'import jwt, cryptography' 2>/dev/null || need+=(python3-jwt python3-cryptography)
# OpenSSH's client (ssh, scp, sftp, ssh-keygen) and tmux (a terminal for it):
# nook ssh runs ssh, and the SSH tests drive the real client (internal/sshd).
have ssh        || need+=(openssh-client)
have tmux       || need+=(tmux)
# systemd-analyze, to check packaging/nook.service (these machines do not
# run systemd; the package only provides the tools).
have systemd-analyze || need+=(systemd)
if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ]; then
		echo "nook needs these packages: ${need[*]}; run make as root (or apt-get install them)" >&2
		exit 1
	fi
	echo "installing ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# CRIU >= 4, built from Debian's source (bookworm's 3.17 fails on these
# kernels): container pauses then checkpoint to disk. Without it they freeze
# in RAM and the checkpoint tests skip, so a failed build warns, not stops.
if ! "$(dirname "$0")/criu.sh"; then
	if [ "${CI:-}" = true ]; then
		echo "CRIU could not be built: under CI=true that is an error (the checkpoint tests would otherwise skip)" >&2
		exit 1
	fi
	echo "warning: CRIU could not be built: container pauses will freeze in RAM, and the checkpoint tests will skip" >&2
fi
if ! have go && [ ! -x /usr/local/go/bin/go ]; then
	echo "Go is not installed: nook needs Go >= 1.24 to build" >&2
	exit 1
fi
# runc >= 1.5.2 built from its Go module (bookworm's 1.1.5 lacks the fixes for
# the November 2025 container escapes); a failed build keeps Debian's runc,
# and `nook info` shows the advisories against it.
if ! "$(dirname "$0")/runc.sh"; then
	if [ "${CI:-}" = true ]; then
		echo "runc could not be built: under CI=true that is an error (the tests would run Debian's runc, which lacks the advisories' fixes)" >&2
		exit 1
	fi
	echo "warning: runc could not be built: nook keeps Debian's runc, and nook info lists the advisories against it" >&2
fi
# The MCP Inspector (a real MCP client nobody here wrote) for the MCP tests, from npm.
INSPECTOR_VERSION=2.12.0
dir="$(dirname "$0")/../.cache/mcp-inspector"
if command -v npm >/dev/null 2>&1 && [ "$(cat "$dir/.version" 2>/dev/null)" != "$INSPECTOR_VERSION" ]; then
	echo "installing @modelcontextprotocol/inspector@$INSPECTOR_VERSION into .cache/mcp-inspector" >&2
	mkdir -p "$dir"
	(cd "$dir" && npm install --silent --no-audit --no-fund --no-save "@modelcontextprotocol/inspector@$INSPECTOR_VERSION" >/dev/null 2>&1) &&
		echo "$INSPECTOR_VERSION" > "$dir/.version" || { echo "could not install the MCP Inspector from npm" >&2; exit 1; }
fi
# E2B's JS SDK (its npm package, pinned by internal/e2e/testdata/e2b's
# package-lock.json) for the E2B end-to-end test. npm ci runs only when the
# lock file differs from the one last installed.
src="$(dirname "$0")/../internal/e2e/testdata/e2b"
dir="$(dirname "$0")/../.cache/e2b-sdk"
if command -v npm >/dev/null 2>&1 && { ! cmp -s "$src/package-lock.json" "$dir/.installed-lock.json" || [ ! -d "$dir/node_modules/e2b" ]; }; then
	echo "installing E2B's SDK (npm ci from internal/e2e/testdata/e2b) into .cache/e2b-sdk" >&2
	mkdir -p "$dir"
	rm -f "$dir/.installed-lock.json"
	cp "$src/package.json" "$src/package-lock.json" "$dir/"
	if ! out="$(cd "$dir" && npm ci --silent --no-audit --no-fund 2>&1)"; then
		echo "$out" >&2
		echo "could not install E2B's SDK from npm (npm ci in .cache/e2b-sdk failed)" >&2
		exit 1
	fi
	cp "$src/package-lock.json" "$dir/.installed-lock.json"
fi
