package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/internal/periodic"
)

// ReclaimerConfig configures a Reclaimer.
type ReclaimerConfig struct {
	// Redis client. Required.
	Redis redis.UniversalClient
	// Streams are the shards' keys, scanned in turn; Group and Consumer
	// (the name entries are claimed for). Required.
	Streams         []string
	Group, Consumer string
	// MinIdle is the reclaim threshold. Default 60s.
	MinIdle time.Duration
	// Interval between scans. Default MinIdle/4, at least 100ms.
	Interval time.Duration
	// Count is how many entries one XAUTOCLAIM takes. Default 64.
	Count int64
	// Take reserves room for up to max entries, calls read with how many
	// fit, and runs what it returned: Consumer.Take, so reclaimed
	// entries count against the consumer's concurrency and byte budget
	// before XAUTOCLAIM reads them. Required.
	Take func(ctx context.Context, max int, read func(ctx context.Context, n int) ([]Entry, error)) (int, error)
	// OnReclaimed, when set, is told how many entries each scan took.
	OnReclaimed func(n int)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *ReclaimerConfig) setDefaults() error {
	if c.Redis == nil || len(c.Streams) == 0 || c.Group == "" || c.Consumer == "" || c.Take == nil {
		return errors.New("stream: reclaimer needs Redis, Streams, Group, Consumer and Take")
	}
	if c.MinIdle <= 0 {
		c.MinIdle = 60 * time.Second
	}
	if c.Interval <= 0 {
		c.Interval = max(c.MinIdle/4, 100*time.Millisecond)
	}
	if c.Count <= 0 {
		c.Count = 64
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Reclaimer periodically claims idle entries for its consumer.
//
// An entry pending longer than the threshold (default 60 s) belongs to a
// consumer that crashed, was killed, or is merely slow. The reclaimer takes
// it with XAUTOCLAIM and runs it again. A slow original may still finish:
// the handler's guard makes both runs end with the effect applied once.
type Reclaimer struct {
	cfg ReclaimerConfig
}

// NewReclaimer validates cfg and fills its defaults.
func NewReclaimer(cfg ReclaimerConfig) (*Reclaimer, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Reclaimer{cfg: cfg}, nil
}

// Run scans every Interval until ctx is done.
func (r *Reclaimer) Run(ctx context.Context) error {
	return periodic.Run(ctx, r.cfg.Interval, r.cfg.Logger, "reclaim scan failed", func(ctx context.Context) error {
		_, err := r.Scan(ctx)
		return err
	})
}

// Scan walks every shard's whole pending list once, claiming every entry
// idle past the threshold, and returns how many it claimed. A shard whose
// scan fails does not keep the others from theirs; the first error is
// returned.
func (r *Reclaimer) Scan(ctx context.Context) (int, error) {
	total := 0
	var first error
	for _, s := range r.cfg.Streams {
		n, err := r.scan(ctx, s)
		total += n
		if err != nil && first == nil {
			first = fmt.Errorf("stream %s: %w", s, err)
		}
	}
	return total, first
}

// scan walks one shard's pending list.
func (r *Reclaimer) scan(ctx context.Context, stream string) (int, error) {
	total := 0
	start := "0-0"
	for {
		next := ""
		n, err := r.cfg.Take(ctx, int(r.cfg.Count), func(ctx context.Context, n int) ([]Entry, error) {
			entries, nx, err := AutoClaim(ctx, r.cfg.Redis, stream, r.cfg.Group, r.cfg.Consumer, r.cfg.MinIdle, start, n)
			if err != nil {
				return nil, err
			}
			next = nx
			if len(entries) == 0 {
				return nil, nil
			}
			if err := r.withDeliveries(ctx, stream, entries); err != nil {
				// Claimed, and now pending under this consumer with
				// no count read: they run with Deliveries 1 rather
				// than wait a whole threshold again.
				r.cfg.Logger.Warn("could not read the delivery counts of reclaimed entries", "stream", stream, "err", err)
			}
			return entries, nil
		})
		if err != nil {
			if strings.HasPrefix(err.Error(), "NOGROUP") {
				return total, nil
			}
			return total, err
		}
		if n > 0 {
			total += n
			if r.cfg.OnReclaimed != nil {
				r.cfg.OnReclaimed(n)
			}
			r.cfg.Logger.Info("reclaimed idle entries", "stream", stream, "count", n, "idle_over", r.cfg.MinIdle)
		}
		if next == "0-0" || next == "" || ctx.Err() != nil {
			return total, nil
		}
		start = next
	}
}

// withDeliveries attaches each claimed entry's delivery count from
// XPENDING, which the dispatcher compares with its maximum. XAUTOCLAIM
// itself has already counted this delivery.
func (r *Reclaimer) withDeliveries(ctx context.Context, stream string, entries []Entry) error {
	pipe := r.cfg.Redis.Pipeline()
	cmds := make([]*redis.XPendingExtCmd, len(entries))
	for i, e := range entries {
		cmds[i] = pipe.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: stream, Group: r.cfg.Group, Start: e.StreamID, End: e.StreamID, Count: 1,
		})
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	for i := range entries {
		if p, err := cmds[i].Result(); err == nil && len(p) == 1 {
			entries[i].Deliveries = p[0].RetryCount
		}
	}
	return nil
}
