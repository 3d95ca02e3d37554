// Command counters is a handler plugin serving update_sales_counter: it adds
// an order's seats to its event's sales counter. A counter incremented twice
// looks like a counter incremented once by a larger order, and there is no
// state to read, so the guard is the job id recorded in the same transaction
// as the increment.
package main

import (
	"github.com/usherhq/usher/plugins/counters/counter"
	"github.com/usherhq/usher/sdk"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "1.0.0"

func main() {
	p := sdk.New("counters", version)
	sdk.HandleRecordJobID(p, counter.Handler{Version: version})
	sdk.Serve(p)
}
