package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/pause"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// Every console action, in Chromium, against one running host, each its
// own subtest (a failure in one hides none of the others; each sets up
// what it needs and leaves the kind resumed), checked against the
// database and against what the CLI prints: pause and resume a kind (its
// deliveries wait in the stream, the page shows it paused, the waiting
// job applies once resumed); cancel a job whose entry waits there (it
// never runs: the host acks it as cancelled after the resume, while the
// other job applies) and a scheduled one; run a scheduled job now;
// requeue a ticked set of dead letters; discard another (kept in its
// history); roll a plugin back. Each is recorded in operator_actions with
// who acted, the name given at login and the browser's address ("ada via
// the console from 127.0.0.1:…"), and the job's page and `host jobs show`
// list it.
func TestConsoleActionsInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	v1 := hosttest.Build(t, "./plugins/counters/chaos")
	v2 := hosttest.Build(t, "./plugins/counters/chaos", "main.version=2.0.0")
	cliBin := hosttest.Build(t, "./cmd/host")
	dir := t.TempDir()
	install(t, dir, v1, "1.0.0")
	h := hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream, PluginDir: dir, DisablePluginWatch: true,
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond, AdminAddr: "127.0.0.1:0",
		PausePollInterval: 200 * time.Millisecond})
	hosttest.Eventually(t, 10*time.Second, "the admin listener", func() bool { return h.AdminAddr() != "" })
	base := "http://" + h.AdminAddr()
	const kind = "update_sales_counter"
	ev, err := orders.CreateEvent(ctx, pool, "Actions Night", "Stagedoor Hall")
	require.NoError(t, err)

	// One browser, logged in once as ada; each subtest in a tab of its
	// own, with its own deadline.
	bctx := browser(t, chromium, 1000, 10*time.Minute)
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), h.AdminToken), chromedp.SendKeys(chromedp.ID("operator"), "ada"),
		chromedp.Submit(chromedp.ID("login")), chromedp.WaitVisible(chromedp.ID("pending"))), "log in")
	// who is the actor the console records for ada's browser.
	const who = `^ada via the console from 127\.0\.0\.1:\d+$`

	// act is one action's subtest: a tab and the helpers it checks with.
	type act struct {
		t    *testing.T
		bctx context.Context
	}
	tab := func(t *testing.T) act {
		tctx, cancel := chromedp.NewContext(bctx)
		tctx, cancelTimeout := context.WithTimeout(tctx, 2*time.Minute)
		t.Cleanup(func() { cancelTimeout(); cancel() })
		require.NoError(t, chromedp.Do(tctx, chromedp.EmulateViewport(1280, 1000)), "a tab")
		return act{t, tctx}
	}
	run := func(a act, what string, steps ...chromedp.Action[chromedp.Void]) {
		a.t.Helper()
		require.NoError(a.t, chromedp.Do(a.bctx, steps...), what)
	}
	text := func(a act, sel string) string {
		a.t.Helper()
		return pageText(a.t, a.bctx, sel)
	}
	count := func(a act, sel string) int {
		a.t.Helper()
		n, err := chromedp.Run(a.bctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
		require.NoError(a.t, err, "count "+sel)
		return n
	}
	confirmAll := func(a act) {
		a.t.Helper()
		_, err := chromedp.Run(a.bctx, chromedp.Evaluate[bool](`window.confirm = () => true; true`)) // the pages ask first
		require.NoError(a.t, err)
	}
	cli := func(t *testing.T, args ...string) string {
		t.Helper()
		cmd := exec.Command(cliBin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "DATABASE_URL=" + dbURL, "USER=ada"}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "host %q: %s", args, out)
		return string(out)
	}
	place := func(t *testing.T, jobs orders.Jobs) orders.Placed {
		t.Helper()
		p, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: 2}, jobs)
		require.NoError(t, err)
		return p
	}
	scheduled := func(t *testing.T) string {
		t.Helper()
		p := place(t, orders.Jobs{})
		job, err := schedule.NewJob(ctx, pool, kind, json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, p.ID)), time.Now().Add(time.Hour), p.RequestID, "")
		require.NoError(t, err)
		return job
	}
	applied := func(t *testing.T, job string) int64 {
		return hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, job)
	}
	// recorded is the actors of operator_actions' rows of action on target.
	recorded := func(t *testing.T, action, target string) []string {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT actor FROM operator_actions WHERE action = $1 AND target = $2 ORDER BY id`, action, target)
		require.NoError(t, err)
		actors, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return actors
	}
	recordedOnce := func(t *testing.T, action, target string) string {
		t.Helper()
		actors := recorded(t, action, target)
		require.Len(t, actors, 1, "%s %s recorded once", action, target)
		require.Regexp(t, who, actors[0], "%s %s: who acted", action, target)
		return actors[0]
	}
	// paused leaves kind paused (by the test, not the console) until the
	// subtest ends, and waits for the host to see it.
	paused := func(t *testing.T) {
		t.Helper()
		_, _, err := pause.Pause(ctx, pool, kind, "test", "set up")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = pause.Resume(ctx, pool, kind, "test") })
		hosttest.Eventually(t, 10*time.Second, "the host to see the pause", func() bool { return h.Paused(kind) })
	}
	// onStream places n counter jobs and waits until their entries wait
	// in the stream, pending.
	onStream := func(t *testing.T, n int) []string {
		t.Helper()
		var ids []int64
		var jobs []string
		for range n {
			p := place(t, orders.Jobs{Counter: true})
			ids, jobs = append(ids, p.OutboxIDs[0]), append(jobs, strconv.FormatInt(p.OutboxIDs[0], 10))
		}
		hosttest.Eventually(t, 10*time.Second, "the entries in the stream, waiting", func() bool {
			return hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = ANY($1) AND published_at IS NOT NULL AND done_at IS NULL`, ids) == int64(n) &&
				hosttest.Pending(t, rdb, stream, "usher") == int64(n)
		})
		return jobs
	}
	// letters adds n counter jobs for orders that do not exist and waits
	// for their dead letters; ready makes the orders exist, so a
	// requeued letter applies.
	letters := func(t *testing.T, n int) (jobs []string, ready func(i int)) {
		t.Helper()
		orderID := func(i int) int64 { return 910000000 + int64(len(t.Name()))*1000 + int64(i) }
		for i := range n {
			ids, err := outbox.Add(ctx, pool, outbox.Message{Kind: kind, Payload: json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, orderID(i))),
				RequestID: fmt.Sprintf("req-%s-%d", t.Name(), i)})
			require.NoError(t, err)
			jobs = append(jobs, strconv.FormatInt(ids[0], 10))
		}
		hosttest.Eventually(t, 30*time.Second, fmt.Sprintf("%d dead letters", n), func() bool {
			return hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE job_id = ANY($1) AND requeued_at IS NULL`, jobs) == int64(n)
		})
		return jobs, func(i int) {
			_, err := pool.Exec(ctx, `INSERT INTO orders (id, public_id, event_id, buyer, email, seats) VALUES ($1, $2, $3, 'Late', 'l@example.com', 1)`,
				orderID(i), fmt.Sprintf("late-%s-%d", t.Name(), i), ev)
			require.NoError(t, err)
		}
	}
	letterOf := func(t *testing.T, job string) int64 {
		return hosttest.Count(t, pool, `SELECT id FROM dead_letters WHERE job_id = $1`, job)
	}
	kindSel := fmt.Sprintf(`div.kind[data-kind="%s"]`, kind)

	t.Run("pause and resume", func(t *testing.T) {
		a := tab(t)
		t.Cleanup(func() { _, _ = pause.Resume(ctx, pool, kind, "test") })
		run(a, "plugins", chromedp.Navigate(base+"/console/plugins"), chromedp.WaitVisible(chromedp.ID("plugins")))
		confirmAll(a)
		run(a, "pause", click(kindSel+" button.pause"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text(a, "#flash"), "paused update_sales_counter: every host leaves its deliveries waiting in the stream")
		require.Equal(t, "paused", text(a, kindSel+" .paused"))
		actor := recordedOnce(t, "pause_kind", kind)
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM kind_pauses WHERE kind = $1 AND resumed_at IS NULL AND paused_by = $2`, kind, actor))
		require.Contains(t, cli(t, "kinds", "paused"), kind)
		require.Contains(t, cli(t, "kinds", "paused"), actor)
		hosttest.Eventually(t, 10*time.Second, "the host to see the pause", func() bool { return h.Paused(kind) })
		waiting := onStream(t, 1)
		run(a, "plugins", chromedp.Navigate(base+"/console/plugins"), chromedp.WaitVisible(chromedp.ID("plugins")))
		shot(t, a.bctx, "plugins-paused")
		require.Zero(t, applied(t, waiting[0]), "paused: it waits")

		run(a, "resume", click(kindSel+" button.resume"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text(a, "#flash"), "resumed update_sales_counter")
		require.Zero(t, count(a, kindSel+" .paused"))
		recordedOnce(t, "resume_kind", kind)
		require.Contains(t, cli(t, "kinds", "paused"), "no kind is paused")
		hosttest.Eventually(t, 30*time.Second, "the waiting job applied once resumed", func() bool {
			return applied(t, waiting[0]) == 1 && hosttest.Pending(t, rdb, stream, "usher") == 0
		})
	})

	t.Run("cancel", func(t *testing.T) {
		a := tab(t)
		// A job on the stream is cancelled by request: no host starts it
		// from then on, and the flash says what it cannot promise.
		paused(t)
		jobs := onStream(t, 2)
		keepJob, goneJob := jobs[0], jobs[1]
		run(a, "a waiting job", chromedp.Navigate(base+"/console/jobs?id="+goneJob), chromedp.WaitVisible(chromedp.ID("cancel-job")))
		confirmAll(a)
		run(a, "cancel it", click("#cancel-job button"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text(a, "#flash"), "cancel requested for job "+goneJob+" on the stream: no host will start it from now on")
		require.Contains(t, text(a, "#flash"), "a run already started finishes under its guard")
		recordedOnce(t, "cancel_job", goneJob)
		// A job waiting for its scheduled run is cancelled: it never runs.
		dropJob := scheduled(t)
		run(a, "the job", chromedp.Navigate(base+"/console/jobs?id="+dropJob), chromedp.WaitVisible(chromedp.ID("cancel-job")))
		require.Equal(t, "waiting_to_retry", text(a, "#job-state"), "scheduled, not run")
		confirmAll(a)
		run(a, "cancel it", chromedp.SendKeys(chromedp.CSS("#cancel-job input[name=reason]"), "refunded at the desk"),
			click("#cancel-job button"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text(a, "#flash"), "cancelled job "+dropJob+": its scheduled run never runs")
		require.Equal(t, "cancelled", text(a, "#job-state"))
		require.Equal(t, "cancel_job", text(a, `#actions tr[data-action="cancel_job"] .action`))
		actor := recordedOnce(t, "cancel_job", dropJob)
		require.Equal(t, actor, text(a, `#actions tr[data-action="cancel_job"] .actor`), "the job's page says who")
		require.Contains(t, text(a, `#actions tr[data-action="cancel_job"] .detail`), "was scheduled; refunded at the desk")
		require.Zero(t, count(a, "#cancel-job"), "nothing left to cancel")
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE job_id = $1 AND outcome = 'cancelled'`, dropJob))
		out := cli(t, "jobs", "show", dropJob)
		require.Contains(t, out, "cancelled")
		require.Contains(t, out, "cancel_job")
		require.Contains(t, out, actor, "jobs show says who")
		require.Contains(t, out, "refunded at the desk")
		shot(t, a.bctx, "job-cancelled")

		_, err := pause.Resume(ctx, pool, kind, "test")
		require.NoError(t, err)
		hosttest.Eventually(t, 30*time.Second, "the other job applied once resumed, the cancelled one settled", func() bool {
			return applied(t, keepJob) == 1 && hosttest.Pending(t, rdb, stream, "usher") == 0
		})
		require.Zero(t, applied(t, goneJob), "a job cancelled on the stream never runs")
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id::text = $1 AND outcome = 'cancelled'`, goneJob))
		require.Zero(t, applied(t, dropJob), "a cancelled job never runs")
		require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM scheduled_jobs WHERE job_id = $1 AND enqueued_at IS NULL`, dropJob), "nothing left to schedule")
	})

	t.Run("run now", func(t *testing.T) {
		a := tab(t)
		job := scheduled(t)
		run(a, "the job", chromedp.Navigate(base+"/console/jobs?id="+job), chromedp.WaitVisible(chromedp.ID("run-now")))
		require.Equal(t, "waiting_to_retry", text(a, "#job-state"))
		run(a, "run it now", click("#run-now button"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text(a, "#flash"), "job "+job+" is due now")
		actor := recordedOnce(t, "run_job_now", job)
		hosttest.Eventually(t, 30*time.Second, "the scheduled job applied", func() bool { return applied(t, job) == 1 })
		out := cli(t, "jobs", "show", job)
		require.Contains(t, out, "state       done")
		require.Contains(t, out, "run_job_now")
		require.Contains(t, out, actor)
		run(a, "the job", chromedp.Navigate(base+"/console/jobs?id="+job), chromedp.WaitVisible(chromedp.ID("actions")))
		require.Equal(t, "done", text(a, "#job-state"))
		require.Equal(t, "run_job_now", text(a, `#actions tr[data-action="run_job_now"] .action`))
		require.Equal(t, actor, text(a, `#actions tr[data-action="run_job_now"] .actor`))
	})

	t.Run("requeue a selected set", func(t *testing.T) {
		a := tab(t)
		jobs, ready := letters(t, 3)
		ready(0)
		ready(1) // the first two can run once requeued
		row := func(job string) string { return fmt.Sprintf(`#letters tr[data-job="%s"]`, job) }
		run(a, "dead letters", chromedp.Navigate(base+"/console/deadletters"), chromedp.WaitVisible(chromedp.ID("requeue-set")))
		for _, j := range jobs {
			require.Equal(t, 1, count(a, row(j)+" input.pick"), "job %s's letter offered", j)
		}
		for _, j := range jobs[:2] {
			run(a, "tick "+j, click(row(j)+" input.pick"))
		}
		shot(t, a.bctx, "deadletters-ticked")
		run(a, "requeue the ticked", click("#requeue-set button"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text(a, "#flash"), "requeued 2 chosen dead letter(s)")
		require.Zero(t, count(a, row(jobs[0])))
		require.Zero(t, count(a, row(jobs[1])))
		require.Equal(t, 1, count(a, row(jobs[2])), "the letter not ticked stays")
		var actor string
		for _, j := range jobs[:2] {
			actor = recordedOnce(t, "requeue_dead_letter", j)
		}
		require.Empty(t, recorded(t, "requeue_dead_letter", jobs[2]))
		hosttest.Eventually(t, 30*time.Second, "the requeued set applied", func() bool { return applied(t, jobs[0])+applied(t, jobs[1]) == 2 })
		out := cli(t, "jobs", "show", jobs[0])
		require.Contains(t, out, "requeue_dead_letter")
		require.Contains(t, out, actor)
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE job_id = $1 AND requeued_at IS NULL`, jobs[2]))
	})

	t.Run("discard", func(t *testing.T) {
		a := tab(t)
		jobs, _ := letters(t, 1)
		job, letter := jobs[0], letterOf(t, jobs[0])
		run(a, "the letter", chromedp.Navigate(fmt.Sprintf("%s/console/deadletters/%d", base, letter)), chromedp.WaitVisible(chromedp.ID("discard")))
		confirmAll(a)
		run(a, "discard it", chromedp.SendKeys(chromedp.CSS("#discard input[name=reason]"), "test order, never existed"),
			click("#discard button"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text(a, "#flash"), fmt.Sprintf("discarded dead letter %d of job %s", letter, job))
		require.Zero(t, count(a, fmt.Sprintf(`#letters tr[data-job="%s"]`, job)), "no longer open")
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE job_id = $1 AND discarded_at IS NOT NULL
			AND requeued_at IS NULL AND discard_reason = 'test order, never existed'`, job), "kept, marked discarded")
		actor := recordedOnce(t, "discard_dead_letter", job)
		require.NotContains(t, cli(t, "deadletters", "list"), job, "no longer listed open")
		out := cli(t, "jobs", "show", job)
		require.Contains(t, out, "discarded (dead letter")
		require.Contains(t, out, "discard_dead_letter")
		require.Contains(t, out, actor)
		run(a, "its job", chromedp.Navigate(base+"/console/jobs?id="+job), chromedp.WaitVisible(chromedp.ID("actions")))
		require.Equal(t, "discarded", text(a, "#job-state"))
		require.Contains(t, text(a, `#actions tr[data-action="discard_dead_letter"] .detail`), "test order, never existed")
		require.Equal(t, actor, text(a, `#actions tr[data-action="discard_dead_letter"] .actor`))
		require.Equal(t, 1, count(a, "#deliveries tbody tr"), "its dead-lettered delivery is still in its history")
		shot(t, a.bctx, "job-discarded")
	})

	t.Run("rollback", func(t *testing.T) {
		a := tab(t)
		install(t, dir, v2, "2.0.0")
		row := `tr[data-plugin="counters"] `
		run(a, "plugins", chromedp.Navigate(base+"/console/plugins"), chromedp.WaitVisible(chromedp.ID("plugins")))
		require.Zero(t, count(a, row+"button.rollback"), "nothing to roll back to yet")
		run(a, "reload", click(row+"button.reload"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Equal(t, "2.0.0", text(a, row+".version"))
		require.Equal(t, "Roll back to 1.0.0", text(a, row+"button.rollback"))
		run(a, "plugins", chromedp.Navigate(base+"/console/plugins"), chromedp.WaitVisible(chromedp.ID("plugins")))
		confirmAll(a)
		run(a, "roll back", click(row+"button.rollback"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text(a, "#flash"), "counters: rolled back (2.0.0 → 1.0.0)")
		require.Equal(t, "1.0.0", text(a, row+".version"))
		for _, p := range h.Plugins() {
			require.Equal(t, "1.0.0", p.Version)
		}
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM plugin_swaps WHERE plugin = 'counters'
			AND from_version = '2.0.0' AND to_version = '1.0.0'`))
		actor := recordedOnce(t, "rollback_plugin", "counters")
		require.Regexp(t, `rollback_plugin\s+counters\s+`+regexp.QuoteMeta(actor)+`\s+\S+\s+2\.0\.0 → 1\.0\.0`, cli(t, "kinds", "paused"))
		shot(t, a.bctx, "plugins-rolled-back")
	})
}
