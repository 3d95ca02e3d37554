package retention

import (
	"fmt"
	"time"
)

// Redelivery is what decides how long a job can still come back after its
// identity was recorded: the host's reclaim, delivery and retry settings.
type Redelivery struct {
	// MaxDeliveries, ReclaimIdle, ReclaimInterval and JobTimeout: an
	// entry is run at most MaxDeliveries times, each run lasting up to
	// JobTimeout and each takeover waiting ReclaimIdle plus up to one
	// ReclaimInterval scan.
	MaxDeliveries   int64
	ReclaimIdle     time.Duration
	ReclaimInterval time.Duration
	JobTimeout      time.Duration
	// MaxAttempts, RetryBackoff and MaxBackoff: a transient failure is
	// retried up to MaxAttempts times, the delay doubling from
	// RetryBackoff up to MaxBackoff.
	MaxAttempts  int
	RetryBackoff time.Duration
	MaxBackoff   time.Duration
	// ReconcileAfter and ReconcileInterval: an outbox row whose stream
	// entry was lost is published again this long after it was.
	ReconcileAfter    time.Duration
	ReconcileInterval time.Duration
}

// Bound is the shortest retention the runtime accepts for processed job
// ids, done outbox rows and dead letters: the longest a job's entries,
// retries and republications can keep it coming back when the hosts are
// up. It is the sum of
//
//	MaxDeliveries × (ReclaimIdle + ReclaimInterval + JobTimeout)
//	+ the backoffs of MaxAttempts retries
//	+ ReconcileAfter + ReconcileInterval
//
// Time alone is not the whole rule (a stream backlog while every host is
// down outlasts any bound): Purge also checks the state, see Config.
func (r Redelivery) Bound() time.Duration {
	return r.deliveries() + r.retries() + r.ReconcileAfter + r.ReconcileInterval
}

func (r Redelivery) deliveries() time.Duration {
	return time.Duration(r.MaxDeliveries) * (r.ReclaimIdle + r.ReclaimInterval + r.JobTimeout)
}

func (r Redelivery) retries() time.Duration {
	var sum time.Duration
	for a := range r.MaxAttempts {
		d := r.RetryBackoff << min(a, 16)
		if r.MaxBackoff > 0 {
			d = min(d, r.MaxBackoff)
		}
		sum += d
	}
	return sum
}

// Explain spells the bound out with the settings it comes from, for the
// error that refuses a retention below it.
func (r Redelivery) Explain() string {
	return fmt.Sprintf("%s = MaxDeliveries %d × (ReclaimIdle %s + ReclaimInterval %s + JobTimeout %s) + backoffs of MaxAttempts %d retries from RetryBackoff %s (%s) + ReconcileAfter %s + ReconcileInterval %s",
		r.Bound(), r.MaxDeliveries, r.ReclaimIdle, r.ReclaimInterval, r.JobTimeout, r.MaxAttempts, r.RetryBackoff, r.retries(),
		r.ReconcileAfter, r.ReconcileInterval)
}

// Check refuses a retention (0: keep for ever) shorter than the bound;
// name is the setting, for the error.
func (r Redelivery) Check(name string, retention time.Duration) error {
	if retention < 0 {
		return fmt.Errorf("%s %s is negative (0 keeps the rows for ever)", name, retention)
	}
	if retention != 0 && retention < r.Bound() {
		return fmt.Errorf("%s %s is shorter than the redelivery bound %s: a job could still come back after its rows were deleted and be applied twice",
			name, retention, r.Explain())
	}
	return nil
}
