package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/jobctl"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/pause"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// A cancel through the admin API of a job whose run has started (its
// entry is on the stream, its plugin holding it) is recorded as a request
// that says what it cannot promise, and the run finishes under its guard,
// applied once, its outcome applied, the request then no longer standing;
// the job actions want the token, refuse bad input with 422 and a clear
// error, and record who acted.
func TestJobActionsAdminAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	want := b.placeOrders(t, 1, 1)
	jobID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "stall", Duration: "2s", Once: true})
	cfg := b.config()
	cfg.AdminAddr = "127.0.0.1:0"
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	call := func(path string, token bool) (int, string) {
		t.Helper()
		c := adminCall{method: "POST", path: path}
		if token {
			c.token = h.AdminToken
		}
		code, _, body := c.do(t, h.AdminAddr())
		return code, body
	}

	for _, path := range []string{"/jobs/cancel?id=" + jobID, "/jobs/run-now?id=1", "/deadletters/discard?id=1", "/deadletters/requeue?id=1"} {
		code, body := call(path, false)
		require.Equal(t, 401, code, "%s: %s", path, body)
	}
	b.held(t, "counter.before_apply", jobID)
	code, body := call("/jobs/cancel?id="+jobID+"&by=ops", true)
	require.Equal(t, 200, code, body)
	require.Contains(t, body, "cancel requested for job "+jobID+" on the stream: no host will start it from now on; a run already started finishes under its guard")
	hosttest.Eventually(t, 5*time.Second, "the host to hear the cancel", func() bool { return h.Cancelled(jobID) })
	b.waitDrained(t, 1)
	b.requireCounters(t, want)
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE outcome = 'applied'`))
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, jobID), "applied once")
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE job_id = $1 AND verdict = 'cancelled'`, jobID))
	hosttest.Eventually(t, 5*time.Second, "the applied job's cancel to stand no more", func() bool { return !h.Cancelled(jobID) })
	j, err := history.GetJob(ctx, b.pool, jobID)
	require.NoError(t, err)
	require.Equal(t, history.Done, j.State, "jobs show tells: it ran")
	require.Equal(t, jobctl.ActionCancel, j.Actions[0].Action)
	require.Contains(t, j.Actions[0].Detail, "was stream")

	later, err := schedule.NewJob(ctx, b.pool, "update_sales_counter", json.RawMessage(`{"order_id":1}`), time.Now().Add(time.Hour), "", "")
	require.NoError(t, err)
	_, err = deadletter.Add(ctx, b.pool, deadletter.Letter{JobID: "dl", Kind: "update_sales_counter", Payload: []byte(`{}`),
		Reason: "permanent", Attempts: 1, StreamID: "9-0"})
	require.NoError(t, err)
	letter := hosttest.Count(t, b.pool, `SELECT id FROM dead_letters WHERE job_id = 'dl'`)
	for _, tc := range []struct {
		path, want string
		code       int
	}{
		{"/jobs/cancel", "name the job", 422},
		{"/jobs/cancel?id=" + jobID, "has ended (applied)", 422},
		{"/jobs/run-now?id=" + jobID, "has no scheduled run waiting", 422},
		{"/deadletters/requeue?id=x", `\"x\" is not a dead letter ID`, 422},
		{"/deadletters/requeue", "name at least one dead letter", 422},
		{fmt.Sprintf("/deadletters/discard?id=%d&id=99", letter), "discard takes one dead letter", 422},
		{"/deadletters/discard?id=99", "no dead letter 99", 422},
		{"/jobs/run-now?id=" + later + "&by=ops", "job " + later + " is due now", 200},
		{fmt.Sprintf("/deadletters/discard?id=%d&by=ops&reason=spam", letter), "discarded dead letter", 200},
	} {
		code, body := call(tc.path, true)
		require.Equal(t, tc.code, code, "%s: %s", tc.path, body)
		require.Contains(t, body, tc.want, tc.path)
	}
	require.EqualValues(t, 3, hosttest.Count(t, b.pool, `SELECT count(*) FROM operator_actions WHERE actor LIKE 'ops via the admin API from 127.0.0.1:%'`),
		"the cancel requested, the run-now and the discard; no refusal recorded")
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM scheduled_jobs WHERE job_id = $1 AND run_at <= now()`, later))
}

// A chosen set of dead letters requeued through the admin API
// (/deadletters/requeue?id=A&id=B): both put back through the outbox with
// their identities kept, each applied once, each requeue recorded with who
// asked; asked again, the set is refused (no longer open) and nothing more
// is recorded or run. The letter not named stays open.
func TestRequeueSetAdminAPI(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.placeOrders(t, 3, 1)
	// The three jobs are dead letters, never applied.
	rows, err := b.pool.Query(ctx, `SELECT id::text, payload::text FROM outbox ORDER BY id LIMIT 3`)
	require.NoError(t, err)
	var jobs []string
	var letters []int64
	for rows.Next() {
		var id, payload string
		require.NoError(t, rows.Scan(&id, &payload))
		jobs = append(jobs, id)
		_, err := deadletter.Add(ctx, b.pool, deadletter.Letter{JobID: id, Kind: "update_sales_counter", Payload: []byte(payload),
			Reason: "test", LastError: "test", Attempts: 1, StreamID: fmt.Sprintf("0-%d", len(jobs))})
		require.NoError(t, err)
	}
	require.NoError(t, rows.Err())
	for _, j := range jobs {
		letters = append(letters, hosttest.Count(t, b.pool, `SELECT id FROM dead_letters WHERE job_id = $1`, j))
	}
	require.Len(t, jobs, 3)
	_, err = b.pool.Exec(ctx, `UPDATE outbox SET published_at = now()`)
	require.NoError(t, err)
	cfg := b.config()
	cfg.AdminAddr = "127.0.0.1:0"
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	call := func(path string) (int, string) {
		t.Helper()
		code, _, body := adminCall{method: "POST", path: path, token: h.AdminToken}.do(t, h.AdminAddr())
		return code, body
	}
	applied := func(job string) int64 {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, job)
	}

	set := fmt.Sprintf("/deadletters/requeue?id=%d&id=%d&by=ops", letters[0], letters[1])
	code, body := call(set)
	require.Equal(t, 200, code, body)
	var resp struct{ Jobs []string }
	require.NoError(t, json.Unmarshal([]byte(body), &resp))
	require.ElementsMatch(t, jobs[:2], resp.Jobs, "the chosen letters' jobs, identities kept")
	hosttest.Eventually(t, 30*time.Second, "the requeued set applied", func() bool { return applied(jobs[0])+applied(jobs[1]) == 2 })

	code, body = call(set)
	require.Equal(t, 422, code, "a set already requeued: %s", body)
	b.waitDrained(t, 2)
	for _, j := range jobs[:2] {
		require.EqualValues(t, 1, applied(j), "job %s applied once", j)
		require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM operator_actions WHERE action = 'requeue_dead_letter'
			AND target = $1 AND actor LIKE 'ops via the admin API from 127.0.0.1:%'`, j), "job %s: one requeue recorded, with who", j)
	}
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM operator_actions`), "the refused second call recorded nothing")
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters WHERE requeued_at IS NOT NULL AND id = ANY($1)`, letters[:2]))
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters WHERE requeued_at IS NULL AND discarded_at IS NULL AND id = $1`, letters[2]),
		"the letter not named stays open")
	require.Zero(t, applied(jobs[2]))
}

// placeHeld commits n orders of seats[i] seats each for one new event,
// each with its counter job, and returns the event and the jobs' ids.
func (b *testBundle) placeHeld(t *testing.T, seats ...int) (event int64, jobs []string) {
	t.Helper()
	ctx := context.Background()
	event, err := orders.CreateEvent(ctx, b.pool, "Held", "Stagedoor Hall")
	require.NoError(t, err)
	for _, n := range seats {
		p, err := orders.Place(ctx, b.pool, orders.Order{EventID: event, Buyer: "Buyer", Email: "b@example.com", Seats: n}, orders.Jobs{Counter: true})
		require.NoError(t, err)
		jobs = append(jobs, strconv.FormatInt(p.OutboxIDs[0], 10))
	}
	return event, jobs
}

// waitOnStream waits until n entries wait pending in the stream with
// nothing left to publish and no job done.
func (b *testBundle) waitOnStream(t *testing.T, n int64) {
	t.Helper()
	hosttest.Eventually(t, 20*time.Second, fmt.Sprintf("%d entries waiting on the stream", n), func() bool {
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE done_at IS NOT NULL`), "a job ran while its kind was paused")
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == n
	})
}

