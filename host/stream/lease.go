package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// LeaseConfig configures a Lease.
type LeaseConfig struct {
	// Redis client. Required.
	Redis redis.UniversalClient
	// Streams are the shards' keys; Group and Consumer (this host's name
	// in the group, the lease's holder and the name dead hosts' entries
	// are claimed for). Required.
	Streams         []string
	Group, Consumer string
	// TTL is how long the lease lives unless refreshed: a host silent
	// this long (killed, frozen, cut off from Redis) is taken for dead and
	// its pending entries are claimed by the others. Default 5s.
	TTL time.Duration
	// Refresh is how often the lease is renewed. Default TTL/3.
	Refresh time.Duration
	// Interval between scans for dead consumers. Default TTL/3.
	Interval time.Duration
	// Count bounds the entries one claim takes. Default 64.
	Count int
	// Take is Consumer.Take: the claimed entries run through the
	// consumer's pool and budget. Required.
	Take func(ctx context.Context, max int, read func(ctx context.Context, n int) ([]Entry, error)) (int, error)
	// OnClaimed, when set, is told how many entries each claim took.
	OnClaimed func(n int)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *LeaseConfig) setDefaults() error {
	if c.Redis == nil || len(c.Streams) == 0 || c.Group == "" || c.Consumer == "" || c.Take == nil {
		return errors.New("stream: lease needs Redis, Streams, Group, Consumer and Take")
	}
	if c.TTL <= 0 {
		c.TTL = 5 * time.Second
	}
	if c.TTL < 10*time.Millisecond {
		return fmt.Errorf("stream: lease TTL %s is under 10ms", c.TTL)
	}
	if c.Refresh <= 0 {
		c.Refresh = c.TTL / 3
	}
	if c.Refresh >= c.TTL {
		return fmt.Errorf("stream: lease refresh %s must be under its TTL %s", c.Refresh, c.TTL)
	}
	if c.Interval <= 0 {
		c.Interval = c.TTL / 3
	}
	if c.Count <= 0 {
		c.Count = 64
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Lease is a host's heartbeat in Redis, and the watch on everyone else's.
//
// Every host holds a key with a TTL, {shard}:lease:<consumer>, on every
// shard (in the shard's slot, so the script that claims a dead host's
// entries is single-slot), renewed every Refresh by a goroutine of its own
// (a host busy with slow jobs keeps its lease). A consumer of the group with entries pending, no live
// lease and idle (no read, no claim) for at least the TTL is a host that
// is gone: its pending entries are claimed at once for this host, instead
// of after the reclaim threshold, which stays for the entries of a host
// that is alive but slow. The idle condition keeps a live host that has no
// lease (one of a version before leases, during a rolling upgrade; one
// whose lease a failover lost) from being robbed while it reads.
//
// A frozen host that comes back finds its entries claimed; its late
// results are absorbed by the guards, as for any reclaimed entry.
type Lease struct {
	cfg  LeaseConfig
	keys []string
}

// NewLease validates cfg and fills its defaults.
func NewLease(cfg LeaseConfig) (*Lease, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	l := &Lease{cfg: cfg}
	for _, s := range cfg.Streams {
		l.keys = append(l.keys, LeaseKey(s, cfg.Consumer))
	}
	return l, nil
}

// LeaseKey is consumer's lease key for stream, in the stream's hash slot:
// the stream's own hash tag when it has one, else the whole stream key
// as the tag (a key without a tag hashes whole, so both land in one
// slot).
func LeaseKey(stream, consumer string) string { return leasePrefix(stream) + consumer }

func leasePrefix(stream string) string { return slotPrefix(stream) + ":lease:" }

// Renew sets the lease, on every shard, for another TTL.
func (l *Lease) Renew(ctx context.Context) error {
	now := time.Now().UTC().Format(time.RFC3339Nano)
	if len(l.keys) == 1 {
		return l.cfg.Redis.Set(ctx, l.keys[0], now, l.cfg.TTL).Err()
	}
	_, err := l.cfg.Redis.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, k := range l.keys {
			pipe.Set(ctx, k, now, l.cfg.TTL)
		}
		return nil
	})
	return err
}

// Run renews the lease and scans for dead consumers until ctx is done;
// the lease is taken before Run returns its first scan. It does not
// delete the lease when it stops: a host that stops cleanly leaves its
// unfinished entries pending too, and they are claimed once it expires.
func (l *Lease) Run(ctx context.Context) error {
	if err := l.Renew(ctx); err != nil && ctx.Err() == nil {
		l.cfg.Logger.Warn("host lease not taken", "keys", l.keys, "err", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.every(ctx, l.cfg.Refresh, func(ctx context.Context) {
			if err := l.Renew(ctx); err != nil && ctx.Err() == nil {
				l.cfg.Logger.Warn("host lease not renewed", "keys", l.keys, "err", err)
			}
		})
	}()
	l.every(ctx, l.cfg.Interval, func(ctx context.Context) {
		if _, err := l.ClaimDead(ctx); err != nil && ctx.Err() == nil {
			l.cfg.Logger.Warn("dead host scan failed", "err", err)
		}
	})
	wg.Wait()
	return nil
}

func (l *Lease) every(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(ctx)
		}
	}
}

