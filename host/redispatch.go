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
// count and its fields; an empty reply when the entry is no longer pending
// here (acked, or taken by another host). The entry ran here before, so it
// is within the entry limit.
var claimOwnScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return {} end
local m = redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3])
if #m == 0 or not m[1][2] then return {} end
return {p[1][4] + 1, m[1][2]}`)

// maxRedispatchWaiting bounds the entries a host waits to run again; each
// waits as its stream id alone (the entry is read again when it runs).
const maxRedispatchWaiting = 4096

// redispatchWhenReady runs again, on this host, an entry it left pending
// because its plugin crashed under it, was not running, or had its share
// of stalled jobs: as soon as the plugin is ready and below that share,
// not after the reclaim threshold. The reclaimer remains
// for the entries of hosts that died. An entry the host stops waiting for
// (ReclaimIdle passed, or the host stops) stays pending for the reclaimer.
func (h *Host) redispatchWhenReady(e stream.Entry, rt route) {
	id := e.StreamID
	h.mu.RLock()
	ctx, c := h.runCtx, h.consumer
	h.mu.RUnlock()
	if ctx == nil || c == nil {
		return
	}
	// Only for a restart or a swap, not a plugin marked unhealthy (its
	// entries wait in the stream for the reclaimer) unless it is a version
	// on probation (a rollback is coming), and a bounded number at once.
	// The route is read again: the version that left the entry may have
	// been swapped (rolled back) since.
	cur, ok := h.currentRoute(e.Kind)
	if !ok {
		return
	}
	if _, p := h.probationOf(e.Kind); (cur.plugin == rt.plugin && !cur.plugin.Healthy() && p == nil) || h.redispatchWaiting.Load() >= maxRedispatchWaiting {
		return
	}
	if _, dup := h.redispatching.LoadOrStore(id, true); dup {
		return
	}
	h.redispatchWaiting.Add(1)
	go func() {
		defer h.redispatching.Delete(id)
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
			// The kind's route now, not the one that left the entry: a
			// rollback or a swap serves it from another supervisor.
			if rt, ok := h.currentRoute(e.Kind); ok && rt.plugin.Ready() && (rt.l == nil || rt.l.stalled.Load() < h.stalledCap()) {
				break
			}
			if time.Now().After(deadline) {
				return
			}
			wait = min(2*wait, time.Second)
		}
		reply, err := claimOwnScript.Run(ctx, h.rdb, []string{h.cfg.Stream}, h.cfg.Group, h.cfg.Consumer, id).Slice()
		if err != nil || len(reply) != 2 {
			return
		}
		n, _ := reply[0].(int64)
		vals, _ := reply[1].([]any)
		m := redis.XMessage{ID: id, Values: map[string]any{}}
		var held int64
		for i := 0; i+1 < len(vals); i += 2 {
			k, _ := vals[i].(string)
			v, _ := vals[i+1].(string)
			if _, dup := m.Values[k]; !dup {
				m.Values[k] = v
			}
			held += int64(len(k) + len(v))
		}
		e := stream.Decode(m)
		e.Deliveries, e.Held = n, held
		h.log.Debug("entry run again now that its plugin is ready", "stream_id", id, "job_id", e.JobID, "deliveries", n)
		_, _ = c.Take(ctx, 1, func(context.Context, int) ([]stream.Entry, error) { return []stream.Entry{e}, nil })
	}()
}

// currentRoute is the route serving kind now.
func (h *Host) currentRoute(kind string) (route, bool) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	rt, ok := h.routes[kind]
	return rt, ok && rt.plugin != nil
}
