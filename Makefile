# usher: `make demo` runs the main job, `make test` runs the tests.
GO      ?= go
GOBIN   := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

BIN     := bin
PLUGINS := $(BIN)/plugins
CHAOS_PLUGINS := $(BIN)/chaos-plugins

.PHONY: all build plugins chaos-plugins demo test test-short bench chaos soak generate check-generate lint vet-plugins services tools clean screenshots

all: build

build: plugins
	$(GO) build -o $(BIN)/host ./cmd/host
	$(GO) build -o $(BIN)/mailprovider ./cmd/mailprovider
	$(GO) build -o $(BIN)/bench ./cmd/bench

# Each plugin is a binary plus its manifest (name, version, SHA-256, its
# migrations and its grants on Stagedoor's tables, from plugins/NAME/db),
# which the host verifies and installs before starting it. A host watching $(PLUGINS) hot-swaps
# a plugin whose manifest changed: make plugins COUNTERS_VERSION=1.1.0
plugins:
	@mkdir -p $(PLUGINS)
	$(GO) build -ldflags "-X main.version=$(or $(COUNTERS_VERSION),1.0.0)" -o $(PLUGINS)/counters ./plugins/counters
	$(GO) build -ldflags "-X main.version=$(or $(TICKETS_VERSION),1.0.0)" -o $(PLUGINS)/tickets ./plugins/tickets
	rm -rf $(PLUGINS)/tickets-migrations && cp -r plugins/tickets/db/migrations $(PLUGINS)/tickets-migrations
	$(GO) run ./cmd/host plugins manifest $(PLUGINS)/counters --name counters --version $(or $(COUNTERS_VERSION),1.0.0) --kind update_sales_counter \
		--grants plugins/counters/db/grants.json --write
	$(GO) run ./cmd/host plugins manifest $(PLUGINS)/tickets --name tickets --version $(or $(TICKETS_VERSION),1.0.0) --kind render_tickets --kind send_tickets \
		--migrations $(PLUGINS)/tickets-migrations --grants plugins/tickets/db/grants.json --write
	$(GO) build -ldflags "-X main.version=$(or $(CHECKOUT_VERSION),1.0.0)" -o $(PLUGINS)/checkout ./plugins/checkout
	rm -rf $(PLUGINS)/checkout-migrations && cp -r plugins/checkout/db/migrations $(PLUGINS)/checkout-migrations
	$(GO) run ./cmd/host plugins manifest $(PLUGINS)/checkout --name checkout --version $(or $(CHECKOUT_VERSION),1.0.0) \
		$(CHECKOUT_MANIFEST_FLAGS) --migrations $(PLUGINS)/checkout-migrations --grants plugins/checkout/db/grants.json --write

# The checkout workflow's kinds, and the other plugins' kinds its steps
# run, which a decision may schedule only when the manifest lists them.
CHECKOUT_MANIFEST_FLAGS := --kind reserve_seats --kind release_seats --kind usher.workflow.checkout \
	--enqueue render_tickets --enqueue update_sales_counter --enqueue send_tickets

