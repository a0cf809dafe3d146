# lua-resty-ffi-qrpc
#
#   make               build libffi_qrpc.so
#   make demo          install missing packages (root) or say which, build, start the demo, curl it
#   make demo-stop     stop the demo
#   make test          lint + every Go test (nginx integration, rockspec install, demo) + race run of qrpc/, ffi/, internal/bridge/, internal/hostq/
#                      against the nginx installed here (QRPC_NGINX=debian|openresty|resty-ffi|/path picks another)
#   make test-long     the soak, stress and 30-second scenarios make test leaves out (CI runs them)
#   make test-openresty / test-resty-ffi   build that nginx (cached in QRPC_BUILD_DIR), run the nginx suites on it
#   make bench         the side-by-side benchmark into bench/out/ (BENCH_QUICK=1 for a short run)
#   make bench-update  a full run into the committed bench/results.md and .svg
#   make lint          gofmt, go vet, luacheck, the docs check (README length, links, no history, every option documented),
#                      every goroutine through internal/safego (internal/golint)
#   make install       Lua module + libffi_qrpc.so + qrpc.h under PREFIX (DESTDIR supported)
#   make dist          release tarball dist/lua-resty-ffi-qrpc-<version>.tar.gz (Go deps vendored)
#   make rocks         dist + source rock + linux-x86_64 binary rock in dist/
#   make limits        regenerate lua/resty/ffi/qrpc/limits.lua from internal/limits
#   make proto         regenerate qrpc/qrpcpb, demo/proto/demopb and demo/proto/greeter.protoset
#   make clean

# A root shell on a fresh machine often lacks /usr/local/go/bin on PATH.
ifeq ($(origin GO),undefined)
GO := $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
endif
GO_DIR := $(patsubst %/,%,$(dir $(shell command -v $(GO) 2>/dev/null)))
ifneq ($(GO_DIR),)
# Tests and scripts run `go` themselves (the nginx suite builds the library).
export PATH := $(GO_DIR):$(PATH)
GOFMT ?= $(GO_DIR)/gofmt
endif
GOFMT ?= gofmt
export GO

PREFIX      ?= /usr/local
# Lua modules: LuaJIT's default package.path (and luarocks') searches
# $(PREFIX)/share/lua/5.1. OpenResty: LUA_LIB_DIR=/usr/local/openresty/site/lualib.
LUA_LIB_DIR ?= $(PREFIX)/share/lua/5.1
# The Go runtime library. The module searches PREFIX/lib when it sits in
# PREFIX/share/lua/5.1, its own Lua root (so OpenResty: LIB_DIR=$(LUA_LIB_DIR)),
# package.cpath and the dynamic linker; anywhere else needs configure{ lib = ... }.
LIB_DIR     ?= $(PREFIX)/lib
# The C ABI (qrpc.h), for C hosts and for checking abi.lua's cdef against.
INCLUDE_DIR ?= $(PREFIX)/include
INSTALL     ?= install
LUACHECK    ?= luacheck

BIN  := .bin
LIB  := libffi_qrpc.so
DEMO := demo/qrpc-demo

GO_TEST_TIMEOUT ?= 20m
GO_TEST_FLAGS   ?=
# The test-only hooks (internal/bridge/testhook.go) exist in test builds
# only; the library nginx loads is built without them.
GO_TEST_TAGS    := -tags qrpctesthooks
# Test binaries run side by side: the nginx, examples, demo and rockspec
# suites mostly wait on processes and the network, so on 2 CPUs 4 at once
# take about half the wall time of 2 (docs/testing.md).
GO_TEST_P       ?= 4
# What the suites share instead of each linking its own copy. HOOKS_LIB is
# the library with the test-only hooks (internal/safego's injected
# panics), for the nginx tests that arm them; no user loads it.
HOOKS_LIB := $(BIN)/hooks/$(LIB)
TEST_ENV = QRPC_TEST_LIB=$(CURDIR)/$(LIB) QRPC_TEST_HOOKS_LIB=$(CURDIR)/$(HOOKS_LIB) QRPC_TEST_DEMO=$(CURDIR)/$(DEMO)
# The long tests (each calls ngxtest.Long, which skips it unless
# QRPC_TEST_LONG=1): run by make test-long only.
LONG_TESTS := TestNoFalseStalls|TestLuarocksInstallFromRocksServer|TestPoolSimulationLong|TestBenchQuickSmoke|TestConnCacheDistinctOptionsBounded|TestPartialFramesDefaultOptionsReleased|TestConcurrencyFloodRecovers|TestRefusedAddrsLeaveNothing
LONG_PKGS  := ./nginx/ ./rockspec/ ./qrpc/ ./bench/

