package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/internal/doctest"
)

// A second enqueue with the same key and kind inside its window returns
// the first job's id and adds nothing, with pgx and with database/sql; the
// key is per kind; another key is another job; a rolled-back enqueue frees
// the key; after the window the key enqueues a new job.
func TestDedupSequential(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	job := client.Job{Kind: "award_points", Payload: map[string]int{"order_id": 4471}, DedupKey: "order-4471"}

	first, err := client.Enqueue(ctx, pool, job)
	require.NoError(t, err)
	again, err := client.Enqueue(ctx, pool, job)
	require.NoError(t, err)
	require.Equal(t, first, again, "the first job's id")
	viaSQL, err := client.EnqueueSQL(ctx, db, job)
	require.NoError(t, err)
	require.Equal(t, first, viaSQL, "database/sql sees the same key")
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox`), "one job")

	other := job
	other.Kind = "send_receipt"
	otherID, err := client.Enqueue(ctx, pool, other)
	require.NoError(t, err)
	require.NotEqual(t, first, otherID, "the key is per kind")
	otherKey := job
	otherKey.DedupKey = "order-4472"
	otherKeyID, err := client.Enqueue(ctx, pool, otherKey)
	require.NoError(t, err)
	require.NotEqual(t, first, otherKeyID)
	require.EqualValues(t, 3, hosttest.Count(t, pool, `SELECT count(*) FROM outbox`))

	// Rolled back: the key is free again, and the next enqueue is the job.
	rolled := job
	rolled.DedupKey = "order-4473"
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	gone, err := client.Enqueue(ctx, tx, rolled)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	kept, err := client.Enqueue(ctx, pool, rolled)
	require.NoError(t, err)
	require.NotEqual(t, gone, kept)
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1`, kept))

	// A short window: the same id while it holds, then a new job.
	short := job
	short.DedupKey, short.DedupWindow = "order-4474", 300*time.Millisecond
	start := time.Now()
	firstShort, err := client.Enqueue(ctx, pool, short)
	require.NoError(t, err)
	var next int64
	hosttest.Eventually(t, 10*time.Second, "the window to pass", func() bool {
		next, err = client.Enqueue(ctx, pool, short)
		require.NoError(t, err)
		if next == firstShort {
			require.Less(t, time.Since(start), 5*time.Second, "still the first job long after its window")
			return false
		}
		return true
	})
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "a new job only after the window")
	require.EqualValues(t, 2, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE payload->>'order_id' = '4471' AND id IN ($1, $2)`, firstShort, next))
	again, err = client.Enqueue(ctx, pool, short)
	require.NoError(t, err)
	require.Equal(t, next, again, "the new job holds the key for a window of its own")

	// The default window is a day.
	var window time.Duration
	require.NoError(t, pool.QueryRow(ctx, `SELECT extract(epoch FROM expires_at - created_at)::bigint * 1000000000
		FROM job_dedup_keys WHERE dedup_key = 'order-4471' AND kind = 'award_points'`).Scan(&window))
	require.Equal(t, client.DefaultDedupWindow, window)

	_, err = client.Enqueue(ctx, pool, client.Job{Kind: "k", DedupWindow: time.Hour})
	require.ErrorContains(t, err, "DedupWindow and no DedupKey")
	_, err = client.Enqueue(ctx, pool, client.Job{Kind: "k", DedupKey: "x", DedupWindow: -time.Second})
	require.ErrorContains(t, err, "negative DedupWindow")
}

// Many processes enqueueing the same key at once make one job: each of 16
// goroutines enqueues in its own transaction, released together and
// committed after a pause, so the claims overlap in the database.
func TestDedupConcurrent(t *testing.T) {
	t.Parallel()
	owner, dbURL := hosttest.DB(t)
	ctx := context.Background()
	const n = 16
	// A connection per goroutine: each holds its transaction open.
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.MaxConns = n
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	for round := range 3 {
		key := fmt.Sprintf("order-%d", round)
		var ready, release sync.WaitGroup
		ready.Add(n)
		release.Add(1)
		ids := make([]int64, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tx, err := pool.Begin(ctx)
				ready.Done()
				if err != nil {
					errs[i] = err
					return
				}
				defer tx.Rollback(ctx)
				release.Wait()
				if ids[i], errs[i] = client.Enqueue(ctx, tx, client.Job{Kind: "award_points", Payload: json.RawMessage(`{}`), DedupKey: key}); errs[i] != nil {
					return
				}
				time.Sleep(20 * time.Millisecond) // hold the claim while others wait on it
				errs[i] = tx.Commit(ctx)
			}()
		}
		ready.Wait()
		release.Done()
		wg.Wait()
		for i := range n {
			require.NoError(t, errs[i])
			require.Equal(t, ids[0], ids[i], "every enqueue answers the one job's id")
		}
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1`, ids[0]))
	}
	require.EqualValues(t, 3, hosttest.Count(t, owner, `SELECT count(*) FROM outbox`), "one job per key")
}

