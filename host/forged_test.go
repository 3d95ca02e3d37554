package host_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/internal/entry"
)

// Someone who can XADD to the stream but holds no key forges entries
// claiming the outbox ids of real jobs not yet relayed: unsigned, signed
// with another key, and a real signature over a changed payload. Each is
// dead-lettered as forged and acked, touches no guard and no outbox row, and
// the real jobs with those ids are then applied, not absorbed. A relay
// duplicate of a signed entry is still absorbed as before.
func TestForgedEntriesDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	want := b.placeOrders(t, 2, 1)
	type job struct {
		outboxID int64
		orderID  int64
	}
	rows, err := b.pool.Query(ctx, `SELECT id, (payload->>'order_id')::bigint FROM outbox ORDER BY id`)
	require.NoError(t, err)
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (job, error) {
		var j job
		return j, r.Scan(&j.outboxID, &j.orderID)
	})
	require.NoError(t, err)
	require.Len(t, jobs, 2)
	a, c := jobs[0], jobs[1]
	key := hosttest.SigningKey(t, b.pool)
	// Each forgery claims a real job's identity with the other order's
	// payload: absorbed as that job, it would count one order twice and
	// lose the other.
	claim := func(j, other job) entry.Fields {
		id := strconv.FormatInt(j.outboxID, 10)
		return entry.Fields{JobID: id, OutboxID: id, Kind: "update_sales_counter",
			Payload: `{"order_id":` + strconv.FormatInt(other.orderID, 10) + `}`, Attempt: "0"}
	}
	xadd := func(vals []any) string {
		id, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: vals}).Result()
		require.NoError(t, err)
		return id
	}
	unsigned := claim(a, c).Values(key)
	unsignedID := xadd(unsigned[:len(unsigned)-2]) // no sig field
	otherKeyID := xadd(claim(c, a).Values(bytes.Repeat([]byte{1}, entry.MinKeyLen)))
	altered := claim(a, a).Values(key) // the genuine entry, signed...
	for i := 0; i < len(altered); i += 2 {
		if altered[i] == entry.FieldPayload {
			altered[i+1] = claim(a, c).Payload // ...then its payload changed
		}
	}
	alteredID := xadd(altered)

	cfg := b.config()
	cfg.DisableRelay = true // the real entries go out only after the forgeries ran
	hosttest.Start(t, cfg)
	hosttest.Eventually(t, 30*time.Second, "3 forged entries dead-lettered and acked", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`) == 3 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	letters, err := deadletter.List(ctx, b.pool, "", 10)
	require.NoError(t, err)
	reasons := map[string]string{}
	for _, l := range letters {
		require.Equal(t, deadletter.ForgedKind, l.Kind)
		require.Equal(t, "forged:"+l.StreamID, l.JobID, "never under the identity it claims")
		require.Contains(t, l.Reason, "entry "+l.StreamID+" is not signed by a relay of this cluster: forged or altered")
		reasons[l.StreamID] = l.Reason
	}
	require.Contains(t, reasons[unsignedID], "it has no signature")
	require.Contains(t, reasons[otherKeyID], "its signature does not match its fields")
	require.Contains(t, reasons[alteredID], "its signature does not match its fields")
	require.Contains(t, reasons[alteredID], fmt.Sprintf(`it claims job "%d"`, a.outboxID))
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`), "no guard ran")
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "no effect")
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE done_at IS NOT NULL OR outcome IS NOT NULL`),
		"no outcome recorded on the rows they claimed")

	// The real jobs are relayed: applied once each, nothing absorbed.
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Redis: b.rdb, Stream: b.stream, Key: key})
	require.NoError(t, err)
	n, err := relay.RelayOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	b.waitDrained(t, 2)
	b.requireCounters(t, want)
	for _, j := range jobs {
		require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1 AND order_id = $2`,
			strconv.FormatInt(j.outboxID, 10), j.orderID), "job %d applied to its own order", j.outboxID)
	}
	hosttest.Eventually(t, 10*time.Second, "both rows finished", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE outcome = 'applied'`) == 2
	})
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT coalesce(sum(count), 0)::bigint FROM absorbed_duplicates`))

	// A relay duplicate (the same signed entry again) is absorbed by the
	// guard, not dead-lettered.
	msgs, err := b.rdb.XRevRangeN(ctx, b.stream, "+", "-", 1).Result()
	require.NoError(t, err)
	require.NoError(t, b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: msgs[0].Values}).Err())
	hosttest.Eventually(t, 30*time.Second, "the duplicate absorbed", func() bool {
		return hosttest.Count(t, b.pool, `SELECT coalesce(sum(count), 0)::bigint FROM absorbed_duplicates WHERE guard = 'job_id'`) == 1 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	require.EqualValues(t, 3, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
	b.requireCounters(t, want)

	// A forged entry's letter is never requeued, by kind or by id.
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		n, err := deadletter.Requeue(ctx, tx, 0, deadletter.ForgedKind)
		require.Zero(t, n)
		return err
	}))
	err = pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := deadletter.Requeue(ctx, tx, letters[0].ID, "")
		return err
	})
	require.ErrorContains(t, err, "forged entries are never requeued")
}
