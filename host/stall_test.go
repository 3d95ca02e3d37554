package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
)

// A plugin whose jobs hang does not hold the host's slots: with 4 or 40
// of its jobs hung in Postgres (16 slots), another plugin's jobs still go
// through the relay, run and are applied, while the hung ones are still
// asleep. The hung plugin's further entries wait parked (not
// dead-lettered, not lost) until its stalled jobs end.
func TestStalledPluginSlowsOnlyItself(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		stalled, batchMax int
	}{{4, 1}, {40, 1}, {40, 32}} {
		stalled := tc.stalled
		name := fmt.Sprintf("%d stalled", stalled)
		if tc.batchMax > 1 {
			name += " in batches"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := hostileSetup(t)
			ctx := context.Background()
			msgs := make([]outbox.Message, stalled)
			for i := range msgs {
				msgs[i] = outbox.Message{Kind: "hostile_apply", Payload: json.RawMessage(`{"case": "stall"}`)}
			}
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				_, err := outbox.Add(ctx, tx, msgs...)
				return err
			}))
			cfg := b.config()
			cfg.Plugins = append(cfg.Plugins, b.bin)
			cfg.Concurrency = 16
			cfg.StalledAfter = 300 * time.Millisecond
			// Longer than the test: the stalled jobs stay asleep.
			cfg.JobTimeout = 2 * time.Minute
			cfg.StatementTimeout = 2 * time.Minute
			cfg.ShutdownGrace = time.Second
			// One job per transaction: each stalled job sleeps on a
			// connection of its own, which the test counts. In
			// batches, the jobs of a batch share one connection, and
			// a batch that stalls lets the next one start.
			cfg.BatchMax = tc.batchMax
			// A connection for each job in flight, to count them by
			// (the default pool, 4, would hold the rest waiting for
			// one).
			cfg.PluginPoolSize = cfg.Concurrency
			admin, err := pgxpool.New(ctx, hosttest.AdminURL(t, b.dbURL))
			require.NoError(t, err)
			defer admin.Close()
			asleep := func() int64 {
				return hosttest.Count(t, admin, `SELECT count(*) FROM pg_stat_activity
					WHERE usename = 'usher_plugin_hostile' AND wait_event = 'PgSleep' AND datname = current_database()`)
			}
			h := hosttest.Start(t, cfg)
			// The first burst takes every slot; stalled, they give
			// their slots back, and the plugin gets no more.
			want := min(int64(stalled), int64(cfg.Concurrency))
			if tc.batchMax > 1 {
				hosttest.Eventually(t, 30*time.Second, "the hostile jobs asleep", func() bool { return asleep() >= 1 })
				want = asleep()
			} else {
				hosttest.Eventually(t, 30*time.Second, "the hostile jobs asleep", func() bool { return asleep() == want })
			}

			placed := b.placeOrders(t, 200, 5)
			hosttest.Eventually(t, 60*time.Second, "the counters applied while the hostile plugin hangs", func() bool {
				return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 200
			})
			b.requireCounters(t, placed)
			if tc.batchMax > 1 {
				// More batches may have started and stalled since.
				require.GreaterOrEqual(t, asleep(), want, "the hung jobs are still asleep: the counters did not wait for them")
			} else {
				require.Equal(t, want, asleep(), "the hung jobs are still asleep: the counters did not wait for them")
			}
			// Nothing of the hung plugin was dead-lettered or lost: its
			// other entries wait, pending, for a slot of their own.
			require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
			require.EqualValues(t, stalled, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = 'hostile_apply' AND done_at IS NULL`))
			start := time.Now()
			require.NoError(t, h.Stop())
			require.Less(t, time.Since(start), 20*time.Second, "shutdown waited for the hung jobs")
		})
	}
}
