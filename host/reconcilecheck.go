package host

import (
	"fmt"
	"time"
)

// ReconcileFloor is the shortest ReconcileAfter that republishes no job
// whose entry is merely waiting for its redelivery: a delivery that dies
// is taken over after ReclaimIdle plus up to one ReclaimInterval scan and
// runs up to JobTimeout, with this configuration (a zero setting counting
// as its default). With the defaults it is 1m45s.
func (c Config) ReconcileFloor() time.Duration {
	c.fill()
	return c.ReclaimIdle + c.ReclaimInterval + c.JobTimeout
}

// reconcileGrace is how much older than the stream's oldest entry a row
// must have been published to count as lost: longer than a relay
// transaction can stay open between its BEGIN (the row's published_at)
// and its XADD, which the server ends after IdleInTransactionTimeout.
func (c Config) reconcileGrace() time.Duration {
	c.fill()
	return c.IdleInTransactionTimeout + 5*time.Second
}

// reconcileWarning is why ReconcileAfter is dangerous, "" when it is not.
//
// Warned, not refused: a row republished early is a second stream entry
// for a job whose first may still run, which its guard absorbs (nothing
// is doubled), so the invariants hold; what it costs is a republish storm
// under load, one more entry per job each ReconcileAfter. Tests and demos
// use seconds on purpose, with ReclaimIdle and JobTimeout as short.
func (c Config) reconcileWarning() string {
	floor := c.ReconcileFloor()
	if c.ReconcileAfter >= floor {
		return ""
	}
	return fmt.Sprintf("ReconcileAfter (--reconcile-after) %s is shorter than a redelivery can take, %s = ReclaimIdle %s + ReclaimInterval %s + JobTimeout %s: "+
		"the reconciler will republish jobs whose entries are still pending or running, one more stream entry per such job every %s (duplicates the guards absorb, at the cost of a republish storm under load); "+
		"raise it to at least %s unless stream entries are being lost",
		c.ReconcileAfter, floor, c.ReclaimIdle, c.ReclaimInterval, c.JobTimeout, c.ReconcileAfter, floor)
}
