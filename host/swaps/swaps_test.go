package swaps_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/swaps"
)

// Rows come back newest first, the last n per plugin, for the plugins
// asked (every plugin when none); a long reason is cut; Trim deletes what
// is older than its time and nothing else.
func TestRecordLastTrim(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	for i := range 4 {
		require.NoError(t, swaps.Record(ctx, pool, swaps.Swap{Host: "host-a", Plugin: "counters", Action: swaps.Swapped,
			From: fmt.Sprintf("1.%d.0", i), To: fmt.Sprintf("1.%d.0", i+1), Cause: swaps.CauseReload}))
	}
	require.NoError(t, swaps.Record(ctx, pool, swaps.Swap{Host: "host-b", Plugin: "tickets", Action: swaps.Refused,
		From: "1.0.0", To: "2.0.0", Cause: swaps.CauseDirChange, Reason: strings.Repeat("x", 5000)}))
	// The first two rows a day old.
	_, err := pool.Exec(ctx, `UPDATE plugin_swaps SET at = at - interval '1 day' WHERE id <= 2`)
	require.NoError(t, err)

	last, err := swaps.Last(ctx, pool, []string{"counters"}, 3)
	require.NoError(t, err)
	require.Len(t, last, 1)
	var tos []string
	for _, s := range last["counters"] {
		tos = append(tos, s.To)
	}
	require.Equal(t, []string{"1.4.0", "1.3.0", "1.2.0"}, tos, "newest first, three of them")

	all, err := swaps.Last(ctx, pool, nil, 10)
	require.NoError(t, err)
	require.Len(t, all["counters"], 4)
	require.Len(t, all["tickets"], 1)
	require.Equal(t, "host-b", all["tickets"][0].Host)
	require.Less(t, len(all["tickets"][0].Reason), 1100, "a long reason is cut")

	n, err := swaps.Trim(ctx, pool, time.Now().Add(-time.Hour))
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	all, err = swaps.Last(ctx, pool, nil, 10)
	require.NoError(t, err)
	require.Len(t, all["counters"], 2)
}
