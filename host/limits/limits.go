// Package limits holds a job kind to a concurrency limit and a rate limit
// across every host.
//
// An operator's limits live in Postgres (the kind_limits table): Set and
// Unset write them, each with a row in operator_actions, in one
// transaction. Every host runs a Limiter that reads them every Interval
// (default 1s), so a change reaches every host within Interval, without a
// restart.
//
// The limits are enforced in Redis, where every host of the group asks
// before it starts a job of a limited kind (one script, atomic, on Redis's
// clock):
//
//   - concurrency N: at most N jobs of the kind hold a permit at once. A
//     permit is a member of a sorted set scored by its lease's end; the
//     host renews the leases of the permits it holds every Lease/3, so a
//     host that dies frees its permits within Lease (default 15s). A host
//     cut off from Redis for longer than Lease loses its permits and the
//     kind may run more than N until its jobs end.
//   - rate R a second: a token bucket of Burst tokens (default R rounded
//     up, at least 1) refilled at R a second. A start takes a token; in
//     any window of T seconds at most Burst + R*T jobs start.
//
// A job held back by a limit is parked by the pipeline as a paused one is:
// it stays pending in the stream, its delivery is given back (it counts
// towards neither MaxDeliveries nor MaxAttempts), and it runs when a
// permit or a token is free: on this host as soon as Ready says so (the
// redispatcher polls it), else when the reclaimer takes it again. A job
// already running when a limit is set or lowered finishes; only starts
// are held back.
package limits

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/outbox"
)

// Limit is one kind's limits; a zero Concurrency or Rate is no such limit.
type Limit struct {
	Kind string `json:"kind"`
	// Concurrency: at most this many running at once across every host.
	Concurrency int `json:"concurrency,omitempty"`
	// Rate: at most this many starts a second across every host, in
	// bursts of at most Burst.
	Rate  float64   `json:"rate,omitempty"`
	Burst int       `json:"burst,omitempty"`
	SetAt time.Time `json:"set_at"`
	SetBy string    `json:"set_by"`
}

// The actions this package records in operator_actions.
const (
	ActionLimit   = "limit_kind"
	ActionUnlimit = "unlimit_kind"
)

// DefaultBurst is a rate's burst when none is given: one second's tokens,
// at least one.
func DefaultBurst(rate float64) int { return max(1, int(math.Ceil(rate))) }

// String says the limits as the CLI takes them.
func (l Limit) String() string {
	var parts []string
	if l.Concurrency > 0 {
		parts = append(parts, fmt.Sprintf("concurrency %d", l.Concurrency))
	}
	if l.Rate > 0 {
		parts = append(parts, fmt.Sprintf("rate %s/s burst %d", strconv.FormatFloat(l.Rate, 'f', -1, 64), l.Burst))
	}
	if len(parts) == 0 {
		return "no limit"
	}
	return strings.Join(parts, ", ")
}

// ParseRate reads a rate as the CLI takes it: "10/s", "10", "600/m",
// "3600/h". It returns starts a second.
func ParseRate(s string) (float64, error) {
	num, unit, _ := strings.Cut(strings.TrimSpace(s), "/")
	per := 1.0
	switch unit {
	case "", "s":
	case "m":
		per = 60
	case "h":
		per = 3600
	default:
		return 0, fmt.Errorf("rate %q: the unit is /s, /m or /h", s)
	}
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || n <= 0 || math.IsInf(n, 0) || math.IsNaN(n) {
		return 0, fmt.Errorf("rate %q: want a positive number of starts, as 10/s", s)
	}
	return n / per, nil
}

// Beginner is what Set and Unset need: *pgxpool.Pool, *pgx.Conn.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Set sets kind's limits (l.Kind) on behalf of actor and records the
// action; it replaces the kind's earlier limits whole. A rate with no
// burst gets DefaultBurst.
func Set(ctx context.Context, db Beginner, l Limit, actor string) (Limit, error) {
	switch {
	case l.Kind == "":
		return l, errors.New("limits: name the kind")
	case actor == "":
		return l, errors.New("limits: name who acts")
	case l.Concurrency < 0 || l.Rate < 0 || l.Burst < 0:
		return l, errors.New("limits: a limit is positive")
	case l.Concurrency == 0 && l.Rate == 0:
		return l, errors.New("limits: set a concurrency, a rate or both (unlimit removes them)")
	case l.Burst > 0 && l.Rate == 0:
		return l, errors.New("limits: a burst needs a rate")
	case math.IsInf(l.Rate, 0) || math.IsNaN(l.Rate):
		return l, errors.New("limits: the rate is not a number")
	}
	if l.Rate > 0 && l.Burst == 0 {
		l.Burst = DefaultBurst(l.Rate)
	}
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `
			INSERT INTO kind_limits (kind, concurrency, rate, burst, set_by) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (kind) DO UPDATE SET concurrency = $2, rate = $3, burst = $4, set_at = now(), set_by = $5
			RETURNING set_at`, l.Kind, nullInt(l.Concurrency), nullFloat(l.Rate), nullInt(l.Burst), actor).Scan(&l.SetAt); err != nil {
			return err
		}
		l.SetBy = actor
		return record(ctx, tx, actor, ActionLimit, l.Kind, l.String())
	})
	if err != nil {
		return l, fmt.Errorf("limit %s: %w", l.Kind, err)
	}
	return l, nil
}

