package host_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
)

// A ReconcileAfter shorter than one redelivery can take (10s against
// ReclaimIdle 60s + ReclaimInterval 15s + JobTimeout 30s) is warned at
// start with the reason and the floor; the default 15 minutes is not.
func TestShortReconcileAfterWarned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		after time.Duration
		warn  bool
	}{{10 * time.Second, true}, {0, false}, {105 * time.Second, false}} {
		var logs syncBuffer
		cfg := b.config()
		cfg.ReclaimIdle, cfg.ReconcileAfter = time.Minute, tc.after
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		require.Equal(t, 105*time.Second, cfg.ReconcileFloor())
		h, err := host.New(context.Background(), cfg)
		require.NoError(t, err, "warned, not refused")
		h.Close()
		const want = "dangerous setting: ReconcileAfter (--reconcile-after) 10s is shorter than a redelivery can take, " +
			"1m45s = ReclaimIdle 1m0s + ReclaimInterval 15s + JobTimeout 30s"
		if tc.warn {
			require.Contains(t, logs.String(), want)
			require.Contains(t, logs.String(), "raise it to at least 1m45s")
		} else {
			require.NotContains(t, logs.String(), "dangerous setting", "ReconcileAfter %s", tc.after)
		}
	}
}
