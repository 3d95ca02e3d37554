package host_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
)

// A retention window shorter than what redeliveries can reach is refused
// at startup, with the bound and the settings it comes from.
func TestRetentionBelowTheBoundIsRefusedAtStart(t *testing.T) {
	t.Parallel()
	cfg := host.Config{DatabaseURL: "postgres://nowhere.invalid/x", RedisURL: "redis://nowhere.invalid:6379", ProcessedJobsRetention: 30 * time.Minute}
	require.Equal(t, 36*time.Minute+55*time.Second, cfg.RetentionBound(), "the defaults' bound")
	_, err := host.New(context.Background(), cfg)
	require.ErrorContains(t, err, "host: ProcessedJobsRetention 30m0s is shorter than the redelivery bound 36m55s = MaxDeliveries 10 × (ReclaimIdle 1m0s")

	cfg = host.Config{DatabaseURL: "postgres://nowhere.invalid/x", RedisURL: "redis://nowhere.invalid:6379",
		ReclaimIdle: 10 * time.Second, MaxDeliveries: 3, OutboxRetention: 10 * time.Minute}
	_, err = host.New(context.Background(), cfg)
	require.ErrorContains(t, err, "OutboxRetention 10m0s is shorter than the redelivery bound")
}

// A running host trims the stream behind its acks (while another group
// lags, only as far as that group has read), removes a gone consumer, and
// deletes job ids and outbox rows only past their retention.
func TestHostKeepsStorageBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, "audit", "0").Err())
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, "usher", "0").Err())
	require.NoError(t, b.rdb.XGroupCreateConsumer(ctx, b.stream, "usher", "gone-host").Err())
	want := b.placeOrders(t, 40, 2)

	cfg := b.config()
	cfg.ReclaimIdle, cfg.JobTimeout, cfg.MaxDeliveries, cfg.MaxAttempts = time.Second, time.Second, 2, 1
	cfg.ReconcileAfter, cfg.ReconcileInterval = time.Second, time.Second
	cfg.StreamTrimInterval, cfg.CleanupInterval, cfg.ConsumerIdleRemove = 50*time.Millisecond, 100*time.Millisecond, 500*time.Millisecond
	cfg.ProcessedJobsRetention, cfg.OutboxRetention = time.Minute, time.Minute
	require.Less(t, cfg.RetentionBound(), time.Minute)
	cfg.Consumer = "storage-test-host"
	cfg.AdminAddr = "127.0.0.1:0"
	h := hosttest.Start(t, cfg)
	b.waitDrained(t, 40)
	b.requireCounters(t, want)

	hosttest.Eventually(t, 10*time.Second, "the gone consumer removed", func() bool {
		cs, err := b.rdb.XInfoConsumers(ctx, b.stream, "usher").Result()
		require.NoError(t, err)
		for _, c := range cs {
			if c.Name == "gone-host" {
				return false
			}
		}
		return len(cs) == 1 && cs[0].Name == cfg.Consumer
	})
	require.EqualValues(t, 40, b.rdb.XLen(ctx, b.stream).Val(), "audit has read nothing: every entry is kept")
	ids, err := b.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "audit", Consumer: "a", Streams: []string{b.stream, ">"}, Count: 25, Block: -1}).Result()
	require.NoError(t, err)
	for _, m := range ids[0].Messages {
		require.NoError(t, b.rdb.XAck(ctx, b.stream, "audit", m.ID).Err())
	}
	hosttest.Eventually(t, 10*time.Second, "the stream trimmed to what audit has not read", func() bool {
		return b.rdb.XLen(ctx, b.stream).Val() == 15
	})

	// Every job is younger than its window (and the margin): age half of
	// them past both.
	_, err = b.pool.Exec(ctx, `
		WITH old AS (SELECT id FROM outbox ORDER BY id LIMIT 20),
		     o AS (UPDATE outbox SET done_at = done_at - interval '1 hour', published_at = published_at - interval '1 hour'
		           WHERE id IN (SELECT id FROM old))
		UPDATE processed_jobs SET processed_at = processed_at - interval '1 hour' WHERE job_id IN (SELECT id::text FROM old)`)
	require.NoError(t, err)
	hosttest.Eventually(t, 10*time.Second, "the aged rows deleted", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`) == 20 &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox`) == 20
	})
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs p JOIN outbox o ON o.id::text = p.job_id WHERE o.done_at < now() - interval '30 minutes'`))
	b.requireCounters(t, want)

	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	// A trim pass counts its deletions once it is over: the rows can be
	// gone a moment before their count is.
	counted := []string{"usher_stream_entries_trimmed_total 25", `usher_retention_rows_deleted_total{table="processed_jobs"} 20`,
		`usher_retention_rows_deleted_total{table="outbox"} 20`, "usher_consumers_removed_total 1"}
	var metrics string
	hosttest.Eventually(t, 10*time.Second, "the deletions counted", func() bool {
		var code int
		code, _, metrics = adminCall{method: "GET", path: "/metrics", token: h.AdminToken}.do(t, h.AdminAddr())
		require.Equal(t, http.StatusOK, code)
		for _, m := range counted {
			if !strings.Contains(metrics, m) {
				return false
			}
		}
		return true
	})
	for _, m := range counted {
		require.Contains(t, metrics, m)
	}
}
