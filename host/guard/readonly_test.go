package guard_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// A read-only batch of one statement runs in the round trip after its
// transaction's BEGIN, with the check that nothing was written, the
// ROLLBACK and the session's reset. Each way a plugin could use that
// statement against it is refused or undone (a write its parse runs
// included), and the pool's one connection comes back clean for the next
// handle after each.
func TestReadOnlyOneStatement(t *testing.T) {
	t.Parallel()
	owner, _ := hosttest.DB(t)
	ctx := context.Background()
	_, err := owner.Exec(ctx, `CREATE TABLE ro_effects (n int); GRANT SELECT, INSERT ON ro_effects TO usher_plugin_raw`)
	require.NoError(t, err)
	// A domain whose check writes, run by a cast the server folds while
	// it parses a statement: the parse must happen inside the read-only
	// transaction too.
	hosttest.ParseWriter(t, owner, "parse", "usher_plugin_raw")
	pool := hosttest.RawPool(t, owner, 1)
	hs := guard.NewHandles("public", nil)
	job := &usherv1.Job{Kind: "raw_job", Id: "ro-1"}
	exec := func(sql string) (*usherv1.ExecResponse, error) {
		h := guard.IssueReadOnly(hs, ctx, job, pool, "usher_plugin_raw")
		return hs.Exec(ctx, &usherv1.ExecRequest{Handle: h, Statements: []*usherv1.Statement{{Mode: usherv1.Mode_MODE_QUERY, Sql: sql}}})
	}
	one := func(sql string) *usherv1.StatementResult {
		t.Helper()
		res, err := exec(sql)
		require.NoError(t, err, sql)
		require.Len(t, res.GetResults(), 1)
		return res.GetResults()[0]
	}
	// clean checks that the connection is out of any transaction, that
	// what outlives a ROLLBACK (an advisory lock, a prepared statement)
	// is gone, and that nothing was written. (A setting the statement
	// made is undone by the ROLLBACK already.)
	clean := func() {
		t.Helper()
		r := one(`SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
			(SELECT count(*) FROM pg_prepared_statements WHERE from_sql),
			(SELECT count(*) FROM ro_effects) + (SELECT count(*) FROM parse_effects)`)
		require.Len(t, r.GetRows(), 1)
		vals := r.GetRows()[0].GetValues()
		require.EqualValues(t, 0, vals[0].GetInt(), "the advisory lock was released")
		require.EqualValues(t, 0, vals[1].GetInt(), "the prepared statement was deallocated")
		require.EqualValues(t, 0, vals[2].GetInt(), "nothing was written")
	}

	r := one(`SELECT n FROM generate_series(1, 3) n`)
	require.Equal(t, []string{"n"}, r.GetColumns())
	require.Len(t, r.GetRows(), 3)

	// Session state a query leaves behind is reset before the next use.
	one(`SELECT pg_advisory_lock(7)`)
	clean()
	one(`PREPARE left_behind AS SELECT 1`)
	clean()
	one(`DECLARE held CURSOR WITH HOLD FOR SELECT 1`)
	clean()
	one(`SET TRANSACTION READ WRITE`)
	clean()

	for _, c := range []struct{ sql, want string }{
		{`COMMIT`, "controlled the host's transaction (COMMIT)"},
		{`COMMIT AND CHAIN`, "controlled the host's transaction (COMMIT)"},
		{`ROLLBACK`, "controlled the host's transaction (ROLLBACK)"},
		{`SAVEPOINT s`, "controlled the host's transaction (SAVEPOINT)"},
		{`INSERT INTO ro_effects VALUES (1)`, "read-only transaction"},
		{`SELECT '{1}'::parse_dom[]`, "read-only transaction"},
		// An id assigned is a write the database recorded.
		{`SELECT pg_catalog.txid_current()`, "a read-only phase wrote"},
		{`SELECT 1/0`, "division by zero"},
		{`SELEKT 1`, "syntax error"},
		{`SELECT * FROM no_such_table`, "does not exist"},
	} {
		_, err := exec(c.sql)
		require.ErrorContains(t, err, c.want, c.sql)
		require.Contains(t, []codes.Code{codes.PermissionDenied, codes.InvalidArgument}, status.Code(err), c.sql)
		clean()
	}

	// A handle the plugin broke refuses its next statement.
	h := guard.IssueReadOnly(hs, ctx, job, pool, "usher_plugin_raw")
	commit := []*usherv1.Statement{{Mode: usherv1.Mode_MODE_QUERY, Sql: `COMMIT`}}
	_, err = hs.Exec(ctx, &usherv1.ExecRequest{Handle: h, Statements: commit})
	require.Error(t, err)
	_, err = hs.Exec(ctx, &usherv1.ExecRequest{Handle: h, Statements: []*usherv1.Statement{{Mode: usherv1.Mode_MODE_QUERY, Sql: `SELECT 1`}}})
	require.ErrorContains(t, err, "controlled the host's transaction")
}

