package host

import (
	"fmt"
	"time"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/retention"
)

// redelivery is what bounds how long a job can come back, from a filled
// configuration.
func (c *Config) redelivery() retention.Redelivery {
	return retention.Redelivery{
		MaxDeliveries: c.MaxDeliveries, ReclaimIdle: c.ReclaimIdle, ReclaimInterval: c.ReclaimInterval, JobTimeout: c.JobTimeout,
		MaxAttempts: c.MaxAttempts, RetryBackoff: c.RetryBackoff, MaxBackoff: guard.MaxBackoff,
		ReconcileAfter: c.ReconcileAfter, ReconcileInterval: c.ReconcileInterval,
	}
}

// RetentionBound is the shortest retention window New accepts with this
// configuration (a zero setting counting as its default): the longest its redeliveries,
// retries and republications can bring a job back (retention.Redelivery).
// With the defaults it is about 38 minutes.
func (c Config) RetentionBound() time.Duration {
	c.fill()
	return c.redelivery().Bound()
}

func (c *Config) checkRetention() error {
	r := c.redelivery()
	for _, w := range []struct {
		name string
		d    time.Duration
	}{
		{"ProcessedJobsRetention", c.ProcessedJobsRetention},
		{"OutboxRetention", c.OutboxRetention},
		{"DeadLetterRetention", c.DeadLetterRetention},
	} {
		if err := r.Check(w.name, w.d); err != nil {
			return fmt.Errorf("host: %w", err)
		}
	}
	return nil
}

// retainer is the loop that keeps storage bounded (host/retention).
func (h *Host) retainer() (*retention.Retainer, error) {
	c := &h.cfg
	return retention.New(retention.Config{
		Redis: h.rdb, Pool: h.pool, Streams: h.keys, Group: c.Group, Self: c.Consumer,
		TrimInterval: c.StreamTrimInterval, CleanupInterval: c.CleanupInterval, ConsumerIdle: c.ConsumerIdleRemove,
		ProcessedJobs: c.ProcessedJobsRetention, Outbox: c.OutboxRetention, DeadLetters: c.DeadLetterRetention,
		Redelivery: c.redelivery(), History: c.HistoryRetention, Swaps: c.HistoryRetention, Workflows: c.WorkflowRetention, Margin: c.RetentionMargin, Logger: h.log,
		OnTrimmed:          func(n int64) { h.metrics.Trimmed.Add(float64(n)) },
		OnDeleted:          func(table string, n int64) { h.metrics.Retained.WithLabelValues(table).Add(float64(n)) },
		OnConsumersRemoved: func(n int) { h.metrics.ConsumersRemoved.Add(float64(n)) },
	})
}
