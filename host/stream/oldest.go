package stream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Oldest is how long ago, by the Redis server's clock, the oldest entries
// still on a stream's shards were added: the oldest one no consumer of the
// group has read yet, and the oldest one read and not acked (pending:
// running, parked, or waiting for its reclaim). A shard's entry leaves it
// only when acked, after its job's outcome committed, so an outbox row
// published before both with no outcome has lost its entry.
type Oldest struct {
	// Undelivered and Pending are the ages; zero with HasUndelivered or
	// HasPending false when no shard holds such an entry.
	Undelivered, Pending       time.Duration
	HasUndelivered, HasPending bool
}

// ReadOldest reads Oldest over streams for group. A shard that does not
// exist (nothing was ever added, or Redis lost it) holds nothing; a shard
// without the group holds only undelivered entries.
func ReadOldest(ctx context.Context, rdb redis.UniversalClient, streams []string, group string) (Oldest, error) {
	var o Oldest
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return o, fmt.Errorf("stream: TIME: %w", err)
	}
	for _, key := range streams {
		groups, err := rdb.XInfoGroups(ctx, key).Result()
		if err != nil {
			if isNoKey(err) {
				continue
			}
			return o, fmt.Errorf("stream: XINFO GROUPS %s: %w", key, err)
		}
		from := "-" // no group: every entry is undelivered
		for _, g := range groups {
			if g.Name == group {
				from = "(" + g.LastDeliveredID
			}
		}
		first, err := rdb.XRangeN(ctx, key, from, "+", 1).Result()
		if err != nil {
			return o, fmt.Errorf("stream: XRANGE %s: %w", key, err)
		}
		if len(first) == 1 {
			if at, ok := IDTime(first[0].ID); ok {
				o.Undelivered = max(o.Undelivered, now.Sub(at))
				o.HasUndelivered = true
			}
		}
		if from == "-" {
			continue
		}
		p, err := rdb.XPending(ctx, key, group).Result()
		if err != nil {
			return o, fmt.Errorf("stream: XPENDING %s: %w", key, err)
		}
		if p.Count > 0 {
			if at, ok := IDTime(p.Lower); ok {
				o.Pending = max(o.Pending, now.Sub(at))
				o.HasPending = true
			}
		}
	}
	o.Undelivered, o.Pending = max(o.Undelivered, 0), max(o.Pending, 0)
	return o, nil
}

// IDTime is the time a stream id ("ms-seq") was added at, by the clock of
// the Redis server that added it.
func IDTime(id string) (time.Time, bool) {
	ms, _, ok := strings.Cut(id, "-")
	if !ok {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}

func isNoKey(err error) bool {
	return errors.Is(err, redis.Nil) || strings.Contains(err.Error(), "no such key")
}
