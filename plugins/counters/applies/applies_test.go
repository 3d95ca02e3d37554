package applies_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/plugins/counters/applies"
	"github.com/usherhq/usher/plugins/counters/counter"
	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/sdktest"
)

type effects struct {
	SeatsSold int64
	Applies   int64
}

// The recorder's row lives and dies with the increment: whatever the kit
// crashes or repeats, one apply of 4 seats and one counter_applies row;
// with another order's job at once, both.
func TestRecordedApplyIsIdempotent(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[stagedoor.UpdateSalesCounter]{
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[stagedoor.UpdateSalesCounter] {
			ctx := context.Background()
			ev, err := orders.CreateEvent(ctx, pool, "Kae Tempest", "Roundhouse")
			require.NoError(tb, err)
			o, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "B", Email: "b@example.com", Seats: 4}, orders.Jobs{})
			require.NoError(tb, err)
			other, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "C", Email: "c@example.com", Seats: 3}, orders.Jobs{})
			require.NoError(tb, err)
			p := sdk.New("counters", "test")
			sdk.HandleRecordJobID(p, applies.Recorded{Handler: counter.Handler{}, Version: "test"})
			sdk.Use(p, faults.Middleware{})
			return sdktest.Setup[stagedoor.UpdateSalesCounter]{
				Plugin: p, Args: stagedoor.UpdateSalesCounter{OrderID: o.ID},
				Effects: func(ctx context.Context) (any, error) {
					var e effects
					err := pool.QueryRow(ctx, `SELECT (SELECT seats_sold FROM events WHERE id = $1),
						(SELECT count(*) FROM counter_applies WHERE plugin_version = 'test')`, ev).
						Scan(&e.SeatsSold, &e.Applies)
					return e, err
				},
				Want: effects{SeatsSold: 4, Applies: 1},
				// Another order's job on the same event: both counted.
				Race: &sdktest.Race[stagedoor.UpdateSalesCounter]{Args: stagedoor.UpdateSalesCounter{OrderID: other.ID},
					Want: effects{SeatsSold: 7, Applies: 2}},
			}
		},
	})
}
