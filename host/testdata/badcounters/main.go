// Command badcounters is the counters plugin (same name, kind and guard)
// with a version that fails every job, for the tests of automatic
// rollback. The mode is set at build time: -X main.mode=crash exits the
// process in every job, as kill -9 would; -X main.mode=error fails every
// job with a transient error; -X main.mode=crashjob -X main.crashJob=ID
// exits the process in job ID only; -X main.mode=flaky fails every job's
// first attempt with a transient error and applies its retry. Any other
// mode serves like counters. Like the counters plugin's chaos build, it
// records every apply in counter_applies (applies.Recorded).
package main

import (
	"context"
	"errors"
	"os"

	"github.com/usherhq/usher/plugins/counters/applies"
	"github.com/usherhq/usher/plugins/counters/counter"
	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/sdk"
)

var (
	version  = "2.0.0"
	mode     = "crash"
	crashJob string
)

type handler struct{ counter.Handler }

func (h handler) Apply(ctx context.Context, job sdk.Job[stagedoor.UpdateSalesCounter], tx *sdk.Tx) error {
	switch mode {
	case "crash":
		os.Exit(3)
	case "error":
		return errors.New("badcounters: this version fails every job")
	case "crashjob":
		if job.ID == crashJob {
			os.Exit(3)
		}
	case "flaky":
		if job.Attempt == 0 {
			return errors.New("badcounters: the first attempt fails")
		}
	}
	return h.Handler.Apply(ctx, job, tx)
}

func main() {
	p := sdk.New("counters", version)
	sdk.HandleRecordJobID(p, applies.Recorded{Handler: handler{}, Version: version})
	sdk.Serve(p)
}