// A job on the stream that no host has started (its kind paused, so its
// entry waits there, read and parked) is cancelled: 'stream', and
// 'already' when asked again. The host settles it cancelled at its next
// reclaim, while the kind is still paused (a cancelled entry needs no
// plugin), and acks it; resumed, the other jobs apply and the cancelled
// one never runs: no counter_applies row, its seats not counted, no
// processed job id. Its history and operator actions tell the cancel,
// and a cancel after it settled is 'already' too.
func TestCancelOnStreamNeverRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.config()
	cfg.PausePollInterval = 100 * time.Millisecond
	_, _, err := pause.Pause(ctx, b.pool, counterKind, "test", "hold the entries on the stream")
	require.NoError(t, err)
	event, jobs := b.placeHeld(t, 2, 3, 4)
	h := hosttest.Start(t, cfg)
	b.waitOnStream(t, 3)
	cancelled := jobs[1]

	c, err := jobctl.Cancel(ctx, b.pool, cancelled, "ada", "refunded at the desk")
	require.NoError(t, err)
	require.Equal(t, jobctl.WasStream, c.Was)
	require.Contains(t, c.String(), "`host jobs show "+cancelled+"` tells which")
	c, err = jobctl.Cancel(ctx, b.pool, cancelled, "ada", "")
	require.NoError(t, err)
	require.Equal(t, jobctl.WasCancelled, c.Was, "asked twice before the host settled it")
	hosttest.Eventually(t, 5*time.Second, "the host to hear the cancel", func() bool { return h.Cancelled(cancelled) })
	hosttest.Eventually(t, 20*time.Second, "the cancelled job settled while its kind is paused", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE id = $1 AND outcome = 'cancelled' AND done_at IS NOT NULL`, cancelled) == 1
	})
	require.True(t, h.Paused(counterKind))
	// The ack follows the settling commit (commit, then ack): it may not
	// have landed when the outcome is first seen.
	hosttest.Eventually(t, 10*time.Second, "the cancelled entry acked, the others waiting", func() bool {
		return hosttest.Pending(t, b.rdb, b.stream, "usher") == 2
	})
	c, err = jobctl.Cancel(ctx, b.pool, cancelled, "ada", "")
	require.NoError(t, err)
	require.Equal(t, jobctl.WasCancelled, c.Was, "asked again after it settled")

	_, err = pause.Resume(ctx, b.pool, counterKind, "test")
	require.NoError(t, err)
	b.waitDrained(t, 2)
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, cancelled), "its handler never ran")
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs WHERE job_id = $1`, cancelled))
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = ANY($1)`, []string{jobs[0], jobs[2]}))
	b.requireCounters(t, map[int64]int64{event: 2 + 4})
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE id = $1 AND outcome = 'cancelled'`, cancelled))
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE id = ANY($1) AND outcome = 'applied'`, []int64{mustInt(t, jobs[0]), mustInt(t, jobs[2])}))
	require.Zero(t, hosttest.Pending(t, b.rdb, b.stream, "usher"))

	j, err := history.GetJob(ctx, b.pool, cancelled)
	require.NoError(t, err)
	require.Equal(t, history.Cancelled, j.State)
	require.NotEmpty(t, j.History)
	for _, r := range j.History {
		require.Equal(t, "cancelled", string(r.Verdict), "every delivery of it settled cancelled")
		require.Contains(t, r.Reason, "cancelled by an operator while on the stream")
	}
	require.Len(t, j.Actions, 1, "the repeats record nothing")
	require.Equal(t, jobctl.ActionCancel, j.Actions[0].Action)
	require.Equal(t, "ada", j.Actions[0].Actor)
	require.Equal(t, "was stream; refunded at the desk", j.Actions[0].Detail)
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return n
}

// A cancel asked while two hosts run reaches both by its notification:
// their poll interval is 30 s here, so only the NOTIFY can bring it
// within the 5 s allowed. The time from the cancel's commit to each host
// holding it is logged. The job is then settled cancelled by whichever
// host reclaims its entry first, and never runs.
func TestCancelOnStreamReachesEveryHost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.config()
	cfg.PausePollInterval = 30 * time.Second
	_, _, err := pause.Pause(ctx, b.pool, counterKind, "test", "hold the entries on the stream")
	require.NoError(t, err)
	_, jobs := b.placeHeld(t, 1, 1)
	hosts := []*hosttest.Running{hosttest.Start(t, cfg), hosttest.Start(t, cfg)}
	b.waitOnStream(t, 2)
	job := jobs[0]
	for _, h := range hosts {
		require.False(t, h.Cancelled(job))
	}

	var wg sync.WaitGroup
	heard := make([]time.Duration, len(hosts))
	asked := time.Now()
	c, err := jobctl.Cancel(ctx, b.pool, job, "ada", "")
	require.NoError(t, err)
	committed := time.Since(asked)
	require.Equal(t, jobctl.WasStream, c.Was)
	for i, h := range hosts {
		wg.Go(func() {
			for !h.Cancelled(job) && time.Since(asked) < 5*time.Second {
				time.Sleep(200 * time.Microsecond)
			}
			heard[i] = time.Since(asked)
		})
	}
	wg.Wait()
	for i, d := range heard {
		require.Less(t, d, 5*time.Second, "host %d never heard the cancel", i)
		require.True(t, hosts[i].Cancelled(job))
	}
	t.Logf("cancel committed in %s; heard by host 0 after %s, host 1 after %s (from the call)",
		committed.Round(time.Microsecond), heard[0].Round(time.Microsecond), heard[1].Round(time.Microsecond))

	hosttest.Eventually(t, 20*time.Second, "the cancelled job settled and acked", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE id = $1 AND outcome = 'cancelled'`, job) == 1 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 1
	})
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "nothing ran: the other job's kind is still paused")
}

