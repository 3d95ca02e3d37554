package stream_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/stream"
)

// Arriving counts an entry from the read that takes it until it has
// arrived (its Dispatch calls Entry.Arrived, once however often it calls
// it) or its Dispatch returns, and never after: a batch waits on it
// (guard.Config.Arriving), so a count that stayed up would hold every
// batch for its longest wait. Its channel is closed when the count falls
// to 0, which is what wakes a waiting batch.
func TestArrivingCountsEntriesUntilTheyArrive(t *testing.T) {
	t.Parallel()
	rdb, key := hosttest.Redis(t)
	ctx := context.Background()
	release := map[string]chan struct{}{"1": make(chan struct{}), "2": make(chan struct{}), "3": make(chan struct{})}
	started := make(chan struct{}, 4)
	c, err := stream.NewConsumer(stream.ConsumerConfig{
		Redis: rdb, Streams: []string{key}, Group: "g", Name: "c1", Concurrency: 4,
		Dispatch: func(ctx context.Context, e stream.Entry) bool {
			if e.JobID == "1" {
				e.Arrived()
				e.Arrived()
			}
			started <- struct{}{}
			<-release[e.JobID]
			return false // left pending: nothing to ack
		},
	})
	require.NoError(t, err)
	entry := func(i int) stream.Entry {
		return stream.Entry{StreamID: fmt.Sprintf("%d-0", i), JobID: fmt.Sprint(i), Kind: "k"}
	}
	n, zero := c.Arriving()
	require.Equal(t, 0, n, "nothing read yet")
	requireClosed(t, zero, "the count is 0")

	// A read for the 4 free slots that finds 3 entries.
	var during <-chan struct{}
	got, err := c.Take(ctx, 4, func(ctx context.Context, n int) ([]stream.Entry, error) {
		require.Equal(t, 4, n)
		var a int
		a, during = c.Arriving()
		require.Equal(t, 4, a, "the read's room counts while it reads")
		return []stream.Entry{entry(1), entry(2), entry(3)}, nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, got)
	for range 3 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the entries were not all dispatched")
		}
	}
	n, zero = c.Arriving()
	require.Equal(t, 2, n, "1 arrived (twice: counted once); 2 and 3 have not, and their Dispatch has not returned")
	requireOpen(t, zero)
	requireOpen(t, during)

	// An entry already running here, read again, is not started twice
	// and does not stay counted.
	got, err = c.Take(ctx, 1, func(ctx context.Context, n int) ([]stream.Entry, error) {
		return []stream.Entry{entry(2)}, nil
	})
	require.NoError(t, err)
	require.Equal(t, 1, got)
	n, _ = c.Arriving()
	require.Equal(t, 2, n)
	select {
	case <-started:
		t.Fatal("the entry running here was started again")
	case <-time.After(200 * time.Millisecond):
	}

	// A Dispatch that returns without calling Arrived: the consumer does.
	close(release["2"])
	require.Eventually(t, func() bool { n, _ := c.Arriving(); return n == 1 }, 10*time.Second, time.Millisecond)
	requireOpen(t, zero)
	close(release["3"])
	requireClosed(t, zero, "the count fell to 0")
	requireClosed(t, during, "the count fell to 0")
	close(release["1"])
	n, zero = c.Arriving()
	require.Equal(t, 0, n)
	requireClosed(t, zero, "the count is 0")
}

func requireClosed(t *testing.T, ch <-chan struct{}, why string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("the channel was not closed: %s", why)
	}
}

func requireOpen(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal("the channel was closed while entries were arriving")
	default:
	}
}

