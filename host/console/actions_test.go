package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/schedule"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// Every console action, in Chromium, against a running host, each checked
// against the database and against what the CLI prints: pause a kind
// (its deliveries wait in the stream, the page shows it paused), cancel a
// job whose entry waits there (it never runs: the host acks it as
// cancelled after the resume, while the other job applies), resume; run a
// scheduled job now; requeue a ticked set of dead letters and discard
// another (kept in its history); roll a plugin back. Each is recorded in
// operator_actions with actor console, and the job's page and `host jobs
// show` list it.
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
	cli := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(cliBin, args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "DATABASE_URL=" + dbURL, "USER=ada"}
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "host %q: %s", args, out)
		return string(out)
	}
	ev, err := orders.CreateEvent(ctx, pool, "Actions Night", "Stagedoor Hall")
	require.NoError(t, err)
	place := func(jobs orders.Jobs) orders.Placed {
		t.Helper()
		p, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: 2}, jobs)
		require.NoError(t, err)
		return p
	}
	applied := func(job string) int64 {
		return hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, job)
	}
	consoleActions := func(action, target string) int64 {
		return hosttest.Count(t, pool, `SELECT count(*) FROM operator_actions WHERE actor = 'console' AND action = $1 AND target = $2`, action, target)
	}

	shots := artifacts(t)
	bctx := browser(t, chromium, 1000, 2*time.Minute)
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, steps...), what)
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		require.NoError(t, err, "screenshot "+name)
		require.NoError(t, os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644))
	}
	text := func(sel string) string {
		t.Helper()
		return pageText(t, bctx, sel)
	}
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
		require.NoError(t, err, "count "+sel)
		return n
	}
	confirmAll := func() {
		t.Helper()
		_, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.confirm = () => true; true`)) // the pages ask first
		require.NoError(t, err)
	}
	run("log in", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), h.AdminToken), chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("pending")))

	// Pause, cancel in the stream, resume.
	func() {
		kind := `div.kind[data-kind="update_sales_counter"]`
		run("plugins", chromedp.Navigate(base+"/console/plugins"), chromedp.WaitVisible(chromedp.ID("plugins")))
		confirmAll()
		run("pause", click(kind+" button.pause"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text("#flash"), "paused update_sales_counter: every host leaves its deliveries waiting in the stream")
		require.Equal(t, "paused", text(kind+" .paused"))
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM kind_pauses WHERE kind = 'update_sales_counter' AND resumed_at IS NULL AND paused_by = 'console'`))
		require.EqualValues(t, 1, consoleActions("pause_kind", "update_sales_counter"))
		require.Regexp(t, `(?m)^update_sales_counter\s+\S+\s+console`, cli("kinds", "paused"))
		hosttest.Eventually(t, 10*time.Second, "the host to see the pause", func() bool { return h.Paused("update_sales_counter") })

		keep, gone := place(orders.Jobs{Counter: true}), place(orders.Jobs{Counter: true})
		keepJob, goneJob := strconv.FormatInt(keep.OutboxIDs[0], 10), strconv.FormatInt(gone.OutboxIDs[0], 10)
		hosttest.Eventually(t, 10*time.Second, "the entries in the stream, waiting", func() bool {
			return hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = ANY($1) AND published_at IS NOT NULL AND done_at IS NULL`,
				[]int64{keep.OutboxIDs[0], gone.OutboxIDs[0]}) == 2 && hosttest.Pending(t, rdb, stream, "usher") == 2
		})
		// A job on the stream is cancelled by request: no host starts it
		// from then on, and the flash says what it cannot promise.
		run("a waiting job", chromedp.Navigate(base+"/console/jobs?id="+goneJob), chromedp.WaitVisible(chromedp.ID("cancel-job")))
		confirmAll()
		run("cancel it", click("#cancel-job button"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text("#flash"), "cancel requested for job "+goneJob+" on the stream: no host will start it from now on")
		require.Contains(t, text("#flash"), "a run already started finishes under its guard")
		require.EqualValues(t, 1, consoleActions("cancel_job", goneJob))
		// A job waiting for its scheduled run is cancelled: it never runs.
		drop := place(orders.Jobs{})
		dropJob, err := schedule.NewJob(ctx, pool, "update_sales_counter", json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, drop.ID)),
			time.Now().Add(time.Hour), drop.RequestID, "")
		require.NoError(t, err)
		run("the job", chromedp.Navigate(base+"/console/jobs?id="+dropJob), chromedp.WaitVisible(chromedp.ID("cancel-job")))
		require.Equal(t, "waiting_to_retry", text("#job-state"), "scheduled, not run")
		confirmAll()
		run("cancel it", chromedp.SendKeys(chromedp.CSS("#cancel-job input[name=reason]"), "refunded at the desk"),
			click("#cancel-job button"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text("#flash"), "cancelled job "+dropJob+": its scheduled run never runs")
		require.Equal(t, "cancelled", text("#job-state"))
		require.Equal(t, "cancel_job", text(`#actions tr[data-action="cancel_job"] .action`))
		require.Equal(t, "console", text(`#actions tr[data-action="cancel_job"] .actor`))
		require.Contains(t, text(`#actions tr[data-action="cancel_job"] .detail`), "was scheduled; refunded at the desk")
		require.Zero(t, count("#cancel-job"), "nothing left to cancel")
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE job_id = $1 AND outcome = 'cancelled'`, dropJob))
		require.EqualValues(t, 1, consoleActions("cancel_job", dropJob))
		out := cli("jobs", "show", dropJob)
		require.Contains(t, out, "cancelled")
		require.Contains(t, out, "cancel_job")
		require.Contains(t, out, "refunded at the desk")
		shot("job-cancelled")

		run("plugins", chromedp.Navigate(base+"/console/plugins"), chromedp.WaitVisible(chromedp.ID("plugins")))
		shot("plugins-paused")
		run("resume", click(kind+" button.resume"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text("#flash"), "resumed update_sales_counter")
		require.Zero(t, count(kind+" .paused"))
		require.EqualValues(t, 1, consoleActions("resume_kind", "update_sales_counter"))
		require.Contains(t, cli("kinds", "paused"), "no kind is paused")
		hosttest.Eventually(t, 30*time.Second, "the waiting job applied once resumed, the cancelled one settled", func() bool {
			return applied(keepJob) == 1 && hosttest.Pending(t, rdb, stream, "usher") == 0
		})
		require.Zero(t, applied(goneJob), "a job cancelled on the stream never runs")
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1 AND outcome = 'cancelled'`, gone.OutboxIDs[0]))
		require.Zero(t, applied(dropJob), "a cancelled job never runs")
		require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM scheduled_jobs WHERE job_id = $1 AND enqueued_at IS NULL`, dropJob), "nothing left to schedule")
	}()

	// Run a scheduled job now.
	func() {
		p := place(orders.Jobs{})
		job, err := schedule.NewJob(ctx, pool, "update_sales_counter", json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, p.ID)),
			time.Now().Add(time.Hour), p.RequestID, "")
		require.NoError(t, err)
		run("the job", chromedp.Navigate(base+"/console/jobs?id="+job), chromedp.WaitVisible(chromedp.ID("run-now")))
		require.Equal(t, "waiting_to_retry", text("#job-state"))
		run("run it now", click("#run-now button"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text("#flash"), "job "+job+" is due now")
		require.EqualValues(t, 1, consoleActions("run_job_now", job))
		hosttest.Eventually(t, 30*time.Second, "the scheduled job applied", func() bool { return applied(job) == 1 })
		out := cli("jobs", "show", job)
		require.Contains(t, out, "state       done")
		require.Contains(t, out, "run_job_now")
		run("the job", chromedp.Navigate(base+"/console/jobs?id="+job), chromedp.WaitVisible(chromedp.ID("actions")))
		require.Equal(t, "done", text("#job-state"))
		require.Equal(t, "run_job_now", text(`#actions tr[data-action="run_job_now"] .action`))
	}()

	// Requeue a ticked set, discard a letter.
	func() {
		var jobs []string
		for i := range 3 {
			ids, err := outbox.Add(ctx, pool, outbox.Message{Kind: "update_sales_counter",
				Payload: json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, 910000001+i)), RequestID: fmt.Sprintf("req-actions-%d", i)})
			require.NoError(t, err)
			jobs = append(jobs, strconv.FormatInt(ids[0], 10))
		}
		hosttest.Eventually(t, 30*time.Second, "three dead letters", func() bool {
			return hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE job_id = ANY($1) AND requeued_at IS NULL`, jobs) == 3
		})
		letter := func(job string) int64 {
			return hosttest.Count(t, pool, `SELECT id FROM dead_letters WHERE job_id = $1`, job)
		}
		for i := range 2 { // the first two can run once their orders exist
			_, err = pool.Exec(ctx, `INSERT INTO orders (id, public_id, event_id, buyer, email, seats) VALUES ($1, $2, $3, 'Late', 'l@example.com', 1)`,
				910000001+i, fmt.Sprintf("actions-late-%d", i), ev)
			require.NoError(t, err)
		}
		run("dead letters", chromedp.Navigate(base+"/console/deadletters"), chromedp.WaitVisible(chromedp.ID("requeue-set")))
		require.Equal(t, 3, count("#letters input.pick"))
		for _, j := range jobs[:2] {
			run("tick "+j, click(fmt.Sprintf(`#letters tr[data-job="%s"] input.pick`, j)))
		}
		shot("deadletters-ticked")
		run("requeue the ticked", click("#requeue-set button"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text("#flash"), "requeued 2 chosen dead letter(s)")
		require.Equal(t, 1, count("#letters tbody tr"))
		require.Equal(t, 1, count(fmt.Sprintf(`#letters tr[data-job="%s"]`, jobs[2])))
		for _, j := range jobs[:2] {
			require.EqualValues(t, 1, consoleActions("requeue_dead_letter", j))
		}
		hosttest.Eventually(t, 30*time.Second, "the requeued set applied", func() bool { return applied(jobs[0])+applied(jobs[1]) == 2 })
		require.Contains(t, cli("jobs", "show", jobs[0]), "requeue_dead_letter")

		run("the third letter", chromedp.Navigate(fmt.Sprintf("%s/console/deadletters/%d", base, letter(jobs[2]))), chromedp.WaitVisible(chromedp.ID("discard")))
		confirmAll()
		run("discard it", chromedp.SendKeys(chromedp.CSS("#discard input[name=reason]"), "test order, never existed"),
			click("#discard button"), chromedp.WaitVisible(chromedp.ID("no-letters")))
		require.Contains(t, text("#flash"), fmt.Sprintf("discarded dead letter %d of job %s", letter(jobs[2]), jobs[2]))
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE job_id = $1 AND discarded_at IS NOT NULL
			AND requeued_at IS NULL AND discard_reason = 'test order, never existed'`, jobs[2]), "kept, marked discarded")
		require.EqualValues(t, 1, consoleActions("discard_dead_letter", jobs[2]))
		require.Contains(t, cli("deadletters", "list"), "no open dead letters")
		out := cli("jobs", "show", jobs[2])
		require.Contains(t, out, "discarded (dead letter")
		require.Contains(t, out, "discard_dead_letter")
		run("its job", chromedp.Navigate(base+"/console/jobs?id="+jobs[2]), chromedp.WaitVisible(chromedp.ID("actions")))
		require.Equal(t, "discarded", text("#job-state"))
		require.Contains(t, text(`#actions tr[data-action="discard_dead_letter"] .detail`), "test order, never existed")
		require.Equal(t, 1, count("#deliveries tbody tr"), "its dead-lettered delivery is still in its history")
		shot("job-discarded")
	}()

	// Roll a plugin back.
	func() {
		install(t, dir, v2, "2.0.0")
		row := `tr[data-plugin="counters"] `
		run("plugins", chromedp.Navigate(base+"/console/plugins"), chromedp.WaitVisible(chromedp.ID("plugins")))
		require.Zero(t, count(row+"button.rollback"), "nothing to roll back to yet")
		run("reload", click(row+"button.reload"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Equal(t, "2.0.0", text(row+".version"))
		require.Equal(t, "Roll back to 1.0.0", text(row+"button.rollback"))
		run("plugins", chromedp.Navigate(base+"/console/plugins"), chromedp.WaitVisible(chromedp.ID("plugins")))
		confirmAll()
		run("roll back", click(row+"button.rollback"), chromedp.WaitVisible(chromedp.ID("flash")))
		require.Contains(t, text("#flash"), "counters: rolled back (2.0.0 → 1.0.0)")
		require.Equal(t, "1.0.0", text(row+".version"))
		for _, p := range h.Plugins() {
			require.Equal(t, "1.0.0", p.Version)
		}
		require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM plugin_swaps WHERE plugin = 'counters'
			AND from_version = '2.0.0' AND to_version = '1.0.0'`))
		require.EqualValues(t, 1, consoleActions("rollback_plugin", "counters"))
		require.Regexp(t, `rollback_plugin\s+counters\s+console\s+\S+\s+2\.0\.0 → 1\.0\.0`, cli("kinds", "paused"))
		shot("plugins-rolled-back")
	}()
}