# The same plugins built for the demo, the chaos suite and the tests: the
# shipped handlers wrapped in faults.Middleware (and, for counters, a
# counter_applies row per apply), under the same names, kinds and
# versions, so the manifests and database roles are the same.
chaos-plugins:
	@mkdir -p $(CHAOS_PLUGINS)
	$(GO) build -ldflags "-X main.version=$(or $(COUNTERS_VERSION),1.0.0)" -o $(CHAOS_PLUGINS)/counters ./plugins/counters/chaos
	$(GO) build -ldflags "-X main.version=$(or $(TICKETS_VERSION),1.0.0)" -o $(CHAOS_PLUGINS)/tickets ./plugins/tickets/chaos
	rm -rf $(CHAOS_PLUGINS)/tickets-migrations && cp -r plugins/tickets/db/migrations $(CHAOS_PLUGINS)/tickets-migrations
	$(GO) run ./cmd/host plugins manifest $(CHAOS_PLUGINS)/counters --name counters --version $(or $(COUNTERS_VERSION),1.0.0) --kind update_sales_counter \
		--grants plugins/counters/chaos/grants.json --write
	$(GO) run ./cmd/host plugins manifest $(CHAOS_PLUGINS)/tickets --name tickets --version $(or $(TICKETS_VERSION),1.0.0) --kind render_tickets --kind send_tickets \
		--migrations $(CHAOS_PLUGINS)/tickets-migrations --grants plugins/tickets/db/grants.json --write
	$(GO) build -ldflags "-X main.version=$(or $(CHECKOUT_VERSION),1.0.0)" -o $(CHAOS_PLUGINS)/checkout ./plugins/checkout/chaos
	rm -rf $(CHAOS_PLUGINS)/checkout-migrations && cp -r plugins/checkout/db/migrations $(CHAOS_PLUGINS)/checkout-migrations
	$(GO) run ./cmd/host plugins manifest $(CHAOS_PLUGINS)/checkout --name checkout --version $(or $(CHECKOUT_VERSION),1.0.0) \
		$(CHECKOUT_MANIFEST_FLAGS) --migrations $(CHAOS_PLUGINS)/checkout-migrations --grants plugins/checkout/db/grants.json --write

services:
	@.ci/services

tools:
	@.ci/tools

# The main job: host, both plugins (their chaos builds), the mail provider,
# a burst of Stagedoor orders with faults injected, and a summary proving
# nothing was lost or doubled. Exits non-zero if an invariant does not hold.
demo: services build chaos-plugins
	$(BIN)/host demo --plugin-dir $(CHAOS_PLUGINS) --mailprovider $(BIN)/mailprovider

# Chaos: the whole system as separate processes (its own Redis and Postgres,
# three hosts with the plugins' chaos builds, the mail provider), 20,000
# orders over 10 minutes while it kills, stalls and restarts them on a
# printed seed; then every invariant. Exits non-zero if anything was lost or doubled.
# SEED=N replays a run; CHAOS_FLAGS passes more flags (chaos -h).
.PHONY: chaos-short
chaos: services build chaos-plugins
	$(GO) build -o $(BIN)/chaos ./cmd/chaos
	$(BIN)/chaos --host-bin $(BIN)/host --plugin-dir $(CHAOS_PLUGINS) --mailprovider $(BIN)/mailprovider $(if $(SEED),--seed $(SEED)) $(CHAOS_FLAGS)

# The CI-sized run: about 90 seconds, every fault type three times.
chaos-short: services build chaos-plugins
	$(GO) build -o $(BIN)/chaos ./cmd/chaos
	$(BIN)/chaos --short --host-bin $(BIN)/host --plugin-dir $(CHAOS_PLUGINS) --mailprovider $(BIN)/mailprovider $(if $(SEED),--seed $(SEED)) $(CHAOS_FLAGS)

# Soak: SOAK_JOBS small counter jobs (default a million) through a real host
# and the counters plugin at SOAK_RATE jobs/s, with stream trimming and every
# retention window on; prints Redis used_memory, the stream's length, host
# and plugin RSS and the runtime tables' sizes over time, and fails if they
# grow after warm-up (host/soak_test.go). About 45 minutes at the defaults;
# CI runs SOAK_JOBS=20000.
SOAK_JOBS ?= 1000000
SOAK_RATE ?= 400
soak: services
	USHER_SOAK_JOBS=$(SOAK_JOBS) USHER_SOAK_RATE=$(SOAK_RATE) $(GO) test -run '^TestSoak$$' -count=1 -v -timeout 6h ./host

