// Command usher-vet checks handler plugins for what Go's types cannot stop:
// an effect outside the effect phase, sdk.KeyForTest outside tests, and a
// claim effect whose idempotency key never reaches the provider call (see package
// github.com/usherhq/usher/sdk/analysis/effectcheck).
//
// Run it on its own or as go vet's tool:
//
//	go run ./cmd/usher-vet ./plugins/...
//	go vet -vettool=$(which usher-vet) ./...
package main

import (
	"golang.org/x/tools/go/analysis/singlechecker"

	"github.com/usherhq/usher/sdk/analysis/effectcheck"
)

func main() { singlechecker.Main(effectcheck.Analyzer) }
