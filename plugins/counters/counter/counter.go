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
	// Version is the plugin version, logged with every applied job so a
	// hot swap is observable.
	Version string
}

var _ sdk.RecordJobID[stagedoor.UpdateSalesCounter] = Handler{}

// Apply increments the counter.
func (h Handler) Apply(ctx context.Context, job sdk.Job[stagedoor.UpdateSalesCounter], tx *sdk.Tx) error {
	if err := faults.At(ctx, "counter.apply", job.ID); err != nil {
		return err
	}
	n, err := tx.Exec(ctx, `
		UPDATE events e SET seats_sold = e.seats_sold + o.seats
		FROM orders o WHERE o.id = $1 AND e.id = o.event_id`, job.Args.OrderID)
	if err != nil {
		return fmt.Errorf("update_sales_counter: %w", err)
	}
	if n == 0 {
		return sdk.Permanent(fmt.Errorf("order %d does not exist", job.Args.OrderID))
	}
	if _, err := tx.Exec(ctx, `INSERT INTO counter_applies (job_id, order_id, plugin_version) VALUES ($1, $2, $3)`,
		job.ID, job.Args.OrderID, h.Version); err != nil {
		return fmt.Errorf("update_sales_counter: audit: %w", err)
	}
	job.Log.Info("seats counted", "order_id", job.Args.OrderID, "plugin_version", h.Version)
	return nil
}
