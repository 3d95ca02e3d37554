package retention_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/host/retention"
	"github.com/usherhq/usher/host/swaps"
)

type testBundle struct {
	pool   *pgxpool.Pool
	rdb    *redis.Client
	stream string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool, _ := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	return &testBundle{pool: pool, rdb: rdb, stream: stream}
}

func (b *testBundle) retainer(t *testing.T, cfg retention.Config) *retention.Retainer {
	t.Helper()
	cfg.Redis, cfg.Pool, cfg.Streams = b.rdb, b.pool, []string{b.stream}
	if cfg.Group == "" {
		cfg.Group = "usher"
	}
	if cfg.Self == "" {
		cfg.Self = "self"
	}
	cfg.Logger = hosttest.Logger(t, -4)
	r, err := retention.New(cfg)
	require.NoError(t, err)
	return r
}

func (b *testBundle) add(t *testing.T, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		id, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.stream, Values: []any{"n", i}}).Result()
		require.NoError(t, err)
		ids[i] = id
	}
	return ids
}

func (b *testBundle) read(t *testing.T, group, consumer string, n int64) []string {
	t.Helper()
	res, err := b.rdb.XReadGroup(context.Background(), &redis.XReadGroupArgs{
		Group: group, Consumer: consumer, Streams: []string{b.stream, ">"}, Count: n, Block: -1,
	}).Result()
	require.NoError(t, err)
	var ids []string
	for _, m := range res[0].Messages {
		ids = append(ids, m.ID)
	}
	return ids
}

func (b *testBundle) left(t *testing.T) []string {
	t.Helper()
	msgs, err := b.rdb.XRange(context.Background(), b.stream, "-", "+").Result()
	require.NoError(t, err)
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

// Trimming never removes an entry a group still owes: one read but not
// acked (pending), or one a lagging group has not read yet. Once every
// group has read and acked, the stream shrinks to nothing.
func TestTrimKeepsPendingAndUndelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.retainer(t, retention.Config{})
	ids := b.add(t, 10)

	tr, err := r.Trim(ctx)
	require.NoError(t, err)
	require.Zero(t, tr.Entries, "no group yet: nobody has read anything, nothing is trimmed")
	require.Len(t, b.left(t), 10)

	require.NoError(t, b.rdb.XGroupCreate(ctx, b.stream, "usher", "0").Err())
	require.NoError(t, b.rdb.XGroupCreate(ctx, b.stream, "audit", "0").Err())
	require.Equal(t, ids, b.read(t, "usher", "c1", 10))
	require.NoError(t, b.rdb.XAck(ctx, b.stream, "usher", ids[:4]...).Err()) // 4..9 stay pending
	require.Equal(t, ids[:2], b.read(t, "audit", "a1", 2))
	require.NoError(t, b.rdb.XAck(ctx, b.stream, "audit", ids[:2]...).Err()) // audit lags at 2

	tr, err = r.Trim(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, tr.Entries)
	require.Equal(t, ids[2], tr.Owed, "the lagging group's next entry")
	require.Equal(t, ids[2:], b.left(t))

	require.Equal(t, ids[2:], b.read(t, "audit", "a1", 100))
	require.NoError(t, b.rdb.XAck(ctx, b.stream, "audit", ids[2:]...).Err())
	tr, err = r.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, ids[4], tr.Owed, "the oldest pending entry")
	require.Equal(t, ids[4:], b.left(t))

	// A pending entry in the middle holds everything after it.
	require.NoError(t, b.rdb.XAck(ctx, b.stream, "usher", ids[4], ids[6], ids[7], ids[8], ids[9]).Err())
	_, err = r.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, ids[5:], b.left(t))

	require.NoError(t, b.rdb.XAck(ctx, b.stream, "usher", ids[5]).Err())
	tr, err = r.Trim(ctx)
	require.NoError(t, err)
	require.Empty(t, tr.Owed)
	require.Empty(t, b.left(t), "every group read and acked everything")
	require.WithinDuration(t, time.Now(), tr.Before, 5*time.Second, "nothing owed: the low-water mark is Redis's clock")

	// New entries after the trim are owed again.
	more := b.add(t, 3)
	tr, err = r.Trim(ctx)
	require.NoError(t, err)
	require.Equal(t, more[0], tr.Owed)
	require.Equal(t, more, b.left(t))
}

