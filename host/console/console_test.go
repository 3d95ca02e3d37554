package console

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/ops"
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
