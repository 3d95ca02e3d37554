package stream_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/stream"
)

func TestShardKeys(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"usher:{jobs}", "usher:{jobs-1}", "usher:{jobs-2}"}, stream.ShardKeys("usher:{jobs}", 3))
	require.Equal(t, []string{"jobs", "jobs-1"}, stream.ShardKeys("jobs", 2), "a key without a hash tag")
	require.Equal(t, "a:{x-7}:b", stream.ShardKey("a:{x}:b", 7))
	require.Equal(t, "a:{}-2", stream.ShardKey("a:{}", 2), "an empty tag is no tag")
	require.Equal(t, 0, stream.ShardOf("anything", 1))
	seen := map[int]int{}
	for i := range 6000 {
		s := stream.ShardOf(fmt.Sprint(i), 6)
		require.True(t, s >= 0 && s < 6)
		seen[s]++
	}
	for s := range 6 {
		require.InDelta(t, 1000, seen[s], 150, "shard %d of 6 gets about a sixth of 6,000 jobs: %v", s, seen)
	}
}

// A consumer of three shards reads and acks each shard's entries on their
// own key, even where two shards hold the same entry id (ids are per
// stream): every entry runs once, and every shard's pending list empties.
func TestConsumerReadsEveryShard(t *testing.T) {
	t.Parallel()
	rdb, base := hosttest.Redis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	shards := stream.ShardKeys(base, 3)
	for s, key := range shards {
		for i := 1; i <= 20; i++ {
			// The same ids on every shard.
			require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, ID: fmt.Sprintf("%d-1", i),
				Values: []any{"job_id", fmt.Sprintf("%d/%d", s, i), "kind", "k"}}).Err())
		}
	}
	var mu sync.Mutex
	ran := map[string]int{}
	c, err := stream.NewConsumer(stream.ConsumerConfig{
		Redis: rdb, Streams: shards, Group: "g", Name: "c1", Concurrency: 4, IdlePoll: 20 * time.Millisecond,
		Dispatch: func(ctx context.Context, e stream.Entry) bool {
			mu.Lock()
			defer mu.Unlock()
			ran[e.Stream+" "+e.JobID]++
			return true
		},
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	hosttest.Eventually(t, 10*time.Second, "60 entries run and acked", func() bool {
		mu.Lock()
		n := len(ran)
		mu.Unlock()
		var pending int64
		for _, key := range shards {
			pending += hosttest.Pending(t, rdb, key, "g")
		}
		return n == 60 && pending == 0
	})
	cancel()
	require.NoError(t, <-done)
	for k, n := range ran {
		require.Equal(t, 1, n, "%s ran once", k)
	}
	for s, key := range shards {
		for i := 1; i <= 20; i++ {
			require.Equal(t, 1, ran[key+" "+fmt.Sprintf("%d/%d", s, i)])
		}
	}
}

// The reclaimer and the lease scan every shard: entries left pending by a
// consumer that died, on each of three shards, are claimed on their own
// shard.
func TestReclaimAndLeaseScanEveryShard(t *testing.T) {
	t.Parallel()
	rdb, base := hosttest.Redis(t)
	ctx := context.Background()
	shards := stream.ShardKeys(base, 3)
	for _, key := range shards {
		require.NoError(t, rdb.XGroupCreateMkStream(ctx, key, "g", "0").Err())
		for i := range 4 {
			require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"job_id", fmt.Sprint(i), "kind", "k"}}).Err())
		}
		// Two read by the reclaimer's victim, then two by the lease's.
		require.NoError(t, rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "slow", Streams: []string{key, ">"}, Count: 2}).Err())
	}
	time.Sleep(300 * time.Millisecond)
	for _, key := range shards {
		require.NoError(t, rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "dead", Streams: []string{key, ">"}, Count: 2}).Err())
	}
	took := map[string]int{}
	take := func(ctx context.Context, max int, read func(context.Context, int) ([]stream.Entry, error)) (int, error) {
		es, err := read(ctx, max)
		for _, e := range es {
			took[e.Stream]++
		}
		return len(es), err
	}
	time.Sleep(60 * time.Millisecond)
	l, err := stream.NewLease(stream.LeaseConfig{Redis: rdb, Streams: shards, Group: "g", Consumer: "live", TTL: 50 * time.Millisecond, Take: take})
	require.NoError(t, err)
	// "slow" holds a lease on every shard: it is alive, so only "dead"'s
	// entries are the lease's to take.
	slow, err := stream.NewLease(stream.LeaseConfig{Redis: rdb, Streams: shards, Group: "g", Consumer: "slow", TTL: time.Minute, Take: take})
	require.NoError(t, err)
	require.NoError(t, slow.Renew(ctx))
	n, err := l.ClaimDead(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, n, "the dead consumer's two entries on each of three shards")
	for _, key := range shards {
		require.Equal(t, 2, took[key], "claimed on %s", key)
	}
	// Past the slow consumer's idle time, short of the entries the lease
	// just claimed.
	r, err := stream.NewReclaimer(stream.ReclaimerConfig{Redis: rdb, Streams: shards, Group: "g", Consumer: "live", MinIdle: 250 * time.Millisecond, Take: take})
	require.NoError(t, err)
	n, err = r.Scan(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, n, "the slow consumer's two entries on each of three shards")
	for _, key := range shards {
		require.Equal(t, 4, took[key], "reclaimed on %s", key)
		p, err := rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: key, Group: "g", Start: "-", End: "+", Count: 10}).Result()
		require.NoError(t, err)
		for _, e := range p {
			require.Equal(t, "live", e.Consumer)
		}
	}
}

