package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/jobctl"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/internal/doctest"
)

// host jobs cancel and run-now, host deadletters discard and requeue of a
// chosen set, as an operator types them, against the database: a job is
// cancelled where no host can have it (unpublished, scheduled); one on
// the stream is cancelled by request (job_cancels), saying a run already
// started finishes; one started (its start mark), ended, missing or
// dead-lettered is refused with why; every action is in operator_actions
// and in `jobs show`; wrong command lines exit 2.
func TestJobActionsCLI(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, db := hosttest.DB(t)
	bin := hosttest.Build(t, "./cmd/host")
	env := []string{"DATABASE_URL=" + db, "USER=grace"}
	add := func(order int) (string, int64) {
		ids, err := outbox.Add(ctx, pool, outbox.Message{Kind: "update_sales_counter", Payload: json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, order))})
		require.NoError(t, err)
		return strconv.FormatInt(ids[0], 10), ids[0]
	}
	pending, _ := add(1)
	published, publishedRow := add(2)
	started, startedRow := add(3)
	applied, _ := add(4)
	_, err := pool.Exec(ctx, `UPDATE outbox SET published_at = now() WHERE id IN ($1, $2)`, publishedRow, startedRow)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE outbox SET published_at = now(), done_at = now(), outcome = 'applied' WHERE id = $1`, applied)
	require.NoError(t, err)
	run, err := jobctl.Start(ctx, pool, startedRow, started, false)
	require.NoError(t, err)
	require.True(t, run, "a host starts it")
	later := time.Now().Add(time.Hour)
	scheduled, err := schedule.NewJob(ctx, pool, "update_sales_counter", json.RawMessage(`{"order_id":5}`), later, "req-5", "")
	require.NoError(t, err)
	soon, err := schedule.NewJob(ctx, pool, "update_sales_counter", json.RawMessage(`{"order_id":6}`), later, "req-6", "")
	require.NoError(t, err)
	var letters []int64
	for i := range 3 {
		_, err := deadletter.Add(ctx, pool, deadletter.Letter{JobID: fmt.Sprintf("dl-%d", i), Kind: "update_sales_counter",
			Payload: []byte(`{"order_id":7}`), Reason: "permanent: no such order", Attempts: 1, StreamID: fmt.Sprintf("1-%d", i)})
		require.NoError(t, err)
		letters = append(letters, hosttest.Count(t, pool, `SELECT id FROM dead_letters WHERE job_id = $1`, fmt.Sprintf("dl-%d", i)))
	}
	l0, l1, l2 := strconv.FormatInt(letters[0], 10), strconv.FormatInt(letters[1], 10), strconv.FormatInt(letters[2], 10)

	for _, tc := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"jobs", "cancel", pending, "--reason", "order refunded"}, 0, []string{"cancelled job " + pending + ": it was not published"}},
		{[]string{"jobs", "cancel", pending}, 0, []string{"job " + pending + " was cancelled before: nothing more recorded"}},
		{[]string{"jobs", "show", pending}, 0, []string{"state       cancelled", "operator actions", "cancel_job", "grace@", "was pending; order refunded"}},
		{[]string{"jobs", "cancel", published, "--by", "ada"}, 0, []string{"cancel requested for job " + published + " on the stream: no host will start it from now on; a run already started finishes under its guard; `host jobs show " + published + "` tells which"}},
		{[]string{"jobs", "cancel", published}, 0, []string{"job " + published + " was cancelled before: nothing more recorded"}},
		{[]string{"jobs", "show", published}, 0, []string{"state       running", "cancel_job", "ada", "was stream"}},
		{[]string{"jobs", "cancel", started}, 1, []string{"job " + started + " has started", "finishes under its guard"}},
		{[]string{"jobs", "cancel", applied}, 1, []string{"job " + applied + " has ended (applied)"}},
		{[]string{"jobs", "cancel", "999999"}, 1, []string{"no job 999999"}},
		{[]string{"jobs", "cancel", "dl-0"}, 1, []string{"job dl-0 is dead-lettered", "discard its dead letter"}},
		{[]string{"jobs", "cancel", scheduled}, 0, []string{"cancelled job " + scheduled + ": its scheduled run never runs"}},
		{[]string{"jobs", "run-now", scheduled}, 1, []string{"job " + scheduled + " has no scheduled run waiting"}},
		{[]string{"jobs", "run-now", soon}, 0, []string{"job " + soon + " is due now (was due " + later.UTC().Format(time.RFC3339)}},
		{[]string{"jobs", "show", soon}, 0, []string{"run_job_now", "was due "}},
		{[]string{"jobs", "cancel"}, 2, []string{"jobs cancel takes one job ID, got []"}},
		{[]string{"jobs", "run-now", "a", "b"}, 2, []string{"jobs run-now takes one job ID"}},
		{[]string{"deadletters", "list", "--limit", "1"}, 0, []string{"dl-0", "the oldest 1 of 3 open dead letters: --limit 3 shows them all"}},
		{[]string{"deadletters", "list", "--limit", "3"}, 0, []string{"dl-2"}},
		{[]string{"deadletters", "requeue", l0, "999999"}, 1, []string{"no open dead letter 999999", "nothing requeued"}},
		{[]string{"deadletters", "requeue", l0, l1}, 0, []string{"requeued 2 dead letter(s)"}},
		{[]string{"deadletters", "requeue", l0}, 1, []string{"no open dead letter " + l0}},
		{[]string{"deadletters", "discard", l2, "--reason", "test order"}, 0, []string{"discarded dead letter " + l2 + " of job dl-2: kept in its history"}},
		{[]string{"deadletters", "discard", l2}, 1, []string{"dead letter " + l2 + " was discarded at"}},
		{[]string{"deadletters", "discard", l0}, 1, []string{"dead letter " + l0 + " was requeued at"}},
		{[]string{"deadletters", "list"}, 0, []string{"no open dead letters"}},
		{[]string{"jobs", "show", "dl-2"}, 0, []string{"discarded (dead letter " + l2, "discard_dead_letter", "test order"}},
		{[]string{"jobs", "show", "dl-0"}, 0, []string{"requeue_dead_letter", "dead letter " + l0}},
		{[]string{"jobs", "list", "--state", "cancelled"}, 0, []string{pending, scheduled, "2 job(s)"}},
		{[]string{"deadletters", "requeue"}, 2, []string{"takes one or more dead letter IDs, or --kind KIND"}},
		{[]string{"deadletters", "requeue", "x"}, 2, []string{`"x" is not a dead letter ID`}},
		{[]string{"deadletters", "requeue", l0, "--kind", "k"}, 2, []string{"IDs or --kind, not both"}},
		{[]string{"deadletters", "requeue", "--kind", "update_sales_countr"}, 1, []string{`no dead letter was ever of kind "update_sales_countr": is the kind right?`}},
		{[]string{"deadletters", "requeue", "--kind", "update_sales_counter"}, 0, []string{"requeued 0 dead letter(s)"}},
		{[]string{"deadletters", "discard"}, 2, []string{"deadletters discard takes one dead letter ID"}},
	} {
		r := runHost(t, bin, env, tc.args...)
		require.Equal(t, tc.code, r.code, "%q: %s%s", tc.args, r.stdout, r.stderr)
		out := r.stdout
		if tc.code != 0 {
			out = r.stderr
		}
		for _, w := range tc.want {
			require.Contains(t, out, w, "%q", tc.args)
		}
	}

	// A cancelled job frees its deduplication key: the same key enqueues
	// a new job.
	keyed := runHost(t, bin, env, "jobs", "enqueue", "update_sales_counter", `{"order_id":8}`, "--dedup-key", "order-8", "--json")
	require.Zero(t, keyed.code, keyed.stderr)
	var first enqueued
	require.NoError(t, json.Unmarshal([]byte(keyed.stdout), &first))
	require.Zero(t, runHost(t, bin, env, "jobs", "cancel", strconv.FormatInt(first.ID, 10)).code)
	again := runHost(t, bin, env, "jobs", "enqueue", "update_sales_counter", `{"order_id":8}`, "--dedup-key", "order-8", "--json")
	var second enqueued
	require.NoError(t, json.Unmarshal([]byte(again.stdout), &second))
	require.False(t, second.Duplicate, again.stdout)
	require.NotEqual(t, first.ID, second.ID)

	// The database: each cancel settled where the job waited, the
	// refused ones untouched, the scheduled runs moved or due.
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1 AND outcome = 'cancelled' AND published_at IS NOT NULL AND started_at IS NULL`, pending))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1 AND outcome IS NULL AND done_at IS NULL`, publishedRow),
		"on the stream: a request, the row the host's to settle")
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM job_cancels WHERE job_id = $1 AND outbox_id = $2`, published, publishedRow))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1 AND outcome IS NULL AND done_at IS NULL`, startedRow))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM scheduled_jobs WHERE job_id = $1 AND enqueued_at IS NOT NULL`, scheduled))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE job_id = $1 AND outcome = 'cancelled'`, scheduled))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM scheduled_jobs WHERE job_id = $1 AND run_at <= now() AND enqueued_at IS NULL`, soon))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE id = $1 AND discarded_at IS NOT NULL AND discard_reason = 'test order'`, letters[2]))
	require.EqualValues(t, 2, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE job_id IN ('dl-0', 'dl-1')`))
	require.EqualValues(t, 8, hosttest.Count(t, pool, `SELECT count(*) FROM operator_actions`),
		"4 cancels, a run-now, 2 requeues, a discard (the repeats and the refusals record nothing)")
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM operator_actions WHERE target = $1`, started), "a refused cancel records nothing")
}

// The README's job actions, run as written by sh on a fresh database:
// job 1 an outbox row not yet published, job 2 waiting to retry, dead
// letters 1 to 3.
func TestREADMEJobActions(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, dbURL := hosttest.DB(t)
	for i := 1; i <= 2; i++ {
		_, err := outbox.Add(ctx, pool, outbox.Message{Kind: "update_sales_counter", Payload: json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, i))})
		require.NoError(t, err)
	}
	_, err := pool.Exec(ctx, `UPDATE outbox SET published_at = now(), started_at = now(), done_at = now(), outcome = 'retry_scheduled' WHERE id = 2`)
	require.NoError(t, err)
	_, err = schedule.Add(ctx, pool, schedule.Run{JobID: "2", Attempt: 1, Kind: "update_sales_counter", Payload: json.RawMessage(`{"order_id":2}`),
		Reason: "provider busy", RunAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	for i := range 3 {
		_, err := deadletter.Add(ctx, pool, deadletter.Letter{JobID: fmt.Sprintf("dl-%d", i), Kind: "update_sales_counter",
			Payload: []byte(`{"order_id":9}`), Reason: "permanent: no such order", Attempts: 1, StreamID: fmt.Sprintf("1-%d", i)})
		require.NoError(t, err)
	}
	dir := binDir(t)
	env := []string{"DATABASE_URL=" + dbURL, "USER=ada"}
	lines := doctest.Block(t, "docs/operating.md", "**Act on a job.**", "sh")
	require.Len(t, lines, 5)
	for i, want := range []string{
		"cancelled job 1: it was not published, and never will be",
		"job 2 is due now (was due ",
		"requeued 2 dead letter(s)",
		"discarded dead letter 3 of job dl-2: kept in its history, no longer open",
		"cancel_job",
	} {
		require.Contains(t, readmeShell(t, dir, env, lines[i]), want, lines[i])
	}
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = 1 AND outcome = 'cancelled'`))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM scheduled_jobs WHERE job_id = '2' AND run_at <= now()`))
	require.EqualValues(t, 2, hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE requeued_at IS NOT NULL`))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE id = 3 AND discard_reason = 'test order'`))
	require.EqualValues(t, 5, hosttest.Count(t, pool, `SELECT count(*) FROM operator_actions WHERE actor LIKE 'ada@%'`))
}

// The job actions' functions are the runtime's: PUBLIC may not call them,
// and a plugin's role, on its own pool, is refused each one.
func TestJobActionFunctionsArePrivate(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, _ := hosttest.DB(t)
	funcs := []string{"usher_cancel_job", "usher_run_job_now", "usher_discard_dead_letter", "usher_job_start", "usher_jobs_start", "usher_settle_cancel"}
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
		WHERE p.proname = ANY($1) AND a.grantee = 0`, funcs), "PUBLIC has no EXECUTE")
	require.EqualValues(t, len(funcs), hosttest.Count(t, pool, `SELECT count(*) FROM pg_proc WHERE proname = ANY($1)`, funcs))
	plugin := hosttest.RawPool(t, pool, 1)
	for _, call := range []string{`SELECT usher_cancel_job('1', '')`, `SELECT usher_run_job_now('1')`,
		`SELECT usher_discard_dead_letter(1, '')`, `SELECT usher_job_start(1, '1', false)`,
		`SELECT usher_jobs_start('{1}', '{1}', '{false}')`, `SELECT usher_settle_cancel(1, '1', 'k')`} {
		_, err := plugin.Exec(ctx, call)
		require.ErrorContains(t, err, "permission denied for function", call)
	}
}
