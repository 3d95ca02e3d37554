// Package periodic runs a host service's scan on a fixed interval.
package periodic

import (
	"context"
	"log/slog"
	"time"
)

// Run calls scan every interval until ctx is done. A failed scan is logged
// as failMsg (unless the failure is the shutdown itself) and retried at the
// next tick. It returns nil when ctx is done.
func Run(ctx context.Context, interval time.Duration, logger *slog.Logger, failMsg string, scan func(context.Context) error) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := scan(ctx); err != nil && ctx.Err() == nil {
			logger.Warn(failMsg, "err", err)
		}
	}
}

// Drain is Run for a scan done in batches: at every tick it calls batch
// until one does fewer than size rows (or fails), so a backlog drains in
// one tick instead of one batch a tick.
func Drain(ctx context.Context, interval time.Duration, logger *slog.Logger, failMsg string, size int, batch func(context.Context) (int, error)) error {
	return Run(ctx, interval, logger, failMsg, func(ctx context.Context) error {
		for {
			n, err := batch(ctx)
			if err != nil || n < size {
				return err
			}
		}
	})
}
