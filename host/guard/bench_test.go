package guard_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// BenchmarkClaimStatement measures the claim guard's one statement (insert
// the claim row, or re-claim a stale one), as the host runs it: in a
// transaction of its own on the plugin's pool, as the plugin's role. Each
// op claims a new row. ns/op is per claim.
func BenchmarkClaimStatement(b *testing.B) {
	owner, _ := hosttest.DB(b)
	ctx := context.Background()
	if _, err := owner.Exec(ctx, `CREATE TABLE sends (order_id bigint, kind text, claimed_at timestamptz NOT NULL, sent_at timestamptz,
		UNIQUE (order_id, kind)); GRANT SELECT, INSERT, UPDATE ON sends TO usher_plugin_raw`); err != nil {
		b.Fatal(err)
	}
	pool, err := sandbox.OpenPluginPool(ctx, sandbox.PoolConfig{Base: owner.Config(), Role: "usher_plugin_raw", Size: 4})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	b.ResetTimer()
	for i := range b.N {
		kv, err := contract.ToValues([]any{int64(i), "tickets"})
		if err != nil {
			b.Fatal(err)
		}
		sql, args, err := guard.ClaimStatement(&usherv1.ClaimSpec{Table: "sends", KeyColumns: []string{"order_id", "kind"},
			KeyValues: kv, ClaimedColumn: "claimed_at", DoneColumn: "sent_at", LeaseMs: 120_000, Intent: "tickets"})
		if err != nil {
			b.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var at any
			return tx.QueryRow(ctx, sql, args...).Scan(&at)
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// countInvoker answers every apply with one returned write: a counter's
// increment, the shape of update_sales_counter, with no plugin process.
type countInvoker struct{}

func (countInvoker) Invoke(_ context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	res := make([]*usherv1.Result, len(calls))
	for i := range calls {
		args, err := contract.ToValues([]any{int64(i % 100)})
		if err != nil {
			return nil, err
		}
		res[i] = &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{{
			Mode: usherv1.Mode_MODE_EXEC, Sql: `UPDATE bcount SET n = n + 1 WHERE id = $1`, Args: args, MinRows: 1}}}
	}
	return res, nil
}

// BenchmarkJobIDBatch is a record-the-job-id job through the runner's
// batches (BatchMax 32), 32 jobs at a time, against a plugin answer that
// costs nothing: the host's side of a guard-4 batch (BEGIN with the job
// ids recorded, the returned writes, COMMIT with the outcomes). ns/op is
// per job; batch=1 is the same jobs one transaction each.
func BenchmarkJobIDBatch(b *testing.B) {
	for _, max := range []int{1, 32} {
		b.Run(fmt.Sprintf("batch=%d", max), func(b *testing.B) {
			owner, _ := hosttest.DB(b)
			ctx := context.Background()
			if _, err := owner.Exec(ctx, `CREATE TABLE bcount (id bigint PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
				INSERT INTO bcount (id) SELECT generate_series(0, 99); GRANT SELECT, UPDATE ON bcount TO usher_plugin_raw`); err != nil {
				b.Fatal(err)
			}
			pool := hosttest.RawPool(b, owner, 32)
			runner, err := guard.NewRunner(guard.Config{Handles: guard.NewHandles("public", nil), BatchMax: max})
			if err != nil {
				b.Fatal(err)
			}
			db := guard.DB{Pool: pool, Role: "usher_plugin_raw"}
			b.ResetTimer()
			var next atomic.Int64
			var wg sync.WaitGroup
			for range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						job := &usherv1.Job{Id: fmt.Sprint("b-", i), Kind: "raw_job"}
						out := runner.Run(ctx, countInvoker{}, db, usherv1.Guard_GUARD_JOB_ID, job, guard.Delivery{})
						if out.Verdict != guard.Applied {
							b.Error(out.Err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			if n := hosttest.Count(b, owner, `SELECT sum(n) FROM bcount`); n != int64(b.N) {
				b.Fatalf("%d increments for %d jobs", n, b.N)
			}
		})
	}
}
