// Command chaos is the checkout plugin's chaos build: the shipped plugin
// (name checkout, the same kinds, handlers and workflow) with
// faults.Middleware around every phase of its step kinds, so tests, the
// demo and the chaos suite can stall, crash or fail it at
// reserve.before_check ... release.after_commit through USHER_FAULT_DIR.
// make chaos-plugins builds it into bin/chaos-plugins/checkout. It is not
// for production: a fault armed in its directory crashes it on purpose.
package main

import (
	"github.com/usherhq/usher/plugins/checkout/checkout"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/sdk"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "1.0.0"

func main() {
	p := checkout.Plugin(version)
	sdk.Use(p, faults.Middleware{})
	sdk.Serve(p)
}
