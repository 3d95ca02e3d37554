package seats_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/plugins/checkout/seats"
	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/sdktest"
)

// holdEffects is everything a reserve or a release changes: the event's
// held seats, the hold, and every move recorded.
type holdEffects struct {
	SeatsHeld       int64
	Holds, Released int64
	Moves, MovedSum int64
}

func grants(t *testing.T) []pluginhost.Grant {
	t.Helper()
	g, err := pluginhost.ReadGrants("../db/grants.json")
	require.NoError(t, err)
	return g
}

// placed is an order of 3 seats, with no job.
func placed(tb testing.TB, pool *pgxpool.Pool) (order, event int64) {
	ctx := context.Background()
	ev, err := orders.CreateEvent(ctx, pool, "Hania Rani", "Kölner Philharmonie")
	require.NoError(tb, err)
	o, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "B", Email: "b@example.com", Seats: 3}, orders.Jobs{})
	require.NoError(tb, err)
	return o.ID, ev
}

func effects(pool *pgxpool.Pool, event int64) func(context.Context) (any, error) {
	return func(ctx context.Context) (any, error) {
		var e holdEffects
		err := pool.QueryRow(ctx, `SELECT (SELECT seats_held FROM events WHERE id = $1),
			(SELECT count(*) FROM plugin_checkout.seat_holds),
			(SELECT count(*) FROM plugin_checkout.seat_holds WHERE released_at IS NOT NULL),
			(SELECT count(*) FROM plugin_checkout.seat_moves),
			(SELECT coalesce(sum(delta), 0) FROM plugin_checkout.seat_moves)`, event).
			Scan(&e.SeatsHeld, &e.Holds, &e.Released, &e.Moves, &e.MovedSum)
		return e, err
	}
}

func plugin() *sdk.Plugin {
	p := sdk.New("checkout", "test")
	sdk.HandleStateFirst(p, seats.Reserve{})
	sdk.HandleStateFirst(p, seats.Release{})
	return p
}

// reserve_seats holds 3 seats once, whatever crashes and redeliveries:
// never 6.
func TestReserveSeatsIsIdempotent(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[stagedoor.ReserveSeats]{
		Plugin: "checkout", Migrations: os.DirFS("../db/migrations"), Grants: grants(t),
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[stagedoor.ReserveSeats] {
			order, ev := placed(tb, pool)
			return sdktest.Setup[stagedoor.ReserveSeats]{Plugin: plugin(), Args: stagedoor.ReserveSeats{OrderID: order},
				Effects: effects(pool, ev)}
		},
	})
}

// release_seats, the checkout's compensation, gives the 3 held seats back
// once: never -3.
func TestReleaseSeatsIsIdempotent(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[stagedoor.ReleaseSeats]{
		Plugin: "checkout", Migrations: os.DirFS("../db/migrations"), Grants: grants(t),
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[stagedoor.ReleaseSeats] {
			ctx := context.Background()
			order, ev := placed(tb, pool)
			// Held as a reserve leaves it.
			_, err := pool.Exec(ctx, `INSERT INTO plugin_checkout.seat_holds (order_id, event_id, seats) VALUES ($1, $2, 3)`, order, ev)
			require.NoError(tb, err)
			_, err = pool.Exec(ctx, `INSERT INTO plugin_checkout.seat_moves (order_id, event_id, delta, job_id) VALUES ($1, $2, 3, 'reserve')`, order, ev)
			require.NoError(tb, err)
			_, err = pool.Exec(ctx, `UPDATE events SET seats_held = 3 WHERE id = $1`, ev)
			require.NoError(tb, err)
			return sdktest.Setup[stagedoor.ReleaseSeats]{Plugin: plugin(), Args: stagedoor.ReleaseSeats{OrderID: order},
				Effects: effects(pool, ev)}
		},
	})
}