// Unset removes kind's limits on behalf of actor and records the action.
// It reports false, and records nothing, when kind had none.
func Unset(ctx context.Context, db Beginner, kind, actor string) (changed bool, err error) {
	if kind == "" || actor == "" {
		return false, errors.New("limits: name the kind and who acts")
	}
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM kind_limits WHERE kind = $1`, kind)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		changed = true
		return record(ctx, tx, actor, ActionUnlimit, kind, "")
	})
	if err != nil {
		return false, fmt.Errorf("unlimit %s: %w", kind, err)
	}
	return changed, nil
}

func record(ctx context.Context, tx pgx.Tx, actor, action, target, detail string) error {
	_, err := tx.Exec(ctx, `INSERT INTO operator_actions (actor, action, target, detail) VALUES ($1, $2, $3, $4)`, actor, action, target, detail)
	return err
}

func nullInt(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}

func nullFloat(f float64) *float64 {
	if f == 0 {
		return nil
	}
	return &f
}

// List returns every kind's limits, by kind.
func List(ctx context.Context, q outbox.Querier) ([]Limit, error) {
	rows, err := q.Query(ctx, `SELECT kind, coalesce(concurrency, 0), coalesce(rate, 0), coalesce(burst, 0), set_at, set_by
		FROM kind_limits ORDER BY kind`)
	if err != nil {
		return nil, fmt.Errorf("kind limits: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Limit])
}

// Config configures a Limiter.
type Config struct {
	// Pool reads kind_limits. Required.
	Pool outbox.Querier
	// Redis holds the permits and the buckets. Required.
	Redis redis.UniversalClient
	// Stream names the deployment: the keys are the stream's. Required.
	Stream string
	// Holder is this host's consumer name, which its permits carry.
	// Required.
	Holder string
	// Interval between reads of kind_limits. Default 1s.
	Interval time.Duration
	// Lease is how long a permit outlives its host's last renewal.
	// Default 15s.
	Lease time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Limiter enforces the limits on this host's starts.
type Limiter struct {
	cfg    Config
	limits atomic.Pointer[map[string]Limit]
	// notBefore: kind -> unix nanoseconds before which Ready says no
	// (the last refusal's wait).
	notBefore sync.Map
	mu        sync.Mutex
	held      map[string]string // member -> kind
}

// New validates cfg and fills its defaults.
func New(cfg Config) (*Limiter, error) {
	if cfg.Pool == nil || cfg.Redis == nil || cfg.Stream == "" || cfg.Holder == "" {
		return nil, errors.New("limits: limiter needs Pool, Redis, Stream and Holder")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Limiter{cfg: cfg, held: map[string]string{}}, nil
}

// keys are kind's permit set and bucket, in one slot.
func (l *Limiter) keys(kind string) []string {
	base := "usher-limits:{" + l.cfg.Stream + "/" + kind + "}"
	return []string{base + ":running", base + ":bucket"}
}

// Limit returns kind's limits as last read (false: none).
func (l *Limiter) Limit(kind string) (Limit, bool) {
	m := l.limits.Load()
	if m == nil {
		return Limit{}, false
	}
	lim, ok := (*m)[kind]
	return lim, ok
}

// Ready reports whether a start of kind may be tried now: it has no
// limit, or the last refusal's wait has passed.
func (l *Limiter) Ready(kind string) bool {
	if _, ok := l.Limit(kind); !ok {
		return true
	}
	v, ok := l.notBefore.Load(kind)
	return !ok || time.Now().UnixNano() >= v.(int64)
}

// acquire takes a permit (when the kind has a concurrency limit) and a
// token (when it has a rate) together, or neither: it returns 1, or 0 and
// how many milliseconds until a token is due (0: no permit free).
var acquire = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local conc, rate, burst, lease = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and redis.call('ZCARD', KEYS[1]) >= conc then
    return {0, 0}
  end
end
if rate > 0 then
  local b = redis.call('HMGET', KEYS[2], 'tokens', 'ts')
  local tokens = tonumber(b[1]) or burst
  local ts = tonumber(b[2]) or now
  tokens = math.min(burst, tokens + math.max(0, now - ts) * rate / 1000)
  if tokens < 1 then
    redis.call('HSET', KEYS[2], 'tokens', tostring(tokens), 'ts', tostring(now))
    redis.call('PEXPIRE', KEYS[2], math.ceil(burst * 1000 / rate) + 1000)
    return {0, math.ceil((1 - tokens) * 1000 / rate)}
  end
  redis.call('HSET', KEYS[2], 'tokens', tostring(tokens - 1), 'ts', tostring(now))
  redis.call('PEXPIRE', KEYS[2], math.ceil(burst * 1000 / rate) + 1000)
end
if conc > 0 then
  redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease * 4)
end
return {1, 0}
`)

