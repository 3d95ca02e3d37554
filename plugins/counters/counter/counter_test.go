package counter_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/plugins/counters/counter"
	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/sdktest"
)

// Both forms of the job: the order alone, and the order with its event
// (the write names the event it increments).
func TestUpdateSalesCounterIsIdempotent(t *testing.T) {
	t.Parallel()
	for _, named := range []bool{false, true} {
		t.Run(map[bool]string{false: "order", true: "order and event"}[named], func(t *testing.T) {
			t.Parallel()
			testUpdateSalesCounter(t, named)
		})
	}
}

func testUpdateSalesCounter(t *testing.T, named bool) {
	grants, err := pluginhost.ReadGrants("../db/grants.json")
	require.NoError(t, err)
	sdktest.Run(t, sdktest.Case[stagedoor.UpdateSalesCounter]{
		Grants: grants,
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[stagedoor.UpdateSalesCounter] {
			ctx := context.Background()
			ev, err := orders.CreateEvent(ctx, pool, "Kae Tempest", "Roundhouse")
			require.NoError(tb, err)
			o, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "B", Email: "b@example.com", Seats: 4}, orders.Jobs{})
			require.NoError(tb, err)
			// Another order for the same event: its job updates the same row.
			other, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "C", Email: "c@example.com", Seats: 3}, orders.Jobs{})
			require.NoError(tb, err)
			p := sdk.New("counters", "test")
			sdk.HandleRecordJobID(p, counter.Handler{})
			args, race := stagedoor.UpdateSalesCounter{OrderID: o.ID}, stagedoor.UpdateSalesCounter{OrderID: other.ID}
			if named {
				args.EventID, race.EventID = ev, ev
			}
			return sdktest.Setup[stagedoor.UpdateSalesCounter]{
				Plugin: p, Args: args,
				// The counter is the effect: 4 seats once, never 8, never 0.
				Effects: func(ctx context.Context) (any, error) {
					var seats int64
					err := pool.QueryRow(ctx, `SELECT seats_sold FROM events WHERE id = $1`, ev).Scan(&seats)
					return seats, err
				},
				Want: 4,
				// Both orders counted, however their jobs interleave: 7.
				Race: &sdktest.Race[stagedoor.UpdateSalesCounter]{Args: race, Want: 7},
			}
		},
	})
}
