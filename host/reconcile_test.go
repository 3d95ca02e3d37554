package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
)

// Redis loses the stream after the relay published and marked the rows
// (a restart without persistence, a failover): the reconciler republishes
// every row that never got an outcome, and each job is applied once. It
// does not wait for ReconcileAfter (15 minutes): nothing on the stream is
// older than the rows, so they are republished once the grace past the
// stream's oldest entry (IdleInTransactionTimeout + 5s) has gone by.
func TestLostStreamIsRepublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	want := b.placeOrders(t, 50, 2)
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Redis: b.rdb, Stream: b.stream, Key: hosttest.SigningKey(t, b.pool)})
	require.NoError(t, err)
	n, err := relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 50, n)
	require.NoError(t, b.rdb.Del(ctx, b.stream).Err(), "Redis lost the stream")

	cfg := b.config()
	cfg.JobTimeout, cfg.IdleInTransactionTimeout = 2*time.Second, 3*time.Second
	cfg.ReconcileInterval = 200 * time.Millisecond
	lost := time.Now()
	hosttest.Start(t, cfg)
	b.waitDrained(t, 50)
	t.Logf("50 lost entries applied %s after the loss (grace 8s)", time.Since(lost).Round(time.Millisecond))
	b.requireCounters(t, want)
	require.EqualValues(t, 50, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
	require.EqualValues(t, 0, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE done_at IS NULL`), "every row has an outcome")
	require.EqualValues(t, 50, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE republished > 0`))
	// Each republish is on record with the history (the console's chart),
	// one per time a row was handed back.
	require.Equal(t, hosttest.Count(t, b.pool, `SELECT sum(republished) FROM outbox`),
		hosttest.Count(t, b.pool, `SELECT count(*) FROM job_republishes r JOIN outbox o ON o.id = r.outbox_id AND o.kind = r.kind`))
}

// Every outbox row records its job's outcome once the entry is acked.
func TestEveryRowGetsAnOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.placeOrders(t, 20, 2)
	_, err := b.pool.Exec(context.Background(), `INSERT INTO outbox (kind, payload) VALUES ('update_sales_counter', '{"order_id": 99999}')`)
	require.NoError(t, err)
	hosttest.Start(t, b.config())
	b.waitDrained(t, 20) // the dead letter's record rolled back with its transaction
	hosttest.Eventually(t, 10*time.Second, "every row finished", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE done_at IS NULL`) == 0
	})
	require.EqualValues(t, 20, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE outcome = 'applied'`))
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE outcome = 'dead_letter'`))
}
