# What scripts/criu.sh and scripts/runc.sh share: a pinned tool built once
# into $PREFIX. Sourced; the caller defines has_version and sets PREFIX.

# build_lock WHAT exits 0 when the build is there already; otherwise, as
# root only, it takes $PREFIX/.lock (one build at a time: two `make test`
# runs at once) and exits 0 if another build finished meanwhile.
build_lock() {
	has_version && exit 0
	if [ "$(id -u)" != 0 ]; then
		echo "nook needs $1; run make as root (or run $0 as root) to build it" >&2
		exit 1
	fi
	mkdir -p "$PREFIX"
	exec 9>"$PREFIX/.lock"
	flock 9
	has_version && exit 0
	return 0
}

# apt_need WHAT PKG... installs those of the Debian packages that are
# missing, saying what for.
apt_need() {
	local what=$1 p
	shift
	local need=()
	for p in "$@"; do
		if [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]; then
			need+=("$p")
		fi
	done
	if [ ${#need[@]} -gt 0 ]; then
		echo "installing $what: ${need[*]}" >&2
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	fi
}
