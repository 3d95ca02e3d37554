package console_test

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/recurring"
)

// The durable workflows' pages in Chromium, on a host running the flows
// test plugin: the list counts a trip running; its page draws the
// timeline (a lane per step and timer) and takes a signal from its form,
// after which the trip completes, every lane completed or fired; a second
// trip is cancelled from its page and ends cancelled with its release
// step; a schedule is paused from the schedules page; the list pages by
// 200 with the total; the list and the schedules page follow the
// database without a reload. Each action is in the database and in
// operator_actions, with who acted.
func TestConsoleWorkflowPages(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	hosttest.EnsureRoles(t, "flows")
	_, err := pool.Exec(ctx, `CREATE TABLE flow_effects (order_id text NOT NULL, step text NOT NULL, paid bigint NOT NULL, note text NOT NULL,
			at timestamptz NOT NULL DEFAULT now());
		GRANT INSERT ON flow_effects TO `+hosttest.PluginRole("flows"))
	require.NoError(t, err)
	h := hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream, Plugins: []string{hosttest.Build(t, "./host/testdata/flows")},
		DisablePluginWatch: true, ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond, AdminAddr: "127.0.0.1:0",
		PluginEnv: []string{"FLOWS_CRASH_DIR=" + t.TempDir()}})
	hosttest.Eventually(t, 10*time.Second, "the admin listener", func() bool { return h.AdminAddr() != "" })
	base := "http://" + h.AdminAddr() + "/console/"
	state := func(id string) string {
		var s string
		require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM workflows WHERE type = 'trip' AND workflow_id = $1`, id).Scan(&s))
		return s
	}
	for _, id := range []string{"paid-trip", "left-trip"} {
		_, err := client.StartWorkflow(ctx, pool, "trip", id, map[string]string{"order": id})
		require.NoError(t, err)
	}
	// Both wait for the paid signal once their steps and timer are done.
	hosttest.Eventually(t, 60*time.Second, "both trips' first steps done and their timers fired", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM workflow_events WHERE type = 'timer_fired'`) == 2 &&
			hosttest.Count(t, pool, `SELECT count(*) FROM workflow_events WHERE type = 'step_completed'`) == 4
	})
	_, err = recurring.Add(ctx, pool, recurring.Schedule{Name: "nightly-trip", Target: "workflow", What: "trip",
		Input: []byte(`{"order": "nightly"}`), Cron: "0 3 * * *", CatchUp: "one"}, time.Now())
	require.NoError(t, err)

	bctx := browser(t, chromium, 1000, 2*time.Minute)
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, steps...), what)
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.querySelector(`+"`"+sel+"`"+`).innerText.replace(/\s+/g, ' ').trim()`))
		require.NoError(t, err, sel)
		return s
	}
	evaluate := func(js string) []string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](js))
		require.NoError(t, err, js)
		return v
	}
	run("log in", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), h.AdminToken), chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("pending")))
	run("the list", chromedp.Navigate(base+"workflows?type=trip"), chromedp.WaitVisible(chromedp.ID("workflows")))
	require.Contains(t, text("#workflow-counts"), "2 running")
	require.ElementsMatch(t, []string{"paid-trip", "left-trip"},
		evaluate(`Array.from(document.querySelectorAll('#workflows tr[data-workflow]')).map(r => r.dataset.workflow)`))
	// The list follows the database without a reload: a workflow started
	// meanwhile appears (a mark set on the page's window survives).
	markNotReloaded(t, bctx)
	_, err = client.StartWorkflow(ctx, pool, "trip", "late-trip", map[string]string{"order": "late-trip"})
	require.NoError(t, err)
	hosttest.Eventually(t, 30*time.Second, "the started trip listed, without a reload", func() bool {
		return text(`#workflow-counts`) == "3 running" && len(evaluate(`Array.from(document.querySelectorAll('#workflows tr[data-workflow="late-trip"]')).map(r => r.dataset.workflow)`)) == 1
	})
	requireNotReloaded(t, bctx)

	// The paid trip: its timeline, then a signal from its form.
	run("the paid trip", chromedp.Navigate(base+"workflows/trip/paid-trip"), chromedp.WaitVisible(chromedp.ID("timeline-svg")))
	require.Equal(t, "running", text("#workflow-state"))
	lanes := func() []string {
		return evaluate(`Array.from(document.querySelectorAll('#timeline-svg g.lane')).map(g => g.dataset.lane + '=' + g.dataset.state)`)
	}
	require.ElementsMatch(t, []string{"step reserve=completed", "step hold=completed", "timer grace=fired"}, lanes())
	run("send the signal", chromedp.SendKeys(`#signal-form input[name=name]`, "paid"),
		chromedp.SendKeys(`#signal-form input[name=signal_id]`, "pay-1"),
		chromedp.Submit(chromedp.ID("signal-form")), chromedp.WaitVisible(chromedp.ID("flash")))
	require.Contains(t, text("#flash"), "signal paid (pay-1) recorded")
	hosttest.Eventually(t, 60*time.Second, "the paid trip completed", func() bool { return state("paid-trip") == "completed" })
	run("the paid trip, completed", chromedp.Navigate(base+"workflows/trip/paid-trip"), chromedp.WaitVisible(chromedp.ID("workflow-result")))
	require.Equal(t, "completed", text("#workflow-state"))
	require.ElementsMatch(t, []string{"step reserve=completed", "step hold=completed", "timer grace=fired", "step notify=completed"}, lanes())
	require.Contains(t, evaluate(`Array.from(document.querySelectorAll('#timeline-svg line.mark')).map(l => l.dataset.mark)`), "signal_received")
	require.Contains(t, text("#history"), "signal_received paid pay-1")
	require.Empty(t, evaluate(`Array.from(document.querySelectorAll('#workflow-actions form')).map(f => f.id)`), "a finished workflow offers no actions")
	shot(t, bctx, "workflow-timeline")

	// The other is cancelled from its page: it releases and ends cancelled.
	run("cancel the other", chromedp.Navigate(base+"workflows/trip/left-trip"), chromedp.WaitVisible(chromedp.ID("cancel-form")),
		chromedp.SendKeys(`#cancel-form input[name=reason]`, "the buyer left"),
		chromedp.Submit(chromedp.ID("cancel-form")), chromedp.WaitVisible(chromedp.ID("flash")))
	require.Contains(t, text("#flash"), "cancel asked")
	hosttest.Eventually(t, 60*time.Second, "the other trip cancelled", func() bool { return state("left-trip") == "cancelled" })
	run("the cancelled trip", chromedp.Navigate(base+"workflows/trip/left-trip"), chromedp.WaitVisible(chromedp.ID("timeline-svg")))
	require.Equal(t, "cancelled", text("#workflow-state"))
	require.Contains(t, lanes(), "step release=completed")
	require.Contains(t, text("#workflow-result"), "the buyer left")

	// The schedule, paused from its page.
	run("the schedules", chromedp.Navigate(base+"schedules"), chromedp.WaitVisible(chromedp.ID("schedules")))
	require.Contains(t, text(`#schedules tr[data-schedule="nightly-trip"]`), "active")
	run("pause it", chromedp.Submit(`#schedules tr[data-schedule="nightly-trip"] form.pause`), chromedp.WaitVisible(chromedp.ID("flash")))
	require.Contains(t, text("#flash"), "schedule nightly-trip paused")
	require.Contains(t, text(`#schedules tr[data-schedule="nightly-trip"]`), "paused")
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM schedules WHERE name = 'nightly-trip' AND paused`))
	run("delete it", chromedp.Submit(`#schedules tr[data-schedule="nightly-trip"] form.delete`), chromedp.WaitVisible(chromedp.ID("flash")))
	require.Contains(t, text("#flash"), "schedule nightly-trip deleted")
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM schedules`))
	run("no schedules", chromedp.WaitVisible(chromedp.ID("no-schedules")))
	// The schedules page follows the database without a reload: one
	// added by the CLI's side appears, then shows paused.
	markNotReloaded(t, bctx)
	_, err = recurring.Add(ctx, pool, recurring.Schedule{Name: "late-trip", Target: "workflow", What: "trip",
		Input: []byte(`{"order": "late"}`), Every: time.Hour, CatchUp: "one"}, time.Now())
	require.NoError(t, err)
	hosttest.Eventually(t, 30*time.Second, "the added schedule listed, without a reload", func() bool {
		return len(evaluate(`Array.from(document.querySelectorAll('#schedules tr[data-schedule="late-trip"] .state')).map(e => e.textContent)`)) == 1
	})
	_, err = pool.Exec(ctx, `UPDATE schedules SET paused = true WHERE name = 'late-trip'`)
	require.NoError(t, err)
	hosttest.Eventually(t, 30*time.Second, "the schedule shown paused, without a reload", func() bool {
		return text(`#schedules tr[data-schedule="late-trip"] .state`) == "paused"
	})
	requireNotReloaded(t, bctx)

	// The list pages by 200 with the total: 230 workflows of a type of
	// their own, newest first.
	_, err = pool.Exec(ctx, `INSERT INTO workflows (type, workflow_id, state, input, request_id, trace, created_at)
		SELECT 'archived', 'a' || i, 'completed', '{}', 'archived:a' || i, '', now() - i * interval '1 second' FROM generate_series(1, 230) i`)
	require.NoError(t, err)
	run("the archived", chromedp.Navigate(base+"workflows?type=archived"), chromedp.WaitVisible(chromedp.ID("workflows-page")))
	require.Equal(t, "1–200", text("#workflows-shown"))
	require.Equal(t, "230", text("#workflows-total"))
	require.Equal(t, "a1", evaluate(`[document.querySelector('#workflows tr[data-workflow]').dataset.workflow]`)[0], "newest first")
	require.Equal(t, []string{"3"}, evaluate(`[document.getElementById('workflows-live').dataset.live]`), "the list refreshes itself")
	run("the next page", click("#workflows-next"), chromedp.WaitVisible(chromedp.ID("workflows-first")))
	require.Equal(t, "201–230", text("#workflows-shown"))
	require.Len(t, evaluate(`Array.from(document.querySelectorAll('#workflows tr[data-workflow]')).map(r => r.dataset.workflow)`), 30)
	require.Empty(t, evaluate(`Array.from(document.querySelectorAll('#workflows-next')).map(a => a.id)`), "no page after the last")

	var actions []string
	// No name given at login: who acted is "operator" and the browser's
	// address.
	rows, err := pool.Query(ctx, `SELECT action || ' ' || target FROM operator_actions WHERE actor LIKE 'operator via the console from 127.0.0.1:%' ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var a string
		require.NoError(t, rows.Scan(&a))
		actions = append(actions, a)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"workflow signal trip:paid-trip", "workflow cancel trip:left-trip", "schedule pause nightly-trip",
		"schedule delete nightly-trip"}, actions)
}