// Hosts trim at once while entries are added, read and acked: no entry is
// lost to any group.
func TestConcurrentTrimsLoseNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, "usher", "0").Err())
	require.NoError(t, b.rdb.XGroupCreate(ctx, b.stream, "audit", "0").Err())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		r := b.retainer(t, retention.Config{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := r.Trim(ctx)
				require.NoError(t, err)
			}
		}()
	}
	const n = 500
	seen := map[string]map[string]bool{"usher": {}, "audit": {}}
	for i := range n {
		b.add(t, 1)
		for _, g := range []string{"usher", "audit"} {
			if g == "audit" && i%3 != 0 {
				continue // audit reads in bursts
			}
			for _, id := range b.read(t, g, "c", 100) {
				seen[g][id] = true
				require.NoError(t, b.rdb.XAck(ctx, b.stream, g, id).Err())
			}
		}
	}
	for _, id := range b.read(t, "audit", "c", 1000) {
		seen["audit"][id] = true
	}
	close(stop)
	wg.Wait()
	require.Len(t, seen["usher"], n)
	require.Len(t, seen["audit"], n)
}

// A consumer of a host gone for good is removed once it is idle with
// nothing pending; one still holding entries, and the host's own, stay.
func TestIdleConsumersWithNothingPendingAreRemoved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, "usher", "0").Err())
	ids := b.add(t, 2)
	b.read(t, "usher", "gone-idle", 1)
	require.NoError(t, b.rdb.XAck(ctx, b.stream, "usher", ids[0]).Err())
	b.read(t, "usher", "gone-pending", 1) // never acked
	require.NoError(t, b.rdb.XGroupCreateConsumer(ctx, b.stream, "usher", "self").Err())

	r := b.retainer(t, retention.Config{ConsumerIdle: 300 * time.Millisecond})
	gone, err := r.RemoveIdleConsumers(ctx)
	require.NoError(t, err)
	require.Empty(t, gone, "none idle long enough yet")
	var names []string
	hosttest.Eventually(t, 5*time.Second, "the idle consumer removed", func() bool {
		gone, err := r.RemoveIdleConsumers(ctx)
		require.NoError(t, err)
		names = append(names, gone...)
		return len(names) > 0
	})
	require.Equal(t, []string{"gone-idle"}, names)
	cs, err := b.rdb.XInfoConsumers(ctx, b.stream, "usher").Result()
	require.NoError(t, err)
	var left []string
	for _, c := range cs {
		left = append(left, c.Name)
	}
	require.ElementsMatch(t, []string{"gone-pending", "self"}, left)
	require.EqualValues(t, 1, hosttest.Pending(t, b.rdb, b.stream, "usher"), "the pending entry is still there")

	// A stream with no group yet is not an error.
	_, rdbKey := hosttest.Redis(t)
	r2, err := retention.New(retention.Config{Redis: b.rdb, Pool: b.pool, Streams: []string{rdbKey}, Group: "usher", Self: "self"})
	require.NoError(t, err)
	_, err = r2.RemoveIdleConsumers(ctx)
	require.NoError(t, err)
}

// A retention window below the redelivery bound is refused, naming it.
func TestRetentionBelowTheBoundIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	red := retention.Redelivery{MaxDeliveries: 10, ReclaimIdle: time.Minute, ReclaimInterval: 15 * time.Second, JobTimeout: 30 * time.Second,
		MaxAttempts: 8, RetryBackoff: time.Second, MaxBackoff: 5 * time.Minute, ReconcileAfter: 15 * time.Minute, ReconcileInterval: time.Minute}
	require.Equal(t, 17*time.Minute+30*time.Second+255*time.Second+16*time.Minute, red.Bound())
	for _, cfg := range []retention.Config{{ProcessedJobs: time.Hour, Outbox: 10 * time.Minute}, {DeadLetters: 37 * time.Minute}} {
		cfg.Redis, cfg.Pool, cfg.Streams, cfg.Group, cfg.Self, cfg.Redelivery = b.rdb, b.pool, []string{b.stream}, "usher", "self", red
		_, err := retention.New(cfg)
		require.ErrorContains(t, err, "is shorter than the redelivery bound 37m45s = MaxDeliveries 10")
	}
	_, err := retention.New(retention.Config{Redis: b.rdb, Pool: b.pool, Streams: []string{b.stream}, Group: "g", Self: "s",
		Redelivery: red, ProcessedJobs: red.Bound(), Outbox: 2 * time.Hour})
	require.NoError(t, err)
}

