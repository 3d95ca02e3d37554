package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// enqueueCounter commits an order with no job, then its counter job with
// client.Enqueue, as an application would, and returns the event's seats.
func (b *testBundle) enqueueCounter(t *testing.T, seats int) (eventID, outboxID int64) {
	t.Helper()
	ctx := context.Background()
	ev, err := orders.CreateEvent(ctx, b.pool, "Event", "Stagedoor Hall")
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		p, err := orders.PlaceTx(ctx, tx, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: seats}, orders.Jobs{})
		if err != nil {
			return err
		}
		outboxID, err = client.Enqueue(ctx, tx, client.Job{Kind: "update_sales_counter", Payload: map[string]any{"order_id": p.ID}})
		return err
	}))
	return ev, outboxID
}

// A rolling deploy of a new kind: the job is enqueued while the only host
// running serves other kinds. It waits (pending, its deliveries not
// counted, no dead letter), shows in the metrics, and runs once a host
// serving its kind starts.
func TestUnknownKindWaitsForAHostThatServesIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := hostConfig(b.dbURL, b.rdb, b.stream, hosttest.Build(t, "./host/testdata/rawplugin"))
	old.MaxDeliveries = 2 // reclaimed every second: counted deliveries would dead-letter it
	old.AdminAddr = "127.0.0.1:0"
	h1 := hosttest.Start(t, old)

	ev, id := b.enqueueCounter(t, 3)
	hosttest.Eventually(t, 20*time.Second, "the job to wait for its kind", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE id = $1 AND kind_waited_at IS NOT NULL`, id) == 1
	})
	// Reclaimed and given back more often than MaxDeliveries allows.
	var m string
	hosttest.Eventually(t, 20*time.Second, "the entry to wait 4 times", func() bool {
		m = metricsText(t, h1)
		_, n, _ := strings.Cut(m, `usher_entries_waited_for_kind_total{kind="update_sales_counter"} `)
		waits, _ := strconv.Atoi(strings.SplitN(n, "\n", 2)[0])
		return waits >= 4
	})
	require.Contains(t, m, `usher_jobs_waiting_for_kind{kind="update_sales_counter"} 1`)
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
	require.EqualValues(t, 1, hosttest.Pending(t, b.rdb, b.stream, "usher"))

	// The new host serves the kind: its reclaimer takes the entry within
	// ReclaimIdle and applies it, once.
	hosttest.Start(t, b.config())
	hosttest.Eventually(t, 30*time.Second, "the waiting job applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT seats_sold FROM events WHERE id = $1`, ev) == 3 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
	require.NotContains(t, metricsText(t, h1), `usher_jobs_waiting_for_kind{kind="update_sales_counter"}`, "nothing waits any more")
}

// Past UnknownKindWait a job of a kind no host serves is dead-lettered,
// its reason naming the wait; the host's other jobs flow meanwhile.
func TestUnknownKindDeadLetteredAfterItsWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.UnknownKindWait = 4 * time.Second
	cfg.MaxDeliveries = 2
	hosttest.Start(t, cfg)

	ctx := context.Background()
	var id int64
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		var err error
		id, err = client.Enqueue(ctx, tx, client.Job{Kind: "reticulate_splines", Payload: json.RawMessage(`{"n": 1}`), RequestID: "req-wait"})
		return err
	}))
	start := time.Now()
	want := b.placeOrders(t, 5, 1)
	hosttest.Eventually(t, 20*time.Second, "the other jobs applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 5
	})
	b.requireCounters(t, want)
	hosttest.Eventually(t, 30*time.Second, "the unknown kind dead-lettered", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`) == 1
	})
	require.GreaterOrEqual(t, time.Since(start), cfg.UnknownKindWait-time.Second, "not before its wait (the entry is a little older than the commit)")
	letters, err := deadletter.List(ctx, b.pool, "", 10)
	require.NoError(t, err)
	require.Len(t, letters, 1)
	l := letters[0]
	require.Equal(t, fmt.Sprint(id), l.JobID)
	require.Equal(t, "reticulate_splines", l.Kind)
	require.Contains(t, l.Reason, `unknown kind "reticulate_splines": no host served it within UnknownKindWait (4s;`)
	require.True(t, strings.Contains(l.Reason, "update_sales_counter"), l.Reason)
	// The outcome is recorded after the dead letter, then the entry acked.
	hosttest.Eventually(t, 10*time.Second, "the outcome recorded and nothing pending", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE id = $1 AND outcome = 'dead_letter' AND kind_waited_at IS NOT NULL`, id) == 1 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
}
