package sandbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
)

// Every plugin session the host opens carries lock_timeout,
// idle_in_transaction_session_timeout and TCP keepalives, given at login:
// what the plugin sets in its session is undone by the reset, back to
// them.
func TestPluginSessionBounds(t *testing.T) {
	t.Parallel()
	owner, _ := hosttest.DB(t)
	ctx := context.Background()
	require.NoError(t, sandbox.Prepare(ctx, owner, "raw", "usher_plugin_raw", []string{"raw_job"}, nil))
	pool, err := sandbox.OpenPluginPool(ctx, sandbox.PoolConfig{Base: owner.Config(), Role: "usher_plugin_raw", Size: 1,
		LockTimeout: 1500 * time.Millisecond, IdleInTransactionTimeout: 4 * time.Second})
	require.NoError(t, err)
	defer pool.Close()
	settings := func() map[string]string {
		rows, err := pool.Query(ctx, `SELECT name, setting FROM pg_settings WHERE name IN
			('lock_timeout', 'idle_in_transaction_session_timeout', 'tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_keepalives_count')`)
		require.NoError(t, err)
		m := map[string]string{}
		for rows.Next() {
			var k, v string
			require.NoError(t, rows.Scan(&k, &v))
			m[k] = v
		}
		require.NoError(t, rows.Err())
		return m
	}
	want := map[string]string{"lock_timeout": "1500", "idle_in_transaction_session_timeout": "4000",
		"tcp_keepalives_idle": "30", "tcp_keepalives_interval": "10", "tcp_keepalives_count": "3"}
	require.Equal(t, want, settings())
	// The plugin turns them off in its session; the reset brings them back.
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = c.Exec(ctx, "SET lock_timeout = 0; SET idle_in_transaction_session_timeout = 0")
	require.NoError(t, err)
	c.Release()
	require.Equal(t, want, settings())
}

// A host frozen inside a transaction (SIGSTOP: its process sends nothing,
// its kernel still answers) does not hold its locks for ever: the server
// ends the session after its idle_in_transaction_session_timeout, and the
// transaction of another host waiting on the same row goes on. Before,
// the waiter waited for as long as the frozen host was stopped.
func TestFrozenSessionReleasesLocks(t *testing.T) {
	t.Parallel()
	owner, _ := hosttest.DB(t)
	ctx := context.Background()
	_, err := owner.Exec(ctx, `CREATE TABLE frozen_rows (id int PRIMARY KEY, n int NOT NULL);
		INSERT INTO frozen_rows VALUES (1, 0);
		GRANT SELECT, UPDATE ON frozen_rows TO usher_plugin_raw`)
	require.NoError(t, err)
	require.NoError(t, sandbox.Prepare(ctx, owner, "raw", "usher_plugin_raw", []string{"raw_job"}, nil))
	pool, err := sandbox.OpenPluginPool(ctx, sandbox.PoolConfig{Base: owner.Config(), Role: "usher_plugin_raw", Size: 1,
		IdleInTransactionTimeout: time.Second})
	require.NoError(t, err)
	defer pool.Close()

	// The frozen host: a batch's transaction that took the row's lock,
	// then nothing.
	frozen, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer frozen.Release()
	_, err = frozen.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	_, err = frozen.Exec(ctx, "UPDATE frozen_rows SET n = n + 1 WHERE id = 1")
	require.NoError(t, err)

	// The host that reclaimed the job updates the same row.
	other, err := pgx.ConnectConfig(ctx, owner.Config().ConnConfig)
	require.NoError(t, err)
	defer other.Close(ctx)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err = other.Exec(wctx, "UPDATE frozen_rows SET n = n + 10 WHERE id = 1")
	require.NoError(t, err, "the waiter was blocked by the frozen session's lock")
	require.Less(t, time.Since(start), 15*time.Second)
	// The frozen session was ended by the server, its update rolled back.
	_, err = frozen.Exec(ctx, "SELECT 1")
	require.Error(t, err)
	require.EqualValues(t, 10, hosttest.Count(t, owner, "SELECT n FROM frozen_rows WHERE id = 1"))
}
