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
