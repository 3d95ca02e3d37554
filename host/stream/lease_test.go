package stream_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/stream"
)

// The entries of a consumer with no lease and idle past the TTL are
// claimed by a live host's lease at once, with their delivery counted
// once; a consumer with a live lease (slow, not dead) and one without a
// lease that is still reading keep theirs. On one node and on a Redis
// Cluster (the script reads lease keys it is not given, in the stream's
// slot).
func TestLeaseClaimsOnlyDeadHosts(t *testing.T) {
	t.Parallel()
	t.Run("node", func(t *testing.T) {
		t.Parallel()
		rdb, key := hosttest.Redis(t)
		testLeaseClaimsOnlyDeadHosts(t, rdb, key)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := hosttest.StartRedisCluster(t)
		testLeaseClaimsOnlyDeadHosts(t, c.Client(), "usher:test:{"+hosttest.Suffix()+"}")
	})
}

func testLeaseClaimsOnlyDeadHosts(t *testing.T, rdb redis.UniversalClient, key string) {
	ctx := context.Background()
	const ttl = 400 * time.Millisecond
	require.NoError(t, stream.EnsureGroup(ctx, rdb, key, "g"))
	t.Cleanup(func() { _ = rdb.Del(context.Background(), key, stream.LeaseKey(key, "slow")).Err() })
	read := func(consumer string, n int) []string {
		for range n {
			require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"job_id", consumer}}).Err())
		}
		got, err := stream.ReadNew(ctx, rdb, []string{key}, "g", consumer, n)
		require.NoError(t, err)
		require.Len(t, got, n)
		ids := make([]string, n)
		for i, e := range got {
			ids[i] = e.StreamID
		}
		return ids
	}
	deadIDs := read("dead", 3)
	read("slow", 2)
	require.NoError(t, rdb.Set(ctx, stream.LeaseKey(key, "slow"), "x", time.Minute).Err())

	var took []stream.Entry
	take := func(ctx context.Context, max int, r func(ctx context.Context, n int) ([]stream.Entry, error)) (int, error) {
		got, err := r(ctx, max)
		took = append(took, got...)
		return len(got), err
	}
	l, err := stream.NewLease(stream.LeaseConfig{Redis: rdb, Streams: []string{key}, Group: "g", Consumer: "live", TTL: ttl, Take: take})
	require.NoError(t, err)
	require.NoError(t, l.Renew(ctx))

	// Not idle long enough yet: nothing is taken.
	n, err := l.ClaimDead(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "consumers idle under the TTL keep their entries")

	hosttest.Eventually(t, 10*time.Second, "the dead consumer idle past the TTL, as Redis measures it", func() bool {
		cs, err := rdb.XInfoConsumers(ctx, key, "g").Result()
		require.NoError(t, err)
		for _, c := range cs {
			if c.Name == "dead" {
				return c.Idle > ttl
			}
		}
		return false
	})
	read("reading", 1) // no lease, but it reads: alive
	n, err = l.ClaimDead(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	got := make([]string, len(took))
	for i, e := range took {
		got[i] = e.StreamID
		require.EqualValues(t, 2, e.Deliveries, "one delivery counted for the claim")
		require.Equal(t, "dead", e.JobID)
	}
	sort.Strings(got)
	sort.Strings(deadIDs)
	require.Equal(t, deadIDs, got)

	pending := map[string]int64{}
	cs, err := rdb.XInfoConsumers(ctx, key, "g").Result()
	require.NoError(t, err)
	for _, c := range cs {
		pending[c.Name] = c.Pending
	}
	require.Equal(t, map[string]int64{"dead": 0, "slow": 2, "reading": 1, "live": 3}, pending)

	// A second scan finds nothing more.
	n, err = l.ClaimDead(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}
