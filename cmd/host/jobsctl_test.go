package main

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/internal/doctest"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// host jobs enqueue, jobs list and wait --idle as an operator types them:
// an idle runtime waits for nothing; two orders' counter jobs enqueued
// from the command line (one twice under its dedup key, enqueued once)
// keep wait --idle from exiting 0, listed as pending, the list saying
// when --limit cut it; a host started then applies them, wait --idle
// exits 0, and each counter is exact.
func TestJobsEnqueueListAndWaitIdle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, db := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	require.NoError(t, rdb.XGroupCreateMkStream(ctx, stream, "usher", "0").Err())
	bin := hosttest.Build(t, "./cmd/host")
	env := []string{"DATABASE_URL=" + db, "USHER_STREAM=" + stream, "REDIS_URL=" + hosttest.RedisURL()}
	run := func(code int, args ...string) string {
		t.Helper()
		r := runHost(t, bin, env, args...)
		require.Equal(t, code, r.code, "%q: %s%s", args, r.stdout, r.stderr)
		if code != 0 {
			return r.stderr
		}
		return r.stdout
	}

	require.Contains(t, run(0, "wait", "--idle", "--timeout", "5s"), "idle after ")

	ev, err := orders.CreateEvent(ctx, pool, "Nils Frahm", "Funkhaus")
	require.NoError(t, err)
	var placed []orders.Placed
	for seats := range 2 {
		p, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "Zoë", Email: "zoe@example.com", Seats: 2 + seats}, orders.Jobs{})
		require.NoError(t, err)
		placed = append(placed, p)
	}
	var ids []string
	for i, p := range placed {
		payload := fmt.Sprintf(`{"order_id": %d}`, p.ID)
		out := run(0, "jobs", "enqueue", "update_sales_counter", payload, "--dedup-key", fmt.Sprintf("order-%d", p.ID))
		require.Contains(t, out, "enqueued update_sales_counter job ")
		var id int64
		_, err := fmt.Sscanf(out, "enqueued update_sales_counter job %d", &id)
		require.NoError(t, err)
		ids = append(ids, fmt.Sprint(id))
		if i == 0 {
			require.Contains(t, run(0, "jobs", "enqueue", "update_sales_counter", payload, "--dedup-key", fmt.Sprintf("order-%d", p.ID)),
				fmt.Sprintf("job %d holds dedup key \"order-%d\" of update_sales_counter: nothing enqueued", id, p.ID))
			var dup enqueued
			require.NoError(t, json.Unmarshal([]byte(run(0, "jobs", "enqueue", "update_sales_counter", payload, "--dedup-key", fmt.Sprintf("order-%d", p.ID), "--json")), &dup))
			require.Equal(t, enqueued{ID: id, Duplicate: true}, dup)
		}
	}
	require.EqualValues(t, 2, hosttest.Count(t, pool, `SELECT count(*) FROM outbox`), "the duplicate enqueued nothing")
	run(2, "jobs", "enqueue", "update_sales_counter", "{order_id: 1}")
	run(2, "jobs", "enqueue", "update_sales_counter")
	run(2, "jobs", "enqueue", "k", "{}", "--dedup-window", "1h")

	require.Contains(t, run(1, "wait", "--idle", "--timeout", "300ms"), "not idle after 300ms: 2 outbox row(s) unfinished (2 unpublished)")
	out := run(0, "jobs", "list")
	for _, id := range ids {
		require.Regexp(t, `(?m)^`+id+` +update_sales_counter +pending +1 `, out)
	}
	require.Contains(t, out, "2 job(s)")
	out = run(0, "jobs", "list", "--limit", "1")
	require.Contains(t, out, ids[1], "newest first")
	require.NotRegexp(t, `(?m)^`+ids[0]+` `, out)
	require.Contains(t, out, "showing the newest 1 of 2 matching jobs: --limit 2 shows them all")
	require.Contains(t, run(0, "jobs", "list", "--state", "done"), "no job matches")
	require.Contains(t, run(0, "jobs", "list", "--kind", "render_tickets"), "no job matches")
	require.Contains(t, run(2, "jobs", "list", "--state", "finished"), `--state "finished": one of pending, running, waiting_to_retry, done, dead_lettered`)
	var listed listedShown
	require.NoError(t, json.Unmarshal([]byte(run(0, "jobs", "list", "--json", "--limit", "1", "--kind", "update_sales_counter")), &listed))
	require.Equal(t, 2, listed.Total)
	require.True(t, listed.Cut)
	require.Len(t, listed.Jobs, 1)

	hosttest.Start(t, host.Config{DatabaseURL: db, Redis: rdb, Stream: stream, Plugins: []string{hosttest.Build(t, "./plugins/counters")},
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond})
	require.Contains(t, run(0, "wait", "--idle", "--timeout", "60s"), "idle after ")
	out = run(0, "jobs", "list", "--state", "done")
	for _, id := range ids {
		require.Regexp(t, `(?m)^`+id+` +update_sales_counter +done +1 `, out)
	}
	require.EqualValues(t, 5, hosttest.Count(t, pool, `SELECT seats_sold FROM events WHERE id = $1`, ev), "2 + 3 seats, each order counted once")
}

// The README's enqueue, list and wait commands, run as written by sh on
// the database, stream and Redis the environment names: order 1's
// counter job enqueued (again: the same job, nothing added), listed as
// pending, and wait --idle exiting 0 once a host applied it.
func TestREADMEJobsCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	require.NoError(t, rdb.XGroupCreateMkStream(ctx, stream, "usher", "0").Err())
	ev, err := orders.CreateEvent(ctx, pool, "Nils Frahm", "Funkhaus")
	require.NoError(t, err)
	p, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "Zoë", Email: "zoe@example.com", Seats: 4}, orders.Jobs{})
	require.NoError(t, err)
	require.EqualValues(t, 1, p.ID, "the README's order 1")

	dir := binDir(t)
	env := []string{"DATABASE_URL=" + dbURL, "USHER_STREAM=" + stream, "REDIS_URL=" + hosttest.RedisURL()}
	lines := doctest.Block(t, "docs/operating.md", "**Enqueue, list, wait.**", "sh")
	require.Len(t, lines, 3)
	out := readmeShell(t, dir, env, lines[0])
	var id int64
	_, err = fmt.Sscanf(out, "enqueued update_sales_counter job %d\n", &id)
	require.NoError(t, err, out)
	require.Contains(t, readmeShell(t, dir, env, lines[0]), fmt.Sprintf("job %d holds dedup key \"order-1\"", id))
	out = readmeShell(t, dir, env, lines[1])
	require.Regexp(t, fmt.Sprintf(`(?m)^%d +update_sales_counter +pending `, id), out)
	require.Contains(t, out, "1 job(s)")

	hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream, Plugins: []string{hosttest.Build(t, "./plugins/counters")},
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond})
	require.Contains(t, readmeShell(t, dir, env, lines[2]), "idle after ")
	require.EqualValues(t, 4, hosttest.Count(t, pool, `SELECT seats_sold FROM events WHERE id = $1`, ev), "counted once")
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox`))
}
