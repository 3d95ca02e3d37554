package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The request_id and trace committed with an order reach the plugin's log
// lines, in the host's structured log, with the job's identity; the trace
// continues the order's trace id.
func TestPluginLogsCarryRequestAndTrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev, err := orders.CreateEvent(ctx, b.pool, "Hania Rani", "Hall")
	require.NoError(t, err)
	placed, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "B", Email: "b@example.com", Seats: 2}, orders.Jobs{Counter: true})
	require.NoError(t, err)
	var trace string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT trace FROM outbox`).Scan(&trace))
	traceID := strings.Split(trace, "-")[1]

	var logs syncBuffer
	cfg := b.config()
	cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	hosttest.Start(t, cfg)
	b.waitDrained(t, 1)
	var line map[string]any
	hosttest.Eventually(t, 10*time.Second, "the plugin's log line", func() bool {
		for _, l := range strings.Split(logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "seats counted" {
				line = rec
				return true
			}
		}
		return false
	})
	require.Equal(t, "plugin", line["source"])
	require.Equal(t, placed.RequestID, line["request_id"])
	require.Equal(t, strconv.FormatInt(placed.OutboxIDs[0], 10), line["job_id"])
	require.Contains(t, line["trace"], "00-"+traceID+"-", "the plugin logs under the order's trace id")
	// A number the plugin logged arrives as a number, not as its text.
	require.Equal(t, float64(placed.ID), line["order_id"])
	require.Equal(t, "1.0.0", line["plugin_version"])
}
