#!/usr/bin/env bash
# make run: start the daemon on its defaults (if it is not running), create
# a sandbox, and run a command in it.
set -euo pipefail
cd "$(dirname "$0")/.."
NOOK=./bin/nook
SOCK=/run/nook/nook.sock
export NOOK_HOST=unix://$SOCK
# E2B's API on 127.0.0.1:3000 (nook serve --e2b-listen), for programs
# written for E2B's SDKs, unless something else holds that port.
E2B_ADDR=127.0.0.1:3000
# SSH to every sandbox on 127.0.0.1:2222 (nook serve --ssh-listen) and
# preview URLs on 127.0.0.1:8080 (--preview-listen), likewise.
SSH_ADDR=127.0.0.1:2222
PREVIEW_ADDR=127.0.0.1:8080
# listen_if_free FLAG ADDR WHAT: the flag, unless something holds ADDR.
listen_if_free() {
	if (exec 3<>"/dev/tcp/${2%:*}/${2##*:}") 2>/dev/null; then
		echo "$2 is taken: the daemon starts without $3 (nook serve $1 ADDR)" >&2
		return
	fi
	echo "$1 $2"
}
if ! $NOOK info >/dev/null 2>&1; then
	mkdir -p /var/log
	# shellcheck disable=SC2207 # flag and address, no spaces
	listen=($(listen_if_free --e2b-listen "$E2B_ADDR" "E2B's API") $(listen_if_free --ssh-listen "$SSH_ADDR" SSH) $(listen_if_free --preview-listen "$PREVIEW_ADDR" "preview URLs"))
	echo "starting the nook daemon (log: /var/log/nook.log)"
	setsid nohup $NOOK serve "${listen[@]}" >>/var/log/nook.log 2>&1 </dev/null &
	for _ in $(seq 100); do
		$NOOK info >/dev/null 2>&1 && break
		sleep 0.1
	done
	$NOOK info >/dev/null || { tail -20 /var/log/nook.log; exit 1; }
fi
if ! $NOOK inspect demo >/dev/null 2>&1; then
	$NOOK create --name demo --ttl 1d >/dev/null
fi
echo "--- nook exec demo -- uname -a"
$NOOK exec demo -- uname -a
echo "--- nook exec demo -- cat /etc/os-release"
$NOOK exec demo -- cat /etc/os-release
cat <<MSG

The daemon is running and sandbox "demo" is yours. Go on with:
  ./bin/nook exec demo -- bash -c 'apt-get --version; python3 --version'
  ./bin/nook create --name task --ttl 90m     # another sandbox
  ./bin/nook create --isolation vm --name box  # a microVM with its own kernel
  ./bin/nook snapshot box; ./bin/nook fork box --count 3   # branch it
  ./bin/nook create --name web --allow @registries         # egress allowlist
  ./bin/nook template build app ./my-repo      # a template from a Dockerfile (or --from IMAGE)
  ./bin/nook expose demo 8000                  # a port on the host (and its preview URL, with --preview-listen)
  ./bin/nook ls                                # what is running
  ./bin/nook rm demo                           # destroy, leaving nothing behind
  ./bin/nook info                              # backends and host capabilities
MSG
serve_cmdline="/proc/$(pgrep -o -f "$NOOK serve" || echo self)/cmdline"
if grep -q -- "--ssh-listen" "$serve_cmdline" 2>/dev/null; then
	cat <<MSG
SSH reaches every sandbox (no sshd in them):
  ./bin/nook ssh demo                          # a shell, with a certificate made for this login
  ./bin/nook ssh-key add ~/.ssh/id_ed25519.pub # then: ssh -p ${SSH_ADDR##*:} demo@${SSH_ADDR%:*}, scp, sftp, editors (nook ssh-config)
MSG
fi
if grep -q -- "--preview-listen" "$serve_cmdline" 2>/dev/null; then
	cat <<MSG
Web apps in sandboxes open at preview URLs:
  ./bin/nook expose demo 8000                  # prints http://8000-demo.localhost:${PREVIEW_ADDR##*:}/?nook_token=...
MSG
fi
if grep -q -- "--e2b-listen" "$serve_cmdline" 2>/dev/null; then
	cat <<MSG
E2B's SDKs reach it too:
  export E2B_API_URL=http://$E2B_ADDR E2B_SANDBOX_URL=http://$E2B_ADDR E2B_API_KEY=\$(./bin/nook token create --e2b)
MSG
fi