// Purge deletes processed job ids, done outbox rows and dead letters only
// past their window and the stream's low-water mark, and never a job id
// something could still bring back.
func TestPurgeKeepsWhatCouldComeBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := b.pool.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	outboxRow := func(done, published string, jobID any) string {
		var id int64
		require.NoError(t, b.pool.QueryRow(ctx, fmt.Sprintf(`INSERT INTO outbox (kind, payload, job_id, done_at, published_at, outcome)
			VALUES ('k', '{}', $1, %s, %s, 'applied') RETURNING id`, done, published), jobID).Scan(&id))
		return fmt.Sprint(id)
	}
	processed := func(jobID, at string) {
		exec(`INSERT INTO processed_jobs (job_id, kind, processed_at) VALUES ($1, 'k', `+at+`)`, jobID)
	}
	old, recent := `now() - interval '3 hours'`, `now() - interval '10 minutes'`
	gone := outboxRow(old, old, nil)                                        // done and published long ago
	unpublished := outboxRow(old, "NULL", nil)                              // done, but the relay will publish it again
	unfinished := outboxRow("NULL", old, nil)                               // no outcome yet
	young := outboxRow(recent, recent, nil)                                 // done within the window
	republishedLate := outboxRow(old, `now() - interval '30 minutes'`, nil) // published again after it was done
	outboxRow("NULL", old, "s-retried")                                     // a scheduled run of s-retried, not done
	for _, id := range []string{gone, unpublished, unfinished, young, republishedLate} {
		processed(id, old)
	}
	processed("s-retried", old)
	processed("s-waiting", old)
	exec(`INSERT INTO scheduled_jobs (job_id, attempt, kind, payload, run_at) VALUES ('s-waiting', 1, 'k', '{}', now() + interval '1 hour')`)
	processed("s-moved", old)
	exec(`INSERT INTO scheduled_jobs (job_id, attempt, kind, payload, run_at, enqueued_at) VALUES ('s-moved', 1, 'k', '{}', ` + old + `, ` + old + `)`)
	processed("dl-open", old)
	exec(`INSERT INTO dead_letters (job_id, kind, payload, reason, last_error, attempts, stream_id, created_at)
		VALUES ('dl-open', 'k', '', 'permanent', '', 1, '1-1', ` + old + `)`)
	processed("dl-requeued", old)
	exec(`INSERT INTO dead_letters (job_id, kind, payload, reason, last_error, attempts, stream_id, created_at, requeued_at)
		VALUES ('dl-requeued', 'k', '', 'permanent', '', 1, '1-2', ` + old + `, ` + old + `)`)
	processed("outbox-row-deleted", old)
	processed("fresh", recent)

	r := b.retainer(t, retention.Config{Redelivery: retention.Redelivery{ReconcileAfter: time.Hour},
		ProcessedJobs: time.Hour, Outbox: time.Hour, Margin: time.Minute, BatchSize: 2})

	// The stream still owes an entry added 4 hours ago (every host was
	// down): nothing may go, however old.
	deleted, err := r.Purge(ctx, time.Now().Add(-4*time.Hour))
	require.NoError(t, err)
	require.Empty(t, deleted)

	deleted, err = r.Purge(ctx, time.Now())
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"outbox": 1, "scheduled_jobs": 1, "processed_jobs": 4}, deleted)
	left := func() []string {
		t.Helper()
		rows, err := b.pool.Query(ctx, `SELECT job_id FROM processed_jobs`)
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return ids
	}
	kept := []string{unpublished, unfinished, young, republishedLate, "s-retried", "s-waiting", "dl-open", "fresh"}
	require.ElementsMatch(t, kept, left(),
		"kept: a job id whose outbox row is unpublished, unfinished or recent, with a delayed run waiting or an open dead letter, or recent itself")
	require.EqualValues(t, 5, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox`))
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE id = $1`, gone))
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`), "dead letters are kept unless configured")

	// With a dead letter window, the old dead letters go, and with the
	// open one the last thing that could requeue dl-open.
	r = b.retainer(t, retention.Config{Redelivery: retention.Redelivery{ReconcileAfter: time.Hour},
		ProcessedJobs: time.Hour, DeadLetters: time.Hour, Margin: time.Minute})
	deleted, err = r.Purge(ctx, time.Now())
	require.NoError(t, err)
	require.Equal(t, map[string]int64{"dead_letters": 2, "processed_jobs": 1}, deleted)
	require.ElementsMatch(t, []string{unpublished, unfinished, young, republishedLate, "s-retried", "s-waiting", "fresh"}, left())
}

// A request's jobs read the same after retention deleted their outbox
// rows as before, from their history: the tree keeps its shape (the
// parent link is kept in job_links by the delete itself), and each job
// keeps its state, outcome and attempts (kept there too): a job whose last
// record is an abandoned delivery read "unknown" once its rows were gone.
func TestRequestTreeOutlivesOutboxRetention(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old := time.Now().Add(-3 * time.Hour)
	row := func(kind string, jobID, parent any, attempt int) int64 {
		var id int64
		require.NoError(t, b.pool.QueryRow(ctx, `INSERT INTO outbox (kind, payload, request_id, job_id, parent_job_id, attempt, done_at, published_at, outcome)
			VALUES ($1, '{}', 'req-1', $2, $3, $4, $5, $5, 'applied') RETURNING id`, kind, jobID, parent, attempt, old).Scan(&id))
		return id
	}
	record := func(job string, outboxID int64, attempt int, v outcome.Outcome) {
		require.NoError(t, history.Write(ctx, b.pool, history.Record{JobID: job, Kind: "k", OutboxID: outboxID, RequestID: "req-1",
			Attempt: attempt, Verdict: v, StartedAt: old}))
	}
	render := row("render_tickets", nil, nil, 0)
	renderID := strconv.FormatInt(render, 10)
	record(renderID, render, 0, history.Applied)
	send := row("send_tickets", nil, renderID, 0)
	sendID := strconv.FormatInt(send, 10)
	record(sendID, send, 0, history.Retry)
	retried := row("send_tickets", sendID, renderID, 1) // its retry's row, applied
	record(sendID, retried, 1, history.Applied)
	record(sendID, retried, 1, history.Absorbed)
	count := row("update_sales_counter", nil, renderID, 0)
	countID := strconv.FormatInt(count, 10)
	record(countID, count, 0, history.Abandoned) // what came after is gone

	before, err := history.GetWorkflow(ctx, b.pool, "req-1")
	require.NoError(t, err)

	r := b.retainer(t, retention.Config{Redelivery: retention.Redelivery{ReconcileAfter: time.Hour}, Outbox: time.Hour, Margin: time.Minute})
	deleted, err := r.Purge(ctx, time.Now())
	require.NoError(t, err)
	require.Equal(t, int64(4), deleted["outbox"])
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_links WHERE parent_job_id = $1`, renderID),
		"one link per job, however many of its rows went")

	after, err := history.GetWorkflow(ctx, b.pool, "req-1")
	require.NoError(t, err)
	require.Len(t, after.Jobs, 1, "one root: the render")
	root := after.Jobs[0]
	require.Equal(t, renderID, root.ID)
	require.Equal(t, history.Done, root.State)
	require.Equal(t, 1, root.Attempts)
	require.Len(t, root.Children, 2, "the send and the count still under the render")
	byID := map[string]*history.Job{}
	for _, c := range root.Children {
		byID[c.ID] = c
	}
	require.Equal(t, history.Done, byID[sendID].State)
	require.Equal(t, 2, byID[sendID].Attempts, "its first run and its retry")
	require.Equal(t, 1, byID[sendID].Absorbed)
	require.Equal(t, history.Done, byID[countID].State, "its last record abandoned, its row applied: done, as before")
	require.Equal(t, before.Count, after.Count)
	require.Equal(t, map[string]int{history.Done: 3}, before.States)
	require.Equal(t, before.States, after.States)
	// Every job reads the same: state, outcome, attempts, kind, request,
	// parent.
	same := func(w *history.Workflow) map[string]history.Job {
		m := map[string]history.Job{}
		for _, j := range w.All() {
			m[j.ID] = history.Job{ID: j.ID, Kind: j.Kind, RequestID: j.RequestID, Parent: j.Parent, State: j.State,
				Outcome: j.Outcome, Attempts: j.Attempts, Absorbed: j.Absorbed}
		}
		return m
	}
	require.Equal(t, same(before), same(after))
}

