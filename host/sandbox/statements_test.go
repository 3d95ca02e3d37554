package sandbox_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
)

// A plugin's write that ran on a connection is prepared there while the
// connection is idle, and runs by name after; whatever the plugin does to
// the session's prepared statements (its own PREPARE, a name of the
// host's taken over or dropped) is undone at the reset, with the host's
// own, before the connection is used again.
func TestPreparedWrites(t *testing.T) {
	t.Parallel()
	owner, _ := hosttest.DB(t)
	ctx := context.Background()
	_, err := owner.Exec(ctx, `CREATE TABLE prepared_writes (n int); GRANT SELECT, INSERT ON prepared_writes TO usher_plugin_raw`)
	require.NoError(t, err)
	// One connection: every step below gets the connection the step
	// before gave back, after its pool's reset.
	pool := hosttest.RawPool(t, owner, 1)

	const write = "INSERT INTO prepared_writes VALUES ($1)"
	// use runs fn on the pool's connection in a transaction (committed)
	// and gives the connection back to its pool.
	use := func(fn func(conn *pgx.Conn)) {
		t.Helper()
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer c.Release()
		_, err = c.Exec(ctx, "BEGIN")
		require.NoError(t, err)
		fn(c.Conn())
		_, err = c.Exec(ctx, "COMMIT")
		require.NoError(t, err)
	}
	run := func(conn *pgx.Conn, n int) (named bool) { return run2(t, conn, write, n) }
	statements := func(conn *pgx.Conn) (host, plugin int64) {
		t.Helper()
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT from_sql), count(*) FILTER (WHERE from_sql)
			FROM pg_prepared_statements`).Scan(&host, &plugin))
		return host, plugin
	}
	sum := func() int64 { return hosttest.Count(t, owner, `SELECT coalesce(sum(n), 0) FROM prepared_writes`) }

	use(func(conn *pgx.Conn) { require.False(t, run(conn, 1), "the first run is unnamed") })
	use(func(conn *pgx.Conn) {
		require.True(t, run(conn, 2), "prepared while the connection was idle")
		host, plugin := statements(conn)
		require.EqualValues(t, 1, host)
		require.Zero(t, plugin)
	})
	require.EqualValues(t, 3, sum())

	// The plugin takes the name over for SQL of its own: it runs so in
	// this transaction, and not after the reset.
	use(func(conn *pgx.Conn) {
		name, ok := sandbox.WriteName(conn, write)
		require.True(t, ok)
		_, err := conn.Exec(ctx, "DEALLOCATE "+name)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, fmt.Sprintf("PREPARE %s (int) AS INSERT INTO prepared_writes VALUES ($1 * 100)", name))
		require.NoError(t, err)
		require.True(t, run(conn, 4))
	})
	require.EqualValues(t, 403, sum(), "the taken-over name ran the plugin's SQL")
	use(func(conn *pgx.Conn) {
		host, plugin := statements(conn)
		require.Zero(t, host, "the reset deallocated every statement")
		require.Zero(t, plugin)
		require.False(t, run(conn, 5), "forgotten: unnamed again")
	})
	use(func(conn *pgx.Conn) { require.True(t, run(conn, 6)) })
	require.EqualValues(t, 414, sum())

	// A name of the host's dropped: the reset finds one statement short.
	use(func(conn *pgx.Conn) {
		name, _ := sandbox.WriteName(conn, write)
		_, err := conn.Exec(ctx, "DEALLOCATE "+name)
		require.NoError(t, err)
	})
	use(func(conn *pgx.Conn) {
		host, _ := statements(conn)
		require.Zero(t, host)
		require.False(t, run(conn, 7), "a dropped name is forgotten, not run")
	})
	// A statement of the plugin's own does not outlive its call.
	use(func(conn *pgx.Conn) {
		_, err := conn.Exec(ctx, "PREPARE mine AS SELECT 1")
		require.NoError(t, err)
	})
	use(func(conn *pgx.Conn) {
		_, plugin := statements(conn)
		require.Zero(t, plugin)
	})
	// A batch that failed with named writes spoils them.
	use(func(conn *pgx.Conn) { run(conn, 8) })
	use(func(conn *pgx.Conn) {
		require.True(t, run(conn, 9))
		sandbox.SpoilWrites(conn)
	})
	use(func(conn *pgx.Conn) { require.False(t, run(conn, 10), "spoiled: deallocated") })
	require.EqualValues(t, 448, sum())

	// Preparing a write parses it again, outside any job's transaction:
	// what its parse runs (a domain's check on a cast the server folds)
	// writes nothing there. Only the runs' own transactions write.
	hosttest.ParseWriter(t, owner, "parse", "usher_plugin_raw")
	const sneaky = "INSERT INTO prepared_writes SELECT $1::int WHERE '{1}'::parse_dom[] IS NOT NULL"
	// inRuns counts what the runs' own transactions wrote.
	var inRuns int64
	counted := func(conn *pgx.Conn, fn func()) {
		var before, after int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM parse_effects`).Scan(&before))
		fn()
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM parse_effects`).Scan(&after))
		inRuns += after - before
	}
	use(func(conn *pgx.Conn) { counted(conn, func() { require.False(t, run2(t, conn, sneaky, 0)) }) })
	use(func(conn *pgx.Conn) {
		counted(conn, func() { require.False(t, run2(t, conn, sneaky, 0), "its preparation failed: unnamed") })
	})
	require.Positive(t, inRuns)
	require.Equal(t, inRuns, hosttest.Count(t, owner, `SELECT count(*) FROM parse_effects`),
		"the preparation while the connection was idle wrote nothing")

	// At most MaxPreparedWrites a connection.
	use(func(conn *pgx.Conn) {
		for i := range sandbox.MaxPreparedWrites + 5 {
			sql := fmt.Sprintf("INSERT INTO prepared_writes VALUES ($1) -- %d", i)
			_, err := conn.Exec(ctx, sql, 0)
			require.NoError(t, err)
			sandbox.NoteWrite(conn, sql)
		}
	})
	use(func(conn *pgx.Conn) {
		host, _ := statements(conn)
		require.LessOrEqual(t, host, int64(sandbox.MaxPreparedWrites))
		require.Greater(t, host, int64(1))
	})
	// Nor a long one: its plan could hold many times its size.
	long := fmt.Sprintf("INSERT INTO prepared_writes SELECT $1::int WHERE %strue", strings.Repeat("true AND ", sandbox.MaxPreparedWriteBytes/9))
	use(func(conn *pgx.Conn) { require.False(t, run2(t, conn, long, 0)) })
	use(func(conn *pgx.Conn) { require.False(t, run2(t, conn, long, 0), "a long write is never prepared") })

	// A preparation that cannot finish in the release's time (its table
	// locked by another session) is given up: the connection handed out
	// next is usable (the same one, its statement cancelled, or a new one
	// when the old was closed; never a closed one).
	locked := make(chan struct{})
	hold := make(chan error, 1)
	use(func(conn *pgx.Conn) {
		run2(t, conn, write+" -- locked", 11)
		go func() {
			hold <- pgx.BeginFunc(ctx, owner, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, `LOCK TABLE prepared_writes IN ACCESS EXCLUSIVE MODE`); err != nil {
					return err
				}
				close(locked)
				_, err := tx.Exec(ctx, `SELECT pg_sleep(6)`)
				return err
			})
		}()
		hosttest.Eventually(t, 10*time.Second, "the lock queued behind this transaction", func() bool {
			return hosttest.Count(t, owner, `SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
				WHERE c.relname = 'prepared_writes' AND NOT l.granted
				  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`) > 0
		})
	})
	<-locked
	use(func(conn *pgx.Conn) {
		require.False(t, conn.IsClosed())
		run(conn, 12)
	})
	require.NoError(t, <-hold)
	require.EqualValues(t, 471, sum())
}

// run2 runs sql as writeAll does: by name when it is prepared on conn,
// and noted when it ran unnamed.
func run2(t *testing.T, conn *pgx.Conn, sql string, n int) (named bool) {
	t.Helper()
	q := sql
	if name, ok := sandbox.WriteName(conn, sql); ok {
		q, named = name, true
	}
	_, err := conn.Exec(context.Background(), q, n)
	require.NoError(t, err)
	if !named {
		sandbox.NoteWrite(conn, sql)
	}
	return named
}
