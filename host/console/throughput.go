package console

import (
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

// kindTotals is one kind's deliveries over the charts' window, by verdict.
type kindTotals struct {
	Kind                            string
	Applied, Absorbed, DeadLettered int64
	Retry, Abandoned                int64
	Total                           int64
	MeanMS                          float64
	tookMS                          float64
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
	// SVG charts the kind's throughput, Took its mean run duration.
	SVG, Took string
}

// buildCharts draws buckets (of width, from since to until). A bucket with
// no delivery of a kind is a zero on its throughput lines and no point on
// its duration line.
func buildCharts(buckets []ops.Bucket, since, until time.Time, width time.Duration) charts {
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
		tot := totals[b.Kind]
		if tot == nil {
			tot = &kindTotals{Kind: b.Kind}
			totals[b.Kind] = tot
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
	for _, kind := range sortedKeys(totals) {
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
		out.Kinds = append(out.Kinds, kindChart{Kind: kind, SVG: drawChart(kind+": deliveries per second, by verdict", perSecond, since, until, lines),
			Took: drawChart(kind+": mean run duration (started to verdict)", millis, since, until, []series{{Name: "mean", Points: mean}})})
		tot := totals[kind]
		tot.MeanMS = tot.tookMS / float64(tot.Total)
		out.Totals = append(out.Totals, *tot)
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
