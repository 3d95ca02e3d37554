package console

import (
	"slices"
	"sort"
	"time"

	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/ops"
	"github.com/usherhq/usher/host/outcome"
)

// chartVerdicts are the verdicts a kind's throughput chart draws.
var chartVerdicts = []outcome.Outcome{history.Applied, history.Absorbed, history.DeadLettered}

// series is one line of a chart: a value (a rate per second, a mean
// duration) per bucket.
type series struct {
	Name   string
	Points []point
}

type point struct {
	At    time.Time
	Value float64
}

// kindTotals is one kind's deliveries over the charts' window, by verdict,
// with its reclaimed deliveries and republished rows.
type kindTotals struct {
	Kind                            string
	Applied, Absorbed, DeadLettered int64
	Retry, Abandoned                int64
	Total                           int64
	Reclaimed, Republished          int64
	MeanMS                          float64
	tookMS                          float64
	// Idle: nothing of the kind (a kind a plugin serves) in the window.
	Idle bool
}

// charts are the overview's: per kind, its throughput (applied, absorbed
// and dead-lettered per second) and its mean run duration, and the
// duplicates absorbed per second by guard; all from the cluster's job
// history (ops.Throughput).
type charts struct {
	Kinds    []kindChart
	Absorbed string
	Totals   []kindTotals
	Window   time.Duration
	Bucket   time.Duration
	Since    time.Time
}

type kindChart struct {
	Kind string
	// SVG charts the kind's throughput, Took its mean run duration,
	// Trouble its retries, reclaims and republishes per bucket.
	SVG, Took, Trouble string
}

// troubleSeries are the lines of a kind's trouble chart, in order.
var troubleSeries = []string{"retries", "reclaims", "republishes"}

// buildCharts draws buckets and republished (of width, from since to
// until). A bucket with no delivery of a kind is a zero on its throughput
// and trouble lines and no point on its duration line. The kinds come
// busiest first (most deliveries in the window), then by name; the kinds
// of served with nothing in the window come last, idle, with no charts.
func buildCharts(buckets []ops.Bucket, republished []ops.Republished, served []string, since, until time.Time, width time.Duration) charts {
	out := charts{Window: until.Sub(since), Bucket: width, Since: since}
	starts := bucketStarts(since, until, width)
	type key struct {
		kind    string
		verdict outcome.Outcome
	}
	counts := map[key]map[time.Time]int64{}
	took := map[string]map[time.Time][2]float64{} // kind, bucket: ms, count
	absorbed := map[string]map[time.Time]int64{}  // guard, bucket
	totals := map[string]*kindTotals{}
	total := func(kind string) *kindTotals {
		tot := totals[kind]
		if tot == nil {
			tot = &kindTotals{Kind: kind}
			totals[kind] = tot
		}
		return tot
	}
	// trouble counts, per kind and series, each bucket's events.
	trouble := map[string]map[string]map[time.Time]int64{}
	addTrouble := func(kind, name string, at time.Time, n int64) {
		if n == 0 {
			return
		}
		if trouble[kind] == nil {
			trouble[kind] = map[string]map[time.Time]int64{}
		}
		if trouble[kind][name] == nil {
			trouble[kind][name] = map[time.Time]int64{}
		}
		trouble[kind][name][at] += n
	}
	for _, r := range republished {
		total(r.Kind).Republished += r.Count
		addTrouble(r.Kind, "republishes", r.Start, r.Count)
	}
	for _, b := range buckets {
		k := key{b.Kind, b.Verdict}
		if counts[k] == nil {
			counts[k] = map[time.Time]int64{}
		}
		counts[k][b.Start] += b.Count
		if took[b.Kind] == nil {
			took[b.Kind] = map[time.Time][2]float64{}
		}
		t := took[b.Kind][b.Start]
		took[b.Kind][b.Start] = [2]float64{t[0] + b.TookMS, t[1] + float64(b.Count)}
		if b.Verdict == history.Absorbed {
			if absorbed[b.Guard] == nil {
				absorbed[b.Guard] = map[time.Time]int64{}
			}
			absorbed[b.Guard][b.Start] += b.Count
		}
		tot := total(b.Kind)
		tot.Reclaimed += b.Reclaimed
		addTrouble(b.Kind, "reclaims", b.Start, b.Reclaimed)
		if b.Verdict == history.Retry {
			addTrouble(b.Kind, "retries", b.Start, b.Count)
		}
		switch b.Verdict {
		case history.Applied:
			tot.Applied += b.Count
		case history.Absorbed:
			tot.Absorbed += b.Count
		case history.DeadLettered:
			tot.DeadLettered += b.Count
		case history.Retry:
			tot.Retry += b.Count
		case history.Abandoned:
			tot.Abandoned += b.Count
		}
		tot.Total += b.Count
		tot.tookMS += b.TookMS
	}
	rate := func(byStart map[time.Time]int64) []point {
		pts := make([]point, 0, len(starts))
		for _, s := range starts {
			pts = append(pts, point{At: s, Value: float64(byStart[s]) / width.Seconds()})
		}
		return pts
	}
	counted := func(byStart map[time.Time]int64) []point {
		pts := make([]point, 0, len(starts))
		for _, s := range starts {
			pts = append(pts, point{At: s, Value: float64(byStart[s])})
		}
		return pts
	}
	kinds := sortedKeys(totals)
	sort.SliceStable(kinds, func(i, j int) bool { return totals[kinds[i]].Total > totals[kinds[j]].Total })
	for _, kind := range kinds {
		var lines []series
		for _, v := range chartVerdicts {
			lines = append(lines, series{Name: string(v), Points: rate(counts[key{kind, v}])})
		}
		var mean []point
		for _, s := range starts {
			if t := took[kind][s]; t[1] > 0 {
				mean = append(mean, point{At: s, Value: t[0] / t[1]})
			}
		}
		var troubles []series
		for _, name := range troubleSeries {
			troubles = append(troubles, series{Name: name, Points: counted(trouble[kind][name])})
		}
		out.Kinds = append(out.Kinds, kindChart{Kind: kind, SVG: drawChart(kind+": deliveries per second, by verdict", perSecond, since, until, lines),
			Took:    drawChart(kind+": mean run duration (started to verdict)", millis, since, until, []series{{Name: "mean", Points: mean}}),
			Trouble: drawChart(kind+": retries, reclaims, republishes per "+ops.HumanDuration(width), eventCount, since, until, troubles)})
		tot := totals[kind]
		if tot.Total > 0 {
			tot.MeanMS = tot.tookMS / float64(tot.Total)
		}
		out.Totals = append(out.Totals, *tot)
	}
	idle := make([]string, 0, len(served))
	for _, kind := range served {
		if totals[kind] == nil {
			idle = append(idle, kind)
		}
	}
	sort.Strings(idle)
	for _, kind := range slices.Compact(idle) {
		out.Totals = append(out.Totals, kindTotals{Kind: kind, Idle: true})
	}
	var lines []series
	for _, g := range sortedKeys(absorbed) {
		lines = append(lines, series{Name: g, Points: rate(absorbed[g])})
	}
	out.Absorbed = drawChart("duplicates absorbed per second, by guard", perSecond, since, until, lines)
	return out
}

// bucketStarts are the starts of the buckets of width from since's to
// until's, as ops.Throughput computes them (multiples of width since the
// epoch).
func bucketStarts(since, until time.Time, width time.Duration) []time.Time {
	var out []time.Time
	for s := ops.BucketStart(since, width); s.Before(until); s = s.Add(width) {
		out = append(out, s)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