# Everything the library is built from (make only rebuilds when one changes).
LIB_SRC := go.mod go.sum $(shell find ffi qrpc internal -type f \( -name '*.go' -o -name '*.c' -o -name '*.h' \) ! -name '*_test.go' 2>/dev/null)
DEMO_SRC := $(shell find demo/server -type f -name '*.go' ! -name '*_test.go' 2>/dev/null)

.PHONY: limits schema proto-check all demo demo-stop demo-deps test test-go test-race test-long test-rockspec lint bench bench-sched bench-update install uninstall proto clean help

all: $(LIB)

# Built in a temporary directory and renamed into place: a running nginx
# that has the old library mapped keeps its inode instead of crashing on a
# file truncated under it.
$(LIB): $(LIB_SRC)
	@mkdir -p $(BIN)
	@tmp=$$(mktemp -d $(BIN)/build.XXXXXX) && \
	  echo "$(GO) build -buildmode=c-shared -trimpath -o $@ ./ffi" && \
	  $(GO) build -buildmode=c-shared -trimpath -o $$tmp/$(LIB) ./ffi && \
	  mv -f $$tmp/$(LIB) $@; rc=$$?; rm -rf $$tmp; exit $$rc

$(HOOKS_LIB): $(LIB_SRC)
	@mkdir -p $(BIN)/hooks
	@tmp=$$(mktemp -d $(BIN)/build.XXXXXX) && \
	  echo "$(GO) build $(GO_TEST_TAGS) -buildmode=c-shared -trimpath -o $@ ./ffi" && \
	  $(GO) build $(GO_TEST_TAGS) -buildmode=c-shared -trimpath -o $$tmp/$(LIB) ./ffi && \
	  mv -f $$tmp/$(LIB) $@; rc=$$?; rm -rf $$tmp; exit $$rc

$(DEMO): $(DEMO_SRC) $(LIB_SRC)
	$(GO) build -trimpath -o $@ ./demo/server

# ---- demo --------------------------------------------------------------------

demo-deps:
	@demo/scripts/deps

# Sequential on purpose: the packages must be there before anything builds.
demo:
	@demo/scripts/deps
	@$(MAKE) --no-print-directory $(LIB) $(DEMO)
	@demo/scripts/up

demo-stop:
	@demo/scripts/down

# ---- tests -------------------------------------------------------------------

# The library and the demo server are built first so that a build error
# shows up as one, not as a failing test; then the suites and the race run
# go side by side (lines of their output interleave).
test: test-deps lint proto-check $(LIB) $(HOOKS_LIB) $(DEMO)
	@$(MAKE) --no-print-directory --output-sync=line -j2 test-go test-race

test-go: $(LIB) $(HOOKS_LIB) $(DEMO)
	$(TEST_ENV) $(GO) test $(GO_TEST_TAGS) -count=1 -p $(GO_TEST_P) -timeout $(GO_TEST_TIMEOUT) $(GO_TEST_FLAGS) ./...

# The tests that ngxtest.Long skips in make test: soaks, stress, the
# 30-second scenarios. CI runs them once, on the Debian flavour; one
# package at a time (TestNoFalseStalls brings its own CPU hog).
test-long: $(LIB) $(HOOKS_LIB) $(DEMO)
	$(TEST_ENV) QRPC_TEST_LONG=1 $(GO) test -count=1 -p 1 -timeout $(GO_TEST_TIMEOUT) $(GO_TEST_FLAGS) -run '^($(LONG_TESTS))$$' $(LONG_PKGS)

# The protocol and the runtime under the race detector (the nginx suite
# cannot be: the library runs inside nginx there).
test-race:
	$(GO) test $(GO_TEST_TAGS) -race -count=1 -timeout $(GO_TEST_TIMEOUT) ./qrpc/... ./ffi/... ./internal/bridge/... ./internal/hostq/... ./internal/restyhost/...

# Also part of test-go; this runs it alone.
test-rockspec:
	$(GO) test -count=1 -timeout $(GO_TEST_TIMEOUT) -v ./rockspec/

