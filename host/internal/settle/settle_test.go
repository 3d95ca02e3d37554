package settle_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/internal/settle"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/host/stream"
)

// killer terminates the backend of a query about to mark an outbox row,
// while armed: the connection dies between a settlement's first write
// and its outbox mark.
type killer struct {
	armed  atomic.Bool
	killed atomic.Int32
	admin  *pgxpool.Pool
}

func (k *killer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if k.armed.Load() && strings.Contains(data.SQL, "UPDATE outbox SET done_at") {
		k.armed.Store(false)
		var ok bool
		if err := k.admin.QueryRow(ctx, `SELECT pg_terminate_backend($1, 5000)`, conn.PgConn().PID()).Scan(&ok); err == nil && ok {
			k.killed.Add(1)
		}
	}
	return ctx
}

func (k *killer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A retry's scheduled run or a dead letter, the outbox row's mark and the
// delivery's record commit together or not at all: with the connection
// killed between the first write and the mark, none of them is there; the
// settlement run again writes all three.
func TestSettlementCommitsTogetherOrNotAtAll(t *testing.T) {
	t.Parallel()
	owner, dbURL := hosttest.DB(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	k := &killer{admin: owner}
	cfg.ConnConfig.Tracer = k
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := settle.New(settle.Config{Pool: pool, Consumer: "host-a", Logger: hosttest.Logger(t, 0)})
	require.NoError(t, err)

	count := func(sql string, args ...any) int64 { return hosttest.Count(t, owner, sql, args...) }
	delivery := func(jobID string) (*settle.Delivery, int64) {
		ids, err := outbox.Add(ctx, owner, outbox.Message{Kind: "update_sales_counter", Payload: []byte(`{}`), JobID: jobID})
		require.NoError(t, err)
		d := settle.NewDelivery(stream.Entry{StreamID: "1-0", JobID: jobID, OutboxID: ids[0], Kind: "update_sales_counter",
			Payload: []byte(`{}`), Deliveries: 1}, "host-a")
		d.Served("counters", "1.0.0", "job_id")
		return d, ids[0]
	}
	check := func(name, jobID string, id int64, o outcome.Outcome, written int64) {
		t.Helper()
		require.Equal(t, written, count(`SELECT count(*) FROM outbox WHERE id = $1 AND done_at IS NOT NULL AND outcome = $2`, id, string(o)), name+": outbox mark")
		require.Equal(t, written, count(`SELECT count(*) FROM job_history WHERE job_id = $1 AND verdict = $2`, jobID, string(o)), name+": history record")
		switch o {
		case outcome.RetryScheduled:
			require.Equal(t, written, count(`SELECT count(*) FROM scheduled_jobs WHERE job_id = $1`, jobID), name+": scheduled run")
		case outcome.DeadLettered:
			require.Equal(t, written, count(`SELECT count(*) FROM dead_letters WHERE job_id = $1`, jobID), name+": dead letter")
		}
	}

	for _, c := range []struct {
		name   string
		o      outcome.Outcome
		settle func(d *settle.Delivery, jobID string) error
	}{
		{"retry", outcome.RetryScheduled, func(d *settle.Delivery, jobID string) error {
			d.Verdict(outcome.RetryScheduled, "transient; runs again in 1s", "transient")
			_, err := s.Retry(ctx, d, schedule.Run{JobID: jobID, Attempt: 1, Kind: "update_sales_counter", Payload: []byte(`{}`), RunAt: time.Now().Add(time.Hour)})
			return err
		}},
		{"dead letter", outcome.DeadLettered, func(d *settle.Delivery, jobID string) error {
			d.Verdict(outcome.DeadLettered, "permanent: no such order", "no such order")
			return s.DeadLetter(ctx, d, deadletter.Letter{JobID: jobID, Kind: "update_sales_counter", Payload: []byte(`{}`),
				Reason: "permanent: no such order", Attempts: 1, StreamID: "1-0", History: []byte(`[]`)})
		}},
	} {
		jobID := "job-" + strings.ReplaceAll(c.name, " ", "-")
		d, id := delivery(jobID)
		k.armed.Store(true)
		before := k.killed.Load()
		require.Error(t, c.settle(d, jobID), c.name+": the connection was killed before the mark")
		require.Equal(t, before+1, k.killed.Load(), c.name+": the kill happened")
		check(c.name+" (killed)", jobID, id, c.o, 0)

		require.NoError(t, c.settle(d, jobID), c.name+": settled again")
		check(c.name, jobID, id, c.o, 1)
	}
}

// A delivery settled cancelled (its job cancelled on the stream) marks a
// row with no outcome yet, and frees its job's deduplication key; a row
// settled already keeps its outcome (a duplicate of a job that applied
// before the cancel reached the host), and that delivery is recorded as
// absorbed, saying so. A redelivery of the cancelled one is cancelled
// again, its row unchanged.
func TestCancelledNeverOverwritesAnOutcome(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	s, err := settle.New(settle.Config{Pool: pool, Consumer: "host-a", Logger: hosttest.Logger(t, 0)})
	require.NoError(t, err)
	count := func(sql string, args ...any) int64 { return hosttest.Count(t, pool, sql, args...) }
	var keyed, applied int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT usher_enqueue_job('update_sales_counter', '{}', 'req', '', 'order-1', interval '1 hour')`).Scan(&keyed))
	ids, err := outbox.Add(ctx, pool, outbox.Message{Kind: "update_sales_counter", Payload: []byte(`{}`)})
	require.NoError(t, err)
	applied = ids[0]
	_, err = pool.Exec(ctx, `UPDATE outbox SET published_at = now()`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox SET done_at = now(), outcome = 'applied' WHERE id = $1`, applied)
	require.NoError(t, err)
	delivery := func(id int64) *settle.Delivery {
		d := settle.NewDelivery(stream.Entry{StreamID: "1-0", JobID: strconv.FormatInt(id, 10), OutboxID: id, Kind: "update_sales_counter",
			Payload: []byte(`{}`), Deliveries: 1}, "host-a")
		d.Served("counters", "1.0.0", "job_id")
		return d
	}

	d := delivery(keyed)
	require.NoError(t, s.Cancelled(ctx, d, "cancelled on the stream"))
	require.Equal(t, outcome.Cancelled, d.Record.Verdict)
	require.EqualValues(t, 1, count(`SELECT count(*) FROM outbox WHERE id = $1 AND outcome = 'cancelled' AND done_at IS NOT NULL`, keyed))
	require.Zero(t, count(`SELECT count(*) FROM job_dedup_keys WHERE dedup_key = 'order-1'`), "the key is free")
	d = delivery(keyed)
	require.NoError(t, s.Cancelled(ctx, d, "cancelled on the stream"))
	require.Equal(t, outcome.Cancelled, d.Record.Verdict, "a redelivery")
	require.EqualValues(t, 2, count(`SELECT count(*) FROM job_history WHERE job_id = $1 AND verdict = 'cancelled'`, strconv.FormatInt(keyed, 10)))

	d = delivery(applied)
	require.NoError(t, s.Cancelled(ctx, d, "cancelled on the stream"))
	require.Equal(t, outcome.Absorbed, d.Record.Verdict)
	require.Contains(t, d.Record.Reason, "settled applied before the cancel reached this host")
	require.EqualValues(t, 1, count(`SELECT count(*) FROM outbox WHERE id = $1 AND outcome = 'applied'`, applied), "applied stays applied")
	require.EqualValues(t, 1, count(`SELECT count(*) FROM job_history WHERE job_id = $1 AND verdict = 'absorbed'`, strconv.FormatInt(applied, 10)))
}
