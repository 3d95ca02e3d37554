package host

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/usherhq/usher/host/stream"
)

// causeWaitForKind is refuse's verdict on an entry whose kind no plugin here
// serves and which is younger than UnknownKindWait: not a dead letter, a
// wait for a host that serves it (the new kind of a rolling deploy).
const causeWaitForKind = "wait_for_kind"

// unknownKind decides on an entry whose kind no loaded plugin serves: it
// waits while younger than UnknownKindWait, then is dead-lettered.
func (h *Host) unknownKind(e stream.Entry) (cause, reason string) {
	served := strings.Join(h.Kinds(), ", ")
	if h.cfg.UnknownKindWait < 0 {
		return causeBadInput, fmt.Sprintf("unknown kind %q: no loaded plugin serves it (served: %s)", e.Kind, served)
	}
	age, ok := entryAge(e.StreamID, time.Now())
	if ok && age < h.cfg.UnknownKindWait {
		return causeWaitForKind, ""
	}
	return causeBadInput, fmt.Sprintf("unknown kind %q: no host served it within UnknownKindWait (%s; the entry is %s old): deploy a plugin that serves it, then requeue (served here: %s)",
		e.Kind, h.cfg.UnknownKindWait, age.Round(time.Second), served)
}

// entryAge is how long ago the stream entry id was added (its
// millisecond timestamp).
func entryAge(id string, now time.Time) (time.Duration, bool) {
	ms, _, found := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !found || err != nil {
		return 0, false
	}
	return now.Sub(time.UnixMilli(n)), true
}

// waitForKind leaves the entry pending with its delivery given back (it
// does not count towards MaxDeliveries), and records the wait on its
// outbox row: the reconciler then does not publish the row again (its
// entry is still here), and `host inspect` counts it. The reclaimer of
// whichever host takes it next, within ReclaimIdle, runs it if that host
// serves the kind, or makes it wait again.
func (h *Host) waitForKind(ctx context.Context, e stream.Entry) {
	h.metrics.waitedForKind.WithLabelValues(e.Kind).Inc()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	first := false
	if e.OutboxID > 0 {
		err := h.pool.QueryRow(wctx, `
			WITH b AS (SELECT id, kind_waited_at FROM outbox WHERE id = $1 AND kind = $2 AND done_at IS NULL FOR UPDATE)
			UPDATE outbox o SET kind_waited_at = now() FROM b WHERE o.id = b.id
			RETURNING b.kind_waited_at IS NULL`, e.OutboxID, e.Kind).Scan(&first)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			h.log.Warn("could not record an entry's wait for its kind", "stream_id", e.StreamID, "outbox_id", e.OutboxID, "err", err)
		}
	}
	n, ok := h.giveBack(ctx, e)
	if !ok {
		return
	}
	log := h.log.Debug
	if first {
		log = h.log.Info
	}
	log("no plugin here serves the entry's kind: it waits for a host that does", "stream_id", e.StreamID,
		"job_id", e.JobID, "kind", e.Kind, "deliveries", n, "unknown_kind_wait", h.cfg.UnknownKindWait)
}

// kindWait registers usher_entries_waited_for_kind_total (this host's
// waits, by kind) and usher_jobs_waiting_for_kind (every host's: the
// unfinished outbox rows whose entry waited, by kind, read from Postgres
// at each scrape).
func (m *metrics) kindWait(h *Host) {
	m.waitedForKind = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "usher_entries_waited_for_kind_total",
		Help: "Deliveries of entries whose kind no plugin of this host serves, left pending to wait for a host that does (Config.UnknownKindWait).",
	}, []string{"kind"})
	m.reg.MustRegister(m.waitedForKind, waitingCollector{h: h, desc: prometheus.NewDesc("usher_jobs_waiting_for_kind",
		"Unfinished jobs whose entry waits for a host serving its kind, by kind (all hosts; from the outbox).", []string{"kind"}, nil)})
}

type waitingCollector struct {
	h    *Host
	desc *prometheus.Desc
}

func (c waitingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c waitingCollector) Collect(ch chan<- prometheus.Metric) {
	if c.h.pool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rows, err := c.h.pool.Query(ctx, `SELECT kind, count(*) FROM outbox WHERE done_at IS NULL AND kind_waited_at IS NOT NULL GROUP BY kind`)
	if err != nil {
		c.h.log.Warn("metrics: count jobs waiting for their kind", "err", err)
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
