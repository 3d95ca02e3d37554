package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/jobctl"
	"github.com/usherhq/usher/host/ops"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/pause"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// chromiumPath finds Debian's Chromium. Without it the test skips, unless
// CI is set: .ci/run installs it, so there it must run.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium not found and CI is set: .ci/run installs it (apt-get install chromium)")
	}
	t.Skip("chromium not found (apt-get install chromium); the console's browser test needs it")
	return ""
}

// artifacts is where the test's screenshots go: $USHER_ARTIFACTS, else
// testdata/artifacts (gitignored).
func artifacts(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("USHER_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join("testdata", "artifacts")
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	return dir
}

// browser starts Chromium headless with the flags this machine needs and
// returns its context, ended (and the browser stopped) with the test.
func browser(t *testing.T, chromium string, height int, timeout time.Duration) context.Context {
	t.Helper()
	opts := append([]chromedp.ExecAllocatorOption(nil),
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.NoFirstRun, chromedp.WindowSize(1280, height), chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	bctx, cancelTimeout := context.WithTimeout(bctx, timeout)
	t.Cleanup(func() { cancelTimeout(); cancelBrowser(); cancelAlloc() })
	return bctx
}

// install copies bin into dir as "counters" (by rename, as a deploy would)
// with its manifest at version.
func install(t *testing.T, dir, bin, version string) {
	t.Helper()
	src, err := os.ReadFile(bin)
	require.NoError(t, err)
	tmp := filepath.Join(dir, ".counters.tmp")
	require.NoError(t, os.WriteFile(tmp, src, 0o755))
	require.NoError(t, os.Rename(tmp, filepath.Join(dir, "counters")))
	m, err := pluginhost.NewFileManifest(filepath.Join(dir, "counters"), "counters", version, []string{"update_sales_counter"})
	require.NoError(t, err)
	hosttest.AddShipped(t, &m, dir)
	_, err = m.Write(dir)
	require.NoError(t, err)
}

// After a known flow (orders placed, two jobs dead-lettered for orders
// that do not exist) the console, in Chromium, shows the numbers the
// database and Redis hold; reloading a plugin from its page swaps it;
// a dead letter names its last attempt as its job's history does, and
// links to the job; requeueing one dead letter, then the rest of its kind,
// puts them back (no longer open) and the jobs run again, on the new
// version; the job search
// shows a job's rows, history and workflow; and a POST without the
// console's Origin or session is refused.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	v1 := hosttest.Build(t, "./plugins/counters/chaos")
	v2 := hosttest.Build(t, "./plugins/counters/chaos", "main.version=2.0.0")
	dir := t.TempDir()
	install(t, dir, v1, "1.0.0")
	h := hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream, PluginDir: dir, DisablePluginWatch: true,
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond, AdminAddr: "127.0.0.1:0",
		ConsoleChartWindow: time.Minute, ConsoleChartBucket: time.Second})
	hosttest.Eventually(t, 10*time.Second, "the admin listener", func() bool { return h.AdminAddr() != "" })
	base := "http://" + h.AdminAddr()

	// The flow: 12 orders counted, and two counter jobs for orders that
	// do not exist, which the counters plugin fails permanently.
	const n = 12
	ev, err := orders.CreateEvent(ctx, pool, "Console Night", "Stagedoor Hall")
	require.NoError(t, err)
	for range n {
		_, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: 2}, orders.Jobs{Counter: true})
		require.NoError(t, err)
	}
	const missing = 900000001
	ids, err := outbox.Add(ctx, pool, outbox.Message{Kind: "update_sales_counter", Payload: json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, missing)),
		RequestID: "req-console-missing"})
	require.NoError(t, err)
	deadJob := strconv.FormatInt(ids[0], 10)
	const missing2 = 900000002
	ids, err = outbox.Add(ctx, pool, outbox.Message{Kind: "update_sales_counter", Payload: json.RawMessage(fmt.Sprintf(`{"order_id":%d}`, missing2)),
		RequestID: "req-console-missing-2"})
	require.NoError(t, err)
	deadJob2 := strconv.FormatInt(ids[0], 10)
	hosttest.Eventually(t, 30*time.Second, "the orders counted and the missing ones dead-lettered", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies`) == n &&
			hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE requeued_at IS NULL`) == 2 &&
			hosttest.Pending(t, rdb, stream, "usher") == 0
	})
	letterID := hosttest.Count(t, pool, `SELECT id FROM dead_letters WHERE job_id = $1`, deadJob)

	bctx := browser(t, chromium, 1000, 3*time.Minute)
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, steps...), what)
	}
	text := func(sel string) string {
		t.Helper()
		return pageText(t, bctx, sel)
	}
	location := func() string {
		t.Helper()
		loc, err := chromedp.Run(bctx, chromedp.Location())
		require.NoError(t, err)
		return loc
	}
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(bctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
		require.NoError(t, err, "count "+sel)
		return n
	}
	states := func() []string {
		t.Helper()
		out, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#jobs td.state')).map(e => e.textContent.trim())`))
		require.NoError(t, err)
		return out
	}

	// Not logged in: the console sends the browser to its login form; a
	// wrong token is refused there, the right one logs in.
	run("open the console", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")))
	require.Contains(t, location(), "/console/login")
	run("log in wrongly", chromedp.SendKeys(chromedp.ID("token"), strings.Repeat("0", 64)), chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("login-error")))
	run("log in", chromedp.SendKeys(chromedp.ID("token"), h.AdminToken), chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("pending")))
	require.Equal(t, base+"/console/", location())

	// The overview: the numbers inspect reads, the lag ReadLag reads, and
	// charts of the cluster's job history.
	in, err := ops.Inspect(ctx, h.Pool(), rdb, stream, "usher", time.Now())
	require.NoError(t, err)
	run("reload the overview", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("totals")))
	history := func(verdict string) string {
		return strconv.FormatInt(hosttest.Count(t, pool, `SELECT count(*) FROM job_history WHERE kind = 'update_sales_counter'
			AND ($1 = '' OR verdict = $1)`, verdict), 10)
	}
	require.Equal(t, strconv.Itoa(n), history("applied"))
	require.Equal(t, history("applied"), text(`#totals tr[data-kind="update_sales_counter"] .applied`))
	require.Equal(t, history("dead_letter"), text(`#totals tr[data-kind="update_sales_counter"] .dead-letter`))
	require.Equal(t, history("absorbed"), text(`#totals tr[data-kind="update_sales_counter"] .absorbed`))
	require.Equal(t, history(""), text(`#totals tr[data-kind="update_sales_counter"] .total`))
	// The chart's points are the same records per second of their
	// bucket: summed over the buckets, the applied line is the count.
	appliedPerSecond, err := chromedp.Run(bctx, chromedp.Evaluate[[]float64](
		`Array.from(document.querySelectorAll('figure.throughput[data-kind="update_sales_counter"] polyline[data-series="applied"]')).flatMap(p => p.dataset.values.split(' ').map(Number))`))
	require.NoError(t, err)
	var sum float64
	for _, v := range appliedPerSecond {
		sum += v // buckets of 1s: a rate per second is the bucket's count
	}
	require.Equal(t, history("applied"), strconv.FormatFloat(sum, 'f', -1, 64))
	require.Equal(t, "0", text("#pending"))
	require.EqualValues(t, 0, in.Pending)
	lag, err := ops.ReadLag(ctx, h.Pool(), rdb, stream, "usher", time.Now())
	require.NoError(t, err)
	require.Equal(t, strconv.FormatInt(lag.GroupLag, 10), text("#group-lag"))
	require.Equal(t, "0s", text("#oldest-pending"), "nothing pending")
	require.Equal(t, "0s", text("#relay-lag"), "nothing unpublished")
	require.Equal(t, strconv.FormatInt(hosttest.Count(t, pool, `SELECT count(*) FROM processed_jobs`), 10), text("#processed-jobs"))
	require.Equal(t, strconv.FormatInt(hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`), 10), text("#outbox-unpublished"))
	require.Equal(t, "2", text("#dead-open"))
	require.Equal(t, "2", text(`#dead-by-kind tr[data-kind="update_sales_counter"] td.n`))
	// The stream's length moves as the host trims it: the page's, read
	// at its last refresh, meets a fresh inspect's.
	hosttest.Eventually(t, 15*time.Second, "the page's stream length to match inspect's", func() bool {
		now, err := ops.Inspect(ctx, h.Pool(), rdb, stream, "usher", time.Now())
		return err == nil && strconv.FormatInt(now.Entries, 10) == text("#entries")
	})
	// The run time's and queue wait's percentiles, from the same
	// deliveries as SQL reads them: run time over every delivery, queue
	// wait from the outbox row's commit over first deliveries.
	attr := func(sel, name string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](fmt.Sprintf("document.querySelector(%q).getAttribute(%q)", sel, name)))
		require.NoError(t, err)
		return v
	}
	micros := func(seconds float64) string {
		return strconv.FormatInt(time.Duration(seconds*float64(time.Second)).Microseconds(), 10)
	}
	var runP, waitP [3]float64
	require.NoError(t, pool.QueryRow(ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)),
		percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)),
		percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at))
		FROM job_history WHERE kind = 'update_sales_counter'`).Scan(&runP[0], &runP[1], &runP[2]))
	require.NoError(t, pool.QueryRow(ctx, `SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM h.started_at - o.created_at)),
		percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM h.started_at - o.created_at)),
		percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM h.started_at - o.created_at))
		FROM job_history h JOIN outbox o ON o.id = h.outbox_id
		WHERE h.kind = 'update_sales_counter' AND h.attempt = 0 AND h.deliveries = 1`).Scan(&waitP[0], &waitP[1], &waitP[2]))
	runCell, waitCell := `#totals tr[data-kind="update_sales_counter"] td.run-p`, `#totals tr[data-kind="update_sales_counter"] td.wait-p`
	for i, p := range []string{"data-p50", "data-p95", "data-p99"} {
		require.Equal(t, micros(runP[i]), attr(runCell, p), "run time "+p)
		require.Equal(t, micros(waitP[i]), attr(waitCell, p), "queue wait "+p)
	}
	require.Regexp(t, `^\S+ / \S+ / \S+$`, text(runCell))
	require.Regexp(t, `^\S+ / \S+ / \S+$`, text(waitCell))
	require.Equal(t, strconv.FormatInt(hosttest.Count(t, pool, `SELECT count(*) FROM job_history h JOIN outbox o ON o.id = h.outbox_id
		WHERE h.kind = 'update_sales_counter' AND h.attempt = 0 AND h.deliveries = 1`), 10),
		attr(waitCell, "data-waits"), "the first deliveries the waits are over")
	require.Equal(t, 3, count(`figure.throughput[data-kind="update_sales_counter"] polyline`), "applied, absorbed and dead_lettered lines")
	require.Equal(t, 1, count(`figure.took[data-kind="update_sales_counter"] polyline`), "the mean duration's line")
	shot(t, bctx, "overview")

	// Dead letters: the two letters, filtered by kind, and one shown whole.
	run("dead letters", chromedp.Navigate(base+"/console/deadletters?kind=update_sales_counter"), chromedp.WaitVisible(chromedp.ID("letters")))
	require.Equal(t, 2, count("#letters tbody tr"))
	require.Contains(t, text(fmt.Sprintf(`#letters tr[data-job="%s"] .reason`, deadJob)), "does not exist")
	// The letter names its last attempt as the job's history does, and
	// its age humanised.
	letterRow := fmt.Sprintf(`#letters tr[data-job="%s"] `, deadJob)
	require.Equal(t, "0 (1st)", text(letterRow+".attempt"))
	require.Regexp(t, `^\d[\d.]*(µs|ms|s|m\d\ds)$`, text(letterRow+".age"))
	shot(t, bctx, "deadletters")
	// Its job column links to the job's page.
	jobLink := letterRow + "td:nth-child(3) a"
	href, err := chromedp.Run(bctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q).href`, jobLink)))
	require.NoError(t, err)
	require.Equal(t, base+"/console/jobs?id="+deadJob, href)
	run("the letter's job", click(jobLink), chromedp.WaitVisible(chromedp.ID("job-state")))
	require.Equal(t, href, location())
	require.Equal(t, "dead_lettered", text("#job-state"))
	require.Equal(t, "0 (1st)", text("#deliveries tbody tr:last-child .attempt"), "the history's attempt, as the letter names it")
	run("the letters again", chromedp.Navigate(base+"/console/deadletters?kind=update_sales_counter"), chromedp.WaitVisible(chromedp.ID("letters")))
	run("show the letter", click(fmt.Sprintf(`#letters tr[data-job="%s"] a`, deadJob)),
		chromedp.WaitVisible(chromedp.ID("letter")))
	require.Contains(t, text("#letter"), strconv.Itoa(missing))
	require.Equal(t, "0 (1st), as its history numbers it", text("#letter-attempt"))
	shot(t, bctx, "deadletter")

	// Plugins: 1.0.0 running; a 2.0.0 installed in the plugin directory
	// is swapped in by the reload button.
	run("plugins", chromedp.Navigate(base+"/console/plugins"), chromedp.WaitVisible(chromedp.ID("plugins")))
	require.Equal(t, "1.0.0", text(`tr[data-plugin="counters"] .version`))
	require.Equal(t, "healthy", text(`tr[data-plugin="counters"] .health`))
	require.Equal(t, "0", text(`tr[data-plugin="counters"] .in-flight`))
	require.Equal(t, 1, count(`section.swaps[data-plugin="counters"] .no-swaps`))
	install(t, dir, v2, "2.0.0")
	run("reload counters", click(`tr[data-plugin="counters"] button.reload`),
		chromedp.WaitVisible(chromedp.ID("flash")))
	require.Contains(t, text("#flash"), "counters: swapped (1.0.0 → 2.0.0)")
	require.Equal(t, "2.0.0", text(`tr[data-plugin="counters"] .version`))
	require.Contains(t, text(`tr[data-plugin="counters"] .probation`), "rollback to 1.0.0 possible")
	for _, p := range h.Plugins() {
		require.Equal(t, "2.0.0", p.Version)
	}
	// The swap's history: the row the host wrote, as the database holds it.
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM plugin_swaps WHERE plugin = 'counters'
		AND action = 'swapped' AND from_version = '1.0.0' AND to_version = '2.0.0' AND cause = 'reload'`))
	require.Equal(t, 1, count(`section.swaps[data-plugin="counters"] tbody tr`))
	swap := `section.swaps[data-plugin="counters"] tbody tr:first-child `
	var swappedBy string
	require.NoError(t, pool.QueryRow(ctx, `SELECT host FROM plugin_swaps`).Scan(&swappedBy))
	require.NotEmpty(t, swappedBy)
	require.Equal(t, []string{"swapped", "1.0.0", "2.0.0", "reload", swappedBy},
		[]string{text(swap + ".action"), text(swap + ".from"), text(swap + ".to"), text(swap + ".cause"), text(swap + ".host")})
	shot(t, bctx, "plugins-reloaded")

	// The orders appear; requeueing a letter from its page, then every
	// open one of the kind from the list, runs the jobs again (on 2.0.0)
	// with their identities kept.
	for i, id := range []int{missing, missing2} {
		_, err = pool.Exec(ctx, `INSERT INTO orders (id, public_id, event_id, buyer, email, seats) VALUES ($1, $2, $3, 'Late', 'l@example.com', 3)`,
			id, fmt.Sprintf("console-late-%d", i), ev)
		require.NoError(t, err)
	}
	run("requeue one", chromedp.Navigate(fmt.Sprintf("%s/console/deadletters/%d", base, letterID)), chromedp.WaitVisible(chromedp.ID("requeue-one")),
		chromedp.Submit(chromedp.ID("requeue-one")), chromedp.WaitVisible(chromedp.ID("flash")))
	require.Contains(t, text("#flash"), "requeued 1 dead letter(s)")
	require.Equal(t, 1, count("#letters tbody tr"))
	require.Equal(t, 1, count(fmt.Sprintf(`#letters tr[data-job="%s"]`, deadJob2)))
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE requeued_at IS NULL`))
	run("requeue the kind", chromedp.Navigate(base+"/console/deadletters?kind=update_sales_counter"), chromedp.WaitVisible(chromedp.ID("requeue-kind")))
	_, err = chromedp.Run(bctx, chromedp.Evaluate[bool](`window.confirm = () => true; true`)) // the page asks first
	require.NoError(t, err)
	run("requeue the kind", click("#requeue-kind button"), chromedp.WaitVisible(chromedp.ID("no-letters")))
	require.Contains(t, text("#flash"), "requeued 1 dead letter(s) of kind update_sales_counter")
	require.EqualValues(t, 0, hosttest.Count(t, pool, `SELECT count(*) FROM dead_letters WHERE requeued_at IS NULL`))
	hosttest.Eventually(t, 30*time.Second, "the requeued jobs applied by 2.0.0", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies WHERE job_id IN ($1, $2) AND plugin_version = '2.0.0'`, deadJob, deadJob2) == 2
	})
	shot(t, bctx, "deadletters-requeued")

	// Jobs: searched by id, one line for the job (its two outbox rows
	// keep one identity), in the state its page gives it.
	hosttest.Eventually(t, 10*time.Second, "the requeued row finished", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE job_id = $1 AND outcome IS NOT NULL`, deadJob) == 1
	})
	run("jobs", chromedp.Navigate(base+"/console/jobs?id="+deadJob), chromedp.WaitVisible(chromedp.ID("jobs")))
	// Its first row was dead-lettered; the requeued row applied it (the
	// attempt's verdict is in the history below).
	require.Equal(t, []string{"done"}, states(), "one line for the job, as it ended")
	require.Equal(t, "2", text(`#jobs td.attempts`))
	// Its history: dead-lettered on 1.0.0, then applied on 2.0.0.
	require.Equal(t, "done", text("#job-state"))
	deliveries, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('#deliveries tbody tr')).map(r => r.querySelector('.verdict').textContent.trim() + " " + r.querySelector('.plugin-version').textContent.trim())`))
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"dead_letter counters 1.0.0", "applied counters 2.0.0"}, deliveries)
	shot(t, bctx, "job-history")
	run("by request id", chromedp.Navigate(base+"/console/jobs?request=req-console-missing&state=done"), chromedp.WaitVisible(chromedp.ID("jobs")))
	require.Equal(t, []string{"done"}, states())
	require.Contains(t, text(fmt.Sprintf(`#workflow li[data-job="%s"] .state`, deadJob)), "done")
	shot(t, bctx, "jobs")

	// The overview updates itself while jobs flow: no reload (a mark
	// set on the page's window survives), its numbers follow the
	// database's.
	run("the overview again", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("processed-jobs")))
	_, err = chromedp.Run(bctx, chromedp.Evaluate[bool](`window.notReloaded = true; true`))
	require.NoError(t, err)
	before := text("#processed-jobs")
	for range 3 {
		_, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: 1}, orders.Jobs{Counter: true})
		require.NoError(t, err)
	}
	hosttest.Eventually(t, 30*time.Second, "the overview's processed job ids to follow the database's, without a reload", func() bool {
		want := strconv.FormatInt(hosttest.Count(t, pool, `SELECT count(*) FROM processed_jobs`), 10)
		return want != before && text("#processed-jobs") == want && text("#pending") == "0"
	})
	kept, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.notReloaded === true`))
	require.NoError(t, err)
	require.True(t, kept, "the page was not reloaded")
	require.NotEqual(t, "load", text("#live-at"))
	require.Equal(t, base+"/console/", location())

	// The dead letters, a dead letter's page and the plugins page follow
	// the database without a reload too: a letter added appears (and a
	// tick holds the list as it is), a letter discarded elsewhere shows
	// discarded and its page stops, a kind paused and resumed elsewhere
	// shows it.
	run("the dead letters", chromedp.Navigate(base+"/console/deadletters"), chromedp.WaitVisible(chromedp.ID("no-letters")))
	markNotReloaded(t, bctx)
	_, err = deadletter.Add(ctx, pool, deadletter.Letter{JobID: "live-1", Kind: "live_kind", Payload: []byte(`{}`),
		Reason: "permanent: for the live list", Attempts: 1, StreamID: "1-9"})
	require.NoError(t, err)
	hosttest.Eventually(t, 30*time.Second, "the letter listed, without a reload", func() bool {
		return count(`#letters tr[data-job="live-1"] input.pick`) == 1
	})
	requireNotReloaded(t, bctx)
	run("tick it", click(`#letters tr[data-job="live-1"] input.pick`))
	require.Contains(t, text("#live-at"), "held while you choose", "a tick holds the list")
	ticked, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`document.querySelector('#letters tr[data-job="live-1"] input.pick').checked`))
	require.NoError(t, err)
	require.True(t, ticked)
	liveLetter := hosttest.Count(t, pool, `SELECT id FROM dead_letters WHERE job_id = 'live-1'`)
	run("the letter", chromedp.Navigate(fmt.Sprintf("%s/console/deadletters/%d", base, liveLetter)), chromedp.WaitVisible(chromedp.ID("discard")))
	markNotReloaded(t, bctx)
	_, err = jobctl.Discard(ctx, pool, liveLetter, "ops", "discarded elsewhere")
	require.NoError(t, err)
	hosttest.Eventually(t, 30*time.Second, "the letter shown discarded, without a reload", func() bool {
		return strings.Contains(text("#discarded"), "discarded elsewhere") && count("#discard") == 0
	})
	require.Contains(t, text("#live-at"), "final: no longer updated")
	requireNotReloaded(t, bctx)
	kindPaused := `#plugins div.kind[data-kind="update_sales_counter"] .paused`
	run("the plugins", chromedp.Navigate(base+"/console/plugins"), chromedp.WaitVisible(chromedp.ID("plugins")))
	markNotReloaded(t, bctx)
	require.Zero(t, count(kindPaused))
	_, _, err = pause.Pause(ctx, pool, "update_sales_counter", "ops", "paused elsewhere")
	require.NoError(t, err)
	hosttest.Eventually(t, 30*time.Second, "the kind shown paused, without a reload", func() bool { return count(kindPaused) == 1 })
	_, err = pause.Resume(ctx, pool, "update_sales_counter", "ops")
	require.NoError(t, err)
	hosttest.Eventually(t, 30*time.Second, "the kind shown resumed, without a reload", func() bool { return count(kindPaused) == 0 })
	requireNotReloaded(t, bctx)

	// Dead letters page by 200 with an honest total: 450 letters of a
	// kind of their own, three pages, the CLI saying when it cuts.
	for i := range 450 {
		_, err := deadletter.Add(ctx, pool, deadletter.Letter{JobID: fmt.Sprintf("page-%d", i), Kind: "paging_kind", Payload: []byte(`{}`),
			Reason: "permanent: for the pages", Attempts: 1, StreamID: fmt.Sprintf("%d-7", i+1)})
		require.NoError(t, err)
	}
	run("the first page", chromedp.Navigate(base+"/console/deadletters?kind=paging_kind"), chromedp.WaitVisible(chromedp.ID("letters-page")))
	require.Equal(t, "1–200", text("#letters-shown"))
	require.Equal(t, "450", text("#letters-total"))
	require.Equal(t, 200, count("#letters tbody tr"))
	require.Zero(t, count("#letters-first"))
	run("the second page", click("#letters-next"), chromedp.WaitVisible(chromedp.ID("letters-first")))
	require.Equal(t, "201–400", text("#letters-shown"))
	require.Equal(t, "450", text("#letters-total"))
	run("the last page", click("#letters-next"), chromedp.WaitVisible(chromedp.ID("letters-first")))
	require.Equal(t, "401–450", text("#letters-shown"))
	require.Equal(t, 50, count("#letters tbody tr"))
	require.Zero(t, count("#letters-next"), "no page after the last")
	first, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector('#letters tbody tr').dataset.job`))
	require.NoError(t, err)
	require.Equal(t, "page-400", first, "oldest first, page after page")

	checkCSRF(t, base, h.AdminToken)
}

// markNotReloaded marks the page bctx shows; requireNotReloaded checks the
// mark is still there, so the page was updated in place, not reloaded.
func markNotReloaded(t *testing.T, bctx context.Context) {
	t.Helper()
	_, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.notReloaded = true; true`))
	require.NoError(t, err)
}

