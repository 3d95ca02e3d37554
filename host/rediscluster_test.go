package host_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// clusterBundle is a test's own database and stream on a Redis Cluster of
// its own.
type clusterBundle struct {
	*testBundle
	cluster *hosttest.RedisCluster
	crdb    *redis.ClusterClient
}

func setupCluster(t *testing.T) *clusterBundle {
	t.Helper()
	pool, url := hosttest.DB(t)
	c := hosttest.StartRedisCluster(t)
	return &clusterBundle{testBundle: &testBundle{pool: pool, dbURL: url, stream: "usher:test:{" + hosttest.Suffix() + "}",
		counters: hosttest.Build(t, "./plugins/counters/chaos"), faultDir: t.TempDir()}, cluster: c, crdb: c.Client()}
}

// config is a host on the cluster through the seed addresses given.
func (b *clusterBundle) config(seeds ...string) host.Config {
	cfg := hostConfig(b.dbURL, nil, b.stream, b.counters)
	cfg.Redis = nil
	cfg.RedisURL = b.cluster.URL(seeds...)
	// Entries a failover drops after the relay marked them published
	// come back through the reconciler (see TestHostHealsAfterPrimaryKill).
	cfg.ReconcileAfter, cfg.ReconcileInterval = 10*time.Second, time.Second
	return cfg
}