// From SQL, as any language's driver calls it: the six-argument form
// deduplicates, the four-argument form still enqueues every time, and the
// dedup form has its own grant, which a host refuses on a plugin's role.
// appConn connects as the application role usher_test_app (made once
// per cluster), granted EXECUTE on functions in this test's database.
func appConn(t *testing.T, pool *pgxpool.Pool, dbURL string, functions ...string) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, hosttest.AdminURL(t, dbURL))
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `DO $$ BEGIN
		IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'usher_test_app') THEN CREATE ROLE usher_test_app LOGIN; END IF;
	EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
	END $$`)
	require.NoError(t, err)
	for _, f := range functions {
		_, err = pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION `+f+` TO usher_test_app`)
		require.NoError(t, err)
	}
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User("usher_test_app")
	app, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = app.Close(context.Background()) })
	return app
}

func TestDedupFromSQL(t *testing.T) {
	t.Parallel()
	pool, dbURL := hosttest.DB(t)
	ctx := context.Background()
	enqueue := func(sql string, args ...any) int64 {
		t.Helper()
		var id int64
		require.NoError(t, pool.QueryRow(ctx, sql, args...).Scan(&id))
		return id
	}
	a := enqueue(`SELECT usher_enqueue_job('award_points', '{"order_id": 1}', NULL, NULL, 'order-1')`)
	b := enqueue(`SELECT usher_enqueue_job('award_points', '{"order_id": 1}', 'req-2', NULL, 'order-1', interval '1 hour')`)
	require.Equal(t, a, b)
	c := enqueue(`SELECT usher_enqueue_job('award_points', '{"order_id": 1}')`)
	d := enqueue(`SELECT usher_enqueue_job('award_points', '{"order_id": 1}', NULL, NULL, '')`)
	require.NotEqual(t, c, d, "no key: a job every time")
	require.EqualValues(t, 3, hosttest.Count(t, pool, `SELECT count(*) FROM outbox`))
	// Expired (as a window's end would leave it): taken over by a new job.
	_, err := pool.Exec(ctx, `UPDATE job_dedup_keys SET expires_at = now() - interval '1 second'`)
	require.NoError(t, err)
	e := enqueue(`SELECT usher_enqueue_job('award_points', '{"order_id": 1}', NULL, NULL, 'order-1')`)
	require.NotEqual(t, a, e)
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM job_dedup_keys`))

	_, err = pool.Exec(ctx, `SELECT usher_enqueue_job('award_points', '{}', NULL, NULL, 'k', interval '-1 second')`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Contains(t, pgErr.Message, "not positive")

	require.EqualValues(t, 0, hosttest.Count(t, pool, `
		SELECT count(*) FROM pg_proc p LEFT JOIN LATERAL aclexplode(p.proacl) a ON true
		WHERE p.proname IN ('usher_enqueue_job', 'usher_dedup_claim') AND (p.proacl IS NULL OR a.grantee = 0)`), "PUBLIC has no EXECUTE")
	role := sandbox.PluginRole("counters")
	_, err = pool.Exec(ctx, `GRANT EXECUTE ON FUNCTION `+sandbox.AppDedupEnqueueFunction+` TO `+role)
	require.NoError(t, err)
	require.ErrorContains(t, sandbox.CheckPluginRole(ctx, pool, "counters", role),
		"it may call usher_enqueue_job(text, jsonb, text, text, text, interval)")

	// Granted as the client's doc says, an application's role deduplicates.
	app := appConn(t, pool, dbURL, sandbox.AppDedupEnqueueFunction)
	f, err := client.Enqueue(ctx, app, client.Job{Kind: "award_points", DedupKey: "order-1"})
	require.NoError(t, err)
	require.Equal(t, e, f)

	// The README's statement, as written, twice: one job. Its grant is
	// the one given here.
	stmt := doctest.Block(t, "docs/plugins.md", "**Deduplication by a business key.**", "sql")
	require.Len(t, stmt, 1)
	var g, h int64
	require.NoError(t, app.QueryRow(ctx, stmt[0]).Scan(&g))
	require.NoError(t, app.QueryRow(ctx, stmt[0]).Scan(&h))
	require.Equal(t, g, h)
	require.Contains(t, doctest.Read(t, "docs/plugins.md"), "GRANT EXECUTE ON FUNCTION "+sandbox.AppDedupEnqueueFunction+" TO app;")
}
