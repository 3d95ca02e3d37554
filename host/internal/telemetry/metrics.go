// Package telemetry holds the host's Prometheus series, its job spans and
// the names its labels use. It only observes: nothing here decides what
// happens to a job or a plugin.
package telemetry

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/usherhq/usher/host/guard"
)

// Metrics are the host's Prometheus series, on a registry of its own so
// several hosts can live in one process (tests, embedding applications).
type Metrics struct {
	Reg         *prometheus.Registry
	Jobs        *prometheus.CounterVec
	Absorbed    *prometheus.CounterVec
	DeadLetters *prometheus.CounterVec
	Published   prometheus.Counter
	Reclaimed   prometheus.Counter
	Duration    *prometheus.HistogramVec
	Batches     *prometheus.HistogramVec
	// batchPhases: the steps of each committed batch (guard.BatchPhases).
	BatchPhases *prometheus.HistogramVec
	Restarts    *prometheus.CounterVec
	Rollbacks   *prometheus.CounterVec
	// WaitedForKind: see KindWait.
	WaitedForKind *prometheus.CounterVec
	// trimmed, retained and consumersRemoved count what host/retention
	// removed: stream entries, rows per table, gone consumers.
	Trimmed          prometheus.Counter
	Retained         *prometheus.CounterVec
	ConsumersRemoved prometheus.Counter
}

// NewMetrics registers every series on a new registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Reg: prometheus.NewRegistry(),
		Jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_jobs_total", Help: "Job runs by kind and verdict (applied, absorbed, retry, permanent, abandoned, dead_letter).",
		}, []string{"kind", "verdict"}),
		Absorbed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_duplicates_absorbed_total", Help: "Duplicate runs a guard absorbed, by guard, kind and reason.",
		}, []string{"guard", "kind", "reason"}),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_dead_letters_total", Help: "Entries dead-lettered, by kind and cause.",
		}, []string{"kind", "cause"}),
		Published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "usher_outbox_published_total", Help: "Outbox rows the relay published (duplicates included).",
		}),
		Reclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "usher_entries_reclaimed_total", Help: "Stream entries taken over with XAUTOCLAIM.",
		}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "usher_job_duration_seconds", Help: "Time from dispatch to verdict.", Buckets: prometheus.DefBuckets,
		}, []string{"kind"}),
		Batches: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "usher_job_batch_size", Help: "Jobs per batch of record-the-job-id runs, by plugin role and result (committed, split: run again alone).",
			Buckets: []float64{2, 4, 8, 16, 32, 64},
		}, []string{"role", "result"}),
		BatchPhases: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "usher_job_batch_phase_seconds",
			Help:    "Each step of a committed batch of record-the-job-id runs, by plugin role and phase: record (BEGIN with the jobs' records), invoke (the plugin's call), writes (the writes the applies returned), commit (COMMIT with the outcomes).",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .25, 1},
		}, []string{"role", "phase"}),
		Restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_plugin_restarts_total", Help: "Plugin processes restarted after a crash.",
		}, []string{"plugin"}),
		Rollbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_plugin_rollbacks_total",
			Help: "Plugin versions rolled back to the version before, by plugin and cause (crash_loop, failures, crashes, requested).",
		}, []string{"plugin", "cause"}),
		Trimmed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "usher_stream_entries_trimmed_total", Help: "Stream entries trimmed: read and acked by every consumer group.",
		}),
		Retained: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_retention_rows_deleted_total", Help: "Rows deleted past their retention window, by table.",
		}, []string{"table"}),
		ConsumersRemoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "usher_consumers_removed_total", Help: "Consumers removed from the group: idle, with nothing pending.",
		}),
	}
	m.Reg.MustRegister(m.Trimmed, m.Retained, m.ConsumersRemoved)
	m.Reg.MustRegister(m.Jobs, m.Absorbed, m.DeadLetters, m.Published, m.Reclaimed, m.Duration, m.Batches, m.BatchPhases, m.Restarts, m.Rollbacks,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// EntryBytes registers usher_entry_bytes_held, what the consumer holds of
// its byte budget (Config.MaxEntryBytesHeld).
func (m *Metrics) EntryBytes(held func() int64) {
	m.Reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "usher_entry_bytes_held",
		Help: "Bytes of stream entries this host holds: room reserved for reads in progress plus the entries running.",
	}, func() float64 { return float64(held()) }))
}

// Verdicts is usher_jobs_total summed over kinds: how many of this host's
// job runs ended in each verdict (applied, absorbed, retry, permanent,
// abandoned, dead_letter). It reads the counters in memory, so a caller
// may poll it often (cmd/bench waits on it) without a query.
func (m *Metrics) Verdicts() map[string]int64 {
	out := map[string]int64{}
	byLabel(m.Jobs, "verdict", func(verdict string, m *dto.Metric) {
		out[verdict] += int64(m.GetCounter().GetValue())
	})
	return out
}

// byLabel reads c's series in memory and calls fn with each one's value of
// label.
func byLabel(c prometheus.Collector, label string, fn func(value string, m *dto.Metric)) {
	ch := make(chan prometheus.Metric, 16)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue
		}
		for _, l := range pb.GetLabel() {
			if l.GetName() == label {
				fn(l.GetValue(), &pb)
			}
		}
	}
}

// phaseNames are usher_job_batch_phase_seconds' phase labels, in a batch's
// order.
var phaseNames = []string{"record", "invoke", "writes", "commit"}

// ObservePhases records the steps of a committed batch.
func (m *Metrics) ObservePhases(role string, p guard.BatchPhases) {
	for i, d := range []time.Duration{p.Record, p.Invoke, p.Writes, p.Commit} {
		m.BatchPhases.WithLabelValues(role, phaseNames[i]).Observe(d.Seconds())
	}
}

// BatchPhaseTotals is usher_job_batch_phase_seconds summed over plugin
// roles: for each phase (record, invoke, writes, commit) the time all
// committed batches spent in it, and their count. Read in memory, like
// Verdicts: cmd/bench takes it before and after a window.
func (m *Metrics) BatchPhaseTotals() map[string]PhaseTotal {
	out := map[string]PhaseTotal{}
	byLabel(m.BatchPhases, "phase", func(phase string, m *dto.Metric) {
		t := out[phase]
		t.Seconds += m.GetHistogram().GetSampleSum()
		t.Count += m.GetHistogram().GetSampleCount()
		out[phase] = t
	})
	return out
}

// PhaseTotal is one phase's total time and count of batches.
type PhaseTotal struct {
	Seconds float64
	Count   uint64
}

// ObserveBatch records a batch of two jobs or more that reached a plugin
// (guard.Config.OnBatch).
func (m *Metrics) ObserveBatch(b guard.BatchReport) {
	result := "committed"
	if !b.Committed {
		result = "split"
	}
	m.Batches.WithLabelValues(b.Role, result).Observe(float64(b.Jobs))
	if b.Committed {
		m.ObservePhases(b.Role, b.Phases)
	}
}
