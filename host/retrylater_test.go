package host_test

import (
	"context"
	"encoding/json"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
)

// A plugin that asks to run later for ever, with a delay of 0, a negative
// one or MaxInt64 milliseconds (which overflowed to "in -1ms"), gets a
// delay within [MinRetryLater, MaxRetryLater], and every such retry counts
// towards MaxAttempts: the job ends as a max_attempts dead letter that
// says so, with one scheduled run and one history record per attempt, and
// the other plugin's jobs go on (issue 26, item 4).
func TestRetryLaterIsBounded(t *testing.T) {
	t.Parallel()
	for _, ms := range []int64{0, -5, math.MaxInt64} {
		t.Run(strconv.FormatInt(ms, 10), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			want := b.placeOrders(t, 10, 2)
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				_, err := outbox.Add(ctx, tx, outbox.Message{Kind: "raw_job", Payload: json.RawMessage(`{}`)})
				return err
			}))
			cfg := b.config()
			cfg.Plugins = append(cfg.Plugins, hosttest.Build(t, "./host/testdata/rawplugin"))
			cfg.PluginEnv = append(cfg.PluginEnv, "RAW_MODE=retry-later", "RAW_RETRY_MS="+strconv.FormatInt(ms, 10))
			cfg.MaxAttempts = 3
			start := time.Now()
			hosttest.Start(t, cfg)
			if ms == math.MaxInt64 {
				// Its first retry is due in MaxRetryLater, not in the past.
				hosttest.Eventually(t, 30*time.Second, "the raw job's retry scheduled", func() bool {
					return hosttest.Count(t, b.pool, `SELECT count(*) FROM scheduled_jobs WHERE kind = 'raw_job'`) == 1
				})
				var runAt time.Time
				require.NoError(t, b.pool.QueryRow(ctx, `SELECT run_at FROM scheduled_jobs WHERE kind = 'raw_job'`).Scan(&runAt))
				require.WithinDuration(t, start.Add(guard.MaxRetryLater), runAt, time.Minute)
				hosttest.Eventually(t, 30*time.Second, "the orders counted", func() bool {
					return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 10
				})
				b.requireCounters(t, want)
				return
			}
			hosttest.Eventually(t, 30*time.Second, "the raw job dead-lettered and the orders counted", func() bool {
				return hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters WHERE kind = 'raw_job'`) == 1 &&
					hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 10
			})
			var reason string
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT reason FROM dead_letters WHERE kind = 'raw_job'`).Scan(&reason))
			require.Contains(t, reason, "ran without finishing (the last asked to run later) 3 attempts (max 3)")
			require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE kind = 'raw_job' AND verdict = 'retry_scheduled'`))
			require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE kind = 'raw_job' AND verdict = 'dead_letter'
				AND reason LIKE 'max_attempts: %'`))
			// Each retry waited at least MinRetryLater.
			require.GreaterOrEqual(t, time.Since(start), 2*guard.MinRetryLater)
			b.requireCounters(t, want)
		})
	}
}