# -race on every package with concurrency of its own: all but the static
# analyser's (sdk/analysis/...), whose tests type-check every dependency
# of the shipped plugins on one goroutine and take four times the CPU
# raced (44 CPU-s against 10). -p 2 matches the machine's cores; each test
# package uses its own database and stream.
# tools installs (or finds) what tests need beyond Go: psycopg2 for the
# README's Python enqueue, Chromium for the console's browser test.
# -timeout is each package's: the host package alone takes about 13
# minutes under -race on a quiet 2-core machine, and up to 20 beside the
# others. The packages whose tests run longest come first: go test starts the
# packages in the order given, and the longest (host, about half of the
# whole) then runs beside all the others instead of after them.
UNRACED := ./sdk/analysis/...
RACED    = $(shell $(GO) list ./... | grep -v '/sdk/analysis/')
test: services tools
	$(GO) test -race -count=1 -p 2 -timeout 40m ./host ./cmd/bench ./cmd/host $(RACED)
	$(GO) test -count=1 -timeout 10m $(UNRACED)
	# examples/refunds, a third-party plugin in a module of its own: its
	# sdktest tests, and end to end through the documented commands.
	cd examples/refunds && $(GO) test -count=1 -tags e2e -timeout 10m ./...

# Issue 9's benchmark, then the Go benchmarks. bin/bench runs the counter
# workload through an in-process host and the counters plugin: throughput
# at each in-flight level, latency at a fixed offered rate, CPU and peak
# RSS of host and plugin, lost/doubled, and the peers (bench/cmd/peers:
# River, asynq, bare Postgres) on the same workload; a table on stdout,
# JSON and PNG plots in bench-results/. Exits non-zero if usher lost or
# doubled anything. BENCH_FLAGS passes more flags (bin/bench -h);
# BENCH_TIME is the Go benchmarks' -benchtime.
BENCH_FLAGS ?=
BENCH_TIME  ?= 2000x
# The host's packages that have Go benchmarks: building the test binaries
# of the other thirty costs minutes and runs nothing.
BENCH_PKGS  := $(sort $(patsubst %/,./%,$(dir $(shell grep -rl '^func Benchmark' --include='*_test.go' host))))
bench: services build
	$(BIN)/bench --plugin-dir $(PLUGINS) --json bench-results/bench.json $(BENCH_FLAGS)
	$(GO) test -run '^$$' -bench . -benchtime $(BENCH_TIME) -count 1 $(BENCH_PKGS)

# The console's screenshots in docs/console, made by its browser tests
# (Chromium; CI=true makes them fail rather than skip without it) with
# their artifact directory pointed there: a test writes into docs/console
# only the shots docs/*.md show, so what was there before is removed
# first and what is left is exactly what the docs link.
# TestDocShotsComeFromTests checks every linked picture is one a test writes.
BROWSER_TESTS := InBrowser|^TestConsoleShowsAnOrdersWorkflow$$|^TestConsoleWorkflowPages$$
screenshots: services
	rm -f docs/console/*.png
	CI=true USHER_ARTIFACTS=$(CURDIR)/docs/console $(GO) test -count=1 -timeout 20m -run '$(BROWSER_TESTS)' ./host/console/

generate:
	cd proto/usher/v1 && $(GO) generate ./...

check-generate: generate
	@git diff --exit-code -- proto/ || { echo "generated protobuf code is stale: run make generate and commit" >&2; exit 1; }

# usher-vet (cmd/usher-vet) on the shipped plugins, as go vet's tool
# built first (a plugin module of its own runs it as docs/plugins.md's
# "Vet your plugin" says): no effect outside its phase, no KeyForTest
# outside tests, no claim effect that ignores its key.
vet-plugins:
	$(GO) build -o $(BIN)/usher-vet ./cmd/usher-vet
	cd plugins && $(GO) vet -vettool=$(CURDIR)/$(BIN)/usher-vet ./...

lint: vet-plugins
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }
	$(GO) vet ./...
	staticcheck ./...
	cd examples/refunds && $(MAKE) vet && $(GO) vet -tags e2e ./... && staticcheck -tags e2e ./...

clean:
	rm -rf $(BIN)
