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
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// kill -9 of a host under a flow of orders, five times, with a second host
// serving throughout and the reclaim threshold at its 60 s default: the
// dead host's pending entries are claimed through its expired lease and
// applied well within the threshold (the target is 10 s). Every
// order applied once.
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

	hostURL := url + "&pool_max_conns=3"
	if !strings.Contains(url, "?") {
		hostURL = url + "?pool_max_conns=3"
	}
	start := func(consumer string) *exec.Cmd {
		// Small pools: the test server's connections are shared.
		cmd := exec.Command(bin, "run", "--database-url", hostURL, "--plugin-pool-size", "2", "--stream", stream, "--plugins", counters, "--admin-addr", "",
			"--consumer", consumer, "--stalled-after", "1m", "--host-lease-ttl", "5s")
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
	start("survivor")

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
		hosttest.Eventually(t, 30*time.Second, victim+" to hold entries", func() bool { return consumerPending(t, rdb, stream, victim) > 0 })
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		killed := time.Now()
		_ = cmd.Wait()
		ids := pendingIDs(t, rdb, stream, victim)
		require.NoError(t, lock.Rollback(ctx))
		require.NotEmpty(t, ids)
		// Acked means settled: the job's outcome is committed.
		hosttest.Eventually(t, 50*time.Second, fmt.Sprintf("the %d entries %s held to be applied", len(ids), victim), func() bool {
			still := pendingIDs(t, rdb, stream, "")
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
	stopFlow()

	total := placed.Load()
	hosttest.Eventually(t, 60*time.Second, "every job applied and nothing pending", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM processed_jobs`) == total && hosttest.Pending(t, rdb, stream, "usher") == 0
	})
	require.Equal(t, want[0].Load(), hosttest.Count(t, pool, `SELECT seats_sold FROM events WHERE id = $1`, held))
	require.Equal(t, want[1].Load(), hosttest.Count(t, pool, `SELECT seats_sold FROM events WHERE id = $1`, flowing))
	require.Equal(t, total, hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies`), "zero lost, zero doubled")
	slices.Sort(took)
	t.Logf("%d orders; dead host's entries applied after: min %s, median %s, max %s", total, took[0], took[len(took)/2], took[len(took)-1])
	for _, d := range took {
		// Well under the 60 s reclaim threshold they would wait otherwise.
		require.Less(t, d, 15*time.Second)
	}
}

// consumerPending is how many entries consumer has pending.
func consumerPending(t *testing.T, rdb redis.UniversalClient, stream, consumer string) int64 {
	t.Helper()
	return int64(len(pendingIDs(t, rdb, stream, consumer)))
}

// pendingIDs are the ids pending for consumer (for anyone when "").
func pendingIDs(t *testing.T, rdb redis.UniversalClient, stream, consumer string) []string {
	t.Helper()
	p, err := rdb.XPendingExt(context.Background(), &redis.XPendingExtArgs{Stream: stream, Group: "usher", Start: "-", End: "+", Count: 100000, Consumer: consumer}).Result()
	if err != nil {
		return nil
	}
	ids := make([]string, len(p))
	for i, e := range p {
		ids[i] = e.ID
	}
	return ids
}
