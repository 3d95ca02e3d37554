// Command chaos is the counters plugin's chaos build: the shipped
// update_sales_counter handler (plugin name counters, the same kind and
// guard) wrapped twice from outside, for tests, the demo, the chaos suite:
//
//   - faults.Middleware around Apply (counter.before_apply,
//     counter.after_apply), armed through USHER_FAULT_DIR;
//   - applies.Recorded, which adds a counter_applies row (job id, order
//     id, this build's version) to the writes Apply returns, so it commits
//     or rolls back with the increment in the job's own transaction. Tests
//     count doubles and see which version ran a job with it; the shipped
//     plugin writes no such row.
//
// make chaos-plugins builds it into bin/chaos-plugins/counters. The
// plugin's role needs INSERT (job_id, order_id, plugin_version) on
// counter_applies.
package main

import (
	"github.com/usherhq/usher/plugins/counters/applies"
	"github.com/usherhq/usher/plugins/counters/counter"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/sdk"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "1.0.0"

func main() {
	p := sdk.New("counters", version)
	sdk.HandleRecordJobID(p, applies.Recorded{Handler: counter.Handler{Version: version}, Version: version})
	sdk.Use(p, faults.Middleware{})
	sdk.Serve(p)
}