// A cancel asked while its job was on the stream (job_cancels) goes with
// the Outbox window only when nothing of its job is live: kept while the
// job's row is unfinished or done within the window (a redelivery of a
// cancelled job's entry must still find it), or while a delayed run of it
// waits; deleted before the rows it is read against.
func TestPurgeKeepsLiveCancels(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	old, recent := `now() - interval '3 hours'`, `now() - interval '10 minutes'`
	row := func(done, outcome string) string {
		var id int64
		require.NoError(t, b.pool.QueryRow(ctx, fmt.Sprintf(`INSERT INTO outbox (kind, payload, done_at, published_at, outcome)
			VALUES ('k', '{}', %s, %s, %s) RETURNING id`, done, old, outcome)).Scan(&id))
		return fmt.Sprint(id)
	}
	cancel := func(job, at string) {
		_, err := b.pool.Exec(ctx, `INSERT INTO job_cancels (job_id, outbox_id, kind, requested_at) VALUES ($1, $2, 'k', `+at+`)`,
			job, hosttest.Count(t, b.pool, `SELECT coalesce(max(id), 0) FROM outbox`))
		require.NoError(t, err)
	}
	gone := row(old, "'cancelled'")
	cancel(gone, old)
	running := row("NULL", "NULL") // cancelled on the stream, not settled yet
	cancel(running, old)
	settled := row(recent, "'cancelled'") // settled within the window: a redelivery may come
	cancel(settled, old)
	waiting := row(old, "'retry_scheduled'")
	cancel(waiting, old)
	_, err := b.pool.Exec(ctx, `INSERT INTO scheduled_jobs (job_id, attempt, kind, payload, run_at) VALUES ($1, 1, 'k', '{}', now() + interval '1 hour')`, waiting)
	require.NoError(t, err)
	fresh := row(old, "'applied'")
	cancel(fresh, recent)

	r := b.retainer(t, retention.Config{Redelivery: retention.Redelivery{ReconcileAfter: time.Hour}, Outbox: time.Hour, Margin: time.Minute})
	deleted, err := r.Purge(ctx, time.Now())
	require.NoError(t, err)
	require.Equal(t, int64(1), deleted["job_cancels"], "%v", deleted)
	rows, err := b.pool.Query(ctx, `SELECT job_id FROM job_cancels`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.ElementsMatch(t, []string{running, settled, waiting, fresh}, left)
}

// The job history and the swap history are trimmed by the one retainer:
// records older than their window go, in batches, the others stay.
func TestCleanupTrimsTheHistories(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := time.Now()
	for i, age := range []time.Duration{time.Hour, 47 * time.Hour, 49 * time.Hour, 50 * time.Hour, 72 * time.Hour} {
		require.NoError(t, history.Write(ctx, b.pool, history.Record{JobID: "j", Kind: "k", Attempt: i, Verdict: history.Applied, StartedAt: now.Add(-age)}))
		_, err := b.pool.Exec(ctx, `UPDATE job_history SET finished_at = started_at WHERE attempt = $1`, i)
		require.NoError(t, err)
		require.NoError(t, swaps.Record(ctx, b.pool, swaps.Swap{Host: "h", Plugin: "p", Action: swaps.Swapped, From: "1", To: strconv.Itoa(i), Cause: swaps.CauseReload}))
		_, err = b.pool.Exec(ctx, `UPDATE plugin_swaps SET at = $1 WHERE to_version = $2`, now.Add(-age), strconv.Itoa(i))
		require.NoError(t, err)
		// The reconciler's record of a republish goes with the history,
		// and so does the parent link retention kept of a deleted row.
		_, err = b.pool.Exec(ctx, `INSERT INTO job_republishes (outbox_id, job_id, kind, republished_at) VALUES ($1, 'j', 'k', $2)`, i+1, now.Add(-age))
		require.NoError(t, err)
		_, err = b.pool.Exec(ctx, `INSERT INTO job_links (job_id, parent_job_id, kept_at) VALUES ($1, 'p', $2)`, strconv.Itoa(i), now.Add(-age))
		require.NoError(t, err)
	}
	deleted := map[string]int64{}
	r, err := retention.New(retention.Config{Redis: b.rdb, Pool: b.pool, Streams: []string{b.stream}, Group: "usher", Self: "self",
		History: 48 * time.Hour, Swaps: 48 * time.Hour, BatchSize: 2,
		OnDeleted: func(table string, n int64) { deleted[table] += n }})
	require.NoError(t, err)
	require.NoError(t, r.Cleanup(ctx))
	require.Equal(t, map[string]int64{"job_history": 3, "job_republishes": 3, "job_links": 3, "plugin_swaps": 3}, deleted)
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_republishes`))
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_links`))
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history`))
	require.EqualValues(t, 0, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE finished_at < $1`, now.Add(-48*time.Hour)))
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_swaps`))
}

// Finished workflows past their window go with their histories; running
// ones stay however old, and so do those finished recently.
func TestCleanupDeletesFinishedWorkflows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, q := range []string{
		`SELECT usher_start_workflow('trip', w, '{}') FROM unnest(ARRAY['old-done', 'old-failed', 'new-done', 'old-running']) w`,
		`UPDATE workflows SET created_at = now() - interval '10 days'`,
		`UPDATE workflows SET state = 'completed', finished_at = now() - interval '3 days' WHERE workflow_id = 'old-done'`,
		`UPDATE workflows SET state = 'failed', finished_at = now() - interval '3 days' WHERE workflow_id = 'old-failed'`,
		`UPDATE workflows SET state = 'completed', finished_at = now() - interval '1 hour' WHERE workflow_id = 'new-done'`,
	} {
		_, err := b.pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	require.EqualValues(t, 4, hosttest.Count(t, b.pool, `SELECT count(*) FROM workflow_events`))
	deleted := map[string]int64{}
	r, err := retention.New(retention.Config{Redis: b.rdb, Pool: b.pool, Streams: []string{b.stream}, Group: "usher", Self: "self",
		Workflows: 48 * time.Hour, BatchSize: 1, OnDeleted: func(table string, n int64) { deleted[table] += n }})
	require.NoError(t, err)
	require.NoError(t, r.Cleanup(ctx))
	require.Equal(t, map[string]int64{"workflows": 2}, deleted)
	rows, err := b.pool.Query(ctx, `SELECT workflow_id FROM workflows ORDER BY workflow_id`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"new-done", "old-running"}, left)
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM workflow_events`), "their histories went with them")
}