// Jobs published while no host runs, each twice (a relay that crashed
// between publish and mark), one of them cancelled then: the host that
// starts holds the cancel before it reads the stream, settles both of
// that job's entries cancelled and acks them, and never runs it; the
// other jobs apply once each, their duplicates absorbed.
func TestCancelOnStreamDuplicatesNeverRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	event, jobs := b.placeHeld(t, 1, 2, 3)
	published := map[int64]bool{}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Redis: b.rdb, Stream: b.stream, Key: hosttest.SigningKey(t, b.pool),
		BatchSize: 1, PollInterval: time.Millisecond,
		AfterPublish: func(ids []int64) error {
			if !published[ids[0]] {
				published[ids[0]] = true
				return errors.New("relay crashed between publish and mark")
			}
			return nil
		}})
	require.NoError(t, err)
	for hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) > 0 {
		_, _ = relay.RelayOnce(ctx)
	}
	require.EqualValues(t, 6, b.rdb.XLen(ctx, b.stream).Val(), "each job's entry twice on the stream")
	cancelled := jobs[1]
	c, err := jobctl.Cancel(ctx, b.pool, cancelled, "ada", "")
	require.NoError(t, err)
	require.Equal(t, jobctl.WasStream, c.Was)

	cfg := b.config()
	cfg.DisableRelay = true
	hosttest.Start(t, cfg)
	b.waitDrained(t, 2)
	hosttest.Eventually(t, 30*time.Second, "both entries of the cancelled job settled", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE job_id = $1 AND verdict = 'cancelled'`, cancelled) >= 2
	})
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, cancelled), "its handler never ran")
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM job_history WHERE job_id = $1 AND verdict <> 'cancelled'`, cancelled))
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE id = $1 AND outcome = 'cancelled'`, cancelled))
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "one apply for each other order")
	b.requireCounters(t, map[int64]int64{event: 1 + 3})
	require.Zero(t, hosttest.Pending(t, b.rdb, b.stream, "usher"))
}
