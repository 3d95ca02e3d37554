package console_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/internal/mailproc"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// One order of the Stagedoor demo, through both plugins and the mail
// provider: the console's workflow view shows its three jobs (the render,
// the send the render enqueued, under it, and the count), each done, with
// its history, and draws them on a timeline: a lane per job, the send's
// under the render's, a bar per delivery in its verdict.
func TestConsoleShowsAnOrdersWorkflow(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	dir, work := t.TempDir(), t.TempDir()
	for name, kinds := range map[string][]string{"counters": {"update_sales_counter"}, "tickets": {"render_tickets", "send_tickets"}} {
		src, err := os.ReadFile(hosttest.Build(t, "./plugins/"+name+"/chaos"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), src, 0o755))
		m, err := pluginhost.NewFileManifest(filepath.Join(dir, name), name, "1.0.0", kinds)
		require.NoError(t, err)
		hosttest.AddShipped(t, &m, dir)
		_, err = m.Write(dir)
		require.NoError(t, err)
	}
	mp, err := mailproc.Start(hosttest.Build(t, "./cmd/mailprovider"), filepath.Join(work, "mail"), nil)
	require.NoError(t, err)
	defer mp.Stop()
	h := hosttest.Start(t, host.Config{DatabaseURL: dbURL, Redis: rdb, Stream: stream, PluginDir: dir, DisablePluginWatch: true,
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond, AdminAddr: "127.0.0.1:0",
		PluginEnv: []string{"USHER_BLOB_DIR=" + filepath.Join(work, "blobs"), "MAILPROVIDER_URL=" + mp.URL}})
	hosttest.Eventually(t, 10*time.Second, "the admin listener", func() bool { return h.AdminAddr() != "" })
	base := "http://" + h.AdminAddr()

	ev, err := orders.CreateEvent(ctx, pool, "Workflow Night", "Stagedoor Hall")
	require.NoError(t, err)
	placed, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: 2},
		orders.Jobs{Tickets: true, Counter: true})
	require.NoError(t, err)
	hosttest.Eventually(t, 60*time.Second, "the order's tickets mailed and its seats counted", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM plugin_tickets.email_sends WHERE order_id = $1 AND sent_at IS NOT NULL`, placed.ID) == 1 &&
			hosttest.Count(t, pool, `SELECT count(*) FROM counter_applies WHERE order_id = $1`, placed.ID) == 1 &&
			hosttest.Pending(t, rdb, stream, "usher") == 0
	})

	bctx := browser(t, chromium, 900, 2*time.Minute)
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, steps...), what)
	}
	run("log in", chromedp.Navigate(base+"/console/"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), h.AdminToken), chromedp.Submit(chromedp.ID("login")),
		chromedp.WaitVisible(chromedp.ID("pending")))
	run("the order's workflow", chromedp.Navigate(base+"/console/jobs?request="+placed.RequestID), chromedp.WaitVisible(chromedp.ID("workflow")))
	jobs, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('#workflow li[data-job]')).map(li => li.textContent.replace(/\s+/g, ' ').trim())`))
	require.NoError(t, err)
	require.Len(t, jobs, 3, "render, send and count: %q", jobs)
	all := strings.Join(jobs, "\n")
	for _, kind := range []string{"render_tickets", "send_tickets", "update_sales_counter"} {
		require.Contains(t, all, kind)
	}
	for _, j := range jobs {
		require.Contains(t, j, "done", j)
	}
	// The send hangs under the render that enqueued it.
	nested, err := chromedp.Run(bctx, chromedp.Evaluate[int](
		`document.querySelectorAll('#workflow li[data-job] li[data-job]').length`))
	require.NoError(t, err)
	require.Equal(t, 1, nested, "the send under its render")
	// Its timeline: a lane per job in the tree's order, the send under
	// its render, a bar per delivery in its verdict, as job_history holds
	// them.
	lanes, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#request-timeline g.lane')).map(g =>
		g.dataset.depth + ' ' + g.dataset.lane.split(' ')[0] + ' ' + Array.from(g.querySelectorAll('rect.bar')).map(r => r.dataset.state).join(','))`))
	require.NoError(t, err)
	rows, err := pool.Query(ctx, `SELECT kind, string_agg(verdict, ',' ORDER BY finished_at, id) FROM job_history WHERE request_id = $1 GROUP BY job_id, kind`,
		placed.RequestID)
	require.NoError(t, err)
	var want []string
	for rows.Next() {
		var kind, verdicts string
		require.NoError(t, rows.Scan(&kind, &verdicts))
		depth := "0"
		if kind == "send_tickets" {
			depth = "1"
		}
		want = append(want, depth+" "+kind+" "+verdicts)
	}
	require.NoError(t, rows.Err())
	require.ElementsMatch(t, want, lanes)
	for i, l := range lanes {
		if strings.HasPrefix(l, "1 send_tickets") {
			require.True(t, i > 0 && strings.HasPrefix(lanes[i-1], "0 render_tickets"), "the send's lane under its render's: %q", lanes)
		}
	}
	shot(t, bctx, "workflow")
}