// deadScript claims for ARGV[2] (JUSTID: the delivery count is left as
// it is) up to ARGV[5] entries pending for consumers of group ARGV[1]
// that are not ARGV[2], have no lease (key ARGV[3]..name) and are idle
// at least ARGV[4] ms. The check and the claim are one step, so two live
// hosts never both take an entry. It returns {dead consumers, ids}.
//
// The lease keys are not in KEYS (their names come from the group), but
// they are in the stream's slot by construction (LeaseKey), which a
// cluster node allows.
var deadScript = redis.NewScript(`
local cs = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
local want, minidle = tonumber(ARGV[5]), tonumber(ARGV[4])
local dead, ids = {}, {}
for _, c in ipairs(cs) do
  if #ids >= want then break end
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if f['name'] ~= ARGV[2] and tonumber(f['pending']) > 0 and tonumber(f['idle']) >= minidle
     and redis.call('EXISTS', ARGV[3] .. f['name']) == 0 then
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', want - #ids, f['name'])
    if #p > 0 then
      local args = {'XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0}
      for _, e in ipairs(p) do table.insert(args, e[1]) end
      table.insert(args, 'JUSTID')
      local got = redis.call(unpack(args))
      for _, id in ipairs(got) do table.insert(ids, id) end
      table.insert(dead, f['name'])
    end
  end
end
return {dead, ids}
`)

// ClaimDead claims, on every shard, the entries of consumers whose lease
// is gone and runs them here (through Take), until none is left or Take
// has no room; it returns how many it took. A shard whose claim fails
// does not keep the others from theirs; the first error is returned.
func (l *Lease) ClaimDead(ctx context.Context) (int, error) {
	total := 0
	var first error
	for _, s := range l.cfg.Streams {
		n, err := l.claimDead(ctx, s)
		total += n
		if err != nil && first == nil {
			first = fmt.Errorf("stream %s: %w", s, err)
		}
	}
	return total, first
}

// claimDead claims the dead consumers' entries of one shard.
func (l *Lease) claimDead(ctx context.Context, stream string) (int, error) {
	total := 0
	for ctx.Err() == nil {
		var dead []string
		n, err := l.cfg.Take(ctx, l.cfg.Count, func(ctx context.Context, n int) ([]Entry, error) {
			var ids []string
			var err error
			dead, ids, err = l.claim(ctx, stream, n)
			if err != nil || len(ids) == 0 {
				return nil, err
			}
			// Now pending here, idle 0: read each as the consumer
			// reads (cut when oversized), which counts this delivery.
			entries := make([]Entry, 0, len(ids))
			for _, id := range ids {
				e, ok, err := claimOwn(ctx, l.cfg.Redis, stream, l.cfg.Group, l.cfg.Consumer, id)
				if err != nil {
					// Pending here: the reclaimer or a later claim of
					// its own takes it.
					l.cfg.Logger.Warn("claimed entry of a dead host not read", "stream", stream, "id", id, "err", err)
					continue
				}
				if ok {
					entries = append(entries, e)
				}
			}
			return entries, nil
		})
		if err != nil {
			if strings.HasPrefix(err.Error(), "NOGROUP") {
				return total, nil
			}
			return total, err
		}
		if n == 0 {
			return total, nil
		}
		total += n
		if l.cfg.OnClaimed != nil {
			l.cfg.OnClaimed(n)
		}
		l.cfg.Logger.Info("claimed the pending entries of hosts whose lease expired", "stream", stream, "count", n, "hosts", dead, "lease_ttl", l.cfg.TTL)
	}
	return total, nil
}

// claim runs deadScript on one shard for up to n entries.
func (l *Lease) claim(ctx context.Context, stream string, n int) (dead, ids []string, err error) {
	res, err := deadScript.Run(ctx, l.cfg.Redis, []string{stream}, l.cfg.Group, l.cfg.Consumer,
		leasePrefix(stream), l.cfg.TTL.Milliseconds(), n).Slice()
	if err != nil {
		return nil, nil, err
	}
	if len(res) != 2 {
		return nil, nil, fmt.Errorf("stream: dead host script answered %d values", len(res))
	}
	for _, v := range res[0].([]any) {
		s, _ := v.(string)
		dead = append(dead, s)
	}
	for _, v := range res[1].([]any) {
		s, _ := v.(string)
		ids = append(ids, s)
	}
	return dead, ids, nil
}
