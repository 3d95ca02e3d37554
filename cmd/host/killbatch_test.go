package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// kill -9 of a host while a batch of job-id jobs has sent its writes and
// not committed (chosen by holding a lock its writes wait for): the batch
// dies with the connection, its entries stay pending, and the next host
// applies each job once. Batching does not widen what a crash can double.
func TestHostKilledMidBatch(t *testing.T) {
	t.Parallel()
	pool, url := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	ctx := context.Background()
	bin := hosttest.Build(t, "./cmd/host")
	counters := hosttest.Build(t, "./plugins/counters/chaos")
	var evs [2]int64
	for i := range evs {
		var err error
		evs[i], err = orders.CreateEvent(ctx, pool, "Batch", "Hall")
		require.NoError(t, err)
	}
	want := map[int64]int64{}
	for i := range 60 {
		ev := evs[i%2]
		_, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "B", Email: "b@example.com", Seats: 1 + i%3}, orders.Jobs{Counter: true})
		require.NoError(t, err)
		want[ev] += int64(1 + i%3)
	}

	// Every entry on the stream before the host reads: had the host's own
	// relay published them, its first read could take only the first of
	// them (a read blocked on the stream wakes at the first XADD), and
	// that batch of one, waiting on the held row, would keep the others
	// out of a batch for StalledAfter.
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Redis: rdb, Stream: stream, Key: hosttest.SigningKey(t, pool)})
	require.NoError(t, err)
	for deadline := time.Now().Add(30 * time.Second); hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) > 0; {
		require.True(t, time.Now().Before(deadline), "the relay published every job within 30s")
		_, err := relay.RelayOnce(ctx)
		require.NoError(t, err)
	}

	// Every batch writes the first event's counter: hold its row.
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer lock.Rollback(ctx)
	_, err = lock.Exec(ctx, `SELECT 1 FROM events WHERE id = $1 FOR UPDATE`, evs[0])
	require.NoError(t, err)

	start := func(consumer string) *exec.Cmd {
		// Not called off as stalled while the test holds the row.
		cmd := exec.Command(bin, "run", "--database-url", url, "--stream", stream, "--plugins", counters, "--admin-addr", "",
			"--consumer", consumer, "--reclaim-idle", "1s", "--stalled-after", "1m")
		logf, err := os.Create(filepath.Join(t.TempDir(), consumer+".log"))
		require.NoError(t, err)
		cmd.Stdout, cmd.Stderr = io.Discard, logf
		t.Cleanup(func() { b, _ := os.ReadFile(logf.Name()); t.Logf("%s log:\n%.3000s", consumer, b) })
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	// Only an administrator sees other logins' waits in pg_stat_activity.
	admin, err := pgxpool.New(ctx, hosttest.AdminURL(t, url))
	require.NoError(t, err)
	defer admin.Close()
	first := start("first")
	// A transaction waiting on the held row with several jobs recorded
	// (uncommitted rows of processed_jobs, which only pageinspect shows):
	// a batch that has sent its writes.
	_, err = admin.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pageinspect`)
	require.NoError(t, err)
	var inBatch int64
	hosttest.Eventually(t, 30*time.Second, "a batch's writes waiting on the held row", func() bool {
		inBatch = hosttest.Count(t, admin, `
			SELECT coalesce(max(n), 0) FROM (
				SELECT count(*) AS n
				FROM pg_stat_activity a,
				     generate_series(0, pg_relation_size('processed_jobs') / current_setting('block_size')::int - 1) p,
				     heap_page_items(get_raw_page('processed_jobs', p::int)) i
				WHERE a.usename = 'usher_plugin_counters' AND a.wait_event_type = 'Lock' AND a.datname = current_database()
				  AND i.t_xmin::text = a.backend_xid::text
				GROUP BY a.pid) b`)
		return inBatch >= 2
	})
	pending := hosttest.Pending(t, rdb, stream, "usher")
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()
	require.NoError(t, lock.Rollback(ctx))
	// The server ends each of the dead host's sessions when it next
	// reads or writes its socket. Only this database's sessions count:
	// other tests' hosts run the counters plugin as the same role (this
	// wait once counted their transactions too, and timed out beside
	// them). What is still open is logged.
	open := func() int64 {
		return hosttest.Count(t, admin, `SELECT count(*) FROM pg_stat_activity WHERE usename = 'usher_plugin_counters' AND backend_xid IS NOT NULL AND datname = current_database()`)
	}
	for deadline := time.Now().Add(30 * time.Second); open() > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().Before(deadline) {
			continue
		}
		rows, err := admin.Query(ctx, `SELECT pid, state, coalesce(wait_event_type, ''), coalesce(wait_event, ''), left(query, 120)
			FROM pg_stat_activity WHERE usename = 'usher_plugin_counters' AND datname = current_database()`)
		require.NoError(t, err)
		for rows.Next() {
			var pid int
			var state, wtype, wevent, query string
			require.NoError(t, rows.Scan(&pid, &state, &wtype, &wevent, &query))
			t.Logf("plugin session %d: %s, waiting %s/%s: %s", pid, state, wtype, wevent, query)
		}
		rows.Close()
		t.Fatal("the killed host's transactions did not end within 30s")
	}
	t.Logf("killed with %d entries pending, %d of them in the waiting batch; %d jobs committed before", pending, inBatch, hosttest.Count(t, pool, `SELECT count(*) FROM processed_jobs`))

	start("second")
	hosttest.Eventually(t, 60*time.Second, "every job applied and nothing pending", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM processed_jobs`) == 60 && hosttest.Pending(t, rdb, stream, "usher") == 0
	})
	for ev, seats := range want {
		require.Equal(t, seats, hosttest.Count(t, pool, `SELECT seats_sold FROM events WHERE id = $1`, ev), "event %d", ev)
	}
	require.EqualValues(t, 60, hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies`), "zero lost, zero doubled")
	require.EqualValues(t, 60, hosttest.Count(t, pool, `SELECT count(DISTINCT job_id) FROM counter_applies`))
}
