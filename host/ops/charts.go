package ops

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/outcome"
)

// Bucket is what the job history holds of one kind's deliveries that
// ended with one verdict, in one time bucket: every host's, since every
// host writes its deliveries' records there.
type Bucket struct {
	// Start is the bucket's start: a multiple of the bucket width since
	// the Unix epoch.
	Start   time.Time       `json:"start"`
	Kind    string          `json:"kind"`
	Verdict outcome.Outcome `json:"verdict"`
	// Guard is the guard that ran the deliveries (for absorbed ones,
	// the guard that absorbed them).
	Guard string `json:"guard"`
	Count int64  `json:"count"`
	// TookMS is the deliveries' total run time (started to finished), in
	// milliseconds.
	TookMS float64 `json:"took_ms"`
	// Reclaimed counts those of the deliveries that were redeliveries:
	// their entry's delivery count was above 1 (taken over with
	// XAUTOCLAIM from a consumer that held it past the reclaim threshold,
	// or run again after its plugin crashed under it, which the stream
	// counts as a delivery too; the history does not tell them apart).
	Reclaimed int64 `json:"reclaimed"`
}

// throughputSQL buckets job_history by time ($3 seconds wide), kind,
// verdict and guard over [$1, $2).
const throughputSQL = `SELECT to_timestamp(floor(extract(epoch FROM finished_at) / $3) * $3) AS b, kind, verdict, guard,
		count(*), coalesce(sum(extract(epoch FROM finished_at - started_at)), 0) * 1000, count(*) FILTER (WHERE deliveries > 1)
	FROM job_history WHERE finished_at >= $1 AND finished_at < $2
	GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4`

// Throughput reads the job history's records that finished in [since,
// until), counted by bucket of width, kind, verdict and guard, oldest
// first. It reads the index job_history_chart only.
func Throughput(ctx context.Context, q outbox.Querier, since, until time.Time, width time.Duration) ([]Bucket, error) {
	if width < time.Millisecond {
		return nil, fmt.Errorf("ops: throughput: a bucket of %s is too narrow", width)
	}
	rows, err := q.Query(ctx, throughputSQL, since, until, width.Seconds())
	if err != nil {
		return nil, fmt.Errorf("ops: throughput: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Bucket])
	if err != nil {
		return nil, fmt.Errorf("ops: throughput: %w", err)
	}
	for i := range out {
		out[i].Start = onGrid(out[i].Start, width)
	}
	return out, nil
}

// onGrid puts a bucket start Postgres computed in floating point back on
// the grid of width.
func onGrid(t time.Time, width time.Duration) time.Time {
	w, us := width.Microseconds(), t.UnixMicro()
	return time.UnixMicro((us + w/2) / w * w).UTC()
}

// Republished is how many of one kind's outbox rows the reconciler handed
// back to the relay in one time bucket (their stream entries were lost, or
// their jobs ran past ReconcileAfter), on every host.
type Republished struct {
	Start time.Time `json:"start"`
	Kind  string    `json:"kind"`
	Count int64     `json:"count"`
}

// republishedSQL buckets job_republishes as throughputSQL buckets
// job_history.
const republishedSQL = `SELECT to_timestamp(floor(extract(epoch FROM republished_at) / $3) * $3) AS b, kind, count(*)
	FROM job_republishes WHERE republished_at >= $1 AND republished_at < $2
	GROUP BY 1, 2 ORDER BY 1, 2`

// Republishes reads the republishes recorded in [since, until), counted
// by bucket of width and kind, oldest first. They are records kept with
// the job history (job_republishes), so they outlive the outbox rows.
func Republishes(ctx context.Context, q outbox.Querier, since, until time.Time, width time.Duration) ([]Republished, error) {
	if width < time.Millisecond {
		return nil, fmt.Errorf("ops: republishes: a bucket of %s is too narrow", width)
	}
	rows, err := q.Query(ctx, republishedSQL, since, until, width.Seconds())
	if err != nil {
		return nil, fmt.Errorf("ops: republishes: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Republished])
	if err != nil {
		return nil, fmt.Errorf("ops: republishes: %w", err)
	}
	for i := range out {
		out[i].Start = onGrid(out[i].Start, width)
	}
	return out, nil
}

// BucketStart is the start of the bucket of width that holds t, as
// Throughput computes it.
func BucketStart(t time.Time, width time.Duration) time.Time {
	w, us := width.Microseconds(), t.UnixMicro()
	q := us / w
	if us%w < 0 {
		q--
	}
	return time.UnixMicro(q * w).UTC()
}

// LatencySample bounds the deliveries Latencies reads: the newest of the
// window, so that a console refreshing every few seconds reads a few
// thousand rows however busy the hour was.
const LatencySample = 5000

// Latency is one kind's run time (a delivery's start to its outcome) and
// queue wait (the job's commit to its first delivery's start)
// over the newest deliveries of a window, on every host.
type Latency struct {
	Kind string `json:"kind"`
	// Deliveries is how many deliveries the run times are over.
	Deliveries int64 `json:"deliveries"`
	// Run are the run time's p50, p95 and p99.
	Run [3]time.Duration `json:"run_ns"`
	// Waits is how many first deliveries (attempt 0, delivery 1) the
	// waits are over: the commit time is read from the job's outbox row
	// while it is kept, and from the record (committed_at, which
	// retention's delete stamps) once it is gone, so the waits outlive
	// the rows. Wait are their p50, p95 and p99.
	Waits int64            `json:"waits"`
	Wait  [3]time.Duration `json:"wait_ns"`
}

const latencySQL = `SELECT h.kind, count(*),
		percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM h.finished_at - h.started_at)),
		count(h.committed_at) FILTER (WHERE h.attempt = 0 AND h.deliveries = 1),
		percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM h.started_at - h.committed_at))
			FILTER (WHERE h.attempt = 0 AND h.deliveries = 1 AND h.committed_at IS NOT NULL)
	FROM (SELECT kind, started_at, finished_at, attempt, deliveries,
	             coalesce(committed_at, (SELECT o.created_at FROM outbox o WHERE o.id = outbox_id)) AS committed_at
	      FROM job_history
	      WHERE finished_at >= $1 AND finished_at < $2 ORDER BY finished_at DESC LIMIT $3) h
	GROUP BY h.kind ORDER BY h.kind`

// Latencies reads, per kind, the run time and queue wait percentiles of
// the newest LatencySample deliveries that finished in [since, until).
func Latencies(ctx context.Context, q outbox.Querier, since, until time.Time) ([]Latency, error) {
	rows, err := q.Query(ctx, latencySQL, since, until, LatencySample)
	if err != nil {
		return nil, fmt.Errorf("ops: latencies: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Latency, error) {
		var l Latency
		var run, wait []float64
		if err := r.Scan(&l.Kind, &l.Deliveries, &run, &l.Waits, &wait); err != nil {
			return l, fmt.Errorf("ops: latencies: %w", err)
		}
		for i := range min(len(run), 3) {
			l.Run[i] = time.Duration(run[i] * float64(time.Second))
		}
		for i := range min(len(wait), 3) {
			l.Wait[i] = time.Duration(wait[i] * float64(time.Second))
		}
		return l, nil
	})
}
