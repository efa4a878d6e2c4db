# nook: the documented way to build, run, test and benchmark.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
export CGO_ENABLED := 0
GO ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/nookhq/nook/internal/daemon.Version=$(VERSION)

.PHONY: all deps build run test escape unit bench lint fuzz clean

all: build

deps:
	@scripts/deps.sh

build:
	@mkdir -p bin
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/nook ./cmd/nook
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/nook-agent ./cmd/nook-agent

# Start the daemon on its defaults, create a sandbox, run a command in it.
run: deps build
	@scripts/run.sh

STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint:
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# Unit tests and the privileged integration tests (root, runc, mounts,
# cgroups), with the race detector. The base template is built on first use.
# The end-to-end package runs after the others, alone: its density and
# latency checks compare timings, which other packages' tests running
# beside it on a small machine would skew.
test: deps lint
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 40m $$($(GO) list ./... | grep -v '/internal/e2e$$')
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 40m ./internal/e2e

# The escape suite: every attack found on nook, as a test (TestEscape*, in
# the package it attacks). make test runs them too.
escape: deps
	CGO_ENABLED=1 $(GO) test -race -count=1 -run 'Escape' ./...

# Short fuzzing of every decoder of untrusted input.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzFrameReader -fuzztime 20s ./api
	$(GO) test -run '^$$' -fuzz FuzzDecodeRequest -fuzztime 20s ./internal/agent
	$(GO) test -run '^$$' -fuzz FuzzFileRequest -fuzztime 10s ./internal/agent
	$(GO) test -run '^$$' -fuzz FuzzDecodeVolCall -fuzztime 10s ./internal/agent
	$(GO) test -run '^$$' -fuzz FuzzExtract -fuzztime 30s -fuzzminimizetime 3s ./internal/agent/safetar
	$(GO) test -run '^$$' -fuzz FuzzAgentFrameGuard -fuzztime 10s ./internal/agent
	$(GO) test -run '^$$' -fuzz FuzzAgentReplies -fuzztime 10s ./internal/agent
	$(GO) test -run '^$$' -fuzz FuzzParseSize -fuzztime 10s ./internal/core
	$(GO) test -run '^$$' -fuzz FuzzParseDuration -fuzztime 10s ./internal/core
	$(GO) test -run '^$$' -fuzz FuzzParseQMP -fuzztime 10s ./internal/backend/vm
	$(GO) test -run '^$$' -fuzz FuzzParseScope -fuzztime 10s ./internal/daemon
	$(GO) test -run '^$$' -fuzz FuzzFileCapsExcess -fuzztime 10s ./internal/backend/container
	$(GO) test -run '^$$' -fuzz FuzzShiftXattr -fuzztime 10s ./internal/backend/container
	$(GO) test -run '^$$' -fuzz FuzzAgentELF -fuzztime 10s -fuzzminimizetime 3s ./internal/daemon
	$(GO) test -run '^$$' -fuzz FuzzString -fuzztime 10s ./internal/cli/termsafe
	$(GO) test -run '^$$' -fuzz FuzzParseVersion -fuzztime 10s ./internal/runcbin
	$(GO) test -run '^$$' -fuzz FuzzUnpack -fuzztime 30s -fuzzminimizetime 3s ./internal/layerstore
	$(GO) test -run '^$$' -fuzz FuzzListening -fuzztime 10s ./internal/daemon
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 10s ./internal/dockerignore
	$(GO) test -run '^$$' -fuzz FuzzConnectEnvelope -fuzztime 20s ./internal/e2b
	$(GO) test -run '^$$' -fuzz FuzzUploadFileName -fuzztime 10s ./internal/e2b
	$(GO) test -run '^$$' -fuzz FuzzParseBinding -fuzztime 10s ./internal/secrets
	$(GO) test -run '^$$' -fuzz FuzzRewrite -fuzztime 20s ./internal/secrets
	$(GO) test -run '^$$' -fuzz FuzzReplacer -fuzztime 10s ./internal/secrets
	$(GO) test -run '^$$' -fuzz FuzzParseNames -fuzztime 10s ./internal/e2b
	$(GO) test -run '^$$' -fuzz FuzzMetadataRequest -fuzztime 20s ./internal/identity
	$(GO) test -run '^$$' -fuzz FuzzClassify -fuzztime 20s ./internal/egress
	$(GO) test -run '^$$' -fuzz FuzzDecodeRequest -fuzztime 20s ./internal/sshd
	$(GO) test -run '^$$' -fuzz FuzzParseSSHKey -fuzztime 10s ./internal/daemon
	$(GO) test -run '^$$' -fuzz FuzzRoute -fuzztime 10s ./internal/preview

bench: deps build
	$(GO) run ./cmd/nook-bench

clean:
	rm -rf bin
