package main

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/retention"
)

// `host jobs list` finds a job whose outbox rows retention deleted by its
// filters, in the same state with the same attempts as before (it read
// the outbox rows only, so such a job was found only by `jobs show ID`),
// and still says when it cut the list.
func TestJobsListAfterOutboxRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, db := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	bin := hosttest.Build(t, "./cmd/host")
	env := []string{"DATABASE_URL=" + db, "USHER_STREAM=" + stream, "REDIS_URL=" + hosttest.RedisURL()}
	old := time.Now().Add(-3 * time.Hour)
	var ids []string
	for i := range 3 {
		var id int64
		require.NoError(t, pool.QueryRow(ctx, `INSERT INTO outbox (kind, payload, request_id, created_at, done_at, published_at, outcome)
			VALUES ('trimmed_kind', '{}', 'req-list', $1, $1, $1, 'applied') RETURNING id`, old.Add(time.Duration(i)*time.Minute)).Scan(&id))
		ids = append(ids, strconv.FormatInt(id, 10))
		require.NoError(t, history.Write(ctx, pool, history.Record{JobID: ids[i], Kind: "trimmed_kind", OutboxID: id,
			RequestID: "req-list", Verdict: history.Applied, Deliveries: 1, StartedAt: old}))
	}
	list := func(args ...string) listedShown {
		t.Helper()
		r := runHost(t, bin, env, append([]string{"jobs", "list", "--json"}, args...)...)
		require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)
		var out listedShown
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out))
		return out
	}
	before := list("--kind", "trimmed_kind", "--state", "done")
	require.Equal(t, 3, before.Total)
	cutBefore := list("--kind", "trimmed_kind", "--limit", "2")

	r, err := retention.New(retention.Config{Redis: rdb, Pool: pool, Streams: []string{stream}, Group: "usher", Self: "self",
		Logger: hosttest.Logger(t, -4), Redelivery: retention.Redelivery{ReconcileAfter: time.Hour}, Outbox: time.Hour, Margin: time.Minute})
	require.NoError(t, err)
	_, err = r.Purge(ctx, time.Now())
	require.NoError(t, err)
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM outbox`))

	require.Equal(t, before, list("--kind", "trimmed_kind", "--state", "done"))
	cut := list("--kind", "trimmed_kind", "--limit", "2")
	require.Equal(t, cutBefore, cut)
	require.True(t, cut.Cut)
	require.Equal(t, []string{ids[2], ids[1]}, []string{cut.Jobs[0].ID, cut.Jobs[1].ID})
	plain := runHost(t, bin, env, "jobs", "list", "--kind", "trimmed_kind", "--limit", "2")
	require.Contains(t, plain.stdout, "the newest 2 of 3 matching jobs: --limit 3 shows them all")
}