// A stored plugin version (workflow_binaries) goes once no running
// workflow is pinned to it, unless it is its plugin's newest or was loaded
// within the grace.
func TestCleanupDeletesUnpinnedBinaries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO workflow_binaries (plugin, version, sha256, bytes, stored_at) VALUES
			('p', '1.0.0', 'a', 'x', now() - interval '3 hours'),
			('p', '1.1.0', 'b', 'x', now() - interval '2 hours'),
			('p', '1.2.0', 'c', 'x', now() - interval '10 minutes'),
			('p', '2.0.0', 'd', 'x', now() - interval '5 minutes'),
			('q', '1.0.0', 'e', 'x', now() - interval '9 days')`,
		`SELECT usher_start_workflow('trip', 'pinned', '{}')`,
		`UPDATE workflows SET plugin = 'p', plugin_version = '1.1.0'`,
	} {
		_, err := b.pool.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	deleted := map[string]int64{}
	r, err := retention.New(retention.Config{Redis: b.rdb, Pool: b.pool, Streams: []string{b.stream}, Group: "usher", Self: "self",
		OnDeleted: func(table string, n int64) { deleted[table] += n }})
	require.NoError(t, err)
	require.NoError(t, r.Cleanup(ctx))
	require.Equal(t, int64(1), deleted["workflow_binaries"])
	rows, err := b.pool.Query(ctx, `SELECT plugin || '@' || version FROM workflow_binaries ORDER BY 1`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"p@1.1.0", "p@1.2.0", "p@2.0.0", "q@1.0.0"}, left,
		"1.0.0 goes; 1.1.0 is pinned, 1.2.0 in its grace, 2.0.0 and q's the newest")
}
