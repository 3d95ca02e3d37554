package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
)

// A handler that overruns its deadline inside its transaction is cancelled,
// the transaction rolls back (the counter has not moved), and the retry
// applies the job once.
func TestDeadlineOverrunRolledBackAndRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 5, 1)
	jobID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "stall", Duration: "1h", Once: true})
	cfg := b.config()
	cfg.JobTimeout = time.Second
	cfg.RetryBackoff = 100 * time.Millisecond
	hosttest.Start(t, cfg)

	b.waitDrained(t, 5)
	b.requireCounters(t, want)
	require.EqualValues(t, 5, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
	// The host's deadline or the plugin's answer to its cancelled context
	// may come first; either way the run is retried as attempt 1.
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM scheduled_jobs WHERE job_id = $1 AND attempt = 1
		AND (reason LIKE 'timed out after 1s%' OR reason LIKE '%deadline exceeded%')`, jobID),
		"the overrun was retried as attempt 1")
	require.EqualValues(t, 0, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
}

// A handler that panics is recovered by the SDK: the job is dead-lettered
// with the panic, the plugin keeps serving the others.
func TestHandlerPanicDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 10, 2)
	jobID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "panic"})
	h := hosttest.Start(t, b.config())

	hosttest.Eventually(t, 30*time.Second, "9 applied and 1 dead letter", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 9 &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`) == 1 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	l, err := deadletter.List(context.Background(), b.pool, "update_sales_counter", 10)
	require.NoError(t, err)
	require.Len(t, l, 1)
	require.Equal(t, jobID, l[0].JobID)
	require.Contains(t, l[0].Reason, "handler for update_sales_counter panicked")
	require.Zero(t, h.Plugins()[0].Restarts, "a recovered panic does not take the plugin down")

	// Fixed, then requeued: it runs once, under its own identity.
	require.NoError(t, faults.Disarm(b.faultDir, "counter.before_apply"))
	requeue(t, b, l[0].ID, "")
	hosttest.Eventually(t, 30*time.Second, "the requeued job applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, jobID) == 1 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	b.requireCounters(t, want)
	open, err := deadletter.List(context.Background(), b.pool, "", 10)
	require.NoError(t, err)
	require.Empty(t, open, "the requeued letter is closed")
}

// Requeue all of a kind: the jobs go back through the outbox with their
// identities, so guard 4 still recognises any that had been applied.
func TestRequeueKindKeepsIdentity(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	want := b.placeOrders(t, 6, 1)
	// Three of the jobs are dead letters already; one of those had in fact
	// been applied (its identity is in processed_jobs).
	rows, err := b.pool.Query(ctx, `SELECT id::text, payload::text FROM outbox ORDER BY id LIMIT 3`)
	require.NoError(t, err)
	type job struct{ id, payload string }
	jobs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (job, error) {
		var j job
		return j, r.Scan(&j.id, &j.payload)
	})
	require.NoError(t, err)
	for i, j := range jobs {
		_, err := deadletter.Add(ctx, b.pool, deadletter.Letter{JobID: j.id, Kind: "update_sales_counter", Payload: []byte(j.payload),
			Reason: "test", LastError: "test", Attempts: 1, StreamID: fmt.Sprintf("0-%d", i+1)})
		require.NoError(t, err)
	}
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET published_at = now() WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT 3)`)
	require.NoError(t, err)
	hosttest.Start(t, b.config())
	hosttest.Eventually(t, 30*time.Second, "the 3 other jobs applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 3
	})
	requeue(t, b, 0, "update_sales_counter")
	requeue(t, b, 0, "update_sales_counter") // nothing left to requeue
	b.waitDrained(t, 6)
	b.requireCounters(t, want)
	require.EqualValues(t, 6, hosttest.Count(t, b.pool, `SELECT count(DISTINCT job_id) FROM counter_applies`))
	require.EqualValues(t, 3, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE job_id IS NOT NULL`), "requeued once, with their identities")
}

func requeue(t *testing.T, b *testBundle, id int64, kind string) {
	t.Helper()
	require.NoError(t, pgx.BeginFunc(context.Background(), b.pool, func(tx pgx.Tx) error {
		_, err := deadletter.Requeue(context.Background(), tx, id, kind)
		return err
	}))
}

// A handler's 200 KiB error is stored whole once (capped at 64 KiB, the
// cut noted) in the scheduled run and in last_error; the dead letter's
// reason and history and every log line carry it cut short.
func TestLargeErrorStoredOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := outbox.Add(ctx, tx, outbox.Message{Kind: "raw_job", Payload: json.RawMessage(`{}`)})
		return err
	}))
	logs := &syncBuffer{}
	cfg := b.config()
	cfg.Plugins = append(cfg.Plugins, hosttest.Build(t, "./host/testdata/rawplugin"))
	cfg.PluginEnv = append(cfg.PluginEnv, "RAW_MODE=bigerror")
	cfg.MaxAttempts = 2
	cfg.RetryBackoff = 10 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	hosttest.Start(t, cfg)

	hosttest.Eventually(t, 30*time.Second, "the raw job dead-lettered after 2 attempts", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters WHERE kind = 'raw_job'`) == 1
	})
	var reason, lastErr, hist, scheduled string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT reason, last_error, history::text FROM dead_letters`).Scan(&reason, &lastErr, &hist))
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT reason FROM scheduled_jobs`).Scan(&scheduled))
	for what, s := range map[string]string{"last_error": lastErr, "scheduled run's reason": scheduled} {
		require.True(t, strings.HasPrefix(s, "commit: big error: 0123"), "%s keeps the start", what)
		require.LessOrEqual(t, len(s), 64<<10+100, "%s is capped", what)
		require.Contains(t, s, "… (truncated; ", "%s notes the cut", what)
	}
	require.Contains(t, reason, "failed 2 attempts")
	require.Less(t, len(hist), 2<<10, "the history carries the error cut short")
	require.Contains(t, hist, "commit: big error: 0123")
	for _, line := range strings.Split(logs.String(), "\n") {
		require.Less(t, len(line), 4<<10, "log line cut short: %.200s", line)
	}
	require.Contains(t, logs.String(), "bytes)", "the logged error says how long it was")
}
