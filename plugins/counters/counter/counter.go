// Package counter is update_sales_counter's handler.
package counter

import (
	"context"
	"fmt"

	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/sdk"
)

// Handler adds an order's seats to its event's seats_sold. The host records
// the job id in processed_jobs in the same transaction, so a second run of
// the same job never reaches Apply.
type Handler struct {
	// Version is the plugin version, stored with every applied job
	// (counter_applies.plugin_version) so a hot swap is observable.
	Version string
}

var _ sdk.RecordJobID[stagedoor.UpdateSalesCounter] = Handler{}

// Apply increments the counter.
func (h Handler) Apply(ctx context.Context, job sdk.Job[stagedoor.UpdateSalesCounter], tx *sdk.Tx) error {
	if err := faults.At(ctx, "counter.apply", job.ID); err != nil {
		return err
	}
	// Both writes go with Apply's answer: the host runs them in the job's
	// transaction, with no round trip back to it. The audit row needs
	// nothing from the update, and a missing order fails the job and
	// rolls both back.
	tx.Queue(
		sdk.Statement{SQL: `
		UPDATE events e SET seats_sold = e.seats_sold + o.seats
		FROM orders o WHERE o.id = $1 AND e.id = o.event_id`, Args: []any{job.Args.OrderID},
			MinRows: 1, Missing: fmt.Sprintf("update_sales_counter: order %d does not exist", job.Args.OrderID)},
		sdk.Statement{SQL: `INSERT INTO counter_applies (job_id, order_id, plugin_version) VALUES ($1, $2, $3)`,
			Args: []any{job.ID, job.Args.OrderID, h.Version}})
	job.Log.Debug("seats counted", "order_id", job.Args.OrderID, "plugin_version", h.Version)
	return nil
}
