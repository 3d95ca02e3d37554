// Package applies records every apply of update_sales_counter in the
// Stagedoor table counter_applies (job id, order id, plugin version), for
// the counters plugin's chaos build and the tests' plugins: they count
// doubles and see which version ran a job with it. The shipped plugin does
// not import it.
package applies

import (
	"context"

	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/sdk"
)

// Recorded wraps an update_sales_counter handler. The plugin's role needs
// INSERT (job_id, order_id, plugin_version) on counter_applies.
type Recorded struct {
	Handler sdk.RecordJobID[stagedoor.UpdateSalesCounter]
	// Version is stored with every apply, so a hot swap is observable.
	Version string
}

var _ sdk.RecordJobID[stagedoor.UpdateSalesCounter] = Recorded{}

// Apply runs the wrapped Apply, then queues the record behind its writes:
// one more statement of the same answer, in the job's transaction, so it
// commits or rolls back with the increment. A failed Apply records
// nothing.
func (r Recorded) Apply(ctx context.Context, job sdk.Job[stagedoor.UpdateSalesCounter], tx *sdk.Tx) error {
	if err := r.Handler.Apply(ctx, job, tx); err != nil {
		return err
	}
	tx.Queue(sdk.Statement{SQL: `INSERT INTO counter_applies (job_id, order_id, plugin_version) VALUES ($1, $2, $3)`,
		Args: []any{job.ID, job.Args.OrderID, r.Version}})
	return nil
}
