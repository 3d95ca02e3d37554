package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/limits"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/pause"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/internal/entry"
)

// Inspection is the runtime's state as `host inspect` reports it.
type Inspection struct {
	Stream string `json:"stream"`
	Group  string `json:"group"`
	// Shards are the stream's shards, each with its own counts (one, the
	// stream's key itself, unless the hosts run with more).
	Shards []Shard `json:"shards"`
	// Entries is the stream's length; Pending its entries delivered and not
	// acknowledged, per consumer; both over every shard. PendingError says
	// why there is no count (the group does not exist on a shard).
	Entries           int64          `json:"entries"`
	Pending           int64          `json:"pending"`
	PendingError      string         `json:"pending_error,omitempty"`
	Consumers         []ConsumerLoad `json:"consumers"`
	OutboxUnpublished int64          `json:"outbox_unpublished"`
	ScheduledDue      int64          `json:"scheduled_due"`
	ScheduledLater    int64          `json:"scheduled_later"`
	ProcessedJobs     int64          `json:"processed_jobs"`
	// WaitingForKind counts, by kind, the unfinished jobs whose entry
	// waits for a host serving its kind (host.Config.UnknownKindWait).
	WaitingForKind []KindCount `json:"waiting_for_kind,omitempty"`
	// Paused are the kinds an operator paused (host/pause): their
	// deliveries wait in the stream until resumed.
	Paused      []pause.Paused `json:"paused_kinds,omitempty"`
	DeadLetters []KindCount    `json:"dead_letters_open"`
	Absorbed    []Absorbed     `json:"duplicates_absorbed"`
	// Lag is how far behind the runtime is, as of the time Inspect was
	// given.
	Lag Lag `json:"lag"`
	// Limited are the kinds with a concurrency or rate limit
	// (host/limits): their jobs start no faster across every host.
	Limited []limits.Limit `json:"limited_kinds,omitempty"`
	// Priorities are the counts of each priority's band, over every
	// shard, highest priority first: what waits at each priority.
	Priorities []Band `json:"priorities"`
}

// Band is one priority's counts over every shard.
type Band struct {
	Priority int   `json:"priority"`
	Entries  int64 `json:"entries"`
	Pending  int64 `json:"pending"`
}

// Shard is one shard's counts.
type Shard struct {
	Stream  string `json:"stream"`
	Entries int64  `json:"entries"`
	Pending int64  `json:"pending"`
	// GroupLag is the group's lag on this shard, its priority bands
	// summed (-1: Redis cannot say).
	GroupLag int64 `json:"group_lag"`
}

// ConsumerLoad is one consumer's pending entries.
type ConsumerLoad struct {
	Consumer string `json:"consumer"`
	Pending  int64  `json:"pending"`
}

// KindCount is a count of one job kind.
type KindCount struct {
	Kind  string `json:"kind"`
	Count int64  `json:"count"`
}

// Absorbed is the count of duplicates one guard absorbed for a kind, for
// one reason, over every host (the absorbed_duplicates table).
type Absorbed struct {
	Guard  string `json:"guard"`
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
}

// PrioritiesUsed reports whether any band but the default priority's
// holds entries.
func (in Inspection) PrioritiesUsed() bool {
	for _, b := range in.Priorities {
		if b.Priority != entry.DefaultPriority && b.Entries > 0 {
			return true
		}
	}
	return false
}

// DeadLettersOpen is the sum of the open dead letters over kinds.
func (in Inspection) DeadLettersOpen() int64 {
	var n int64
	for _, k := range in.DeadLetters {
		n += k.Count
	}
	return n
}

