package orders

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/plugins/stagedoor"
)

// Checkout is an order whose checkout workflow was started with it.
type Checkout struct {
	Placed
	// Workflow is the runtime's number for the checkout workflow.
	Workflow int64
	// Seats is the order's.
	Seats int
}

// PlaceCheckout commits the order, one ticket row per seat, and starts its
// checkout workflow (id: the order's public id) in the same transaction,
// with usher_start_workflow: the checkout exists if and only if the order
// does. It enqueues no job: the workflow reserves the seats, waits up to
// payWithin for ConfirmPayment (then renders, counts and sends), and
// releases the seats when the payment does not come or CancelCheckout is
// called. The caller's role needs EXECUTE on usher_start_workflow.
func PlaceCheckout(ctx context.Context, pool *pgxpool.Pool, o Order, payWithin time.Duration) (Checkout, error) {
	var c Checkout
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		c, err = PlaceCheckoutTx(ctx, tx, o, payWithin)
		return err
	})
	return c, err
}

// PlaceCheckoutTx is PlaceCheckout inside the caller's transaction.
func PlaceCheckoutTx(ctx context.Context, tx pgx.Tx, o Order, payWithin time.Duration) (Checkout, error) {
	p, err := PlaceTx(ctx, tx, o, Jobs{})
	if err != nil {
		return Checkout{}, err
	}
	in, _ := json.Marshal(stagedoor.Checkout{OrderID: p.ID, PayWithinMS: payWithin.Milliseconds()})
	c := Checkout{Placed: p, Seats: o.Seats}
	var started bool
	if err := tx.QueryRow(ctx, `SELECT id, started FROM usher_start_workflow($1, $2, $3::jsonb)`,
		stagedoor.CheckoutType, p.PublicID, string(in)).Scan(&c.Workflow, &started); err != nil {
		return Checkout{}, fmt.Errorf("orders: start the checkout of %s: %w", p.PublicID, err)
	}
	if !started {
		return Checkout{}, fmt.Errorf("orders: a checkout %s existed before its order", p.PublicID)
	}
	return c, nil
}

// ConfirmPayment records order publicID's payment (reference is the
// payment provider's) and sends its checkout the payment_confirmed signal,
// in one transaction: the signal exists if and only if the payment does.
// The reference is the signal's id, so a payment confirmed twice counts
// once (false, nil). A checkout that ended (its hold timed out, it was
// cancelled) refuses the signal, and the payment is not recorded: the error
// says so. The role needs EXECUTE on usher_signal_workflow.
func ConfirmPayment(ctx context.Context, pool *pgxpool.Pool, orderID int64, publicID, reference string) (bool, error) {
	var added bool
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (order_id, reference) VALUES ($1, $2) ON CONFLICT DO NOTHING`,
			orderID, reference); err != nil {
			return fmt.Errorf("orders: record the payment of %s: %w", publicID, err)
		}
		payload, _ := json.Marshal(map[string]string{"reference": reference})
		if err := tx.QueryRow(ctx, `SELECT usher_signal_workflow($1, $2, $3, $4, $5::jsonb)`,
			stagedoor.CheckoutType, publicID, reference, stagedoor.PaymentConfirmed, string(payload)).Scan(&added); err != nil {
			return fmt.Errorf("orders: confirm the payment of %s: %w", publicID, err)
		}
		return nil
	})
	return added, err
}

// CancelCheckout asks order publicID's checkout to cancel (the buyer left),
// with usher_cancel_workflow in one transaction: an unpaid checkout
// releases its seats and ends cancelled. It reports false when a cancel
// was asked before; a checkout that ended is an error.
func CancelCheckout(ctx context.Context, pool *pgxpool.Pool, publicID, reason string) (bool, error) {
	var asked bool
	err := pool.QueryRow(ctx, `SELECT usher_cancel_workflow($1, $2, $3)`, stagedoor.CheckoutType, publicID, reason).Scan(&asked)
	if err != nil {
		return false, fmt.Errorf("orders: cancel the checkout of %s: %w", publicID, err)
	}
	return asked, nil
}