func requireNotReloaded(t *testing.T, bctx context.Context) {
	t.Helper()
	kept, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`window.notReloaded === true`))
	require.NoError(t, err)
	require.True(t, kept, "the page was not reloaded")
}

// checkCSRF: a POST with the session cookie but no same-origin Origin is
// refused, as is one from another origin, and one without a session.
func checkCSRF(t *testing.T, base, token string) {
	t.Helper()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	post := func(path, origin string, form url.Values, cookie *http.Cookie) (int, *http.Response) {
		req, err := http.NewRequest("POST", base+path, strings.NewReader(form.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		if cookie != nil {
			req.AddCookie(cookie)
		}
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp
	}
	code, _ := post("/console/login", "", url.Values{"token": {token}}, nil)
	require.Equal(t, http.StatusForbidden, code, "login without Origin")
	code, _ = post("/console/login", "http://evil.example", url.Values{"token": {token}}, nil)
	require.Equal(t, http.StatusForbidden, code, "login from another origin")
	code, resp := post("/console/login", base, url.Values{"token": {token}}, nil)
	require.Equal(t, http.StatusSeeOther, code)
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "usher_console" {
			session = c
		}
	}
	require.NotNil(t, session)
	require.True(t, session.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, session.SameSite)

	code, _ = post("/console/plugins/reload", "", nil, session)
	require.Equal(t, http.StatusForbidden, code, "a POST with the cookie but no Origin")
	_, port, _ := strings.Cut(strings.TrimPrefix(base, "http://"), ":")
	otherPort, _ := strconv.Atoi(port)
	code, _ = post("/console/plugins/reload", fmt.Sprintf("http://127.0.0.1:%d", otherPort+1), nil, session)
	require.Equal(t, http.StatusForbidden, code, "a POST from the same site on another port")
	code, _ = post("/console/plugins/reload", base, nil, nil)
	require.Equal(t, http.StatusUnauthorized, code, "a POST without a session")
	code, _ = post("/console/plugins/reload", base, nil, session)
	require.Equal(t, http.StatusSeeOther, code, "the console's own POST")

	// The API itself still wants its bearer token: the cookie is for
	// /console/ only.
	req, err := http.NewRequest("GET", base+"/plugins", nil)
	require.NoError(t, err)
	req.AddCookie(session)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	require.Equal(t, http.StatusUnauthorized, res.StatusCode)
}

// click clicks the element sel selects, once it is there. The console's
// live pages swap a part in when it changed: a node queried the moment it
// is replaced is gone before the click reaches it, and the click is tried
// again on the new one.
func click(sel string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		var err error
		for range 5 {
			if _, err = chromedp.Click(chromedp.CSS(sel))(ctx, tg); err == nil || !replaced(err) {
				return chromedp.Void{}, err
			}
		}
		return chromedp.Void{}, err
	}
}

// replaced: err is chromedp's for a node the page replaced under it.
func replaced(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "No node with given id found") || strings.Contains(msg, "Could not compute box model") ||
		strings.Contains(msg, "Node is detached")
}

// pageText is the trimmed text of the element sel selects, once it is
// there. The overview swaps its live parts in every 2 s: a node read the
// moment it is replaced is gone ("No node with given id found"), and the
// read is tried again on the new one.
func pageText(t *testing.T, bctx context.Context, sel string) string {
	t.Helper()
	var err error
	for range 5 {
		var s string
		s, err = chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err == nil {
			return strings.TrimSpace(s)
		}
		if !replaced(err) {
			break
		}
	}
	require.NoError(t, err, "read "+sel)
	return ""
}