// An entry finished here whose XACK has not returned yet, read again
// meanwhile (a reclaim of an entry idle past the threshold while its ack
// waits, as on a loaded machine), is not run a second time; once the ack
// has returned, a read of it runs it again (its ack may have failed).
func TestEntryWaitingForItsAckIsNotRunAgain(t *testing.T) {
	t.Parallel()
	rdb, key := hosttest.Redis(t)
	ctx := context.Background()
	acks := &holdAcks{gate: make(chan struct{}), held: make(chan struct{}, 4)}
	rdb.AddHook(acks)
	var mu sync.Mutex
	runs := map[string]int{}
	c, err := stream.NewConsumer(stream.ConsumerConfig{
		Redis: rdb, Streams: []string{key}, Group: "g", Name: "c1", Concurrency: 2,
		Dispatch: func(ctx context.Context, e stream.Entry) bool {
			mu.Lock()
			runs[e.StreamID]++
			mu.Unlock()
			return true // done: ack it
		},
	})
	require.NoError(t, err)
	entry := stream.Entry{StreamID: "1-0", JobID: "1", Kind: "k"}
	read := func() {
		t.Helper()
		got, err := c.Take(ctx, 1, func(ctx context.Context, n int) ([]stream.Entry, error) {
			return []stream.Entry{entry}, nil
		})
		require.NoError(t, err)
		require.Equal(t, 1, got)
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return runs["1-0"]
	}

	read()
	select {
	case <-acks.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the entry was not acked")
	}
	require.Equal(t, 1, count())
	read() // its ack is held
	require.Never(t, func() bool { return count() > 1 }, 300*time.Millisecond, 10*time.Millisecond,
		"an entry waiting for its ack was run again")

	// The first run's ack returns; the second run's will be held. Read
	// until the second run has started: a read while that run is under
	// way or waits for its ack is skipped, so it runs no third time (a
	// loop that let every ack through, reading on each tick, was flaky on
	// a loaded machine: a read after the second run's ack starts a third).
	t.Cleanup(func() { close(acks.gate) })
	acks.gate <- struct{}{}
	for deadline := time.Now().Add(10 * time.Second); count() < 2; time.Sleep(20 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "once acked, a read runs it again")
		read()
	}
	for range 15 {
		read() // the second run's ack is held
		time.Sleep(20 * time.Millisecond)
	}
	require.Never(t, func() bool { return count() > 2 }, 200*time.Millisecond, 10*time.Millisecond,
		"read while its second run waited for its ack, it was run a third time")
}

// holdAcks holds each XACK until it takes a token from gate (every one
// once gate is closed), telling held of each.
type holdAcks struct {
	gate chan struct{}
	held chan struct{}
}

func (h *holdAcks) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdAcks) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "xack" {
			select {
			case h.held <- struct{}{}:
			default:
			}
			<-h.gate
		}
		return next(ctx, cmd)
	}
}

func (h *holdAcks) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// An entry whose Dispatch calls Entry.Committed is settled there, before
// Dispatch returns: acked once (however often it is called), its slot free
// for the next read while its Dispatch still runs, never detached after,
// and its bytes given back, and its slot not given back twice, when
// Dispatch returns. The entry read into its slot runs when a worker is
// free: handlers running stay within Concurrency.
func TestCommittedEntrySettlesBeforeDispatchReturns(t *testing.T) {
	t.Parallel()
	rdb, key := hosttest.Redis(t)
	ctx := context.Background()
	require.NoError(t, stream.EnsureGroup(ctx, rdb, key, "g"))
	for i := range 2 {
		require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"job_id", fmt.Sprint(i + 1)}}).Err())
	}
	settled, release, second := make(chan string, 1), make(chan struct{}), make(chan struct{})
	c, err := stream.NewConsumer(stream.ConsumerConfig{
		Redis: rdb, Streams: []string{key}, Group: "g", Name: "c1", Concurrency: 1,
		Dispatch: func(ctx context.Context, e stream.Entry) bool {
			switch e.JobID {
			case "2":
				close(second)
				return true
			case "3":
				return true
			}
			e.Committed()
			e.Committed()
			settled <- e.StreamID
			<-release
			return true
		},
	})
	require.NoError(t, err)
	read := func() int {
		t.Helper()
		got, err := c.Take(ctx, 1, func(ctx context.Context, n int) ([]stream.Entry, error) {
			return stream.ReadNew(ctx, rdb, []string{key}, "g", "c1", n)
		})
		require.NoError(t, err)
		return got
	}
	pending := func() int64 {
		p, err := rdb.XPending(ctx, key, "g").Result()
		require.NoError(t, err)
		return p.Count
	}

	require.Equal(t, 1, read())
	var first string
	select {
	case first = <-settled:
	case <-time.After(10 * time.Second):
		t.Fatal("the first entry was not dispatched")
	}
	require.Eventually(t, func() bool { return pending() == 0 }, 10*time.Second, 10*time.Millisecond,
		"the settled entry was not acked while its Dispatch ran")
	require.False(t, c.Detach(first), "a settled entry was detached")
	// Concurrency 1: the next read finds the settled entry's slot free, and
	// its entry waits for the one worker.
	require.Equal(t, 1, read())
	select {
	case <-second:
		t.Fatal("two entries ran at once with Concurrency 1")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	select {
	case <-second:
	case <-time.After(10 * time.Second):
		t.Fatal("the second entry did not run once the settled one's Dispatch returned")
	}
	require.Eventually(t, func() bool { return pending() == 0 && c.BytesHeld() == 0 }, 10*time.Second, 10*time.Millisecond)
	// Every slot back once, not twice: one more read takes one entry's room.
	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: []any{"job_id", "3"}}).Err())
	require.Equal(t, 1, read())
}

