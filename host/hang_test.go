package host_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
)

// A plugin process that stops answering (alive, but every call runs out of
// time) is killed after three timeouts in a row and restarted, instead of
// taking every job routed to it to its deadline.
func TestWedgedPluginIsRestarted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		for range 3 {
			if _, err := outbox.Add(ctx, tx, outbox.Message{Kind: "raw_job", Payload: json.RawMessage(`{}`)}); err != nil {
				return err
			}
		}
		return nil
	}))
	cfg := b.config()
	cfg.Plugins = append(cfg.Plugins, hosttest.Build(t, "./host/testdata/rawplugin"))
	cfg.PluginEnv = append(cfg.PluginEnv, "RAW_MODE=hang")
	cfg.JobTimeout = 300 * time.Millisecond
	cfg.RetryBackoff = 50 * time.Millisecond
	cfg.MaxAttempts = 20
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 30*time.Second, "the wedged plugin killed and restarted", func() bool {
		for _, p := range h.Plugins() {
			if p.Name == "raw" && p.Restarts >= 1 {
				return true
			}
		}
		return false
	})
}
