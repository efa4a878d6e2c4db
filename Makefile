# nook: the documented way to build, run, test and benchmark.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
export CGO_ENABLED := 0
GO ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/nookhq/nook/internal/daemon.Version=$(VERSION)

# Where make build writes the binaries (make install and make deb take
# them from there).
BUILDDIR ?= bin
# make install: PREFIX and DESTDIR as usual; the unit goes where systemd
# looks (/usr/local/lib/systemd/system is on its path).
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= /etc

.PHONY: all deps build run test escape unit bench lint fuzz clean install uninstall deb

all: build

deps:
	@scripts/deps.sh

build:
	@mkdir -p $(BUILDDIR)
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BUILDDIR)/nook ./cmd/nook
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BUILDDIR)/nook-agent ./cmd/nook-agent

# Install as a service: nook and nook-agent into BINDIR (the daemon finds
# the agent beside nook), the systemd unit (packaging/nook.service, its
# ExecStart naming BINDIR/nook) into UNITDIR, and SYSCONFDIR/nook with the
# documented config.toml (all commented out; an existing one is kept). Run it
# again to upgrade; then systemctl restart nook (sandboxes keep running).
# runc and CRIU come from make deps (into /usr/local/lib/nook).
install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/nook
	install -m 755 $(BUILDDIR)/nook $(BUILDDIR)/nook-agent $(DESTDIR)$(BINDIR)/
	sed 's|^ExecStart=/usr/local/bin/nook |ExecStart=$(BINDIR)/nook |' packaging/nook.service > $(DESTDIR)$(UNITDIR)/nook.service.tmp
	chmod 644 $(DESTDIR)$(UNITDIR)/nook.service.tmp
	mv -f $(DESTDIR)$(UNITDIR)/nook.service.tmp $(DESTDIR)$(UNITDIR)/nook.service
	@# The documented config (every line commented out): never over an administrator's own.
	[ -e $(DESTDIR)$(SYSCONFDIR)/nook/config.toml ] || install -m 644 packaging/config.toml $(DESTDIR)$(SYSCONFDIR)/nook/config.toml
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@if [ -z "$(DESTDIR)" ]; then echo "installed: systemctl enable --now nook (systemctl restart nook after an upgrade), or without systemd $(BINDIR)/nook serve"; fi

# Stops and disables the service (sandboxes keep running), removes what
# make install put in place; config.toml only if unchanged, SYSCONFDIR/nook
# only if empty.
uninstall:
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl disable --now nook.service || true; fi
	rm -f $(DESTDIR)$(BINDIR)/nook $(DESTDIR)$(BINDIR)/nook-agent $(DESTDIR)$(UNITDIR)/nook.service
	@# The config only as make install left it (an administrator's changes stay).
	if cmp -s packaging/config.toml $(DESTDIR)$(SYSCONFDIR)/nook/config.toml; then rm -f $(DESTDIR)$(SYSCONFDIR)/nook/config.toml; fi
	rmdir $(DESTDIR)$(SYSCONFDIR)/nook 2>/dev/null || true
	@if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

# A Debian package (scripts/deb.sh): BUILDDIR/nook_VERSION_ARCH.deb.
deb: build
	@BUILDDIR=$(BUILDDIR) VERSION=$(VERSION) scripts/deb.sh

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
# beside it on a small machine would skew. On the slowest test machine
# seen (process starts 6x slower than on others) the suite took 38 min:
# its bound leaves room for that, within CI's 90.
test: deps lint
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 40m $$($(GO) list ./... | grep -v '/internal/e2e$$')
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 65m ./internal/e2e

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
	$(GO) test -run '^$$' -fuzz FuzzServeConfig -fuzztime 10s ./internal/cli
	$(GO) test -run '^$$' -fuzz FuzzFilter -fuzztime 10s ./internal/listfilter
	$(GO) test -run '^$$' -fuzz FuzzClassify -fuzztime 20s ./internal/egress
	$(GO) test -run '^$$' -fuzz FuzzDecodeRequest -fuzztime 20s ./internal/sshd
	$(GO) test -run '^$$' -fuzz FuzzParseSSHKey -fuzztime 10s ./internal/daemon
	$(GO) test -run '^$$' -fuzz FuzzRoute -fuzztime 10s ./internal/preview

bench: deps build
	$(GO) run ./cmd/nook-bench

clean:
	rm -rf bin
