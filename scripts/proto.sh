#!/usr/bin/env bash
# Generates the Go code of E2B's envd protos (internal/e2b/proto, from
# e2b-dev/infra, Apache-2.0) into internal/e2b/envdpb. The output is
# committed: building and testing nook need neither protoc nor the
# plugins, only changing the protos does. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v protoc >/dev/null 2>&1 || {
	echo "installing protobuf-compiler" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends protobuf-compiler >/dev/null
}
bin="$PWD/.cache/bin"
mkdir -p "$bin"
GOBIN="$bin" go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GOBIN="$bin" go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
pkg=github.com/nookhq/nook/internal/e2b/envdpb
m=()
for p in process filesystem; do
	m+=("--go_opt=M$p/$p.proto=$pkg/$p" "--connect-go_opt=M$p/$p.proto=$pkg/$p")
done
rm -rf internal/e2b/envdpb
mkdir -p internal/e2b/envdpb
PATH="$bin:$PATH" protoc -I internal/e2b/proto \
	--go_out=internal/e2b/envdpb --go_opt=paths=source_relative \
	--connect-go_out=internal/e2b/envdpb --connect-go_opt=paths=source_relative \
	"${m[@]}" process/process.proto filesystem/filesystem.proto
