// Package counter is update_sales_counter's handler.
package counter

import (
	"context"
	"fmt"

	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/sdk"
)

// Handler adds an order's seats to its event's seats_sold. The host records
// the job id in processed_jobs in the same transaction, so a second run of
// the same job never reaches Apply.
type Handler struct {
	// Version is the plugin version, logged with every applied job so a
	// hot swap shows in the host's log.
	Version string
}

var _ sdk.RecordJobID[stagedoor.UpdateSalesCounter] = Handler{}

// Apply increments the counter. The write goes with Apply's answer: the
// host runs it in the job's transaction, with no round trip back to it,
// and a missing order fails the job.
func (h Handler) Apply(ctx context.Context, job sdk.Job[stagedoor.UpdateSalesCounter], tx *sdk.Tx) error {
	st := sdk.Statement{SQL: `
		UPDATE events e SET seats_sold = e.seats_sold + o.seats
		FROM orders o WHERE o.id = $1 AND e.id = o.event_id`, Args: []any{job.Args.OrderID},
		MinRows: 1, Missing: fmt.Sprintf("update_sales_counter: order %d does not exist", job.Args.OrderID)}
	if job.Args.EventID != 0 {
		// The event first: the host sends a batch's writes in the order
		// of their first arguments, so the batches that share events lock
		// them in one order.
		st.SQL = `
		UPDATE events e SET seats_sold = e.seats_sold + o.seats
		FROM orders o WHERE e.id = $1 AND o.id = $2 AND o.event_id = e.id`
		st.Args = []any{job.Args.EventID, job.Args.OrderID}
		st.Missing = fmt.Sprintf("update_sales_counter: order %d of event %d does not exist", job.Args.OrderID, job.Args.EventID)
	}
	tx.Queue(st)
	job.Log.Debug("seats counted", "order_id", job.Args.OrderID, "plugin_version", h.Version)
	return nil
}
