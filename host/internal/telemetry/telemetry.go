package telemetry

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// GuardName is a guard's name in labels, records and reports.
func GuardName(g usherv1.Guard) string {
	switch g {
	case usherv1.Guard_GUARD_STATE_FIRST:
		return "state_first"
	case usherv1.Guard_GUARD_CLAIM:
		return "claim"
	case usherv1.Guard_GUARD_JOB_ID:
		return "job_id"
	case usherv1.Guard_GUARD_WORKFLOW:
		return "workflow"
	}
	return "none"
}

// KindWait registers usher_entries_waited_for_kind_total (this host's
// waits, by kind) and usher_jobs_waiting_for_kind (every host's: the
// unfinished outbox rows whose entry waited, by kind, read from pool at
// each scrape).
func (m *Metrics) KindWait(pool *pgxpool.Pool, log *slog.Logger) {
	m.WaitedForKind = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "usher_entries_waited_for_kind_total",
		Help: "Deliveries of entries whose kind no plugin of this host serves, left pending to wait for a host that does (Config.UnknownKindWait).",
	}, []string{"kind"})
	m.Reg.MustRegister(m.WaitedForKind, waitingCollector{pool: pool, log: log, desc: prometheus.NewDesc("usher_jobs_waiting_for_kind",
		"Unfinished jobs whose entry waits for a host serving its kind, by kind (all hosts; from the outbox).", []string{"kind"}, nil)})
}

type waitingCollector struct {
	pool *pgxpool.Pool
	log  *slog.Logger
	desc *prometheus.Desc
}

func (c waitingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c waitingCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := c.pool.Query(ctx, `SELECT kind, count(*) FROM outbox WHERE done_at IS NULL AND kind_waited_at IS NOT NULL GROUP BY kind`)
	if err != nil {
		c.log.Warn("metrics: count jobs waiting for their kind", "err", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var kind string
		var n int64
		if err := rows.Scan(&kind, &n); err != nil {
			return
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), kind)
	}
}

// Tracer starts the jobs' spans.
type Tracer struct{ t trace.Tracer }

// NewTracer uses the global OpenTelemetry tracer provider.
func NewTracer() Tracer { return Tracer{t: otel.Tracer("github.com/usherhq/usher/host")} }

var propagator = propagation.TraceContext{}

// JobSpan continues a job's trace (its W3C traceparent, "" for none) in a
// span of its own and returns the traceparent the plugin should log with.
func (t Tracer) JobSpan(ctx context.Context, parent, kind, jobID, streamID string, attempt int) (context.Context, trace.Span, string) {
	if parent != "" {
		ctx = propagator.Extract(ctx, propagation.MapCarrier{"traceparent": parent})
	}
	ctx, span := t.t.Start(ctx, "usher.job "+kind, trace.WithAttributes(
		attribute.String("usher.job_id", jobID), attribute.String("usher.kind", kind),
		attribute.String("usher.stream_id", streamID), attribute.Int("usher.attempt", attempt)))
	carrier := propagation.MapCarrier{}
	propagator.Inject(ctx, carrier)
	tp := carrier["traceparent"]
	if tp == "" {
		tp = parent
	}
	return ctx, span, tp
}