// hashTag is the part of key Redis Cluster hashes: its first non-empty
// {...}, else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// A shard's priority bands are in its hash slot (one script reads them
// on a cluster); the default priority's band is the shard's own key.
func TestBandKeys(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"usher:{jobs-2}:p1", "usher:{jobs-2}:p2", "usher:{jobs-2}", "usher:{jobs-2}:p4", "usher:{jobs-2}:p5"},
		stream.BandKeys(stream.ShardKey("usher:{jobs}", 2)))
	require.Equal(t, "{jobs-1}:p1", stream.BandKey("jobs-1", 1), "a key without a tag is the tag of its bands")
	for _, shard := range []string{"usher:{jobs}", "usher:{jobs-5}", "jobs", "jobs-3", "a:{x-7}:b"} {
		for _, band := range stream.BandKeys(shard) {
			require.Equal(t, hashTag(shard), hashTag(band), "band %s of shard %s", band, shard)
		}
	}
	require.Len(t, stream.Keys("usher:{jobs}", 3), 15)
}

// One read of a shard takes its bands highest priority first, up to the
// count asked for, and names the band each entry came from; a consumer
// acks each on its own band.
func TestReadTakesHigherPrioritiesFirst(t *testing.T) {
	t.Parallel()
	rdb, base := hosttest.Redis(t)
	ctx := context.Background()
	bands := stream.BandKeys(base)
	for _, k := range bands {
		require.NoError(t, stream.EnsureGroup(ctx, rdb, k, "g"))
	}
	// Lowest first on the stream: the order of arrival is the reverse
	// of the order wanted.
	for p := len(bands); p >= 1; p-- {
		for i := range 3 {
			require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: bands[p-1],
				Values: []any{"job_id", fmt.Sprintf("p%d-%d", p, i), "kind", "k"}}).Err())
		}
	}
	var got []string
	for {
		entries, err := stream.ReadNew(ctx, rdb, bands, "g", "c1", 4)
		require.NoError(t, err)
		if len(entries) == 0 {
			break
		}
		require.LessOrEqual(t, len(entries), 4)
		for _, e := range entries {
			require.Contains(t, e.JobID, "p")
			require.Equal(t, bands[int(e.JobID[1]-'1')], e.Stream, "entry %s read from its band", e.JobID)
			got = append(got, e.JobID)
			require.NoError(t, rdb.XAck(ctx, e.Stream, "g", e.StreamID).Err())
		}
	}
	require.Equal(t, []string{"p1-0", "p1-1", "p1-2", "p2-0", "p2-1", "p2-2", "p3-0", "p3-1", "p3-2",
		"p4-0", "p4-1", "p4-2", "p5-0", "p5-1", "p5-2"}, got)
	for _, k := range bands {
		require.Zero(t, hosttest.Pending(t, rdb, k, "g"))
	}
}

// An entry's priority field is read when it is one of 1 to 5 in its
// plain decimal form; anything else makes the entry malformed (it is
// dead-lettered), never a job of another priority.
func TestDecodePriority(t *testing.T) {
	t.Parallel()
	decode := func(p string) stream.Entry {
		v := map[string]any{"job_id": "7", "kind": "k"}
		if p != "" {
			v["priority"] = p
		}
		return stream.Decode(redis.XMessage{ID: "1-1", Values: v})
	}
	require.Equal(t, 3, decode("").Priority)
	require.NoError(t, decode("").Err)
	require.Equal(t, 1, decode("1").Priority)
	require.Equal(t, 5, decode("5").Priority)
	for _, bad := range []string{"0", "6", "01", "+1", "x", "-1"} {
		require.ErrorContains(t, decode(bad).Err, "is not one of 1 to 5", "priority %q", bad)
	}
}