// Inspect reads the stream's length and pending entries, the outbox, the
// scheduled runs, the processed job ids, the jobs waiting for a host
// serving their kind, the open dead letters per kind, the duplicates
// absorbed and the lag as of now (ReadLag). A missing consumer group is not
// an error: its text is in PendingError, and the group lag is -1.
func Inspect(ctx context.Context, q outbox.Querier, rdb redis.UniversalClient, base, group string, now time.Time) (Inspection, error) {
	in := Inspection{Stream: base, Group: group, Consumers: []ConsumerLoad{}, DeadLetters: []KindCount{}, Absorbed: []Absorbed{}}
	var err error
	if in.Lag, err = ReadLag(ctx, q, rdb, base, group, now); err != nil {
		return in, err
	}
	n, err := Shards(ctx, q, base)
	if err != nil {
		return in, err
	}
	consumers := map[string]int64{}
	for p := entry.HighestPriority; p <= entry.LowestPriority; p++ {
		in.Priorities = append(in.Priorities, Band{Priority: p})
	}
	for i, shard := range stream.ShardKeys(base, n) {
		sh := Shard{Stream: shard, GroupLag: -1}
		if i < len(in.Lag.shards) {
			sh.GroupLag = in.Lag.shards[i]
		}
		for b, key := range stream.BandKeys(shard) {
			entries, err := rdb.XLen(ctx, key).Result()
			if err != nil {
				return in, fmt.Errorf("redis: XLEN %s: %w", key, err)
			}
			var pending int64
			if p, err := rdb.XPending(ctx, key, group).Result(); err == nil {
				pending = p.Count
				for c, n := range p.Consumers {
					consumers[c] += n
				}
			} else if in.PendingError == "" && (key == shard || !isNoGroup(err)) {
				// A band no job of its priority has reached yet
				// may not exist; the shard's own key does.
				in.PendingError = err.Error()
			}
			sh.Entries += entries
			sh.Pending += pending
			in.Priorities[b].Entries += entries
			in.Priorities[b].Pending += pending
		}
		in.Entries += sh.Entries
		in.Pending += sh.Pending
		in.Shards = append(in.Shards, sh)
	}
	for c, n := range consumers {
		in.Consumers = append(in.Consumers, ConsumerLoad{c, n})
	}
	slices.SortFunc(in.Consumers, func(a, b ConsumerLoad) int { return strings.Compare(a.Consumer, b.Consumer) })
	if err := q.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM outbox WHERE published_at IS NULL),
		(SELECT count(*) FROM scheduled_jobs WHERE enqueued_at IS NULL AND run_at <= now()),
		(SELECT count(*) FROM scheduled_jobs WHERE enqueued_at IS NULL AND run_at > now()),
		(SELECT count(*) FROM processed_jobs)`).Scan(&in.OutboxUnpublished, &in.ScheduledDue, &in.ScheduledLater, &in.ProcessedJobs); err != nil {
		return in, err
	}
	for _, k := range []struct {
		sql string
		to  *[]KindCount
	}{
		{`SELECT kind, count(*) FROM outbox WHERE done_at IS NULL AND kind_waited_at IS NOT NULL GROUP BY kind ORDER BY kind`, &in.WaitingForKind},
		{`SELECT kind, count(*) FROM dead_letters WHERE requeued_at IS NULL AND discarded_at IS NULL GROUP BY kind ORDER BY kind`, &in.DeadLetters},
	} {
		rows, err := q.Query(ctx, k.sql)
		if err != nil {
			return in, err
		}
		if *k.to, err = pgx.AppendRows(*k.to, rows, pgx.RowToStructByPos[KindCount]); err != nil {
			return in, err
		}
	}
	if in.Paused, err = pause.List(ctx, q); err != nil {
		return in, err
	}
	if in.Limited, err = limits.List(ctx, q); err != nil {
		return in, err
	}
	rows, err := q.Query(ctx, `SELECT guard, kind, reason, count FROM absorbed_duplicates ORDER BY guard, kind, reason`)
	if err != nil {
		return in, err
	}
	in.Absorbed, err = pgx.AppendRows(in.Absorbed, rows, pgx.RowToStructByPos[Absorbed])
	return in, err
}

// Lag is how far behind the runtime is.
type Lag struct {
	// GroupLag is the consumer group's lag as Redis counts it (entries
	// added and not yet delivered to the group); -1 when Redis cannot say
	// (after a trim or deletion, or no group).
	GroupLag int64 `json:"group_lag"`
	// OldestPending is the age of the oldest entry delivered and not
	// acknowledged (from its stream id's time); 0 when none.
	OldestPending time.Duration `json:"oldest_pending_ns"`
	// RelayLag is the age of the oldest outbox row not yet published; 0
	// when the relay has published everything.
	RelayLag time.Duration `json:"relay_lag_ns"`
	// shards are each shard's group lag.
	shards []int64
}

// ReadLag reads Lag as of now, over every shard of the stream whose base
// key is base: the group lags summed (-1 if any shard's is unknown), the
// oldest pending entry of them all.
func ReadLag(ctx context.Context, q outbox.Querier, rdb redis.UniversalClient, base, group string, now time.Time) (Lag, error) {
	lag := Lag{}
	n, err := Shards(ctx, q, base)
	if err != nil {
		return lag, err
	}
	for _, shardKey := range stream.ShardKeys(base, n) {
		shard := int64(0)
		for _, key := range stream.BandKeys(shardKey) {
			groups, err := rdb.XInfoGroups(ctx, key).Result()
			if err != nil && !isNoStream(err) {
				return lag, fmt.Errorf("redis: XINFO GROUPS %s: %w", key, err)
			}
			band := int64(-1)
			if err != nil && key != shardKey {
				band = 0 // a band no job has reached: nothing behind
			}
			for _, g := range groups {
				if g.Name == group {
					band = g.Lag
				}
			}
			if band < 0 || shard < 0 {
				shard = -1
			} else {
				shard += band
			}
			if p, err := rdb.XPending(ctx, key, group).Result(); err == nil && p.Count > 0 {
				if ms, ok := stream.IDTime(p.Lower); ok && now.After(ms) {
					lag.OldestPending = max(lag.OldestPending, now.Sub(ms))
				}
			}
		}
		lag.shards = append(lag.shards, shard)
		switch {
		case shard < 0 || lag.GroupLag < 0:
			lag.GroupLag = -1
		default:
			lag.GroupLag += shard
		}
	}
	var oldest *time.Time
	if err := q.QueryRow(ctx, `SELECT min(created_at) FROM outbox WHERE published_at IS NULL`).Scan(&oldest); err != nil {
		return lag, err
	}
	if oldest != nil && now.After(*oldest) {
		lag.RelayLag = now.Sub(*oldest)
	}
	return lag, nil
}

// isNoGroup: err is XPENDING's on a key that does not exist or has no
// such group.
func isNoGroup(err error) bool {
	return err != nil && (strings.HasPrefix(err.Error(), "NOGROUP") || isNoStream(err))
}

func isNoStream(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "no such key") || errors.Is(err, redis.Nil))
}
