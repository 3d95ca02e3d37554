package guard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// An applied run's history record is written in the job's own
// transaction: a transaction that fails at its commit, or is rolled back,
// leaves neither the effect, nor the outcome, nor a record.
func TestAppliedRecordCommitsWithTheJob(t *testing.T) {
	t.Parallel()
	owner, _ := hosttest.DB(t)
	ctx := context.Background()
	_, err := owner.Exec(ctx, `CREATE TABLE histtx (n int); GRANT INSERT ON histtx TO usher_plugin_raw`)
	require.NoError(t, err)
	pool := hosttest.RawPool(t, owner, 1)
	runner, err := guard.NewRunner(guard.Config{Handles: guard.NewHandles("public", nil)})
	require.NoError(t, err)
	ids, err := outbox.Add(ctx, owner, outbox.Message{Kind: "raw_job", Payload: []byte(`{}`), RequestID: "req-h"})
	require.NoError(t, err)
	job := &usherv1.Job{Id: fmt.Sprint(ids[0]), Kind: "raw_job", RequestId: "req-h", Attempt: 2}
	d := guard.Delivery{OutboxID: ids[0], StreamID: "9-0", Deliveries: 3, Consumer: "host-a", Plugin: "raw", Version: "1.2.3",
		Guard: "job_id", Started: time.Now().Add(-time.Second)}

	run := func(n int) *guard.JobTx {
		var one int
		tx, err := guard.BeginWith(ctx, pool, "public", func(r pgx.Row) error { return r.Scan(&one) }, "SELECT 1")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO histtx VALUES ($1)`, n)
		require.NoError(t, err)
		return tx
	}
	state := func() (effects, records, done int64) {
		return hosttest.Count(t, owner, `SELECT count(*) FROM histtx`), hosttest.Count(t, owner, `SELECT count(*) FROM job_history`),
			hosttest.Count(t, owner, `SELECT count(*) FROM outbox WHERE done_at IS NOT NULL`)
	}

	// Fails after the record, before COMMIT.
	err = run(1).Commit(ctx, append(guard.AppliedStatements(runner, job, d), guard.Last("SELECT 1/0"))...)
	require.ErrorContains(t, err, "division by zero")
	e, r, dn := state()
	require.Zero(t, e+r+dn, "nothing of the failed commit is left")

	// Rolled back (the host gave up on it: a crash, a deadline).
	run(2).Rollback(ctx)
	e, r, dn = state()
	require.Zero(t, e+r+dn)

	require.NoError(t, run(3).Commit(ctx, guard.AppliedStatements(runner, job, d)...))
	e, r, dn = state()
	require.Equal(t, [3]int64{1, 1, 1}, [3]int64{e, r, dn})
	var verdict, consumer, plugin, version, grd, stream, req string
	var attempt, deliveries int
	var took time.Duration
	require.NoError(t, owner.QueryRow(ctx, `SELECT verdict, consumer, plugin, plugin_version, guard, stream_id, request_id, attempt, deliveries,
		finished_at - started_at FROM job_history`).Scan(&verdict, &consumer, &plugin, &version, &grd, &stream, &req, &attempt, &deliveries, &took))
	require.Equal(t, []string{"applied", "host-a", "raw", "1.2.3", "job_id", "9-0", "req-h"}, []string{verdict, consumer, plugin, version, grd, stream, req})
	require.Equal(t, []int{2, 3}, []int{attempt, deliveries})
	require.GreaterOrEqual(t, took, time.Second)
}
