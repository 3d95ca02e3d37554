package host_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
)

// A burst of 200 entries of 900 KiB each, every one a real job: the bytes
// the host holds for entries (reserved before each read, held until each is
// finished) never exceed its budget, though 16 such jobs could run at once,
// and every job is applied once.
func TestEntryBytesBounded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.placeOrders(t, 200, 4)
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, "usher", "0").Err())
	rows, err := b.pool.Query(ctx, `SELECT o.id, o.payload->>'order_id' FROM outbox o ORDER BY o.id`)
	require.NoError(t, err)
	type job struct{ id, order string }
	var jobs []job
	for rows.Next() {
		var j job
		var id int64
		require.NoError(t, rows.Scan(&id, &j.order))
		j.id = strconv.FormatInt(id, 10)
		jobs = append(jobs, j)
	}
	require.NoError(t, rows.Err())
	require.Len(t, jobs, 200)
	pad := strings.Repeat("p", 900<<10)
	key := hosttest.SigningKey(t, b.pool)
	pipe := b.rdb.Pipeline()
	for _, j := range jobs {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: hosttest.Signed(key, "job_id", j.id, "kind", "update_sales_counter",
			"payload", fmt.Sprintf(`{"order_id":%s,"pad":%q}`, j.order, pad))})
	}
	_, err = pipe.Exec(ctx)
	require.NoError(t, err)

	const budget = 4 << 20
	cfg := b.config()
	cfg.DisableRelay = true // the entries above are the jobs
	cfg.Concurrency = 16
	cfg.MaxEntryBytesHeld = budget
	h := hosttest.Start(t, cfg)

	hosttest.Eventually(t, 90*time.Second, "200 jobs applied and nothing pending", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 200 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	require.EqualValues(t, 200, hosttest.Count(t, b.pool, `SELECT count(DISTINCT job_id) FROM counter_applies`))
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
	held, peak := h.EntryBytes()
	require.LessOrEqual(t, peak, int64(budget), "bytes held stayed within the budget")
	require.GreaterOrEqual(t, peak, int64(2*900<<10), "the budget was used, not merely idle")
	hosttest.Eventually(t, 10*time.Second, "every byte given back", func() bool {
		held, _ = h.EntryBytes()
		return held == 0
	})
}
