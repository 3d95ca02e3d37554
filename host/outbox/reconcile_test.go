package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/stream"
)

// A row whose entry a host saw lately, waiting for a host that serves its
// kind, is not republished: its entry is still in the stream. One whose
// wait was seen longer ago than StaleAfter is, like any stale row.
func TestReconcileSkipsRowsWaitingForTheirKind(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO outbox (kind, payload, published_at, kind_waited_at) VALUES
		('waiting', '{}', now() - interval '1 hour', now()),
		('waited_long_ago', '{}', now() - interval '1 hour', now() - interval '1 hour'),
		('lost', '{}', now() - interval '1 hour', NULL)`)
	require.NoError(t, err)
	rdb, key := hosttest.Redis(t)
	r, err := outbox.NewReconciler(outbox.ReconcilerConfig{Pool: pool, Redis: rdb, Streams: []string{key}, Group: "g", StaleAfter: 15 * time.Minute})
	require.NoError(t, err)
	n, err := r.Reconcile(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND kind = 'waiting'`))
}

// The reconciler's window comes from the stream: a row is republished
// once it was published Grace before every entry still on the stream
// (pending or undelivered), whatever StaleAfter says; a backlog of any
// age republishes nothing; StaleAfter republishes a row whose entry has
// been pending that long, never one whose entry is undelivered.
func TestReconcileWindowComesFromTheStream(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	rdb, key := hosttest.Redis(t)
	ctx := context.Background()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Redis: rdb, Stream: key, Key: hosttest.SigningKey(t, pool)})
	require.NoError(t, err)
	publish := func(kind string, n int) []string {
		before, err := rdb.XLen(ctx, key).Result()
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO outbox (kind, payload) SELECT $1, '{}' FROM generate_series(1, $2)`, kind, n)
		require.NoError(t, err)
		got, err := relay.RelayOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, n, got)
		msgs, err := rdb.XRange(ctx, key, "-", "+").Result()
		require.NoError(t, err)
		ids := make([]string, 0, n)
		for _, m := range msgs[before:] {
			ids = append(ids, m.ID)
		}
		return ids
	}
	reconcile := func(staleAfter time.Duration) int64 {
		r, err := outbox.NewReconciler(outbox.ReconcilerConfig{Pool: pool, Redis: rdb, Streams: []string{key}, Group: "g",
			Grace: time.Second, StaleAfter: staleAfter})
		require.NoError(t, err)
		n, err := r.Reconcile(ctx)
		require.NoError(t, err)
		return n
	}
	unpublished := func(kind string) int64 {
		return hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL AND kind = '`+kind+`'`)
	}

	lost := publish("lost", 10)
	time.Sleep(1500 * time.Millisecond)
	publish("backlog", 10)
	time.Sleep(1500 * time.Millisecond)
	require.Zero(t, reconcile(time.Second), "every entry is still undelivered, the oldest first: a backlog")

	require.NoError(t, rdb.XDel(ctx, key, lost...).Err(), "Redis lost the oldest entries")
	require.EqualValues(t, 10, reconcile(15*time.Minute), "published a grace before the oldest entry left: lost, without waiting 15 minutes")
	require.EqualValues(t, 10, unpublished("lost"))
	require.Zero(t, unpublished("backlog"))

	require.NoError(t, rdb.XGroupCreate(ctx, key, "g", "0").Err())
	_, err = rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{key, ">"}, Count: 100}).Result()
	require.NoError(t, err)
	require.Zero(t, reconcile(15*time.Minute), "the backlog's entries are pending now: still on the stream")
	require.EqualValues(t, 10, reconcile(time.Second), "pending longer than StaleAfter: the ceiling republishes them")
	require.EqualValues(t, 10, unpublished("backlog"))
}

// The window: Grace past the oldest pending entry, at most StaleAfter,
// and never short of Grace past the oldest undelivered one.
func TestReconcileWindow(t *testing.T) {
	pool, _ := hosttest.DB(t)
	rdb, key := hosttest.Redis(t)
	r, err := outbox.NewReconciler(outbox.ReconcilerConfig{Pool: pool, Redis: rdb, Streams: []string{key}, Group: "g",
		Grace: 45 * time.Second, StaleAfter: 15 * time.Minute})
	require.NoError(t, err)
	for _, tc := range []struct {
		oldest stream.Oldest
		want   time.Duration
	}{
		{stream.Oldest{}, 45 * time.Second},
		{stream.Oldest{Pending: 10 * time.Second, HasPending: true}, 55 * time.Second},
		{stream.Oldest{Pending: time.Hour, HasPending: true}, 15 * time.Minute},
		{stream.Oldest{Pending: time.Hour, HasPending: true, Undelivered: 2 * time.Hour, HasUndelivered: true}, 2*time.Hour + 45*time.Second},
		{stream.Oldest{Undelivered: 5 * time.Second, HasUndelivered: true}, 50 * time.Second},
	} {
		require.Equal(t, tc.want, r.Window(tc.oldest), "%+v", tc.oldest)
	}
}
