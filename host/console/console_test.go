package console

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	svg := drawChart(`<b>kind</b>`, perSecond, []series{{Name: `<script>x</script>`, Points: []point{{At: at, Value: 1}, {At: at.Add(time.Second), Value: 3}}}})
	require.NotContains(t, svg, "<script>")
	require.NotContains(t, svg, "<b>")
	require.Contains(t, svg, "&lt;script&gt;")
	require.Equal(t, 1, strings.Count(svg, "<polyline"))
}

// Rates come from counter differences; a counter that went down (a
// restart) counts from zero.
func TestRates(t *testing.T) {
	t.Parallel()
	at := time.Unix(1000, 0)
	v := []float64{0, 10, 30, 5}
	var samples []sample
	for i := range v {
		samples = append(samples, sample{at: at.Add(time.Duration(i) * 2 * time.Second), jobs: map[string]map[string]float64{"k": {"applied": v[i]}}})
	}
	pts := rates(samples, func(s sample) float64 { return s.jobs["k"]["applied"] })
	require.Len(t, pts, 3)
	require.Equal(t, []float64{5, 10, 2.5}, []float64{pts[0].Value, pts[1].Value, pts[2].Value})
}

// The mean duration between samples is the runs' added time over their
// number; an interval in which none ended has no point.
func TestMeanTook(t *testing.T) {
	t.Parallel()
	at := time.Unix(1000, 0)
	took := []sumCount{{0, 0}, {0.5, 10}, {0.5, 10}, {2.5, 20}}
	var samples []sample
	for i := range took {
		samples = append(samples, sample{at: at.Add(time.Duration(i) * time.Second), took: map[string]sumCount{"k": took[i]}})
	}
	pts := meanTook(samples, "k")
	require.Len(t, pts, 2)
	require.InDeltaSlice(t, []float64{50, 200}, []float64{pts[0].Value, pts[1].Value}, 1e-9)
	require.Equal(t, at.Add(3*time.Second), pts[1].At)
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
