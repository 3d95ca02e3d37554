package ops_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/ops"
)

// Each thing that keeps the runtime from idle is counted and named, and
// idle is none of them: an unpublished outbox row, a scheduled run, a
// running workflow's timer (an ended workflow's is not), an entry unread
// in the stream, one delivered and unacked.
func TestIdleness(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	require.NoError(t, rdb.XGroupCreateMkStream(ctx, stream, "usher", "0").Err())
	read := func() ops.Idleness {
		t.Helper()
		i, err := ops.ReadIdleness(ctx, pool, rdb, stream, "usher")
		require.NoError(t, err)
		return i
	}
	require.True(t, read().Idle(), read().String())
	require.Equal(t, "idle", read().String())

	exec := func(sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err)
	}
	exec(`INSERT INTO outbox (kind, payload) VALUES ('k', '{}')`)
	require.Equal(t, "1 outbox row(s) unfinished (1 unpublished)", read().String())
	exec(`UPDATE outbox SET published_at = now(), done_at = now(), outcome = 'applied'`)
	exec(`INSERT INTO scheduled_jobs (job_id, attempt, kind, payload, run_at) VALUES ('s-1', 0, 'k', '{}', '2030-01-01T00:00:00Z')`)
	require.Equal(t, "1 scheduled run(s) (next due 2030-01-01T00:00:00Z)", read().String())
	exec(`UPDATE scheduled_jobs SET enqueued_at = now()`)
	exec(`INSERT INTO workflows (type, workflow_id, input, request_id, trace) VALUES ('t', 'w1', '{}', 'r', ''), ('t', 'w2', '{}', 'r', '')`)
	exec(`UPDATE workflows SET state = 'completed' WHERE workflow_id = 'w2'`)
	exec(`INSERT INTO workflow_timers (workflow, name, fire_at, set_seq) SELECT id, 'nap', now() + interval '1 hour', 1 FROM workflows`)
	require.Equal(t, "1 workflow timer(s) not yet fired", read().String(), "the completed workflow's timer does not count")
	exec(`UPDATE workflow_timers SET fired_at = now()`)
	require.True(t, read().Idle())

	require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"f": "v"}}).Err())
	require.Equal(t, "1 stream entr(ies) not yet read", read().String())
	require.NoError(t, rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "usher", Consumer: "c", Streams: []string{stream, ">"}, Count: 1}).Err())
	require.Equal(t, "1 stream entr(ies) delivered and not acked", read().String())
}