// renew moves the leases of the members given that are still held.
var renew = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], lease * 4)
return 0
`)

// Acquire asks to start a job of kind, id naming this run (its stream
// entry). ok: it may start, and release must be called when it ends. Not
// ok: a limit holds it back (Ready says when to try again). A kind with no
// limit is always ok and asks Redis nothing.
func (l *Limiter) Acquire(ctx context.Context, kind, id string) (release func(), ok bool, err error) {
	lim, limited := l.Limit(kind)
	if !limited {
		return func() {}, true, nil
	}
	member := l.cfg.Holder + "/" + id
	keys := l.keys(kind)
	res, err := acquire.Run(ctx, l.cfg.Redis, keys, member, lim.Concurrency, lim.Rate, lim.Burst, l.cfg.Lease.Milliseconds()).Int64Slice()
	if err != nil {
		return nil, false, fmt.Errorf("limits: %s: %w", kind, err)
	}
	if len(res) != 2 {
		return nil, false, fmt.Errorf("limits: %s: the script answered %v", kind, res)
	}
	if res[0] != 1 {
		wait := time.Duration(res[1]) * time.Millisecond
		if wait <= 0 {
			// No permit free: a release here clears it sooner.
			wait = 200 * time.Millisecond
		}
		l.notBefore.Store(kind, time.Now().Add(wait).UnixNano())
		return nil, false, nil
	}
	if lim.Concurrency == 0 {
		return func() {}, true, nil
	}
	l.mu.Lock()
	l.held[member] = kind
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.held, member)
			l.mu.Unlock()
			// A permit left behind (Redis unreachable now) ends with its
			// lease; its own context may be over, the job's end is not.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := l.cfg.Redis.ZRem(rctx, keys[0], member).Err(); err != nil {
				l.cfg.Logger.Warn("could not release a concurrency permit; it ends with its lease", "kind", kind, "lease", l.cfg.Lease, "err", err)
			}
			l.notBefore.Delete(kind)
		})
	}, true, nil
}

// Run reads the limits, reports started, then reads them every Interval
// and renews this host's permits every Lease/3 until ctx is done. A failed
// read keeps the last limits (logged); a first read that fails starts with
// none.
func (l *Limiter) Run(ctx context.Context, started func()) error {
	if err := l.Read(ctx); err != nil && ctx.Err() == nil {
		l.cfg.Logger.Warn("could not read the kinds' limits; none until a read succeeds", "err", err)
	}
	started()
	read := time.NewTicker(l.cfg.Interval)
	defer read.Stop()
	renewal := time.NewTicker(l.cfg.Lease / 3)
	defer renewal.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-read.C:
			if err := l.Read(ctx); err != nil && ctx.Err() == nil {
				l.cfg.Logger.Warn("could not read the kinds' limits; the last read stands", "err", err)
			}
		case <-renewal.C:
			l.renew(ctx)
		}
	}
}

// renew renews the leases of the permits this host holds.
func (l *Limiter) renew(ctx context.Context) {
	byKind := map[string][]any{}
	l.mu.Lock()
	for member, kind := range l.held {
		byKind[kind] = append(byKind[kind], member)
	}
	l.mu.Unlock()
	for kind, members := range byKind {
		args := append([]any{l.cfg.Lease.Milliseconds()}, members...)
		if err := renew.Run(ctx, l.cfg.Redis, l.keys(kind)[:1], args...).Err(); err != nil && ctx.Err() == nil {
			l.cfg.Logger.Warn("could not renew concurrency permits", "kind", kind, "permits", len(members), "err", err)
		}
	}
}

// Read reads the limits now.
func (l *Limiter) Read(ctx context.Context) error {
	list, err := List(ctx, l.cfg.Pool)
	if err != nil {
		return err
	}
	m := make(map[string]Limit, len(list))
	for _, lim := range list {
		m[lim.Kind] = lim
	}
	if old := l.limits.Swap(&m); old != nil && changed(*old, m) {
		l.cfg.Logger.Info("kind limits changed", "limited", len(m))
	}
	return nil
}

func changed(a, b map[string]Limit) bool {
	if len(a) != len(b) {
		return true
	}
	for k, x := range a {
		y, ok := b[k]
		if !ok || x.Concurrency != y.Concurrency || x.Rate != y.Rate || x.Burst != y.Burst {
			return true
		}
	}
	return false
}
