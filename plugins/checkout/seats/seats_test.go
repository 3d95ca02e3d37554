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

// placed is an order of 3 seats and another of 2 for the same event (its
// job moves the same event's seats_held), with no job.
func placed(tb testing.TB, pool *pgxpool.Pool) (order, other, event int64) {
	ctx := context.Background()
	ev, err := orders.CreateEvent(ctx, pool, "Hania Rani", "Kölner Philharmonie")
	require.NoError(tb, err)
	o, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "B", Email: "b@example.com", Seats: 3}, orders.Jobs{})
	require.NoError(tb, err)
	p, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "C", Email: "c@example.com", Seats: 2}, orders.Jobs{})
	require.NoError(tb, err)
	return o.ID, p.ID, ev
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
// never 6, never none; with the other order's reserve at once, 5.
func TestReserveSeatsIsIdempotent(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[stagedoor.ReserveSeats]{
		Plugin: "checkout", Migrations: os.DirFS("../db/migrations"), Grants: grants(t),
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[stagedoor.ReserveSeats] {
			order, other, ev := placed(tb, pool)
			return sdktest.Setup[stagedoor.ReserveSeats]{Plugin: plugin(), Args: stagedoor.ReserveSeats{OrderID: order},
				Effects: effects(pool, ev),
				Want:    holdEffects{SeatsHeld: 3, Holds: 1, Moves: 1, MovedSum: 3},
				Race: &sdktest.Race[stagedoor.ReserveSeats]{Args: stagedoor.ReserveSeats{OrderID: other},
					Want: holdEffects{SeatsHeld: 5, Holds: 2, Moves: 2, MovedSum: 5}}}
		},
	})
}

// release_seats, the checkout's compensation, gives the 3 held seats back
// once: never -3, never none; with the other order's release at once, both.
func TestReleaseSeatsIsIdempotent(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[stagedoor.ReleaseSeats]{
		Plugin: "checkout", Migrations: os.DirFS("../db/migrations"), Grants: grants(t),
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[stagedoor.ReleaseSeats] {
			ctx := context.Background()
			order, other, ev := placed(tb, pool)
			// Both held as a reserve leaves them.
			_, err := pool.Exec(ctx, `INSERT INTO plugin_checkout.seat_holds (order_id, event_id, seats) VALUES ($1, $3, 3), ($2, $3, 2)`, order, other, ev)
			require.NoError(tb, err)
			_, err = pool.Exec(ctx, `INSERT INTO plugin_checkout.seat_moves (order_id, event_id, delta, job_id)
				VALUES ($1, $3, 3, 'reserve-1'), ($2, $3, 2, 'reserve-2')`, order, other, ev)
			require.NoError(tb, err)
			_, err = pool.Exec(ctx, `UPDATE events SET seats_held = 5 WHERE id = $1`, ev)
			require.NoError(tb, err)
			return sdktest.Setup[stagedoor.ReleaseSeats]{Plugin: plugin(), Args: stagedoor.ReleaseSeats{OrderID: order},
				Effects: effects(pool, ev),
				Want:    holdEffects{SeatsHeld: 2, Holds: 2, Released: 1, Moves: 3, MovedSum: 2},
				Race: &sdktest.Race[stagedoor.ReleaseSeats]{Args: stagedoor.ReleaseSeats{OrderID: other},
					Want: holdEffects{SeatsHeld: 0, Holds: 2, Released: 2, Moves: 4, MovedSum: 0}}}
		},
	})
}
