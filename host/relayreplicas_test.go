package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
)

// relayAll runs the relay until the outbox is empty and returns how long
// it took and how many batches it made.
func relayAll(t *testing.T, r *outbox.Relay) (time.Duration, int) {
	t.Helper()
	start := time.Now()
	batches := 0
	for {
		n, err := r.RelayOnce(context.Background())
		require.NoError(t, err)
		if n == 0 {
			return time.Since(start), batches
		}
		batches++
	}
}

// With RelayReplicas the relay marks rows published only once the
// replicas acknowledged their entries: on the cluster (one replica per
// primary) a batch waited for by 1 is published, one that asks for 2 is
// not and its rows stay unpublished; so on a single node asked for 1.
// The cost of the WAIT is logged.
func TestRelayWaitsForReplicas(t *testing.T) {
	t.Parallel()
	b := setupCluster(t)
	ctx := context.Background()
	key := hosttest.SigningKey(t, b.pool)
	relay := func(rdb redis.UniversalClient, replicas int) *outbox.Relay {
		r, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Redis: rdb, Stream: b.stream, Key: key, Replicas: replicas})
		require.NoError(t, err)
		return r
	}
	unpublished := func() int64 {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`)
	}
	const rows = 2048
	var took [2]time.Duration
	var batches [2]int
	for round := range 3 { // the first warms up
		for replicas := range 2 {
			addRows(t, b.pool, rows)
			took[replicas], batches[replicas] = relayAll(t, relay(b.crdb, replicas))
			require.Zero(t, unpublished())
		}
		if round > 0 {
			t.Logf("round %d: %d rows in %d batches: %s without WAIT, %s with WAIT 1 (%.1fus a batch more)", round, rows, batches[0],
				took[0], took[1], float64((took[1]-took[0]).Microseconds())/float64(batches[0]))
		}
	}
	require.EqualValues(t, 6*rows, b.crdb.XLen(ctx, b.stream).Val())

	addRows(t, b.pool, 10)
	_, err := relay(b.crdb, 2).RelayOnce(ctx)
	require.ErrorContains(t, err, "1 of 2 replicas acknowledged")
	require.EqualValues(t, 10, unpublished(), "not marked")

	single, stream := hosttest.Redis(t)
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Redis: single, Stream: stream, Key: key, Replicas: 1})
	require.NoError(t, err)
	_, err = r.RelayOnce(ctx)
	require.ErrorContains(t, err, "0 of 1 replicas acknowledged")
	require.EqualValues(t, 10, unpublished(), "not marked")
	require.EqualValues(t, 10, single.XLen(ctx, stream).Val(), "on the stream, to be published again: the documented duplicate")
	_, err = relay(b.crdb, 1).RelayOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, unpublished())
}

// addRows commits n outbox rows in one statement: the relay's work, not
// the orders', is what is measured here.
func addRows(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `INSERT INTO outbox (kind, payload) SELECT 'update_sales_counter', json_build_object('order_id', g)::text::jsonb FROM generate_series(1, $1) g`, n)
	require.NoError(t, err)
}
