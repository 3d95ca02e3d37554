// Command usher-vet checks handler plugins for what Go's types cannot stop:
// an effect outside the effect phase, sdk.KeyForTest outside tests, and a
// claim effect whose idempotency key never reaches the provider call (see package
// github.com/usherhq/usher/sdk/analysis/effectcheck).
//
// Run it on its own, or as a tool of a plugin's module (its go.mod's
// tool line, which `host plugins init` writes; docs/plugins.md, "Vet your
// plugin"), or as go vet's tool given its path:
//
//	go run ./cmd/usher-vet ./plugins/...
//	go tool usher-vet ./...
//	go vet -vettool=/path/to/usher-vet ./...
//
// Not go vet -vettool=$(which usher-vet): when the tool is missing, the
// shell passes an empty path, and go vet runs its own checks and passes.
package main

import (
	"golang.org/x/tools/go/analysis/singlechecker"

	"github.com/usherhq/usher/sdk/analysis/effectcheck"
)

func main() { singlechecker.Main(effectcheck.Analyzer) }
