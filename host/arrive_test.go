package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/internal/entry"
)

// An entry the host dead-letters arrives (stream.Entry.Arrived) before its
// dead letter is written, not when its Dispatch returns: a batch about to
// start waits for the entries on their way to it, of every kind, and must
// not wait through another entry's dead letter.
func TestEntryArrivesBeforeItsDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.MaxDeliveries = 3
	r := hosttest.Start(t, cfg)
	ctx := context.Background()
	key := hosttest.SigningKey(t, b.pool)
	hosttest.Eventually(t, 30*time.Second, "the counters plugin to serve", func() bool {
		for _, p := range r.Host.Plugins() {
			if p.Healthy {
				return true
			}
		}
		return false
	})

	signed := func(id string, deliveries int64) stream.Entry {
		f := entry.Fields{JobID: id, OutboxID: "0", Kind: "update_sales_counter", Payload: `{"order_id":1}`, Attempt: "0"}
		return stream.Entry{StreamID: "1-" + id, JobID: id, Kind: f.Kind, Payload: []byte(f.Payload), Deliveries: deliveries,
			Signed: f, Sig: f.Sign(key)}
	}
	forged := signed("forged", 1)
	forged.Sig = ""
	for _, c := range []struct {
		name string
		e    stream.Entry
	}{
		{"forged", forged},
		{"delivered too often", signed("too-often", 4)},
	} {
		before := hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`)
		arrivals, atArrival := 0, int64(-1)
		c.e.Arrived = func() {
			arrivals++
			atArrival = hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`)
		}
		require.True(t, r.Host.DispatchForTest(ctx, c.e), "%s: the dead letter is committed, the entry may be acked", c.name)
		require.Equal(t, 1, arrivals, "%s: Arrived calls", c.name)
		require.Equal(t, before, atArrival, "%s: arrived only after its dead letter was written", c.name)
		require.Equal(t, before+1, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`), c.name)
	}
}
