package host

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/stream"
)

// claimOwnScript takes a new delivery of an entry this consumer still owns
// (XCLAIM to itself, which counts the delivery and resets its idle time, so
// no other host's reclaimer takes it meanwhile) and returns its delivery
// count; 0 when the entry is no longer pending here (acked, or taken by
// another host).
var claimOwnScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return 0 end
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3])
return p[1][4] + 1`)

// redispatchWhenReady runs again, on this host, an entry it left pending
// because its plugin crashed under it or was not running: as soon as the
// plugin is ready, not after the reclaim threshold. The reclaimer remains
// for the entries of hosts that died. An entry the host stops waiting for
// (ReclaimIdle passed, or the host stops) stays pending for the reclaimer.
func (h *Host) redispatchWhenReady(e stream.Entry, rt route) {
	h.mu.RLock()
	ctx, c := h.runCtx, h.consumer
	h.mu.RUnlock()
	if ctx == nil || c == nil {
		return
	}
	// Only for a restart, not a plugin marked unhealthy (its entries wait
	// in the stream, not in this host's memory), and at most Concurrency
	// entries at once: each waiting one holds its entry outside the byte
	// budget. The rest wait for the reclaimer.
	if !rt.plugin.Healthy() || h.redispatchWaiting.Load() >= int64(h.cfg.Concurrency) {
		return
	}
	if _, dup := h.redispatching.LoadOrStore(e.StreamID, true); dup {
		return
	}
	h.redispatchWaiting.Add(1)
	go func() {
		defer h.redispatching.Delete(e.StreamID)
		defer h.redispatchWaiting.Add(-1)
		deadline := time.Now().Add(h.cfg.ReclaimIdle)
		// A first pause: the run that left it has to end before it runs
		// again here (the consumer refuses an entry still running).
		wait := 100 * time.Millisecond
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			if rt.plugin.Ready() {
				break
			}
			if time.Now().After(deadline) {
				return
			}
			wait = min(2*wait, time.Second)
		}
		n, err := claimOwnScript.Run(ctx, h.rdb, []string{h.cfg.Stream}, h.cfg.Group, h.cfg.Consumer, e.StreamID).Int64()
		if err != nil || n == 0 {
			return
		}
		e.Deliveries = n
		h.log.Debug("entry run again now that its plugin is ready", "stream_id", e.StreamID, "job_id", e.JobID, "deliveries", n)
		_, _ = c.Take(ctx, 1, func(context.Context, int) ([]stream.Entry, error) { return []stream.Entry{e}, nil })
	}()
}
