# usher: `make demo` runs the main job, `make test` runs the tests.
GO      ?= go
GOBIN   := $(shell $(GO) env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

BIN     := bin
PLUGINS := $(BIN)/plugins

.PHONY: all build plugins demo test test-short bench chaos generate check-generate lint services tools clean

all: build

build: plugins
	$(GO) build -o $(BIN)/host ./cmd/host
	$(GO) build -o $(BIN)/mailprovider ./cmd/mailprovider

plugins:
	@mkdir -p $(PLUGINS)
	$(GO) build -o $(PLUGINS)/counters ./plugins/counters
	$(GO) build -o $(PLUGINS)/tickets ./plugins/tickets

services:
	@.ci/services

tools:
	@.ci/tools

# The main job: host, both plugins, the mail provider, a burst of Stagedoor
# orders with faults injected, and a summary proving nothing was lost or
# doubled. Exits non-zero if an invariant does not hold.
demo: services build
	$(BIN)/host demo --plugin-dir $(PLUGINS) --mailprovider $(BIN)/mailprovider

# -race everywhere: most packages have concurrency. -p 2 matches the
# machine's cores; each test package uses its own database and stream.
test: services
	$(GO) test -race -count=1 -p 2 -timeout 20m ./...

bench: services
	$(GO) test -run '^$$' -bench . -benchtime 2000x -count 1 ./host/...

generate:
	cd proto/usher/v1 && $(GO) generate ./...

check-generate: generate
	@git diff --exit-code -- proto/ || { echo "generated protobuf code is stale: run make generate and commit" >&2; exit 1; }

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed" >&2; exit 1; }
	$(GO) vet ./...
	staticcheck ./...

clean:
	rm -rf $(BIN)
