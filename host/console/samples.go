package console

import (
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The counters the overview charts, and the verdicts it draws of the jobs
// counter.
const (
	jobsMetric     = "usher_jobs_total"
	absorbedMetric = "usher_duplicates_absorbed_total"
	durationMetric = "usher_job_duration_seconds"
)

var chartVerdicts = []string{"applied", "absorbed", "dead_letter"}

// sample is the counters' values at one time: this host's, since it
// started (Prometheus counters are per process).
type sample struct {
	at time.Time
	// jobs is usher_jobs_total by kind, then verdict.
	jobs map[string]map[string]float64
	// absorbed is usher_duplicates_absorbed_total by guard (summed over
	// kinds and reasons).
	absorbed map[string]float64
	// took is usher_job_duration_seconds's sum and count by kind.
	took map[string]sumCount
}

type sumCount struct{ sum, count float64 }

// sampler keeps the last n samples.
type sampler struct {
	g   prometheus.Gatherer
	n   int
	now func() time.Time

	mu   sync.Mutex
	ring []sample
}

func newSampler(g prometheus.Gatherer, n int, now func() time.Time) *sampler {
	return &sampler{g: g, n: n, now: now}
}

func (s *sampler) sample() error {
	mfs, err := s.g.Gather()
	if err != nil {
		return err
	}
	sm := sample{at: s.now(), jobs: map[string]map[string]float64{}, absorbed: map[string]float64{}, took: map[string]sumCount{}}
	for _, mf := range mfs {
		switch mf.GetName() {
		case jobsMetric:
			for _, m := range mf.GetMetric() {
				l := labels(m.GetLabel())
				if sm.jobs[l["kind"]] == nil {
					sm.jobs[l["kind"]] = map[string]float64{}
				}
				sm.jobs[l["kind"]][l["verdict"]] += m.GetCounter().GetValue()
			}
		case durationMetric:
			for _, m := range mf.GetMetric() {
				h := m.GetHistogram()
				sm.took[labels(m.GetLabel())["kind"]] = sumCount{h.GetSampleSum(), float64(h.GetSampleCount())}
			}
		case absorbedMetric:
			for _, m := range mf.GetMetric() {
				sm.absorbed[labels(m.GetLabel())["guard"]] += m.GetCounter().GetValue()
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ring = append(s.ring, sm)
	if len(s.ring) > s.n {
		s.ring = append(s.ring[:0:0], s.ring[len(s.ring)-s.n:]...)
	}
	return nil
}

func labels[L interface {
	GetName() string
	GetValue() string
}](ls []L) map[string]string {
	out := make(map[string]string, len(ls))
	for _, l := range ls {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// snapshot is a copy of the samples, oldest first.
func (s *sampler) snapshot() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.ring...)
}

// series is one line of a chart: a value (a rate per second, a mean
// duration) at each sample after the first.
type series struct {
	Name   string
	Points []point
}

type point struct {
	At    time.Time
	Value float64
}

// rates turns counter values into per-second rates between samples; a
// counter that went down (the host restarted) counts from zero.
func rates(samples []sample, value func(sample) float64) []point {
	var pts []point
	for i := 1; i < len(samples); i++ {
		dt := samples[i].at.Sub(samples[i-1].at).Seconds()
		if dt <= 0 {
			continue
		}
		d := value(samples[i]) - value(samples[i-1])
		if d < 0 {
			d = value(samples[i])
		}
		pts = append(pts, point{At: samples[i].at, Value: d / dt})
	}
	return pts
}

// meanTook is the mean duration, in milliseconds, of the runs of kind
// that ended between samples; an interval in which none ended has no
// point.
func meanTook(samples []sample, kind string) []point {
	var pts []point
	for i := 1; i < len(samples); i++ {
		a, b := samples[i-1].took[kind], samples[i].took[kind]
		if b.count < a.count { // the host restarted
			a = sumCount{}
		}
		if n := b.count - a.count; n > 0 {
			pts = append(pts, point{At: samples[i].at, Value: (b.sum - a.sum) / n * 1000})
		}
	}
	return pts
}

// kindTotals is one kind's counters in the latest sample.
type kindTotals struct {
	Kind                          string
	Applied, Absorbed, DeadLetter float64
	Retry, Permanent, Abandoned   float64
}

// charts are the overview's: one per kind (applied, absorbed and
// dead-lettered per second) and one of duplicates absorbed per guard.
type charts struct {
	Kinds    []kindChart
	Absorbed string
	Totals   []kindTotals
	Samples  int
	Interval time.Duration
}

type kindChart struct {
	Kind string
	// SVG charts the kind's throughput, Took its mean run duration.
	SVG, Took string
}

func (s *sampler) charts(interval time.Duration) charts {
	samples := s.snapshot()
	out := charts{Samples: len(samples), Interval: interval}
	if len(samples) == 0 {
		return out
	}
	last := samples[len(samples)-1]
	kinds := map[string]bool{}
	guards := map[string]bool{}
	for _, sm := range samples {
		for k := range sm.jobs {
			kinds[k] = true
		}
		for g := range sm.absorbed {
			guards[g] = true
		}
	}
	for _, k := range sortedKeys(kinds) {
		var lines []series
		for _, v := range chartVerdicts {
			lines = append(lines, series{Name: v, Points: rates(samples, func(sm sample) float64 { return sm.jobs[k][v] })})
		}
		took := []series{{Name: "mean", Points: meanTook(samples, k)}}
		out.Kinds = append(out.Kinds, kindChart{Kind: k, SVG: drawChart(k+": jobs per second", perSecond, lines),
			Took: drawChart(k+": mean run duration (dispatch to verdict)", millis, took)})
		j := last.jobs[k]
		out.Totals = append(out.Totals, kindTotals{Kind: k, Applied: j["applied"], Absorbed: j["absorbed"], DeadLetter: j["dead_letter"],
			Retry: j["retry"], Permanent: j["permanent"], Abandoned: j["abandoned"]})
	}
	var lines []series
	for _, g := range sortedKeys(guards) {
		lines = append(lines, series{Name: g, Points: rates(samples, func(sm sample) float64 { return sm.absorbed[g] })})
	}
	out.Absorbed = drawChart("duplicates absorbed per second, by guard", perSecond, lines)
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
