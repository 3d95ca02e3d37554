package host_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/ops"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// Twenty jobs of priority 1 enqueued after a backlog of 600 of the
// default priority, all of them on the stream before a host starts: the
// twenty run first (without priorities they would be the last twenty).
// Then a job of priority 1 fails once and is retried at its priority,
// and one of priority 2 is dead-lettered, and its requeue keeps its
// priority too. Every counter is exact.
func TestPriorityJumpsTheBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const backlog, urgent = 600, 20
	want := b.placeOrders(t, backlog, 5)
	last := hosttest.Count(t, b.pool, `SELECT max(id) FROM outbox`)
	for ev, n := range b.placeOrders(t, urgent, 2) {
		want[ev] += n
	}
	_, err := b.pool.Exec(ctx, `UPDATE outbox SET priority = 1 WHERE id > $1`, last)
	require.NoError(t, err)

	// Everything on the stream first: the order the host reads in is
	// then the stream's, not the relay's.
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Redis: b.rdb, Stream: b.stream, Key: hosttest.SigningKey(t, b.pool)})
	require.NoError(t, err)
	for {
		n, err := relay.RelayOnce(ctx)
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	high := stream.BandKey(b.stream, 1)
	require.EqualValues(t, urgent, b.rdb.XLen(ctx, high).Val(), "the urgent jobs on their band")
	require.EqualValues(t, backlog, b.rdb.XLen(ctx, b.stream).Val(), "the backlog on the default band")
	in, err := ops.Inspect(ctx, b.pool, b.rdb, b.stream, "usher", time.Now())
	require.NoError(t, err)
	require.True(t, in.PrioritiesUsed())
	require.Equal(t, []ops.Band{{Priority: 1, Entries: urgent}, {Priority: 2}, {Priority: 3, Entries: backlog}, {Priority: 4}, {Priority: 5}}, in.Priorities)
	require.EqualValues(t, backlog+urgent, in.Entries, "inspect sums the bands")

	cfg := b.config()
	cfg.RetryBackoff = 100 * time.Millisecond
	hosttest.Start(t, cfg)
	drained := func(jobs int64) func() bool {
		return func() bool {
			if hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`) != jobs ||
				hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) != 0 {
				return false
			}
			for _, k := range stream.BandKeys(b.stream) {
				if p, err := b.rdb.XPending(ctx, k, "usher").Result(); err == nil && p.Count > 0 {
					return false
				}
			}
			return true
		}
	}
	hosttest.Eventually(t, 90*time.Second, "every job applied", drained(backlog+urgent))
	b.requireCounters(t, want)

	// The rank, by the time its outcome committed, of the last urgent
	// job.
	worst := hosttest.Count(t, b.pool, `
		SELECT max(r) FROM (SELECT id, priority, rank() OVER (ORDER BY done_at) AS r FROM outbox WHERE attempt = 0) ranked
		WHERE priority = 1`)
	t.Logf("the last urgent job finished %d of %d (first runs; 16 in flight)", worst, backlog+urgent)
	require.Less(t, worst, int64(120), "the urgent jobs waited behind the backlog")

	// A retry keeps its priority (alone: in a batch, a job that fails
	// once is run again alone at once, and succeeds). The fault is armed
	// for the next row's job before it is placed.
	next := func() string { return fmt.Sprint(hosttest.Count(t, b.pool, `SELECT max(id) + 1 FROM outbox`)) }
	ev, err := orders.CreateEvent(ctx, b.pool, "Late", "Stagedoor Hall")
	require.NoError(t, err)
	place := func(priority int) {
		_, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: 2},
			orders.Jobs{Counter: true, Priority: priority})
		require.NoError(t, err)
		want[ev] += 2
	}
	retried := next()
	require.NoError(t, faults.Arm(b.faultDir, "counter.before_apply", faults.Spec{Action: "error", Once: true, JobIDs: []string{retried}}))
	place(1)
	hosttest.Eventually(t, 30*time.Second, "the retried job applied", drained(backlog+urgent+1))
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE coalesce(job_id, id::text) = $1 AND priority = 1`, retried),
		"the retried job's two runs at its priority")
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM scheduled_jobs WHERE job_id = $1 AND priority = 1`, retried))

	// A dead letter keeps its priority, and so does its requeue.
	doomed := next()
	require.NoError(t, faults.Arm(b.faultDir, "counter.before_apply", faults.Spec{Action: "permanent", JobIDs: []string{doomed}}))
	place(2)
	hosttest.Eventually(t, 30*time.Second, "the job dead-lettered", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters WHERE job_id = $1`, doomed) == 1
	})
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters WHERE job_id = $1 AND priority = 2`, doomed))
	require.NoError(t, faults.Arm(b.faultDir, "counter.before_apply", faults.Spec{Action: "error", JobIDs: []string{"none"}}))
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	n, err := deadletter.Requeue(ctx, tx, 0, counterKind)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, tx.Commit(ctx))
	hosttest.Eventually(t, 30*time.Second, "the requeued job applied", drained(backlog+urgent+2))
	b.requireCounters(t, want)
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE coalesce(job_id, id::text) = $1 AND priority = 2`, doomed),
		"the requeue at the job's priority")
	require.Positive(t, b.rdb.XLen(ctx, stream.BandKey(b.stream, 2)).Val(), "the requeue on its band")
}