lint:
	@echo "gofmt -l ."; out=$$($(GOFMT) -l .); if [ -n "$$out" ]; then echo "not gofmt'ed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet $(GO_TEST_TAGS) ./internal/bridge/... ./internal/hostq/... ./ffi/...
	$(LUACHECK) --codes lua demo/lua bench/lua
	@for f in demo/scripts/* .ci/run nginx/flavours/*.sh; do bash -n "$$f" || exit 1; done
	@# docscheck also fails on an include or import that runs back up a floor (Floors)
	$(GO) run ./internal/docscheck/cmd/docscheck
	$(GO) run ./internal/golint/cmd/golint
	$(GO) run ./internal/limits/gen -check
	$(GO) run ./internal/schema/gen -check
	@# files a reader can hold: Lua at most 600 lines, non-test Go at most 800
	@big=$$(find lua -name '*.lua' -exec awk 'END { if (NR > 600) print FILENAME ": " NR " lines (at most 600)" }' {} \; ; \
	  find qrpc internal ffi demo bench -name '*.go' ! -name '*_test.go' ! -name '*.pb.go' -exec awk 'END { if (NR > 800) print FILENAME ": " NR " lines (at most 800)" }' {} \;); \
	  if [ -n "$$big" ]; then echo "$$big"; exit 1; fi
	@awk 'END { if (NR > 400) { print FILENAME ": " NR " lines (at most 400: its figures live in files of their own)"; exit 1 } }' bench/main.go

# ---- nginx flavours --------------------------------------------------------------

# The nginx, rockspec and demo suites run against the nginx QRPC_NGINX names
# (internal/ngxtest): unset, the one installed here. These two targets build
# an OpenResty-equivalent nginx (with stream Lua), or Debian's nginx with real
# lua-resty-ffi, with nginx/flavours/build-*.sh from the sources pinned in
# nginx/flavours/sources.txt (downloaded from upstream, or taken from
# THIRDPARTY=dir when it holds them; verified either way) into
# QRPC_BUILD_DIR (default .build/; skipped when its stamp matches), then run
# those suites on it.
THIRDPARTY     ?=
QRPC_BUILD_DIR ?= $(CURDIR)/.build
FLAVOUR_SUITES := ./internal/ngxtest/ ./nginx/ ./rockspec/ ./demo/ ./examples/
export THIRDPARTY

.PHONY: test-openresty test-resty-ffi nginx-openresty nginx-resty-ffi

nginx-openresty nginx-resty-ffi: nginx-%:
	@echo "==> nginx flavour $*: $(QRPC_BUILD_DIR)/$* (a first build takes minutes)"
	@nginx/flavours/build-$*.sh $(QRPC_BUILD_DIR)/$*

test-openresty test-resty-ffi: test-%: nginx-% $(LIB) $(HOOKS_LIB) $(DEMO)
	QRPC_NGINX=$* QRPC_BUILD_DIR=$(QRPC_BUILD_DIR) $(TEST_ENV) \
	  $(GO) test -count=1 -p $(GO_TEST_P) -timeout $(GO_TEST_TIMEOUT) $(GO_TEST_FLAGS) $(FLAVOUR_SUITES)

# ---- benchmark -----------------------------------------------------------------

# Side by side in one run (see bench/main.go): the Lua client vs. the plain
# Go client, the IPC path vs. a unix socket, HTTP end to end. Needs wrk.
# `make bench` writes bench/out/results.{md,svg} (ignored by git);
# `make bench-update` runs the full benchmark into the committed
# bench/results.{md,svg}.
bench: $(LIB) bench-sched
	$(GO) run ./bench $(BENCH_FLAGS)

# Completions per wake-up of the built-in host (internal/hostq), held to
# their targets (bench/README.md): measurements of the machine's
# scheduling, which make test only logs.
bench-sched:
	QRPC_BENCH=1 $(GO) test -count=1 -v -run '^(TestQueuedEchoesOnOneCPU|TestAnswersWakeOncePerBatch)$$' ./internal/hostq/

bench-update: $(LIB)
	$(GO) run ./bench -update $(BENCH_FLAGS)

# ---- install -------------------------------------------------------------------

# Files go in under a temporary name and are renamed: replacing the library
# of a running nginx in place would crash its workers.
install: $(LIB)
	$(INSTALL) -d $(DESTDIR)$(LUA_LIB_DIR)/resty/ffi $(DESTDIR)$(LIB_DIR) $(DESTDIR)$(INCLUDE_DIR)
	$(INSTALL) -m 644 lua/resty/ffi/qrpc.lua $(DESTDIR)$(LUA_LIB_DIR)/resty/ffi/qrpc.lua
	@for d in $$(cd lua && find resty/ffi/qrpc -type d | sort); do \
	  echo "$(INSTALL) -m 644 lua/$$d/*.lua $(DESTDIR)$(LUA_LIB_DIR)/$$d/"; \
	  $(INSTALL) -d $(DESTDIR)$(LUA_LIB_DIR)/$$d && \
	  $(INSTALL) -m 644 lua/$$d/*.lua $(DESTDIR)$(LUA_LIB_DIR)/$$d/ || exit 1; \
	done
	$(INSTALL) -m 755 $(LIB) $(DESTDIR)$(LIB_DIR)/.$(LIB).new
	mv -f $(DESTDIR)$(LIB_DIR)/.$(LIB).new $(DESTDIR)$(LIB_DIR)/$(LIB)
	$(INSTALL) -m 644 internal/hostq/qrpc.h $(DESTDIR)$(INCLUDE_DIR)/qrpc.h

uninstall:
	rm -f $(DESTDIR)$(LUA_LIB_DIR)/resty/ffi/qrpc.lua $(DESTDIR)$(LIB_DIR)/$(LIB) $(DESTDIR)$(INCLUDE_DIR)/qrpc.h
	rm -rf $(DESTDIR)$(LUA_LIB_DIR)/resty/ffi/qrpc

# ---- packages for make test ------------------------------------------------------

.PHONY: test-deps

# As `make demo` does: installs missing Debian packages as root, else prints
# the apt-get line and stops; says what the (long) first run will do.
test-deps:
	@demo/scripts/deps --for test

# ---- release: tarball and rocks -------------------------------------------------

ROCKSPEC ?= $(firstword $(wildcard rockspec/lua-resty-ffi-qrpc-*.rockspec))
DIST_DIR ?= dist

# A release tarball carries vendor/: build from it, never from the network
# (an inherited -mod=mod would otherwise make go fetch modules).
ifneq ($(wildcard vendor/modules.txt),)
export GOFLAGS := -mod=vendor $(filter-out -mod=%,$(GOFLAGS))
endif

.PHONY: dist rocks clean-dist lint-rockspec

# Always rebuilt: it is cheap next to a Go build, and a stale tarball is a
# wrong release.
dist:
	@GO=$(GO) rockspec/scripts/dist $(ROCKSPEC) $(DIST_DIR)

rocks: dist
	@GO=$(GO) rockspec/scripts/rocks $(ROCKSPEC) $(DIST_DIR)

clean-dist:
	rm -rf $(DIST_DIR)

clean: clean-dist

lint: lint-rockspec

lint-rockspec:
	luarocks lint $(ROCKSPEC)
	@for f in rockspec/scripts/*; do bash -n "$$f" || exit 1; done

# ---- generated code ------------------------------------------------------------

# Regenerates qrpc/qrpcpb from proto/qrpc.proto, and the demo's Go code and
# descriptor set (read by the Lua tests) from demo/proto/greeter.proto, with the
# plugin versions pinned in go.mod. Needs protoc and, for greeter.proto's
# well-known imports, its include files (Debian: protobuf-compiler, libprotobuf-dev).
# Writes lua/resty/ffi/qrpc/limits.lua, the Lua copy of internal/limits (the
# bounds both sides check); make lint fails when the committed one differs.
limits:
	$(GO) run ./internal/limits/gen

# Regenerates lua/resty/ffi/qrpc/schema.lua (every option, as data) from
# internal/schema.
schema:
	$(GO) run ./internal/schema/gen

proto:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go
	$(GO) build -o $(BIN)/protoc-gen-go-vtproto github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto
	protoc -I proto \
	  --plugin=protoc-gen-go=$(BIN)/protoc-gen-go \
	  --plugin=protoc-gen-go-vtproto=$(BIN)/protoc-gen-go-vtproto \
	  --go_out=. --go_opt=module=github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc \
	  --go-vtproto_out=. --go-vtproto_opt=module=github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc \
	  --go-vtproto_opt=features=marshal+unmarshal+unmarshal_unsafe+size+equal+clone \
	  proto/qrpc.proto
	protoc -I demo/proto \
	  --plugin=protoc-gen-go=$(BIN)/protoc-gen-go \
	  --go_out=. --go_opt=module=github.com/lua-resty-ffi-qrpc/lua-resty-ffi-qrpc \
	  demo/proto/greeter.proto
	protoc -I demo/proto --include_imports -o demo/proto/greeter.protoset demo/proto/greeter.proto

# The committed generated code must be what `make proto` produces.
proto-check: proto
	@git diff --exit-code --stat -- qrpc/qrpcpb demo/proto || { echo "qrpc/qrpcpb or demo/proto differs from 'make proto' output: commit the regenerated files"; exit 1; }

clean:
	@demo/scripts/down --quiet
	rm -f $(LIB) libffi_qrpc.h $(DEMO)
	rm -rf demo/run $(BIN)/build.* bench/out nginx/tmp

help:
	@sed -n '/^#   make/p' Makefile
