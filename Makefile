# Every tool a target needs is installed here, at a pinned version, through
# the Go module proxy into ./bin (git-ignored). Nothing is installed by hand.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)
export GOBIN := $(BIN)

BUF_VERSION                := v1.75.0
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
STATICCHECK_VERSION        := v0.8.2
BENCHSTAT_VERSION          := v0.0.0-20260908200009-22c9c6c9d4da
# ghz, the gRPC load tool users measure with: its binary only (its runner
# package does not build against the grpc-go the bench module uses).
GHZ_VERSION                := v0.93.0

FUZZTIME ?= 30000x

.PHONY: bench-check bench-busy bench-happy interop
.PHONY: all test vet fmt-check staticcheck unit fuzz-short proto proto-check lint bench demo tools clean

all: test

## test: everything CI runs
test: vet fmt-check staticcheck proto-check unit bench-check fuzz-short

vet:
	go vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

staticcheck: $(BIN)/staticcheck
	$(BIN)/staticcheck ./...

unit:
	go test -race -shuffle=on -timeout 8m ./...

# The bench module (its own go.mod, so the peers stay out of ours): vet,
# staticcheck and its wiring tests, so that a change of the library or of
# internal/testsvc that breaks the comparison fails here, not in make bench.
bench-check: $(BIN)/staticcheck
	cd bench && go vet ./... && $(BIN)/staticcheck ./... && go test -race -count=1 ./...

