package host

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/stream"
)

// Poison entries: an entry whose run crashes its plugin's process would,
// left pending, crash it at every redelivery, and a crash loop parks every
// job of the plugin. The host counts, per stream entry, the crashes the
// entry was in flight for, and dead-letters it as poison at
// Config.PoisonCrashes.
//
// Attribution: every call in flight on a process that crashes is charged
// one crash. An entry charged once runs alone on the plugin from then on
// (pluginhost.Alone), so its next crash is its own: an innocent entry
// caught in a poison entry's crash is charged once, runs alone, succeeds
// and is cleared; the poison entry is charged at every run.
//
// The count lives in Redis, not in this process: several hosts share the
// stream, and the poison entry's runs are spread over them by the
// reclaimer. The delivery count is no substitute: it also counts hosts
// killed, hangs and shutdowns, which say nothing against the entry. One key
// per entry, {stream}:crashes:<stream id>, in the stream's hash slot,
// expiring crashCountTTL after the last crash and deleted when the entry
// is finished.
const crashCountTTL = 24 * time.Hour

func (h *Host) crashKey(e stream.Entry) string { return h.cfg.Stream + ":crashes:" + e.StreamID }

// crashes returns the crashes charged to e so far. A first delivery has
// none (a crashed entry is always redelivered), which spares the common
// case a round trip.
func (h *Host) crashes(ctx context.Context, e stream.Entry) int64 {
	if e.Deliveries <= 1 {
		return 0
	}
	n, err := h.rdb.Get(ctx, h.crashKey(e)).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		h.log.Warn("could not read an entry's crash count; running it as if it had none", "stream_id", e.StreamID, "err", err)
	}
	return n
}

// chargeCrash counts a crash against e and returns its count (0 when it
// could not be counted: MaxDeliveries still bounds the entry).
func (h *Host) chargeCrash(ctx context.Context, e stream.Entry) int64 {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var incr *redis.IntCmd
	_, err := h.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		incr = p.Incr(ctx, h.crashKey(e))
		p.Expire(ctx, h.crashKey(e), crashCountTTL)
		return nil
	})
	if err != nil {
		h.log.Warn("could not count an entry's crash", "stream_id", e.StreamID, "err", err)
		return 0
	}
	return incr.Val()
}

// clearCrashes forgets e's crashes once it is finished.
func (h *Host) clearCrashes(ctx context.Context, e stream.Entry) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := h.rdb.Del(ctx, h.crashKey(e)).Err(); err != nil {
		h.log.Debug("could not clear an entry's crash count; it expires", "stream_id", e.StreamID, "err", err)
	}
}

// poison dead-letters e after n crashes; crash is the last (nil when the
// count was reached earlier and its letter not written then).
//
// A version on probation (just swapped in) that an entry crashes this
// often is suspected first: it is rolled back, and the entry keeps one
// crash short of the limit, to run alone on the version before, which
// dead-letters it if it crashes that one too.
func (h *Host) poison(ctx context.Context, e stream.Entry, d *delivery, n int64, crash *pluginhost.CrashError) bool {
	last := "counted earlier"
	if crash != nil {
		last = crash.Error()
	}
	if name, p := h.probationOf(e.Kind); p != nil {
		h.autoRollback(name, p, rollbackCrashes, fmt.Sprintf("job %.64s crashed it %d times (last: %s)", e.JobID, n, shortError(last)))
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := h.rdb.Set(sctx, h.crashKey(e), h.cfg.PoisonCrashes-1, crashCountTTL).Err(); err != nil {
			h.log.Warn("could not set back an entry's crash count", "stream_id", e.StreamID, "err", err)
		}
		h.mu.RLock()
		rt := h.routes[e.Kind]
		h.mu.RUnlock()
		h.redispatchWhenReady(e, rt)
		return false
	}
	reason := fmt.Sprintf("poison: its runs crashed the plugin's process %d times (max %d; last: %s); dead-lettered so the plugin's other jobs go on",
		n, h.cfg.PoisonCrashes, last)
	if !h.deadLetter(ctx, e, d, "poison", reason, "") {
		return false
	}
	h.clearCrashes(ctx, e)
	return true
}
