// Package seats holds the checkout plugin's step handlers, reserve_seats
// and release_seats, both under the state-first guard: the state is the
// order's seat_holds row (held, released), and only the run whose
// conditional write on it won moves the event's seats_held.
package seats

import (
	"context"
	"fmt"

	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/sdk"
)

// Hold is what Check read of an order's hold: nothing crosses to Commit
// but the order id, which Commit reads again in its own transaction.
type Hold struct {
	Held     bool `json:"held"`
	Released bool `json:"released"`
}

// check reads order id's hold, and refuses an order that does not exist.
func check(ctx context.Context, db *sdk.ReadOnly, orderID int64) (Hold, error) {
	var h Hold
	var exists bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM orders WHERE id = $1),
			EXISTS (SELECT 1 FROM seat_holds WHERE order_id = $1),
			EXISTS (SELECT 1 FROM seat_holds WHERE order_id = $1 AND released_at IS NOT NULL)`, orderID).
		Scan(&exists, &h.Held, &h.Released)
	if err != nil {
		return h, err
	}
	if !exists {
		return h, sdk.Permanent(fmt.Errorf("order %d does not exist", orderID))
	}
	return h, nil
}

// Reserve holds an order's seats: a seat_holds row, and the seats added
// to the event's seats_held, once.
type Reserve struct{}

var _ sdk.StateFirst[stagedoor.ReserveSeats, Hold] = Reserve{}

// Check: done once the order has a hold (released or not: a released
// hold is never taken again).
func (Reserve) Check(ctx context.Context, job sdk.Job[stagedoor.ReserveSeats], db *sdk.ReadOnly) (Hold, bool, error) {
	h, err := check(ctx, db, job.Args.OrderID)
	return h, h.Held, err
}

// Prepare has nothing slow to do.
func (Reserve) Prepare(_ context.Context, _ sdk.Job[stagedoor.ReserveSeats], h Hold) (Hold, error) {
	return h, nil
}

// Commit inserts the hold where there is none; only the winning run adds
// the seats to the event and records the move.
func (Reserve) Commit(ctx context.Context, job sdk.Job[stagedoor.ReserveSeats], tx *sdk.CommitTx, _ Hold) error {
	win, err := tx.WriteIf(ctx, `INSERT INTO seat_holds (order_id, event_id, seats)
		SELECT id, event_id, seats FROM orders WHERE id = $1
		ON CONFLICT (order_id) DO NOTHING RETURNING event_id, seats`, job.Args.OrderID)
	if err != nil || win == nil {
		return err
	}
	m, err := move(ctx, win, job.ID, job.Args.OrderID, +1)
	if err != nil {
		return err
	}
	job.Log.Info("seats held", "order_id", job.Args.OrderID, "event_id", m.EventID, "seats", m.Seats)
	return sdk.StepResult(ctx, win, job, m)
}

// Release gives an order's held seats back: its hold marked released, and
// the seats taken off the event's seats_held, once. The checkout's
// compensation: it runs only after a reserve, and an order with no hold
// is refused (nothing to release is a bug in its caller, not a success).
type Release struct{}

var _ sdk.StateFirst[stagedoor.ReleaseSeats, Hold] = Release{}

// Check: done once the hold is released.
func (Release) Check(ctx context.Context, job sdk.Job[stagedoor.ReleaseSeats], db *sdk.ReadOnly) (Hold, bool, error) {
	h, err := check(ctx, db, job.Args.OrderID)
	if err == nil && !h.Held {
		err = sdk.Permanent(fmt.Errorf("order %d holds no seats to release", job.Args.OrderID))
	}
	return h, h.Released, err
}

// Prepare has nothing slow to do.
func (Release) Prepare(_ context.Context, _ sdk.Job[stagedoor.ReleaseSeats], h Hold) (Hold, error) {
	return h, nil
}

// Commit marks the hold released where it is not yet; only the winning run
// takes the seats off the event and records the move.
func (Release) Commit(ctx context.Context, job sdk.Job[stagedoor.ReleaseSeats], tx *sdk.CommitTx, _ Hold) error {
	win, err := tx.WriteIf(ctx, `UPDATE seat_holds SET released_at = now()
		WHERE order_id = $1 AND released_at IS NULL RETURNING event_id, seats`, job.Args.OrderID)
	if err != nil || win == nil {
		return err
	}
	m, err := move(ctx, win, job.ID, job.Args.OrderID, -1)
	if err != nil {
		return err
	}
	job.Log.Info("seats released", "order_id", job.Args.OrderID, "event_id", m.EventID, "seats", m.Seats)
	return sdk.StepResult(ctx, win, job, m)
}

// Moved is a step's result (sdk.StepResult): the seats it moved.
type Moved struct {
	EventID int64 `json:"event_id"`
	Seats   int64 `json:"seats"`
}

// move applies the won write's seats (sign +1 holds them, -1 gives them
// back) to the event and records the move, in the won transaction.
func move(ctx context.Context, win *sdk.Win, jobID string, orderID, sign int64) (Moved, error) {
	var m Moved
	rows := win.Returned()
	if !rows.Next() {
		return m, sdk.Permanent(fmt.Errorf("order %d: the hold's write returned no row", orderID))
	}
	if err := rows.Scan(&m.EventID, &m.Seats); err != nil {
		return m, err
	}
	if _, err := win.Exec(ctx, `UPDATE events SET seats_held = seats_held + $2 WHERE id = $1`, m.EventID, sign*m.Seats); err != nil {
		return m, err
	}
	_, err := win.Exec(ctx, `INSERT INTO seat_moves (order_id, event_id, delta, job_id) VALUES ($1, $2, $3, $4)`,
		orderID, m.EventID, sign*m.Seats, jobID)
	return m, err
}