// The host's own statements on a plugin's pool (a claim, its mark) run in
// one round trip with their transaction's COMMIT and the session's reset,
// after their BEGIN's. What the plugin's triggers leave on the session (a
// setting, an advisory lock, a prepared statement) is reset before the
// next use, and the reset failing (its check finds the prepared
// statement) undoes nothing the transaction committed.
func TestWithResetCommitsApartFromTheReset(t *testing.T) {
	t.Parallel()
	owner, _ := hosttest.DB(t)
	ctx := context.Background()
	_, err := owner.Exec(ctx, `
		CREATE TABLE claimlike (k text PRIMARY KEY);
		GRANT SELECT, INSERT ON claimlike TO usher_plugin_raw;
		CREATE FUNCTION claimlike_leave() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			PERFORM set_config('application_name', 'left behind', false), pg_advisory_lock(9);
			IF NEW.k = 'prepare' THEN
				EXECUTE 'PREPARE left_behind AS SELECT 1';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER claimlike_leave BEFORE INSERT ON claimlike FOR EACH ROW EXECUTE FUNCTION claimlike_leave()`)
	require.NoError(t, err)
	pool := hosttest.RawPool(t, owner, 1)
	insert := func(k string) error {
		return guard.WithReset(ctx, pool, "public", "BEGIN", func(b *pgx.Batch) {
			b.Queue("INSERT INTO claimlike VALUES ($1)", k)
			b.Queue("COMMIT")
		}, func(br pgx.BatchResults) error {
			for range 2 {
				if _, err := br.Exec(); err != nil {
					return err
				}
			}
			return nil
		})
	}
	session := func() (app string, locks, prepared int64) {
		t.Helper()
		require.NoError(t, guard.WithReset(ctx, pool, "public", "", func(b *pgx.Batch) {
			b.Queue(`SELECT current_setting('application_name'),
				(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
				(SELECT count(*) FROM pg_prepared_statements WHERE from_sql)`)
		}, func(br pgx.BatchResults) error {
			return br.QueryRow().Scan(&app, &locks, &prepared)
		}))
		return app, locks, prepared
	}
	clean := func() {
		t.Helper()
		app, locks, prepared := session()
		require.NotEqual(t, "left behind", app)
		require.Zero(t, locks)
		require.Zero(t, prepared)
	}

	require.NoError(t, insert("a"))
	clean()
	require.NoError(t, insert("prepare"), "the check's failure is the reset's, not the transaction's")
	clean()
	require.EqualValues(t, 2, hosttest.Count(t, owner, `SELECT count(*) FROM claimlike`))

	// A statement that fails rolls its transaction back; the connection
	// comes back out of it.
	require.ErrorContains(t, insert("a"), "duplicate key")
	clean()
	require.EqualValues(t, 2, hosttest.Count(t, owner, `SELECT count(*) FROM claimlike`))
}
