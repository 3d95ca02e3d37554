package host_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/ops"
	"github.com/usherhq/usher/host/pause"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/internal/contract"
)

// pendingOnShards is the group's pending entries over the first n shards
// of base (-1 when a shard has no group yet).
func pendingOnShards(t *testing.T, rdb redis.UniversalClient, base string, n int) int64 {
	t.Helper()
	var total int64
	for _, key := range stream.ShardKeys(base, n) {
		p := hosttest.Pending(t, rdb, key, "usher")
		if p < 0 {
			return -1
		}
		total += p
	}
	return total
}

// added is how many entries were ever added to each of the first n shards
// of base (XINFO STREAM's entries-added: trimming does not lower it).
func added(t *testing.T, rdb redis.UniversalClient, base string, n int) []int64 {
	t.Helper()
	out := make([]int64, n)
	for i, key := range stream.ShardKeys(base, n) {
		info, err := rdb.XInfoStream(context.Background(), key).Result()
		if err == nil {
			out[i] = info.EntriesAdded
		}
	}
	return out
}

// Two hosts on a stream of six shards: the relays spread the jobs over
// every shard, both hosts read every shard, and each order is applied
// once.
func TestShardedHostsApplyEachJobOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const shards, n = 6, 1200
	cfg := b.config()
	cfg.StreamShards = shards
	hosttest.Start(t, cfg)
	hosttest.Start(t, cfg)
	want := b.placeOrders(t, n, 5)
	hosttest.Eventually(t, 60*time.Second, fmt.Sprintf("%d jobs recorded and nothing pending on any shard", n), func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`) == n &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0 &&
			pendingOnShards(t, b.rdb, b.stream, shards) == 0
	})
	b.requireCounters(t, want)
	require.EqualValues(t, n, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
	per := added(t, b.rdb, b.stream, shards)
	t.Logf("entries added per shard: %v", per)
	var sum int64
	for i, a := range per {
		require.Greater(t, a, int64(n/shards/2), "shard %d holds its share of the jobs", i)
		sum += a
	}
	require.GreaterOrEqual(t, sum, int64(n))
	in, err := ops.Inspect(context.Background(), b.pool, b.rdb, b.stream, "usher", time.Now())
	require.NoError(t, err)
	require.Len(t, in.Shards, shards, "inspect shows every shard")
	require.Zero(t, in.Pending)
}

// Lowering --stream-shards strands nothing: a host on six shards relays
// jobs of a paused kind (read and parked, pending under it on every
// shard) and stops; a host started with one shard still reads the six
// (the most any host used, recorded in stream_shards), takes the stopped
// host's entries once its lease is gone, and applies every job once when
// the kind is resumed; the jobs placed after it are published to shard 0
// alone.
func TestLoweringShardsStrandsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, _, err := pause.Pause(ctx, b.pool, counterKind, "test", "hold the jobs on six shards")
	require.NoError(t, err)
	six := b.config()
	six.StreamShards, six.PausePollInterval = 6, 100*time.Millisecond
	six.HostLeaseTTL = time.Second
	a := hosttest.Start(t, six)
	first := b.placeOrders(t, 300, 3)
	hosttest.Eventually(t, 30*time.Second, "the paused jobs relayed over the six shards and pending there", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0 &&
			pendingOnShards(t, b.rdb, b.stream, 6) >= 300
	})
	before := added(t, b.rdb, b.stream, 6)
	for i, n := range before {
		require.Positive(t, n, "shard %d got jobs", i)
	}
	require.NoError(t, a.Stop())
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`), "nothing ran while paused")

	one := b.config()
	one.StreamShards, one.PausePollInterval = 1, 100*time.Millisecond
	one.HostLeaseTTL = time.Second
	hosttest.Start(t, one)
	_, err = pause.Resume(ctx, b.pool, counterKind, "test")
	require.NoError(t, err)
	second := b.placeOrders(t, 100, 3)
	hosttest.Eventually(t, 60*time.Second, "all 400 jobs recorded and nothing pending on any of the six shards", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`) == 400 &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0 &&
			pendingOnShards(t, b.rdb, b.stream, 6) == 0
	})
	b.requireCounters(t, merge(first, second))
	require.EqualValues(t, 400, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
	after := added(t, b.rdb, b.stream, 6)
	require.GreaterOrEqual(t, after[0]-before[0], int64(100), "the new jobs went to shard 0")
	for i := 1; i < 6; i++ {
		require.Equal(t, before[i], after[i], "nothing new was published to shard %d", i)
	}
	n, err := ops.Shards(ctx, b.pool, b.stream)
	require.NoError(t, err)
	require.Equal(t, 6, n, "the most shards any host used is kept")
}

// merge adds each event's expected seats of b to a.
func merge(a, b map[int64]int64) map[int64]int64 {
	out := map[int64]int64{}
	for ev, n := range a {
		out[ev] += n
	}
	for ev, n := range b {
		out[ev] += n
	}
	return out
}

// A shard count out of range is refused before anything is dialled.
func TestStreamShardsOutOfRangeRefused(t *testing.T) {
	t.Parallel()
	for _, n := range []int{-1, stream.MaxShards + 1} {
		_, err := host.New(context.Background(), host.Config{DatabaseURL: "postgres://nowhere/db", RedisURL: "redis://nowhere:1", StreamShards: n})
		require.ErrorContains(t, err, fmt.Sprintf("StreamShards %d: must be between 1 and %d", n, stream.MaxShards))
	}
}

// The plugin contract's own variables are the host's to set: a PluginEnv
// naming one (--plugin-env) is refused before anything is dialled, where
// a plugin told it is only asked its manifest would run no job.
func TestPluginEnvRefusesTheContractsVariables(t *testing.T) {
	t.Parallel()
	for _, name := range []string{contract.ManifestOnlyEnv, contract.ParentPIDEnv} {
		_, err := host.New(context.Background(), host.Config{DatabaseURL: "postgres://nowhere/db", RedisURL: "redis://nowhere:1",
			PluginEnv: []string{"MAILPROVIDER_URL=http://x", name + "=1"}})
		require.ErrorContains(t, err, "PluginEnv "+name+": the host sets it itself")
	}
}
