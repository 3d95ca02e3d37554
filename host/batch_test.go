package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// Jobs that record their id run in batches: one transaction and one call
// to the plugin for the jobs waiting. A batch holding a job whose order is
// gone (its write affects no row) is rolled back and each of its jobs runs
// again alone: the others apply once, the bad one is dead-lettered with
// its own reason. Jobs recorded before are absorbed inside a batch.
func TestBatchesApplyEachJobOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	want := b.placeOrders(t, 300, 5)
	// Three jobs for orders that do not exist, among the others.
	_, err := b.pool.Exec(ctx, `INSERT INTO outbox (kind, payload) SELECT 'update_sales_counter', jsonb_build_object('order_id', 900000000 + n) FROM generate_series(1, 3) n`)
	require.NoError(t, err)
	// Five jobs applied before (as if by an earlier run): absorbed.
	rows, err := b.pool.Query(ctx, `
		INSERT INTO processed_jobs (job_id, kind)
		SELECT coalesce(job_id, id::text), kind FROM outbox WHERE kind = 'update_sales_counter' ORDER BY id LIMIT 5
		RETURNING job_id`)
	require.NoError(t, err)
	rows.Close()
	require.NoError(t, rows.Err())
	_, err = b.pool.Exec(ctx, `
		UPDATE events e SET seats_sold = seats_sold + s.seats
		FROM (SELECT o.event_id, sum(o.seats) AS seats FROM orders o
		      JOIN outbox x ON (x.payload->>'order_id')::bigint = o.id
		      JOIN processed_jobs p ON p.job_id = coalesce(x.job_id, x.id::text)
		      GROUP BY o.event_id) s
		WHERE e.id = s.event_id`)
	require.NoError(t, err)

	cfg := b.config()
	cfg.AdminAddr = "127.0.0.1:0"
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 60*time.Second, "every job done", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE done_at IS NULL`) == 0 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	b.requireCounters(t, want)
	require.EqualValues(t, 295, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "zero lost, zero doubled")
	require.EqualValues(t, 295, hosttest.Count(t, b.pool, `SELECT count(DISTINCT job_id) FROM counter_applies`))
	require.EqualValues(t, 3, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters WHERE reason LIKE '%does not exist%'`))
	require.EqualValues(t, 295, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE verdict = 'applied'`))
	require.EqualValues(t, 5, hosttest.Count(t, b.pool, `SELECT coalesce(sum(count), 0) FROM absorbed_duplicates WHERE guard = 'job_id'`))

	m := metricsText(t, h)
	count := func(result string) (n, sum float64) {
		for name, v := range map[string]*float64{"count": &n, "sum": &sum} {
			re := regexp.MustCompile(`usher_job_batch_size_` + name + `\{result="` + result + `",role="usher_plugin_counters"\} (\S+)`)
			if mm := re.FindStringSubmatch(m); mm != nil {
				*v, _ = strconv.ParseFloat(mm[1], 64)
			}
		}
		return n, sum
	}
	committed, jobs := count("committed")
	split, splitJobs := count("split")
	require.Positive(t, committed, "no batch of two jobs or more committed:\n%s", m)
	t.Logf("%.0f batches committed, %.1f jobs each; %.0f split (%.0f jobs run again alone)", committed, jobs/committed, split, splitJobs)
	// Each committed batch's steps, timed: one of each per batch.
	totals := h.BatchPhaseTotals()
	for _, phase := range []string{"record", "invoke", "writes", "commit"} {
		re := regexp.MustCompile(`usher_job_batch_phase_seconds_count\{phase="` + phase + `",role="usher_plugin_counters"\} (\S+)`)
		mm := re.FindStringSubmatch(m)
		require.NotNil(t, mm, "no %s phase in the metrics", phase)
		require.Equal(t, mm[1], strconv.FormatFloat(committed, 'f', -1, 64), "one %s step per committed batch", phase)
		require.EqualValues(t, committed, totals[phase].Count)
		require.Positive(t, totals[phase].Seconds, phase)
	}
}

// A job that hangs inside a batch holds only itself: the batch is called
// off after StalledAfter, and its other jobs run again alone and apply
// while the hanging one is still held.
func TestHangingJobDoesNotHoldItsBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 200, 4)
	// The hundredth job arrives while other jobs wait: it runs in a batch.
	// The host reads 120 entries at once, so the jobs around it wait
	// together for their batches.
	jobID := b.armJob(t, 99, "counter.before_apply", faults.Spec{Action: "stall", Duration: "1h"})
	cfg := b.config()
	cfg.Concurrency, cfg.PluginPoolSize = 120, 8
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.StalledAfter = 500 * time.Millisecond
	cfg.JobTimeout = 5 * time.Minute // far past the wait below: only the split can free the others
	h := hosttest.Start(t, cfg)

	b.held(t, "counter.before_apply", jobID)
	hosttest.Eventually(t, 90*time.Second, "every other job applied while one hangs", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 199
	})
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, jobID), "the hanging job has not applied")
	m := metricsText(t, h)
	require.Regexp(t, `usher_job_batch_size_count\{result="split",role="usher_plugin_counters"\} [1-9]`, m, "the hanging job's batch was split")

	// Released, it applies once, and every counter is exact.
	require.NoError(t, faults.Disarm(b.faultDir, "counter.before_apply"))
	require.NoError(t, h.Stop())
	next := b.config()
	next.DisableRelay = true
	hosttest.Start(t, next)
	b.waitDrained(t, 200)
	b.requireCounters(t, want)
	require.EqualValues(t, 200, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
}

// kill -9 of the plugin (its exit in the middle of an apply) while it
// holds a batch: every job of the batch is abandoned with the crash, runs
// again alone when the plugin is back, and applies once.
func TestPluginCrashMidBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 200, 4)
	b.armJob(t, 99, "counter.before_apply", faults.Spec{Action: "crash", Once: true})
	cfg := b.config()
	// The host reads 120 entries at once, so the jobs around the crashing
	// one wait together for their batches.
	cfg.Concurrency, cfg.PluginPoolSize = 120, 8
	cfg.AdminAddr = "127.0.0.1:0"
	h := hosttest.Start(t, cfg)

	b.waitDrained(t, 200)
	b.requireCounters(t, want)
	require.EqualValues(t, 200, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "zero lost, zero doubled")
	require.EqualValues(t, 200, hosttest.Count(t, b.pool, `SELECT count(DISTINCT job_id) FROM counter_applies`))
	require.GreaterOrEqual(t, h.Plugins()[0].Restarts, 1, "the plugin crashed")
	require.Regexp(t, `usher_job_batch_size_count\{result="split",role="usher_plugin_counters"\} [1-9]`, metricsText(t, h),
		"the crash took a batch down")
}

// Two entries of one job can be waiting for a batch at once (a relay that
// published a row twice, back to back): a batch takes one entry of each
// job, and the other waits until that batch is over, then is absorbed.
// Every entry is published twice here, and the host reads them only once
// they are all on the stream, so both entries of many jobs wait together.
func TestBatchHoldsTwoEntriesOfOneJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 200, 5)
	published := map[int64]bool{}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Redis: b.rdb, Stream: b.stream, Key: hosttest.SigningKey(t, b.pool),
		BatchSize: 1, PollInterval: time.Millisecond,
		AfterPublish: func(ids []int64) error {
			if !published[ids[0]] { // one goroutine: RelayOnce below
				published[ids[0]] = true
				return errors.New("relay crashed between publish and mark")
			}
			return nil
		}})
	require.NoError(t, err)
	ctx := context.Background()
	for hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) > 0 {
		_, _ = relay.RelayOnce(ctx)
	}
	require.EqualValues(t, 400, b.rdb.XLen(ctx, b.stream).Val(), "each job's entry twice on the stream")

	cfg := b.config()
	cfg.DisableRelay = true
	hosttest.Start(t, cfg)
	b.waitDrained(t, 200)
	b.requireCounters(t, want)
	require.EqualValues(t, 200, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "one apply per order")
	require.EqualValues(t, 200, hosttest.Count(t, b.pool, `SELECT count(DISTINCT job_id) FROM counter_applies`))
	// At least the 200 second entries; on a loaded machine a slow entry
	// may also be reclaimed (the threshold is 1s here) and absorbed.
	hosttest.Eventually(t, 30*time.Second, "every second entry absorbed", func() bool {
		return hosttest.Count(t, b.pool,
			`SELECT coalesce(sum(count), 0)::bigint FROM absorbed_duplicates WHERE guard = 'job_id' AND kind = 'update_sales_counter'`) >= 200
	})
	require.EqualValues(t, 200, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "still one apply per order")
}

// Record-the-job-id jobs that enqueue from Apply, in batches: the SDK runs
// a batch's calls at once, so their Enqueue callbacks reach the host
// together, on the batch's one transaction, which the host gives them one
// at a time. Each of 200 parents writes its row and enqueues its child
// once, and each child writes its row once.
func TestBatchedEnqueues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `CREATE TABLE fanout_rows (kind text NOT NULL, n bigint NOT NULL);
		GRANT INSERT ON fanout_rows TO usher_plugin_fanout`)
	require.NoError(t, err)
	var msgs []outbox.Message
	for n := 1; n <= 200; n++ {
		msgs = append(msgs, outbox.Message{Kind: "fanout_parent", Payload: json.RawMessage(fmt.Sprintf(`{"n": %d}`, n))})
	}
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := outbox.Add(ctx, tx, msgs...)
		return err
	}))

	cfg := b.config()
	cfg.Plugins = append(cfg.Plugins, hosttest.Build(t, "./host/testdata/fanout"))
	cfg.AdminAddr = "127.0.0.1:0"
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 60*time.Second, "every parent and child applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = 'fanout_child'`) == 200 &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE done_at IS NULL`) == 0 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
	for _, kind := range []string{"parent", "child"} {
		require.EqualValues(t, 200, hosttest.Count(t, b.pool, `SELECT count(*) FROM fanout_rows WHERE kind = $1`, kind), kind)
		require.EqualValues(t, 200, hosttest.Count(t, b.pool, `SELECT count(DISTINCT n) FROM fanout_rows WHERE kind = $1`, kind), kind)
	}
	require.EqualValues(t, 200, hosttest.Count(t, b.pool, `SELECT count(DISTINCT payload->>'n') FROM outbox WHERE kind = 'fanout_child'`))
	m := metricsText(t, h)
	re := regexp.MustCompile(`usher_job_batch_size_count\{result="committed",role="usher_plugin_fanout"\} (\S+)`)
	mm := re.FindStringSubmatch(m)
	require.NotNil(t, mm, "no batch of the fanout plugin committed:\n%s", m)
	n, _ := strconv.ParseFloat(mm[1], 64)
	require.Positive(t, n, "no batch of the fanout plugin committed")
	t.Logf("%.0f batches of the fanout plugin committed", n)
}

// A job that stalls holds only itself, under a steady flow: the next batch
// overtakes its batch milliseconds after its pool's recent calls would
// have answered, and its batch is called off a tenth of a second or so
// later, not after StalledAfter (5s here), so no other job of its plugin
// waits anywhere near StalledAfter. Before, every job around it waited for
// StalledAfter. The p99 from commit to apply of the other jobs, against
// the same flow's with nothing stalled, is logged, not asserted: the
// issue's target is twice at most, and a machine shared with other tests
// moves both by more than that.
func TestStalledJobHoldsOnlyItself(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev, err := orders.CreateEvent(ctx, b.pool, "Flow", "Stagedoor Hall")
	require.NoError(t, err)
	cfg := b.config()
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.ShutdownGrace = time.Second
	cfg.StalledAfter = 5 * time.Second
	h := hosttest.Start(t, cfg)
	// flow places n orders at rate a second and returns their outbox ids'
	// range.
	const rate, n = 300, 600
	flow := func() (first, last int64) {
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		for i := range n {
			<-tick.C
			placed, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: 1}, orders.Jobs{Counter: true})
			require.NoError(t, err)
			if i == 0 {
				first = placed.OutboxIDs[0]
			}
			last = placed.OutboxIDs[0]
		}
		return first, last
	}
	// latency is the p99 and the longest from commit to apply.
	latency := func(first, last int64, except string) (p99, worst float64) {
		require.NoError(t, b.pool.QueryRow(ctx, `
			SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY s), max(s)
			FROM (SELECT extract(epoch FROM p.processed_at - o.created_at) AS s
			      FROM processed_jobs p JOIN outbox o ON o.id::text = p.job_id
			      WHERE o.id BETWEEN $1 AND $2 AND p.job_id <> $3) x`, first, last, except).Scan(&p99, &worst))
		return p99, worst
	}
	applied := func(want int64) {
		hosttest.Eventually(t, 60*time.Second, fmt.Sprintf("%d jobs applied", want), func() bool {
			return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == want
		})
	}
	flow() // warm-up: the plugin's pool and the batches' call times
	first, last := flow()
	applied(2 * n)
	clean, _ := latency(first, last, "")
	t.Logf("batches split with nothing stalled: %s", regexp.MustCompile(`usher_job_batch_size_count\{result="split",role="usher_plugin_counters"\} \d+`).FindString(metricsText(t, h)))

	stalled := strconv.FormatInt(last+n/2, 10) // the middle of the next flow
	require.NoError(t, faults.Arm(b.faultDir, "counter.before_apply", faults.Spec{Action: "stall", Duration: "1h", JobIDs: []string{stalled}}))
	first, last = flow()
	require.Equal(t, stalled, strconv.FormatInt(first+n/2-1, 10), "the stalled job's id was foreseen")
	applied(3*n - 1)
	withStall, worst := latency(first, last, stalled)
	t.Logf("p99 from commit to apply: %.1f ms with nothing stalled, %.1f ms with job %s stalled (%.2fx); longest %.1f ms",
		clean*1000, withStall*1000, stalled, withStall/clean, worst*1000)
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, stalled), "the stalled job is still held")
	t.Logf("batches split: %s", regexp.MustCompile(`usher_job_batch_size_count\{result="split",role="usher_plugin_counters"\} \d+`).FindString(metricsText(t, h)))
	require.Less(t, worst, cfg.StalledAfter.Seconds()/2, "a job waited behind the stalled one for StalledAfter")
}

// Three hosts whose batches write the same rows (2,400 counter jobs over
// 100 events, each batch a dozen of them) never deadlock: every batch
// sends its jobs' writes in the order of their first arguments, and the
// counter's write names its event first, so two batches lock the events
// they share in one order. With the queue's order (or a write naming the
// order) they deadlocked, 3 times in this test, which took 39 s instead
// of 7: each time a batch rolled back after the server's deadlock_timeout
// and its jobs ran again alone.
func TestHostsSharingRowsDoNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 2400
	want := b.placeOrders(t, n, 100)
	deadlocks := func() int64 {
		return hosttest.Count(t, b.pool, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`)
	}
	before := deadlocks()
	cfg := b.config()
	cfg.Concurrency = 64
	for range 3 {
		hosttest.Start(t, cfg)
	}
	b.waitDrained(t, n)
	b.requireCounters(t, want)
	require.EqualValues(t, n, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
	// The statistics collector reports a deadlock within a second or so.
	time.Sleep(1500 * time.Millisecond)
	require.Zero(t, deadlocks()-before, "deadlocks between the hosts' batches")
}
