package client_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/internal/doctest"
)

// A job's priority, from Go and from SQL: stored on its outbox row, the
// default (3) when it names none, refused outside 1 to 5 with the range
// in the message; with a key, deduplicated as any. The seven-argument
// form has its own grant, which a plugin role may not hold.
func TestEnqueuePriority(t *testing.T) {
	t.Parallel()
	pool, dbURL := hosttest.DB(t)
	ctx := context.Background()
	priority := func(id int64) int64 {
		t.Helper()
		return hosttest.Count(t, pool, `SELECT priority FROM outbox WHERE id = $1`, id)
	}
	for _, tc := range []struct {
		job  client.Job
		want int64
	}{
		{client.Job{Kind: "send_tickets"}, 3},
		{client.Job{Kind: "send_tickets", Priority: client.HighestPriority}, 1},
		{client.Job{Kind: "send_tickets", Priority: client.DefaultPriority}, 3},
		{client.Job{Kind: "send_tickets", Priority: client.LowestPriority, RequestID: "req-1"}, 5},
		{client.Job{Kind: "send_tickets", Priority: 2, DedupKey: "order-7"}, 2},
	} {
		id, err := client.Enqueue(ctx, pool, tc.job)
		require.NoError(t, err)
		require.Equal(t, tc.want, priority(id), "%+v", tc.job)
	}
	again, err := client.Enqueue(ctx, pool, client.Job{Kind: "send_tickets", Priority: 1, DedupKey: "order-7"})
	require.NoError(t, err)
	require.Equal(t, int64(2), priority(again), "a duplicate is the first job, at its priority")

	for _, p := range []int{-1, 6} {
		_, err := client.Enqueue(ctx, pool, client.Job{Kind: "send_tickets", Priority: p})
		require.ErrorContains(t, err, "a priority is 1 (the highest) to 5 (the lowest), 3 by default")
	}
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT usher_enqueue_job('send_tickets', '{}', NULL, NULL, NULL, NULL, 1)`).Scan(&id))
	require.Equal(t, int64(1), priority(id))
	require.NoError(t, pool.QueryRow(ctx, `SELECT usher_enqueue_job('send_tickets', '{}', NULL, NULL, NULL, NULL, NULL)`).Scan(&id))
	require.Equal(t, int64(3), priority(id))
	_, err = pool.Exec(ctx, `SELECT usher_enqueue_job('send_tickets', '{}', NULL, NULL, NULL, NULL, 9)`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "22023", pgErr.Code, "invalid_parameter_value")
	require.Contains(t, pgErr.Message, "send_tickets job has priority 9: a priority is 1 (the highest) to 5 (the lowest), 3 by default")
	_, err = pool.Exec(ctx, `INSERT INTO outbox (kind, payload, priority) VALUES ('k', '{}', 0)`)
	require.ErrorContains(t, err, "outbox_priority", "the table refuses it too")

	require.EqualValues(t, 0, hosttest.Count(t, pool, `
		SELECT count(*) FROM pg_proc p LEFT JOIN LATERAL aclexplode(p.proacl) a ON true
		WHERE p.proname = 'usher_enqueue_job' AND (p.proacl IS NULL OR a.grantee = 0)`), "PUBLIC has no EXECUTE")
	role := sandbox.PluginRole("counters")
	_, err = pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION `+sandbox.AppPriorityEnqueueFunction+` TO `+role)
	require.NoError(t, err)
	require.ErrorContains(t, sandbox.CheckPluginRole(ctx, pool, "counters", role),
		"it may call usher_enqueue_job(text, jsonb, text, text, text, interval, integer)")

	// An application granted only the four-argument form is told, by
	// the server, that a priority needs the other grant.
	app := appConn(t, pool, dbURL, sandbox.AppEnqueueFunction)
	_, err = client.Enqueue(ctx, app, client.Job{Kind: "send_tickets"})
	require.NoError(t, err)
	_, err = client.Enqueue(ctx, app, client.Job{Kind: "send_tickets", Priority: 1})
	require.ErrorContains(t, err, "permission denied for function usher_enqueue_job")
	_, err = pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION `+sandbox.AppPriorityEnqueueFunction+` TO usher_test_app`)
	require.NoError(t, err)
	id, err = client.Enqueue(ctx, app, client.Job{Kind: "send_tickets", Priority: 1})
	require.NoError(t, err)
	require.Equal(t, int64(1), priority(id))

	// The guide's statement and grant, as written.
	stmt := doctest.Block(t, "docs/plugins.md", "**Priorities.**", "sql")
	require.Len(t, stmt, 1)
	require.NoError(t, app.QueryRow(ctx, stmt[0]).Scan(&id))
	require.Equal(t, int64(1), priority(id))
	require.Contains(t, doctest.Read(t, "docs/plugins.md"), "GRANT EXECUTE ON FUNCTION "+sandbox.AppPriorityEnqueueFunction+" TO app;")
}
