package guard_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
)

// A job's transaction begins with its first statement and commits with its
// last one and the connection's reset, each in one round trip; a last
// statement that fails rolls everything back and leaves the connection
// clean for the next job.
func TestJobTx(t *testing.T) {
	t.Parallel()
	owner, _ := hosttest.DB(t)
	ctx := context.Background()
	_, err := owner.Exec(ctx, `CREATE TABLE jobtx (n int); GRANT SELECT, INSERT ON jobtx TO usher_plugin_raw`)
	require.NoError(t, err)
	pool := hosttest.RawPool(t, owner, 1)

	begin := func() *guard.JobTx {
		var one int
		tx, err := guard.BeginWith(ctx, pool, "public", func(r pgx.Row) error { return r.Scan(&one) }, "SELECT 1")
		require.NoError(t, err)
		require.Equal(t, 1, one)
		require.EqualValues(t, 'T', tx.Conn().PgConn().TxStatus())
		return tx
	}
	count := func() int64 { return hosttest.Count(t, owner, `SELECT count(*) FROM jobtx`) }

	tx := begin()
	_, err = tx.Exec(ctx, `INSERT INTO jobtx VALUES (1)`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET application_name = 'left behind'`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx, guard.Last("INSERT INTO jobtx VALUES ($1)", "2")))
	require.EqualValues(t, 2, count())

	// A statement the plugin prepared does not outlive the commit's
	// reset either (its check fails, and the pool deallocates it).
	tx = begin()
	_, err = tx.Exec(ctx, `PREPARE left_behind AS SELECT 1`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	tx = begin()
	var app string
	require.NoError(t, tx.QueryRow(ctx, `SELECT current_setting('application_name')`).Scan(&app))
	require.NotEqual(t, "left behind", app, "the commit's reset ran")
	var prepared int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements`).Scan(&prepared))
	require.Zero(t, prepared, "the statement the plugin prepared is gone")
	_, err = tx.Exec(ctx, `INSERT INTO jobtx VALUES (3)`)
	require.NoError(t, err)
	err = tx.Commit(ctx, guard.Last("SELECT 1/0"))
	require.ErrorContains(t, err, "division by zero")
	require.EqualValues(t, 2, count(), "a failed last statement rolls the job back")

	// A COMMIT sent through the transaction (as a plugin would) meets the
	// commit gate: refused, and everything before it is rolled back.
	tx = begin()
	_, err = tx.Exec(ctx, `INSERT INTO jobtx VALUES (4)`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `COMMIT`)
	require.ErrorContains(t, err, "only the host commits a job's transaction")
	tx.Rollback(ctx)
	require.EqualValues(t, 2, count(), "the plugin's COMMIT committed nothing")

	tx = begin() // the one connection came back usable
	tx.Rollback(ctx)
	tx.Rollback(ctx)
}
