package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/usherhq/usher/host/hosttest"
)

// BenchmarkCountersEndToEnd measures jobs per second through a real host:
// b.N update_sales_counter jobs committed to the outbox, then relayed,
// consumed, run through guard 4 in the counters plugin process, committed
// and acked. Run with -benchtime Nx.
func BenchmarkCountersEndToEnd(b *testing.B) {
	pool, url := hosttest.DB(b)
	rdb, stream := hosttest.Redis(b)
	ctx := context.Background()
	var ev int64
	if err := pool.QueryRow(ctx, `INSERT INTO events (name) VALUES ('bench') RETURNING id`).Scan(&ev); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		WITH o AS (INSERT INTO orders (public_id, event_id, buyer, email, seats)
		           SELECT 'B-' || n, $1, 'b', 'b@example.com', 1 FROM generate_series(1, $2::int) n RETURNING id)
		INSERT INTO outbox (kind, payload) SELECT 'update_sales_counter', jsonb_build_object('order_id', id) FROM o`, ev, b.N); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	h := hosttest.Start(b, hostConfig(url, rdb, stream, hosttest.Build(b, "./plugins/counters")))
	hosttest.Eventually(b, 10*time.Minute, "every job applied", func() bool {
		return hosttest.Count(b, pool, `SELECT count(*) FROM processed_jobs`) == int64(b.N)
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
	_ = h.Stop()
}
