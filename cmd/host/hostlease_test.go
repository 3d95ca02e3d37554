package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// kill -9 of a host under a flow of orders, five times, with two other
// hosts serving throughout, on a stream of three shards, and the reclaim
// threshold at its 60 s default: the dead host's pending entries are
// claimed, on every shard, through its expired lease and applied well
// within the threshold (the target is 10 s). Then a host is
// frozen (SIGSTOP) for 70 s, past the lease and the reclaim threshold
// both: the others take its entries, and its late results once it
// resumes are absorbed. Every order applied once.
func TestDeadHostEntriesClaimedInSeconds(t *testing.T) {
	t.Parallel()
	pool, url := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	ctx := context.Background()
	bin := hosttest.Build(t, "./cmd/host")
	counters := hosttest.Build(t, "./plugins/counters/chaos")
	held, err := orders.CreateEvent(ctx, pool, "Held", "Hall")
	require.NoError(t, err)
	flowing, err := orders.CreateEvent(ctx, pool, "Flowing", "Hall")
	require.NoError(t, err)
	var want [2]atomic.Int64 // seats of held, flowing
	var placed atomic.Int64
	place := func(ev int64, i int) error {
		seats := 1 + i%4
		if _, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "B", Email: "b@example.com", Seats: seats}, orders.Jobs{Counter: true}); err != nil {
			return err
		}
		if ev == held {
			want[0].Add(int64(seats))
		} else {
			want[1].Add(int64(seats))
		}
		placed.Add(1)
		return nil
	}

	const shards = 3
	hostURL := url + "&pool_max_conns=3"
	if !strings.Contains(url, "?") {
		hostURL = url + "?pool_max_conns=3"
	}
	start := func(consumer string) *exec.Cmd {
		// Small pools: the test server's connections are shared.
		cmd := exec.Command(bin, "run", "--database-url", hostURL, "--plugin-pool-size", "2", "--stream", stream, "--plugins", counters, "--admin-addr", "",
			"--consumer", consumer, "--stalled-after", "1m", "--host-lease-ttl", "5s", "--stream-shards", fmt.Sprint(shards))
		logf, err := os.Create(filepath.Join(t.TempDir(), consumer+".log"))
		require.NoError(t, err)
		cmd.Stdout, cmd.Stderr = logf, logf // a file: Wait never waits on a pipe a plugin child still holds
		t.Cleanup(func() {
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("%s log:\n%.3000s", consumer, b)
			}
		})
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	start("survivor-1")
	start("survivor-2")

	// The flow: an order of the flowing event every 5ms until the end.
	stop := make(chan struct{})
	flowDone := make(chan struct{})
	go func() {
		defer close(flowDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := place(flowing, i); err != nil {
				t.Errorf("place: %v", err)
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	stopFlow := sync.OnceFunc(func() { close(stop); <-flowDone })
	defer stopFlow()

	var took []time.Duration
	for round := range 5 {
		// Jobs of the held event wait on its row, so the host to kill
		// surely holds some pending.
		lock, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = lock.Exec(ctx, `SELECT 1 FROM events WHERE id = $1 FOR NO KEY UPDATE`, held) // orders still insert (their foreign key takes KEY SHARE)
		require.NoError(t, err)
		for i := range 40 {
			require.NoError(t, place(held, i))
		}
		victim := fmt.Sprintf("victim-%d", round)
		cmd := start(victim)
		hosttest.Eventually(t, 30*time.Second, victim+" to hold entries", func() bool { return len(pendingIDs(t, rdb, stream, shards, victim)) > 0 })
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		killed := time.Now()
		_ = cmd.Wait()
		ids := pendingIDs(t, rdb, stream, shards, victim)
		require.NoError(t, lock.Rollback(ctx))
		require.NotEmpty(t, ids)
		// Acked means settled: the job's outcome is committed.
		hosttest.Eventually(t, 50*time.Second, fmt.Sprintf("the %d entries %s held to be applied", len(ids), victim), func() bool {
			still := pendingIDs(t, rdb, stream, shards, "")
			for _, id := range ids {
				if slices.Contains(still, id) {
					return false
				}
			}
			return true
		})
		took = append(took, time.Since(killed))
		t.Logf("round %d: %d entries of the killed host applied %s after the kill", round, len(ids), took[round])
	}

	// A host frozen for 70 s with entries pending: past its lease and the
	// reclaim threshold. The others apply its entries while it is
	// stopped; resumed, it finishes what it held, and each is absorbed.
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = lock.Exec(ctx, `SELECT 1 FROM events WHERE id = $1 FOR NO KEY UPDATE`, held)
	require.NoError(t, err)
	for i := range 40 {
		require.NoError(t, place(held, i))
	}
	frozen := start("frozen")
	hosttest.Eventually(t, 30*time.Second, "the host to freeze to hold entries", func() bool { return len(pendingIDs(t, rdb, stream, shards, "frozen")) > 0 })
	require.NoError(t, frozen.Process.Signal(syscall.SIGSTOP))
	t.Cleanup(func() { _ = frozen.Process.Signal(syscall.SIGCONT) })
	stopped := time.Now()
	ids := pendingIDs(t, rdb, stream, shards, "frozen")
	require.NoError(t, lock.Rollback(ctx))
	// The others take its entries once its lease is gone. Its batch may
	// hold the event's row in a transaction the server ends only after
	// --idle-in-transaction-timeout (40 s here), and their runs wait for
	// that and retry: how long it took is logged, not bounded; what is
	// bounded is the end (every order applied once).
	var frozenTook time.Duration
	for time.Since(stopped) < 68*time.Second && frozenTook == 0 {
		still := pendingIDs(t, rdb, stream, shards, "")
		left := 0
		for _, id := range ids {
			if slices.Contains(still, id) {
				left++
			}
		}
		if left == 0 {
			frozenTook = time.Since(stopped)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if frozenTook > 0 {
		t.Logf("%d entries of the frozen host applied by the others %s after its SIGSTOP", len(ids), frozenTook.Round(time.Millisecond))
	} else {
		t.Logf("%d entries of the frozen host not all applied by the others within its 70 s freeze (its batch held their row)", len(ids))
	}
	time.Sleep(time.Until(stopped.Add(70 * time.Second)))
	require.NoError(t, frozen.Process.Signal(syscall.SIGCONT))
	// Back, it reads and serves again.
	time.Sleep(3 * time.Second)
	stopFlow()

	total := placed.Load()
	// Retries of runs that waited on the frozen batch's row back off.
	hosttest.Eventually(t, 2*time.Minute, "every job applied and nothing pending", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM processed_jobs`) == total && len(pendingIDs(t, rdb, stream, shards, "")) == 0
	})
	require.Equal(t, want[0].Load(), hosttest.Count(t, pool, `SELECT seats_sold FROM events WHERE id = $1`, held))
	require.Equal(t, want[1].Load(), hosttest.Count(t, pool, `SELECT seats_sold FROM events WHERE id = $1`, flowing))
	require.Equal(t, total, hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies`), "zero lost, zero doubled")
	t.Logf("duplicates absorbed: %d", hosttest.Count(t, pool, `SELECT coalesce(sum(count), 0)::bigint FROM absorbed_duplicates`))
	slices.Sort(took)
	t.Logf("%d orders; dead host's entries applied after: min %s, median %s, max %s", total, took[0], took[len(took)/2], took[len(took)-1])
	for _, d := range took {
		// Well under the 60 s reclaim threshold they would wait otherwise.
		require.Less(t, d, 15*time.Second)
	}
}

// pendingIDs are the entries pending for consumer (for anyone when "")
// on the first shards of base, each as "shard id".
func pendingIDs(t *testing.T, rdb redis.UniversalClient, base string, shards int, consumer string) []string {
	t.Helper()
	var ids []string
	for _, key := range stream.ShardKeys(base, shards) {
		p, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: key, Group: "usher", Start: "-", End: "+", Count: 100000, Consumer: consumer}).Result()
		if err != nil {
			continue
		}
		for _, e := range p {
			ids = append(ids, key+" "+e.ID)
		}
	}
	return ids
}
