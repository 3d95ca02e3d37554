package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
)

// BenchmarkRelayBatch measures the relay's hot path: committed outbox rows
// taken FOR UPDATE SKIP LOCKED, signed, XADDed in one pipeline and marked,
// in batches of the default size. ns/op is per row.
func BenchmarkRelayBatch(b *testing.B) {
	pool, _ := hosttest.DB(b)
	rdb, stream := hosttest.Redis(b)
	ctx := context.Background()
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Redis: rdb, Stream: stream, Key: hosttest.SigningKey(b, pool),
		PollInterval: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO outbox (kind, payload)
		SELECT 'update_sales_counter', jsonb_build_object('order_id', n) FROM generate_series(1, $1::int) n`, b.N); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for published := 0; published < b.N; {
		n, err := r.RelayOnce(ctx)
		if err != nil {
			b.Fatal(err)
		}
		published += n
	}
}