# Brief fuzzing of every parser: a count of executions (4-7 s each here),
# longer with FUZZTIME=1000000x. A count, not a duration: with a duration
# Go 1.26's fuzz coordinator can report its own deadline as a failure
# ("context deadline exceeded", no failing input; golang/go#75804, reported fixed
# in Go 1.27), which failed CI on FuzzPushback. Minimization is off: by
# default the fuzzer may spend up to a minute shrinking each new
# interesting input. A crasher is still reported and saved, just not
# shrunk; -timeout bounds a worker that hangs.
fuzz-short:
	@for pkg in $$(go list ./...); do \
	  dir=$$(go list -f '{{.Dir}}' $$pkg); \
	  for f in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$dir/*_test.go 2>/dev/null | sed 's/^func //'); do \
	    echo "fuzz $$pkg $$f ($(FUZZTIME))"; \
	    go test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 0 -timeout 3m $$pkg; \
	  done; \
	done

## proto: regenerate the committed Go code from proto/
proto: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc
	$(BIN)/buf lint
	$(BIN)/buf generate

## proto-check: fail when the committed generated code is stale
proto-check: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc
	$(BIN)/buf lint
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(BIN)/buf generate -o $$tmp; \
	if ! diff -r $$tmp/proto proto -x '*.proto' >/dev/null; then \
	  diff -r $$tmp/proto proto -x '*.proto' || true; \
	  echo "generated code is stale: run 'make proto' and commit"; exit 1; fi

lint: vet fmt-check staticcheck
	$(BIN)/buf lint

# bench: the root micro-benchmarks, the scenario table of every retry stack
# (bench/cmd/scenarios), the incident simulator (internal/incidentsim: long
# outages and fleets, which a real chain cannot run in minutes) and the
# happy-path overhead of every stack relative
# to none (bench/, benchstat), then bench-busy. Raw outputs go to
# $(BENCH_OUT).
BENCH_COUNT ?= 6
BENCH_OUT   ?= $(BIN)/bench-results

bench: $(BIN)/benchstat
	@mkdir -p $(BENCH_OUT)
	@echo "## Micro-benchmarks: budget, breaker, interceptor"
	go test -run '^$$' -bench . -benchmem ./budget/ ./breaker/ ./interceptor/ | tee $(BENCH_OUT)/micro.txt
	cd bench && go run ./cmd/scenarios | tee $(BENCH_OUT)/scenarios.md
	@echo "## Incident simulator: the adaptive throttle against long outages and fleets (deterministic)"
	go run ./internal/incidentsim/cmd/incidents -seed 1 | tee $(BENCH_OUT)/incidents.md
	cd bench && go test -run '^$$' -bench . -benchmem -count $(BENCH_COUNT) . | tee $(BENCH_OUT)/overhead.txt
	@echo "## Happy-path overhead per stack, relative to none (benchstat -col /stack)"
	$(BIN)/benchstat -col /stack $(BENCH_OUT)/overhead.txt | tee $(BENCH_OUT)/overhead-benchstat.txt
	$(MAKE) bench-happy
	$(MAKE) bench-busy

# bench-happy: the happy path of Recommended() against no interceptor and
# pass-through interceptors (interceptor/bench_test.go), unary and bidi,
# HAPPY_COUNT interleaved samples (each round runs every stack once, so
# that the machine's drift falls on all of them), compared by benchstat.
HAPPY_COUNT ?= 10

bench-happy: $(BIN)/benchstat
	@mkdir -p $(BENCH_OUT)
	go test -c -o $(BENCH_OUT)/interceptor.test ./interceptor/
	cd interceptor && for i in $$(seq $(HAPPY_COUNT)); do \
	  $(BENCH_OUT)/interceptor.test -test.run '^$$' -test.bench 'UnaryHappyPath' -test.benchmem -test.benchtime 20000x; \
	  $(BENCH_OUT)/interceptor.test -test.run '^$$' -test.bench 'StreamHappyPath' -test.benchmem -test.benchtime 1500x; \
	done | sed -E 's#/(none|noop|recommended|breaker)-#/stack=\1-#' > $(BENCH_OUT)/happy.txt
	$(BIN)/benchstat -col /stack $(BENCH_OUT)/happy.txt | tee $(BENCH_OUT)/happy-benchstat.txt

# bench-busy: the load tests of issue 19 as users run them (bench/cmd/busy,
# bench/BUSY.md): every tier its own process (bench/cmd/tier) over loopback
# TCP, ghz at a fixed concurrency and the project's open-loop generator,
# retries off and the peers in the same run, each figure the median of 3
# interleaved runs (about 33 minutes on 2 cores). BUSY_FLAGS=-quick for a
# shorter look (about 15 minutes); BUSY_FLAGS='-scenarios replicas' for one
# scenario.
BUSY_FLAGS ?=

bench-busy: $(BIN)/ghz
	@mkdir -p $(BENCH_OUT)
	cd bench && go build -o $(BIN)/stormguard-tier ./cmd/tier
	cd bench && go run ./cmd/busy -ghz $(BIN)/ghz -tier $(BIN)/stormguard-tier \
	  -proto $(CURDIR)/proto/stormguard/testsvc/v1/testsvc.proto -import-paths $(CURDIR)/proto \
	  $(BUSY_FLAGS) | tee $(BENCH_OUT)/busy.md

# interop: an order tier in Python, written from docs/protocol.md alone
# (cmd/stormsim/testdata/interop/order.py, on grpcio), between a Go gateway
# and a Go payment, each its own process over loopback TCP; asserts the
# calls per tier (cmd/stormsim/interop_test.go). Not part of make test,
# which needs nothing but Go: it installs python3-grpcio from Debian's
# packages when PYTHON cannot import grpc. See CONTRIBUTING.md.
PYTHON ?= /usr/bin/python3
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

interop:
	@$(PYTHON) -c 'import grpc' 2>/dev/null || { \
	  echo "installing python3-grpcio (Debian) for $(PYTHON)"; \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q python3-grpcio; }
	STORMGUARD_PYTHON=$(PYTHON) go test -tags interop -race -count=1 -run TestInteropPythonTier -v ./cmd/stormsim/

demo:
	go run ./cmd/stormsim

tools: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/staticcheck $(BIN)/ghz

$(BIN)/buf:
	go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(BIN)/protoc-gen-go:
	go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(BIN)/protoc-gen-go-grpc:
	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
$(BIN)/staticcheck:
	go install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
$(BIN)/benchstat:
	go install golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION)
$(BIN)/ghz:
	go install github.com/bojand/ghz/cmd/ghz@$(GHZ_VERSION)

clean:
	rm -rf $(BIN)
