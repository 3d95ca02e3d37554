package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/pause"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// The current console in Chromium on a host whose jobs really retry, are
// delivered again after a crash and republished: the overview's range is chosen from its
// links (and kept by the live refresh), its retries, reclaims and
// republishes chart sums to the history's counts; a job's page shows its
// payload as the outbox holds it, its download link gives the whole value
// as an attachment, and a job whose row retention deleted says its payload
// is gone; the jobs search pages with an honest total and finds jobs by
// their last error, typed into its form; a job's page follows its job
// from running to done without a reload and stops there, and the plugins
// page counts the job parked while its kind was paused.
func TestConsoleStaysCurrentInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	dir, faultDir := t.TempDir(), t.TempDir()
	install(t, dir, hosttest.Build(t, "./plugins/counters/chaos"), "1.0.0")
	h := hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream, PluginDir: dir, DisablePluginWatch: true,
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond, AdminAddr: "127.0.0.1:0",
		// Each job its own call, so a fault armed for a job fires for it.
		BatchMax: 1, RetryBackoff: 200 * time.Millisecond, PluginEnv: []string{faults.DirEnv + "=" + faultDir}})
	hosttest.Eventually(t, 10*time.Second, "the admin listener", func() bool { return h.AdminAddr() != "" })
	base := "http://" + h.AdminAddr()
	ev, err := orders.CreateEvent(ctx, pool, "Current Night", "Stagedoor Hall")
	require.NoError(t, err)
	order := func() int64 {
		t.Helper()
		p, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: 2}, orders.Jobs{})
		require.NoError(t, err)
		return p.ID
	}

	// Retries: the jobs fail once with a transient error (their ids are
	// known before they commit, to arm the fault for them).
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("history: %d records, %d retries; %d applied", hosttest.Count(t, pool, `SELECT count(*) FROM job_history`),
				hosttest.Count(t, pool, `SELECT count(*) FROM job_history WHERE verdict = 'retry_scheduled'`),
				hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies`))
		}
	})
	const n = 8
	var msgs []outbox.Message
	for range n {
		msgs = append(msgs, outbox.Message{Kind: "update_sales_counter", Payload: json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, order()))})
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	ids, err := outbox.Add(ctx, tx, msgs...)
	require.NoError(t, err)
	var jobs []string
	for _, id := range ids {
		jobs = append(jobs, strconv.FormatInt(id, 10))
	}
	require.NoError(t, faults.Arm(faultDir, "counter.before_apply", faults.Spec{Action: "error", JobIDs: jobs, Once: true}))
	require.NoError(t, tx.Commit(ctx))
	hosttest.Eventually(t, 60*time.Second, "every job applied after a retry", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies`) == n &&
			hosttest.Count(t, pool, `SELECT count(*) FROM job_history WHERE verdict = 'retry_scheduled'`) == n
	})
	// A redelivery: a job whose plugin crashes under it is delivered
	// again (the stream counts the delivery) once the plugin is back (its
	// id is known before it commits, to arm the crash for it alone).
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	ids, err = outbox.Add(ctx, tx, outbox.Message{Kind: "update_sales_counter", Payload: json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, order()))})
	require.NoError(t, err)
	crashed := strconv.FormatInt(ids[0], 10)
	require.NoError(t, faults.Arm(faultDir, "counter.before_apply", faults.Spec{Action: "crash", JobIDs: []string{crashed}, Once: true}))
	require.NoError(t, tx.Commit(ctx))
	hosttest.Eventually(t, 60*time.Second, "the crashed job delivered again and applied", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM job_history WHERE job_id = $1 AND deliveries > 1`, crashed) > 0 &&
			hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, crashed) == 1
	})
	require.NoError(t, faults.Disarm(faultDir, "counter.before_apply"))
	// A republish: a row marked published an hour ago that never
	// finished (its entry lost); the reconciler hands it back and it runs.
	ids, err = outbox.Add(ctx, pool, outbox.Message{Kind: "update_sales_counter", Payload: json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, order()))})
	require.NoError(t, err)
	lost := strconv.FormatInt(ids[0], 10)
	hosttest.Eventually(t, 30*time.Second, "the row applied once", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, lost) == 1
	})
	_, err = pool.Exec(ctx, `UPDATE outbox SET published_at = now() - interval '1 hour', done_at = NULL, outcome = NULL WHERE id = $1`, ids[0])
	require.NoError(t, err)
	rec, err := outbox.NewReconciler(outbox.ReconcilerConfig{Pool: pool, Redis: rdb, Streams: []string{stream}, Group: "usher", StaleAfter: time.Minute})
	require.NoError(t, err)
	republished, err := rec.Reconcile(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, republished)
	hosttest.Eventually(t, 30*time.Second, "the republished row run again (absorbed)", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE id = $1 AND done_at IS NOT NULL`, ids[0]) == 1 &&
			hosttest.Pending(t, rdb, stream, "usher") == 0
	})
	// Retention took one done job's row: only its history is left.
	gone := jobs[1]
	_, err = pool.Exec(ctx, `DELETE FROM outbox WHERE coalesce(job_id, id::text) = $1`, gone)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `DELETE FROM scheduled_jobs WHERE job_id = $1`, gone) // its retry's, moved to the outbox
	require.NoError(t, err)
	// 230 old rows of a kind of their own, for the jobs search's pages.
	_, err = pool.Exec(ctx, `INSERT INTO outbox (kind, payload, created_at, published_at, done_at, outcome)
		SELECT 'archived_kind', '{}', now() - interval '2 days' + i * interval '1 second', now(), now(), 'applied' FROM generate_series(1, 230) i`)
	require.NoError(t, err)

	bctx := browser(t, chromium, 1000, 3*time.Minute)
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, steps...), what)
	}
	text := func(sel string) string {
		t.Helper()
		return pageText(t, bctx, sel)
	}
	eval := func(js string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](js))
		require.NoError(t, err, js)
		return v
	}
	sum := func(kind, series string) string {
		t.Helper()
		return eval(fmt.Sprintf(`String(document.querySelector('figure.trouble[data-kind=%q] polyline[data-series=%q]').dataset.values.split(' ').map(Number).reduce((a, b) => a + b, 0))`, kind, series))
	}
	count := func(sql string, args ...any) string {
		t.Helper()
		return strconv.FormatInt(hosttest.Count(t, pool, sql, args...), 10)
	}
	run("log in", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), h.AdminToken), chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("pending")))

	// The range: 1h (the configured window) first, then 6h from its link,
	// kept by the live refresh.
	require.Equal(t, "1h", eval(`document.querySelector('#ranges a[aria-current]').dataset.range`))
	require.Equal(t, "60", eval(`document.getElementById('chart-window').dataset.bucketSeconds`))
	run("choose 6h", click(`#ranges a[data-range="6h"]`), chromedp.WaitVisible(chromedp.CSS(`#chart-window[data-range="6h"]`)))
	require.Equal(t, "360", eval(`document.getElementById('chart-window').dataset.bucketSeconds`), "6h in buckets of 6m")
	require.Equal(t, "6h", eval(`document.querySelector('#ranges a[aria-current]').dataset.range`))
	_, err = chromedp.Run(bctx, chromedp.Evaluate[bool](`window.notReloaded = true; true`))
	require.NoError(t, err)
	before := text("#live-at")
	require.Equal(t, "12", eval(`document.getElementById('overview').dataset.live`), "6h refreshes every 12 s")
	hosttest.Eventually(t, 30*time.Second, "a live refresh", func() bool { return text("#live-at") != before })
	require.Equal(t, "6h", eval(`document.getElementById('chart-window').dataset.range`), "the refresh keeps the range")
	require.Equal(t, "true", eval(`String(window.notReloaded === true)`))

	// Retries, reclaims and republishes: the chart's buckets sum to the
	// history's counts, as do the totals.
	const kind = "update_sales_counter"
	retries := count(`SELECT count(*) FROM job_history WHERE kind = $1 AND verdict = 'retry_scheduled'`, kind)
	reclaims := count(`SELECT count(*) FROM job_history WHERE kind = $1 AND deliveries > 1`, kind)
	republishes := count(`SELECT count(*) FROM job_republishes WHERE kind = $1`, kind)
	require.NotEqual(t, "0", retries)
	require.NotEqual(t, "0", reclaims)
	require.Equal(t, "1", republishes)
	require.Equal(t, retries, sum(kind, "retries"))
	require.Equal(t, reclaims, sum(kind, "reclaims"))
	require.Equal(t, republishes, sum(kind, "republishes"))
	row := `#totals tr[data-kind="update_sales_counter"] `
	require.Equal(t, retries, text(row+".retry"))
	require.Equal(t, reclaims, text(row+".reclaimed"))
	require.Equal(t, republishes, text(row+".republished"))
	require.Equal(t, count(`SELECT count(*) FROM job_history WHERE kind = $1`, kind), text(row+".total"))
	require.Equal(t, kind, eval(`document.querySelector('figure.throughput').dataset.kind`), "the only busy kind first")
	shot(t, bctx, "overview-range")

	// A job's payload, as the outbox holds it, and its download.
	job := jobs[0]
	var stored string
	require.NoError(t, pool.QueryRow(ctx, `SELECT payload::text FROM outbox WHERE id = $1`, job).Scan(&stored))
	run("a job", chromedp.Navigate(base+"/console/jobs?id="+job), chromedp.WaitVisible(chromedp.ID("payload-shown")))
	var pretty any
	require.NoError(t, json.Unmarshal([]byte(text("#payload-shown")), &pretty))
	var want any
	require.NoError(t, json.Unmarshal([]byte(stored), &want))
	require.Equal(t, want, pretty)
	require.Equal(t, strconv.Itoa(len(stored)), eval(`document.getElementById('payload-note').dataset.bytes`))
	download, err := chromedp.Run(bctx, chromedp.Evaluate[string](`fetch(document.getElementById('payload-download').href).then(r => r.text().then(body => JSON.stringify(
		[r.status, r.headers.get('content-type'), r.headers.get('content-disposition'), body])))`, chromedp.EvalAwaitPromise))
	require.NoError(t, err)
	var got []any
	require.NoError(t, json.Unmarshal([]byte(download), &got))
	require.Equal(t, []any{float64(200), "application/json", `attachment; filename="job-` + job + `-payload.json"`, stored}, got)
	shot(t, bctx, "job-payload")
	run("a job whose row is gone", chromedp.Navigate(base+"/console/jobs?id="+gone), chromedp.WaitVisible(chromedp.ID("payload-gone")))
	require.Contains(t, text("#payload-gone"), "no longer kept: outbox retention deleted the job's rows")
	require.EqualValues(t, 0, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE coalesce(job_id, id::text) = $1`, gone))

	// The jobs search: pages of 200 with the total, from its form.
	run("jobs", chromedp.Navigate(base+"/console/jobs"), chromedp.WaitVisible(chromedp.ID("job-search")),
		chromedp.SendKeys(chromedp.CSS(`#job-search input[name="kind"]`), "archived_kind"), chromedp.Submit(chromedp.ID("job-search")),
		// The results' page: its form says what was searched.
		chromedp.WaitVisible(chromedp.CSS(`#job-search input[name="kind"][value="archived_kind"]`)), chromedp.WaitVisible(chromedp.ID("jobs-page")))
	archived := count(`SELECT count(*) FROM outbox WHERE kind = 'archived_kind'`)
	require.Equal(t, "1–200", text("#jobs-shown"))
	require.Equal(t, archived, text("#jobs-total"))
	run("the next page", click("#jobs-next"), chromedp.WaitVisible(chromedp.ID("jobs-first")))
	require.Equal(t, "201–"+archived, text("#jobs-shown"))
	require.Equal(t, "0", eval(`String(document.querySelectorAll('#jobs-next').length)`))
	shot(t, bctx, "jobs-paging")
	// By the last error's text, in another case, and a time range.
	run("by error", chromedp.Navigate(base+"/console/jobs"), chromedp.WaitVisible(chromedp.ID("job-search")),
		chromedp.SendKeys(chromedp.ID("job-error"), "INJECTED Transient"),
		chromedp.SendKeys(chromedp.ID("job-from"), time.Now().UTC().Add(-time.Hour).Format("2006-01-02T15:04")),
		chromedp.Submit(chromedp.ID("job-search")), chromedp.WaitVisible(chromedp.CSS(`#job-error[value="INJECTED Transient"]`)),
		chromedp.WaitVisible(chromedp.ID("jobs-page")))
	// Jobs, each created at its latest row's commit.
	failed := count(`SELECT count(*) FROM (SELECT DISTINCT ON (coalesce(job_id, id::text)) coalesce(job_id, id::text) AS job, created_at
		FROM outbox ORDER BY coalesce(job_id, id::text), id DESC) o
		WHERE o.created_at >= now() - interval '1 hour' AND (SELECT h.error FROM job_history h
		WHERE h.job_id = o.job AND h.error <> '' ORDER BY h.finished_at DESC, h.id DESC LIMIT 1) ILIKE '%injected transient%'`)
	require.NotEqual(t, "0", failed)
	require.Equal(t, failed, text("#jobs-total"))
	require.Equal(t, "1–"+failed, text("#jobs-shown"))
	lastErrors := eval(`JSON.stringify(Array.from(document.querySelectorAll('#jobs td.last-error')).map(e => e.textContent.trim()))`)
	var errs []string
	require.NoError(t, json.Unmarshal([]byte(lastErrors), &errs))
	for _, e := range errs {
		require.Contains(t, strings.ToLower(e), "injected transient error")
	}
	shot(t, bctx, "jobs-search")

	// A job's page follows its job without a reload and stops once the
	// job is final. With its kind paused a job waits parked, and the
	// plugins page counts it parked now and its page says the pause holds
	// it; resumed, the job's page goes from
	// running to done by itself, its cancel form goes and the refresh
	// stops.
	_, _, err = pause.Pause(ctx, pool, kind, "test", "hold one job")
	require.NoError(t, err)
	hosttest.Eventually(t, 10*time.Second, "the host to see the pause", func() bool { return h.Paused(kind) })
	ids, err = outbox.Add(ctx, pool, outbox.Message{Kind: kind, Payload: json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, order()))})
	require.NoError(t, err)
	held := strconv.FormatInt(ids[0], 10)
	parkedNow := func() int64 {
		for _, p := range h.Plugins() {
			if p.Name == "counters" {
				return p.ParkedNow
			}
		}
		return -1
	}
	hosttest.Eventually(t, 30*time.Second, "the job parked", func() bool { return parkedNow() == 1 })
	run("plugins", chromedp.Navigate(base+"/console/plugins"), chromedp.WaitVisible(chromedp.ID("plugins-legend")))
	require.Equal(t, "1", text(`tr[data-plugin="counters"] .parked-now`))
	require.NotEqual(t, "0", text(`tr[data-plugin="counters"] .parked-total`))
	require.Contains(t, text("#plugins-legend"), "Restarts: how often this host started the plugin's process again after it crashed")
	require.Contains(t, eval(`document.querySelector('#plugins th[title*="reclaim"]').textContent`), "parked now")
	run("the held job", chromedp.Navigate(base+"/console/jobs?id="+held), chromedp.WaitVisible(chromedp.ID("job-state")))
	require.Equal(t, "running", text("#job-state"))
	require.Contains(t, text("#job-held"), "Held: its kind "+kind+" is paused (by test, ")
	require.Contains(t, text("#job-held"), ": hold one job); no host starts it until the kind is resumed.")
	require.Equal(t, "3", eval(`document.getElementById('job-live').dataset.live`))
	require.Equal(t, "1", eval(`String(document.querySelectorAll('#cancel-job').length)`))
	_, err = chromedp.Run(bctx, chromedp.Evaluate[bool](`window.notReloaded = true; true`))
	require.NoError(t, err)
	_, err = pause.Resume(ctx, pool, kind, "test")
	require.NoError(t, err)
	hosttest.Eventually(t, 30*time.Second, "the job's page to say done by itself", func() bool { return text("#job-state") == "done" })
	require.Equal(t, "true", eval(`String(window.notReloaded === true)`), "no reload")
	hosttest.Eventually(t, 10*time.Second, "the refresh to stop", func() bool { return strings.HasSuffix(text("#live-at"), "final: no longer updated") })
	require.Equal(t, "0", eval(`String(document.querySelectorAll('[data-live]').length)`))
	require.Equal(t, "0", eval(`String(document.querySelectorAll('#cancel-job').length)`), "nothing to cancel in a job done")
	require.Equal(t, "0", eval(`String(document.querySelectorAll('#job-held').length)`), "resumed: held no longer")
	require.Equal(t, "applied", text("#deliveries tbody tr:last-child .verdict"))
	require.Equal(t, base+"/console/jobs?id="+held, eval(`location.href`))
	require.Zero(t, parkedNow(), "run: parked no longer")
}
