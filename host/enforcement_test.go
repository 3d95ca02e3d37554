package host_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
)

// A plugin that skips the SDK and talks to the host's callback service
// directly meets the same rules: each misbehaviour is refused with a clear
// reason, the job is dead-lettered, and the other plugin's jobs flow.
func TestHostEnforcesCapabilities(t *testing.T) {
	t.Parallel()
	cases := []struct {
		mode, reason string
	}{
		{"check-write", "read-only transaction"},
		{"exec-first", "a plain write in the commit phase needs a conditional write that won first"},
		{"enqueue-first", "follow-on jobs can only be enqueued after a conditional write won"},
		{"no-write-if", "made no conditional write"},
		{"stale-handle", "its phase has ended"},
		{"garbage", "plugin answered garbage: 0 results for 1 calls"},
		{"badoutcome", "plugin answered garbage"},
		{"panic", "times (max 2) without finishing"}, // 3 or more: reclaims race the restarts
		{"hang", "timed out after 1s"},
	}
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			raw := hosttest.Build(t, "./host/testdata/rawplugin")
			want := b.placeOrders(t, 10, 2)
			ctx := context.Background()
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				_, err := outbox.Add(ctx, tx, outbox.Message{Kind: "raw_job", Payload: json.RawMessage(`{}`)})
				return err
			}))
			cfg := b.config()
			cfg.Plugins = append(cfg.Plugins, raw)
			cfg.PluginEnv = append(cfg.PluginEnv, "RAW_MODE="+tc.mode)
			cfg.JobTimeout = time.Second
			cfg.MaxDeliveries = 2
			cfg.MaxAttempts = 1
			cfg.ReclaimIdle = 300 * time.Millisecond
			hosttest.Start(t, cfg)

			hosttest.Eventually(t, 30*time.Second, "the raw job dead-lettered and the orders counted", func() bool {
				return hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters WHERE kind = 'raw_job'`) == 1 &&
					hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 10
			})
			var reason string
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT reason || ' ' || last_error FROM dead_letters WHERE kind = 'raw_job'`).Scan(&reason))
			require.Contains(t, reason, tc.reason)
			b.requireCounters(t, want) // the check-write and exec-first writes never landed
		})
	}
}

// A plugin that declares a kind without a guard is refused at load, with a
// message naming the kind; so is one that prints to stdout before its
// handshake. Neither stops the host: it starts without them.
func TestPluginRefusedAtLoad(t *testing.T) {
	t.Parallel()
	for mode, msg := range map[string]string{
		"noguard": `declares kind "raw_job" without a guard`,
		"stdout":  "stdout",
	} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			cfg := b.config()
			cfg.Plugins = []string{hosttest.Build(t, "./host/testdata/rawplugin")}
			cfg.PluginEnv = []string{"RAW_MODE=" + mode}
			cfg.Logger = hosttest.Logger(t, 100)
			h, err := host.New(context.Background(), cfg)
			require.NoError(t, err)
			defer h.Close()
			require.Empty(t, h.Plugins())
			refusals := h.Refusals()
			require.Len(t, refusals, 1)
			require.Contains(t, refusals[0].Error, msg)
		})
	}
}
