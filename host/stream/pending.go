package stream

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// Pending is what one consumer does with the entries pending under its
// name beyond reading and acking them: give a delivery back (park), count
// the crashes an entry was in flight for (poison), and take an entry it
// still owns again (redispatch). Each works on the entry's own shard
// (Entry.Stream), and every key it touches is in that shard's hash slot.
type Pending struct {
	Redis           redis.UniversalClient
	Group, Consumer string
}

// parkScript gives back the delivery of an entry its consumer still owns:
// XCLAIM to the same consumer with RETRYCOUNT set to the count before
// this delivery (ARGV[4] is the count the delivery was made with), and
// never higher than the count is now. The reclaimer may have claimed the
// entry again while this delivery waited for a slot or ran; the consumer
// skips such a claim (the entry is already running here), so it never
// reached a plugin either and is given back with it. JUSTID keeps XCLAIM
// from counting a delivery of its own.
var parkScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[3], ARGV[3], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return -1 end
local n = math.min(math.max(tonumber(ARGV[4]) - 1, 0), tonumber(p[1][4]))
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[3], 'RETRYCOUNT', n, 'JUSTID')
return n`)

// GiveBack runs parkScript: the delivery of e no longer counts towards
// the host's MaxDeliveries. It returns the entry's delivery count after
// (-1 when the entry is no longer pending here).
func (p Pending) GiveBack(ctx context.Context, e Entry) (int64, error) {
	return parkScript.Run(context.WithoutCancel(ctx), p.Redis, []string{e.Stream},
		p.Group, p.Consumer, e.StreamID, e.Deliveries).Int64()
}

// ClaimOwn takes a new delivery of the entry id of shard stream that this
// consumer still owns, read as the consumer reads (an oversized entry cut
// the same way), with its delivery count; false when it is no longer
// pending here.
func (p Pending) ClaimOwn(ctx context.Context, stream, id string) (Entry, bool, error) {
	return claimOwn(ctx, p.Redis, stream, p.Group, p.Consumer, id)
}

// CrashCountTTL is how long an entry's crash count is kept after its last
// crash.
//
// The count lives in Redis, not in a host's memory: several hosts share
// the stream, and a poison entry's runs are spread over them by the
// reclaimer. The delivery count is no substitute: it also counts hosts
// killed, hangs and shutdowns, which say nothing against the entry. One
// key per entry, {shard}:crashes:<stream id>, in its shard's hash slot,
// deleted when the entry is finished.
const CrashCountTTL = 24 * time.Hour

func (p Pending) crashKey(e Entry) string { return e.Stream + ":crashes:" + e.StreamID }

// Crashes returns the crashes charged to e so far. A first delivery has
// none (a crashed entry is always redelivered), which spares the common
// case a round trip.
func (p Pending) Crashes(ctx context.Context, e Entry) (int64, error) {
	if e.Deliveries <= 1 {
		return 0, nil
	}
	n, err := p.Redis.Get(ctx, p.crashKey(e)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// ChargeCrash counts a crash against e and returns its count.
func (p Pending) ChargeCrash(ctx context.Context, e Entry) (int64, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var incr *redis.IntCmd
	_, err := p.Redis.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
		incr = pipe.Incr(ctx, p.crashKey(e))
		pipe.Expire(ctx, p.crashKey(e), CrashCountTTL)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return incr.Val(), nil
}

// SetCrashes sets e's crash count to n.
func (p Pending) SetCrashes(ctx context.Context, e Entry, n int64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return p.Redis.Set(ctx, p.crashKey(e), n, CrashCountTTL).Err()
}

// ClearCrashes forgets e's crashes once it is finished.
func (p Pending) ClearCrashes(ctx context.Context, e Entry) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return p.Redis.Del(ctx, p.crashKey(e)).Err()
}
