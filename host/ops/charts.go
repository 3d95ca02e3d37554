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
}

// throughputSQL buckets job_history by time ($3 seconds wide), kind,
// verdict and guard over [$1, $2).
const throughputSQL = `SELECT to_timestamp(floor(extract(epoch FROM finished_at) / $3) * $3) AS b, kind, verdict, guard,
		count(*), coalesce(sum(extract(epoch FROM finished_at - started_at)), 0) * 1000
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
		// Postgres computed the start in floating point: back on the grid.
		w := width.Microseconds()
		us := out[i].Start.UnixMicro()
		out[i].Start = time.UnixMicro((us + w/2) / w * w).UTC()
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
