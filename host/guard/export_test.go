package guard

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// For the external tests (package guard_test, which may import hosttest).

type JobTx = jobTx

// BeginWith begins a job's transaction with one statement sent with its
// BEGIN.
func BeginWith(ctx context.Context, pool *pgxpool.Pool, schema string, scan func(pgx.Row) error, sql string, args ...any) (*jobTx, error) {
	return beginWith(ctx, pool, schema, opening{sql: sql, args: args, scan: scan})
}

// Last is a statement for JobTx.Commit to send before COMMIT.
func Last(sql string, args ...string) lastStatement {
	l := lastStatement{sql: sql}
	for _, a := range args {
		l.args = append(l.args, []byte(a))
	}
	return l
}

// ClaimStatement is the one-statement claim the host builds from spec, and
// its arguments (the key's values, then the lease in seconds).
func ClaimStatement(spec *usherv1.ClaimSpec) (string, []any, error) {
	c, err := buildClaim(spec)
	if err != nil {
		return "", nil, err
	}
	return c.claim, append(append([]any{}, c.keys...), c.lease.Seconds()), nil
}

// AppliedStatements are the statements an applied run's Commit sends to record its
// outbox outcome and history record (none when d.OutboxID is 0).
func AppliedStatements(r *Runner, job *usherv1.Job, d Delivery) []lastStatement {
	return r.appliedStatement(job, d)
}

// IssueReadOnly issues a read-only handle for job on pool, as the check
// phase of state first and the effect phase of a claim receive one, and
// returns its id for Handles.Exec.
func IssueReadOnly(hs *Handles, ctx context.Context, job *usherv1.Job, pool *pgxpool.Pool, role string) string {
	return hs.issue(ctx, capReadOnly, job, pool, nil, role).id
}

// WithReset runs statements and the session's reset in one round trip.
var WithReset = withReset
