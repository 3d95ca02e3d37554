package console

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/ops"
	"github.com/usherhq/usher/host/outcome"
)

// Every page parses with the layout (a broken template would stop the
// admin listener from starting).
func TestPagesParse(t *testing.T) {
	t.Parallel()
	pages, err := parsePages()
	require.NoError(t, err)
	for _, p := range []string{"overview.html", "deadletters.html", "deadletter.html", "plugins.html", "jobs.html", "login.html", "error.html"} {
		require.Contains(t, pages, p)
	}
}

// A chart's text is escaped: a kind or guard name reaches the page as
// HTML through it.
func TestChartEscapes(t *testing.T) {
	t.Parallel()
	at := time.Unix(1000, 0)
	svg := drawChart(`<b>kind</b>`, perSecond, at, at.Add(time.Second), []series{{Name: `<script>x</script>`, Points: []point{{At: at, Value: 1}, {At: at.Add(time.Second), Value: 3}}}})
	require.NotContains(t, svg, "<script>")
	require.NotContains(t, svg, "<b>")
	require.Contains(t, svg, "&lt;script&gt;")
	require.Equal(t, 1, strings.Count(svg, "<polyline"))
}

// The charts' points are the buckets' counts over their width, zero
// where a bucket holds none; the mean duration is over every verdict, with
// no point where a bucket holds none; the trouble chart counts retries,
// reclaims and republishes per bucket; the totals are the buckets' sums.
// The busiest kind comes first, a served kind with nothing last, idle.
func TestBuildCharts(t *testing.T) {
	t.Parallel()
	since := time.Unix(1000, 0).UTC()
	at := func(s int) time.Time { return since.Add(time.Duration(s) * time.Second) }
	buckets := []ops.Bucket{
		{Start: at(0), Kind: "a_quiet", Verdict: "applied", Guard: "job id recorded", Count: 1, TookMS: 5},
		{Start: at(0), Kind: "k", Verdict: "applied", Guard: "job id recorded", Count: 10, TookMS: 100, Reclaimed: 3},
		{Start: at(0), Kind: "k", Verdict: "absorbed", Guard: "job id recorded", Count: 2, TookMS: 20},
		{Start: at(4), Kind: "k", Verdict: "applied", Guard: "job id recorded", Count: 4, TookMS: 400},
		{Start: at(4), Kind: "k", Verdict: "retry_scheduled", Guard: "job id recorded", Count: 1, TookMS: 1000},
	}
	republished := []ops.Republished{{Start: at(2), Kind: "k", Count: 2}}
	c := buildCharts(buckets, republished, []string{"z_idle", "k", "a_idle", "z_idle"}, since, at(6), 2*time.Second)
	require.Len(t, c.Kinds, 2)
	require.Equal(t, []kindTotals{
		{Kind: "k", Applied: 14, Absorbed: 2, Retry: 1, Total: 17, Reclaimed: 3, Republished: 2, MeanMS: 1520.0 / 17, tookMS: 1520},
		{Kind: "a_quiet", Applied: 1, Total: 1, MeanMS: 5, tookMS: 5},
		{Kind: "a_idle", Idle: true}, {Kind: "z_idle", Idle: true},
	}, c.Totals)
	require.Equal(t, "k", c.Kinds[0].Kind, "busiest first")
	svg := c.Kinds[0].SVG
	require.Equal(t, 3, strings.Count(svg, "<polyline"), "applied, absorbed, dead_letter")
	trouble := c.Kinds[0].Trouble
	require.Contains(t, trouble, `data-series="retries" data-values="0 0 1"`)
	require.Contains(t, trouble, `data-series="reclaims" data-values="3 0 0"`)
	require.Contains(t, trouble, `data-series="republishes" data-values="0 2 0"`)
	// 3 buckets: applied 5/s, 0, 2/s; the y axis goes to 5.
	require.Contains(t, svg, `data-series="applied"`)
	require.Contains(t, c.Kinds[0].Took, `data-series="mean"`)
	require.Contains(t, c.Absorbed, `data-series="job id recorded"`)
	require.Equal(t, []time.Time{at(0), at(2), at(4)}, bucketStarts(since, at(6), 2*time.Second))
}

func TestSafeNext(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"/console/jobs?id=1": "/console/jobs?id=1", "": "/console/", "https://evil.example/": "/console/",
		"//evil.example/console/": "/console/", "/plugins": "/console/", `/console/\evil`: "/console/",
	} {
		require.Equal(t, want, safeNext(in), in)
	}
}

// A request's jobs on the durable workflows' timeline: a lane per job in
// the tree's order, a child under its parent, a bar per delivery coloured
// by its verdict; the axis ends at the last outcome once every job is
// final, and now while one is not. Names are escaped.
func TestRequestTimeline(t *testing.T) {
	t.Parallel()
	at := func(ms int) time.Time { return time.Unix(1000, 0).Add(time.Duration(ms) * time.Millisecond).UTC() }
	rec := func(attempt int, verdict outcome.Outcome, from, to int) history.Record {
		return history.Record{Attempt: attempt, Deliveries: 1, Consumer: "host-a", Verdict: verdict, StartedAt: at(from), FinishedAt: at(to)}
	}
	send := &history.Job{ID: "2", Kind: "send<tickets>", State: history.Done, History: []history.Record{rec(0, outcome.Applied, 900, 1000)}}
	render := &history.Job{ID: "1", Kind: "render_tickets", State: history.Done, Children: []*history.Job{send},
		History: []history.Record{rec(0, outcome.RetryScheduled, 0, 100), rec(1, outcome.Applied, 500, 600)}}
	count := &history.Job{ID: "3", Kind: "update_sales_counter", State: history.Done, History: []history.Record{rec(0, outcome.Applied, 50, 80)}}
	wf := &history.Workflow{RequestID: "req-1", Jobs: []*history.Job{render, count}}

	tl := buildRequestTimeline(wf, at(60_000))
	require.Equal(t, at(0), tl.Start)
	require.Equal(t, at(1000), tl.End, "every job final: the last outcome")
	var lanes []string
	for _, l := range tl.Lanes {
		var bars []string
		for _, b := range l.Bars {
			bars = append(bars, b.State)
		}
		lanes = append(lanes, fmt.Sprintf("%d %s %v", l.Depth, l.Name, bars))
	}
	require.Equal(t, []string{"0 render_tickets 1 [retry_scheduled applied]", "1 send<tickets> 2 [applied]", "0 update_sales_counter 3 [applied]"}, lanes)
	require.Contains(t, tl.Lanes[0].Bars[1].Title, "attempt 1 (2nd), delivery 1: applied after 100ms on host-a")
	svg := drawTimeline(tl)
	require.Equal(t, 4, strings.Count(svg, `<rect class="bar"`))
	require.Contains(t, svg, `data-state="retry_scheduled" x="200.0"`, "the first delivery at the axis' start")
	require.Contains(t, svg, `fill="#e08214"`)
	require.Contains(t, svg, `<a href="/console/jobs?id=1">`)
	require.NotContains(t, svg, "<tickets>")
	require.Contains(t, svg, `data-depth="1"`)

	send.State, send.History = history.Running, nil
	tl = buildRequestTimeline(wf, at(60_000))
	require.Equal(t, at(60_000), tl.End, "a job not final: now")
	require.Empty(t, tl.Lanes[1].Bars, "no delivery yet, no bar")
	require.Empty(t, buildRequestTimeline(&history.Workflow{Jobs: []*history.Job{{ID: "4", Kind: "k", State: history.Pending}}}, at(0)).Lanes,
		"nothing delivered: no timeline")
}
