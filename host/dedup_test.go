package host_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// outbox.Add takes the same key as the client: keyed and unkeyed messages
// in one batch keep their order, a key already held (by a client enqueue
// too: one key space per kind) answers the holder's id, and a job added
// twice by key runs once on a host.
func TestDedupOutboxAdd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev, err := orders.CreateEvent(ctx, b.pool, "Event", "Stagedoor Hall")
	require.NoError(t, err)
	placed, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "Ada", Email: "a@example.com", Seats: 3}, orders.Jobs{})
	require.NoError(t, err)
	payload := json.RawMessage(`{"order_id": ` + strconv.FormatInt(placed.ID, 10) + `}`)
	msg := outbox.Message{Kind: counterKind, Payload: payload, DedupKey: "order-" + strconv.FormatInt(placed.ID, 10)}

	first, err := client.Enqueue(ctx, b.pool, client.Job{Kind: counterKind, Payload: payload, DedupKey: msg.DedupKey})
	require.NoError(t, err)
	ids, err := outbox.Add(ctx, b.pool, outbox.Message{Kind: "other_kind", Payload: json.RawMessage(`{}`)}, msg,
		outbox.Message{Kind: "other_kind", Payload: json.RawMessage(`{}`), DedupKey: msg.DedupKey, DedupWindow: time.Hour}, msg)
	require.NoError(t, err)
	require.Len(t, ids, 4)
	require.Equal(t, first, ids[1], "held by the client's enqueue")
	require.Equal(t, first, ids[3])
	require.NotEqual(t, ids[0], ids[2])
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = $1`, counterKind))
	require.EqualValues(t, 3, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox`))
	_, err = outbox.Add(ctx, b.pool, outbox.Message{Kind: "k", Payload: json.RawMessage(`{}`), DedupWindow: time.Hour})
	require.ErrorContains(t, err, "DedupWindow and no DedupKey")

	// The counters plugin runs the one job: the seats are counted once.
	cfg := b.config()
	hosttest.Start(t, cfg)
	hosttest.Eventually(t, 30*time.Second, "the job applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = $1 AND outcome = 'applied'`, counterKind) == 1
	})
	require.EqualValues(t, 3, hosttest.Count(t, b.pool, `SELECT seats_sold FROM events WHERE id = $1`, ev))
}

// A business key deduplicates however many applications enqueue it and
// however many hosts run: two hosts serve the counters while every one of
// 120 orders is enqueued by three transactions at once with the order's
// key, and once more after its job applied (inside the window). Each
// enqueue answers the one job's id, one outbox row exists per order, each
// job applies once on one of the two hosts, and every event counts each
// order's seats once.
func TestDedupTwoHosts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.config()
	hosts := []*hosttest.Running{hosttest.Start(t, cfg), hosttest.Start(t, cfg)}
	require.Len(t, hosts, 2)

	const n, racers = 120, 3
	want := map[int64]int64{}
	events := make([]int64, 4)
	for i := range events {
		var err error
		events[i], err = orders.CreateEvent(ctx, b.pool, "Event "+strconv.Itoa(i), "Stagedoor Hall")
		require.NoError(t, err)
	}
	type placed struct {
		job     client.Job
		ids     [racers]int64
		errs    [racers]error
		eventID int64
	}
	all := make([]*placed, n)
	for i := range all {
		ev := events[i%len(events)]
		o, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "Ada", Email: "a@example.com", Seats: 1 + i%6}, orders.Jobs{})
		require.NoError(t, err)
		want[ev] += int64(1 + i%6)
		id := strconv.FormatInt(o.ID, 10)
		all[i] = &placed{eventID: ev, job: client.Job{Kind: counterKind, DedupKey: "order-" + id,
			Payload: json.RawMessage(`{"order_id": ` + id + `, "event_id": ` + strconv.FormatInt(ev, 10) + `}`)}}
	}
	// Three transactions per order race for its key, each committing.
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range all {
		for r := range racers {
			wg.Go(func() {
				<-start
				p.errs[r] = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					var err error
					p.ids[r], err = client.Enqueue(ctx, tx, p.job)
					return err
				})
			})
		}
	}
	close(start)
	wg.Wait()
	for _, p := range all {
		for r := range racers {
			require.NoError(t, p.errs[r])
			require.Equal(t, p.ids[0], p.ids[r], "every racer for %s answered the one job", p.job.DedupKey)
		}
	}
	b.waitDrained(t, n)

	// Once applied, an enqueue of the same key within its window still
	// answers the first job and adds nothing.
	for _, p := range all {
		again, err := client.Enqueue(ctx, b.pool, p.job)
		require.NoError(t, err)
		require.Equal(t, p.ids[0], again)
	}
	require.EqualValues(t, n, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = $1`, counterKind), "one row per key")
	hosttest.Eventually(t, 10*time.Second, "nothing left to publish", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
	})
	b.requireCounters(t, want)
	requireOnceEach(t, b, n)
	perHost := map[string]int64{}
	rows, err := b.pool.Query(ctx, `SELECT consumer, count(*) FROM job_history WHERE verdict = 'applied' GROUP BY consumer`)
	require.NoError(t, err)
	for rows.Next() {
		var c string
		var k int64
		require.NoError(t, rows.Scan(&c, &k))
		perHost[c] = k
	}
	require.NoError(t, rows.Err())
	t.Logf("%d orders enqueued %d times each at once and once more after: applied per host %v", n, racers, perHost)
	require.Len(t, perHost, 2, "both hosts ran jobs")
}