func (b *clusterBundle) waitDrained(t *testing.T, jobs int64, within time.Duration) {
	t.Helper()
	hosttest.Eventually(t, within, fmt.Sprintf("%d jobs recorded and nothing pending", jobs), func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`) == jobs &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0 &&
			hosttest.Pending(t, b.crdb, b.stream, "usher") == 0
	})
}

// A host given only a node that does not serve the stream's slot follows
// the redirect: jobs flow, none lost or doubled (the seed's single-node
// client exited on MOVED).
func TestHostOnRedisClusterFollowsMoved(t *testing.T) {
	t.Parallel()
	b := setupCluster(t)
	want := b.placeOrders(t, 300, 5)
	hosttest.Start(t, b.config(b.cluster.NotServing(b.stream)))
	b.waitDrained(t, 300, 60*time.Second)
	b.requireCounters(t, want)
	require.EqualValues(t, 300, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
}

// Under a flow of orders, the primary serving the stream is killed (-9);
// its replica is promoted, and the two hosts find the new primary by
// themselves. Then the old primary comes back (as a
// replica). Nothing lost, nothing doubled; the longest pause in progress
// is logged.
func TestHostHealsAfterPrimaryKill(t *testing.T) {
	t.Parallel()
	failover{orders: 3000, hosts: 2, shards: 1, placers: 1, pace: 2 * time.Millisecond}.run(t)
}

// The scale-out case: three hosts on six shards spread over the cluster's
// three primaries, 20,000 orders, and the primary serving shard 0 killed
// (-9) under the flow, its replica promoted, the old primary brought back
// as a replica. Every job applied once; the longest pause and the spread
// of each job's time from commit to applied are logged.
func TestShardedHostsThroughPrimaryKill(t *testing.T) {
	t.Parallel()
	failover{orders: 20000, hosts: 3, shards: 6, placers: 4}.run(t)
}

// failover is a flow of orders through hosts on a cluster while the
// primary serving the stream's first shard is killed.
type failover struct {
	orders, hosts, shards int
	// placers place the orders, each pausing pace between two.
	placers int
	pace    time.Duration
}

func (f failover) run(t *testing.T) {
	b := setupCluster(t)
	ctx := context.Background()
	total := f.orders
	ev, err := orders.CreateEvent(ctx, b.pool, "Failover", "Stagedoor Hall")
	require.NoError(t, err)
	seed := b.cluster.NotServing(b.stream)
	// The first host is told of one node (not the primary to be killed),
	// the others of every node; only the first relays when there is one
	// shard: their leases and scripts go through the failover too.
	for i := range f.hosts {
		cfg := b.config(seed)
		if i > 0 {
			cfg = b.config(b.cluster.Addrs()...)
			cfg.DisableRelay = f.shards == 1
		}
		cfg.StreamShards = f.shards
		hosttest.Start(t, cfg)
	}
	if f.shards > 1 {
		primaries := map[string][]string{}
		for _, key := range stream.ShardKeys(b.stream, f.shards) {
			p := b.cluster.PrimaryFor(key)
			primaries[p] = append(primaries[p], key)
		}
		t.Logf("shards per primary: %v", primaries)
	}

	var (
		mu     sync.Mutex
		placed int64
		want   int64
	)
	done := make(chan struct{})
	var placers sync.WaitGroup
	for w := range f.placers {
		placers.Add(1)
		go func() { // a steady flow of orders
			defer placers.Done()
			for i := w; i < total; i += f.placers {
				seats := 1 + rand.IntN(6)
				if _, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "B", Email: "b@example.com", Seats: seats}, orders.Jobs{Counter: true}); err != nil {
					t.Errorf("place: %v", err)
					return
				}
				mu.Lock()
				placed, want = placed+1, want+int64(seats)
				mu.Unlock()
				time.Sleep(f.pace)
			}
		}()
	}
	go func() { placers.Wait(); close(done) }()
	applied := func() int64 { return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) }
	// Generous: hosts under -race on a machine busy with other tests
	// take a while to start their plugins; the kill comes after.
	hosttest.Eventually(t, 2*time.Minute, "a first 300 jobs applied", func() bool { return applied() >= 300 })

	primary := b.cluster.PrimaryFor(b.stream)
	require.NotEqual(t, seed, primary)
	killed := time.Now()
	b.cluster.Kill(primary)
	t.Logf("killed primary %s at %d applied", primary, applied())

	// Progress: the longest time the applied count stood still while
	// placed orders waited, sampled every 20ms until everything is in.
	var longest, stalledSince time.Duration
	last, lastAt := applied(), time.Since(killed)
	promoted := time.Duration(0)
	// A bound on finishing, not a measure of speed: 20,000 orders under
	// -race on a loaded CI machine took 3-5 minutes after the kill.
	deadline := time.Now().Add(10 * time.Minute)
	for {
		n := applied()
		now := time.Since(killed)
		mu.Lock()
		p := placed
		mu.Unlock()
		if n != last {
			last, lastAt = n, now
		} else if p > n {
			stalledSince = now - lastAt
			longest = max(longest, stalledSince)
		}
		if promoted == 0 && b.cluster.PrimaryFor(b.stream) != primary {
			promoted = now
			t.Logf("replica promoted %s after the kill", promoted)
		}
		select {
		case <-done:
		default:
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if n >= int64(total) {
			break
		}
		require.True(t, time.Now().Before(deadline), "timed out at %d of %d applied (promoted after %s)", n, total, promoted)
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("longest pause in progress after the kill: %s (all %d applied %s after the kill)", longest, total, time.Since(killed))

	b.cluster.Restart(primary)
	b.cluster.WaitHealthy(30 * time.Second)
	hosttest.Eventually(t, 60*time.Second, fmt.Sprintf("%d jobs recorded and nothing pending on any shard", total), func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`) == int64(total) &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0 &&
			pendingOnShards(t, b.crdb, b.stream, f.shards) == 0
	})
	require.EqualValues(t, total, applied(), "one apply per order")
	require.Equal(t, want, hosttest.Count(t, b.pool, `SELECT seats_sold FROM events WHERE id = $1`, ev))
	t.Logf("duplicates absorbed: %d", hosttest.Count(t, b.pool, `SELECT coalesce(sum(count), 0)::bigint FROM absorbed_duplicates`))
	// Each job's time from its commit to its outcome's (processed_at is
	// its transaction's start, so a little under).
	var p50, p99, worst float64
	require.NoError(t, b.pool.QueryRow(ctx, `
		SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s), percentile_cont(0.99) WITHIN GROUP (ORDER BY s), max(s)
		FROM (SELECT extract(epoch FROM p.processed_at - o.created_at) AS s
		      FROM processed_jobs p JOIN outbox o ON o.id::text = p.job_id) x`).Scan(&p50, &p99, &worst))
	t.Logf("commit to applied: p50 %.3fs, p99 %.3fs, max %.3fs", p50, p99, worst)
	require.NotZero(t, promoted, "the replica was promoted")
	// The generous bound the issue asks of a failover: the flow resumes
	// on its own, well before anyone would restart a host by hand.
	require.Less(t, longest, 30*time.Second, "the longest pause")
	require.Less(t, worst, 60.0, "every job applied within a minute of its commit, the failover's included")
}