// One shard's entries of several priorities, read in one batch and
// finished together, are acked each on its own band: acks grouped by the
// number of shards (one) sent every id to the first entry's band, and the
// others stayed pending until a reclaim ran them again.
func TestAcksReachEachBand(t *testing.T) {
	t.Parallel()
	rdb, key := hosttest.Redis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bands := stream.BandKeys(key)
	for i := range 8 {
		band := bands[0] // the highest priority's
		if i%2 == 1 {
			band = key // the default's
		}
		require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: band, Values: []any{"job_id", fmt.Sprint(i), "kind", "k"}}).Err())
	}
	all := make(chan struct{})
	var started sync.WaitGroup
	started.Add(8)
	go func() { started.Wait(); close(all) }()
	c, err := stream.NewConsumer(stream.ConsumerConfig{
		Redis: rdb, Streams: []string{key}, Group: "g", Name: "c1", Concurrency: 8, IdlePoll: 20 * time.Millisecond,
		Dispatch: func(ctx context.Context, e stream.Entry) bool {
			started.Done()
			<-all // every entry finishes at once: their acks go in one batch
			return true
		},
	})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	requireClosed(t, all, "the 8 entries of both bands started")
	hosttest.Eventually(t, 10*time.Second, "nothing pending on either band", func() bool {
		return hosttest.Pending(t, rdb, bands[0], "g") == 0 && hosttest.Pending(t, rdb, key, "g") == 0
	})
	cancel()
	require.NoError(t, <-done)
}

// Entries handed to the consumer while Run drains (a reclaim scan or a
// dead host's claim still in flight at the stop) are never started after
// the drain's wait, and stay pending for another host: under -race, the
// drain's wait and a late start were a data race on the consumer's count
// of running entries.
func TestTakeWhileDrainingStartsNothingLate(t *testing.T) {
	t.Parallel()
	rdb, key := hosttest.Redis(t)
	for round := range 20 {
		ctx, cancel := context.WithCancel(context.Background())
		var ran atomic.Int64
		c, err := stream.NewConsumer(stream.ConsumerConfig{
			Redis: rdb, Streams: []string{key}, Group: "g", Name: "c1", Concurrency: 4, IdlePoll: 5 * time.Millisecond,
			ShutdownGrace: time.Second,
			Dispatch: func(ctx context.Context, e stream.Entry) bool {
				ran.Add(1)
				return false
			},
		})
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		stop := make(chan struct{})
		var takers sync.WaitGroup
		for w := range 2 {
			takers.Go(func() { // a reclaimer still taking while the host stops
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					_, _ = c.Take(context.Background(), 1, func(ctx context.Context, n int) ([]stream.Entry, error) {
						return []stream.Entry{{Stream: key, StreamID: fmt.Sprintf("%d-%d", round, w*1_000_000+i), JobID: fmt.Sprint(i), Kind: "k"}}, nil
					})
				}
			})
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		cancel()
		require.NoError(t, <-done)
		after := ran.Load()
		time.Sleep(10 * time.Millisecond) // the takers go on taking
		close(stop)
		takers.Wait()
		require.Equal(t, after, ran.Load(), "round %d: an entry taken after the drain ran", round)
	}
}
