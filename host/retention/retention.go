// Package retention keeps the runtime's storage bounded: it trims the
// stream behind the oldest entry any consumer group still owes, removes the
// consumers of hosts gone for good, and, when configured, deletes processed
// job ids, done outbox rows (with their delayed runs) and dead letters past
// their retention windows.
//
// The safety rule: nothing is removed that could still bring a job back.
//
//   - A stream entry is trimmed only when every group has read it and none
//     holds it pending. The scan and the trim are one Lua script, so any
//     number of hosts may run it at once.
//   - A job id is deleted from processed_jobs only when it is older than its
//     retention (at least Redelivery.Bound), older than the oldest entry the
//     stream still owes (less Config.Margin), no outbox row that carries it is
//     unfinished, unpublished or recent, no delayed run of it is waiting, and
//     no open dead letter of it could be requeued.
//   - A done outbox row, a delayed run moved to the outbox and a dead letter
//     are deleted only past their retention and the stream's low-water mark.
//   - A cancel asked while its job was on the stream (job_cancels) goes
//     with the Outbox window, under a job id's rule: no outbox row or
//     delayed run of its job is live.
//
// Retention windows are off (rows kept for ever) unless configured. A
// table rows were deleted from is vacuumed right after, so its space is
// reused even where autovacuum is off or lags.
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/internal/periodic"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/swaps"
	"github.com/usherhq/usher/host/workflow"
)

// DefaultMargin is Config.Margin's default.
const DefaultMargin = 5 * time.Minute

// Config configures a Retainer. Every field says its default.
type Config struct {
	// Redis holds the stream. Required.
	Redis redis.UniversalClient
	// Pool is the runtime's database. Required.
	Pool *pgxpool.Pool
	// Streams are the stream's shards' keys; Group the consumer group
	// whose gone consumers are removed; Self this host's consumer, never
	// removed. Required. Trimming respects every group of every shard.
	Streams     []string
	Group, Self string

	// TrimInterval is how often the stream is trimmed. Default 5s;
	// negative: never.
	TrimInterval time.Duration
	// CleanupInterval is how often gone consumers are removed and the
	// retention windows applied. Default 1m.
	CleanupInterval time.Duration
	// ConsumerIdle: a consumer of Group with nothing pending, idle this
	// long, is removed (XGROUP DELCONSUMER). Default 24h; negative: never.
	ConsumerIdle time.Duration

	// ProcessedJobs, Outbox and DeadLetters are the retention windows of
	// processed_jobs (by processed_at), of done outbox rows and the
	// delayed runs moved to the outbox (by when they were done and
	// published), and of dead letters (by created_at). 0: kept for ever
	// (the default). A window set must be at least Redelivery.Bound(),
	// or New refuses it.
	ProcessedJobs, Outbox, DeadLetters time.Duration
	// Redelivery gives the bound the windows are checked against.
	Redelivery Redelivery
	// History and Swaps are the windows of the job history (job_history,
	// by finished_at, and job_republishes, by republished_at) and the plugins' swap history (plugin_swaps, by
	// at): records of what happened, never read to decide a job, so not
	// held to Redelivery's bound. 0: kept for ever.
	History, Swaps time.Duration
	// Workflows is the window of finished workflows (by finished_at),
	// deleted with their histories (host/workflow.Trim); a running one is
	// never deleted. 0: kept for ever (the default). A window set must be
	// at least Redelivery.Bound(): a late redelivery of a finished
	// workflow's task or step still finds it.
	Workflows time.Duration
	// Margin is taken off the stream's low-water mark before it is
	// compared with Postgres's times: it covers the clocks of Redis and
	// Postgres drifting apart and the relay's transaction (published_at
	// is its start, before its entries were added). Default 5 minutes.
	Margin time.Duration
	// BatchSize is how many rows one delete removes. Default 5000.
	BatchSize int

	// OnTrimmed, OnDeleted and OnConsumersRemoved, when set, are told
	// what each pass removed.
	OnTrimmed          func(n int64)
	OnDeleted          func(table string, n int64)
	OnConsumersRemoved func(n int)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if c.Redis == nil || c.Pool == nil || len(c.Streams) == 0 || c.Group == "" || c.Self == "" {
		return errors.New("retention: needs Redis, Pool, Streams, Group and Self")
	}
	for _, w := range []struct {
		name string
		d    time.Duration
	}{{"ProcessedJobs", c.ProcessedJobs}, {"Outbox", c.Outbox}, {"DeadLetters", c.DeadLetters}, {"Workflows", c.Workflows}} {
		if err := c.Redelivery.Check("retention: "+w.name, w.d); err != nil {
			return err
		}
	}
	if c.TrimInterval == 0 {
		c.TrimInterval = 5 * time.Second
	}
	if c.CleanupInterval <= 0 {
		c.CleanupInterval = time.Minute
	}
	if c.ConsumerIdle == 0 {
		c.ConsumerIdle = 24 * time.Hour
	}
	if c.Margin <= 0 {
		c.Margin = DefaultMargin
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 5000
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// Retainer runs the trims and deletes.
type Retainer struct {
	cfg Config
}

// New validates cfg, refusing a retention window below the bound, and
// fills its defaults.
func New(cfg Config) (*Retainer, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Retainer{cfg: cfg}, nil
}

// Run trims every TrimInterval and cleans up every CleanupInterval until
// ctx is done.
func (r *Retainer) Run(ctx context.Context) error {
	log := r.cfg.Logger
	var wg sync.WaitGroup
	if r.cfg.TrimInterval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = periodic.Run(ctx, r.cfg.TrimInterval, log, "stream trim failed", func(ctx context.Context) error {
				_, err := r.Trim(ctx)
				return err
			})
		}()
	}
	err := periodic.Run(ctx, r.cfg.CleanupInterval, log, "storage cleanup failed", r.Cleanup)
	wg.Wait()
	return err
}

// Cleanup removes gone consumers and applies the retention windows once.
func (r *Retainer) Cleanup(ctx context.Context) error {
	_, cerr := r.RemoveIdleConsumers(ctx)
	cerr = errors.Join(cerr, r.trimRecords(ctx))
	if r.cfg.ProcessedJobs == 0 && r.cfg.Outbox == 0 && r.cfg.DeadLetters == 0 {
		return cerr
	}
	// The low-water mark is read with a trim (when trimming is off, the
	// scan still reads it and trims nothing it must keep).
	low, err := r.Trim(ctx)
	if err != nil {
		return errors.Join(cerr, err)
	}
	_, perr := r.Purge(ctx, low.Before)
	return errors.Join(cerr, perr)
}

// vacuum vacuums table, whose rows were just deleted: their space is
// reused once it is, so the table stays flat where autovacuum is off or
// lags. SKIP_LOCKED: another host vacuuming it is enough.
func (r *Retainer) vacuum(ctx context.Context, table string) error {
	if _, err := r.cfg.Pool.Exec(ctx, `VACUUM (SKIP_LOCKED) `+table); err != nil && ctx.Err() == nil {
		return fmt.Errorf("retention: vacuum %s: %w", table, err)
	}
	return nil
}

// trimRecords applies the History, Workflows and Swaps windows.
func (r *Retainer) trimRecords(ctx context.Context) error {
	var errs []error
	batched := []struct {
		table  string
		window time.Duration
		trim   func(ctx context.Context, q outbox.Querier, before time.Time, batch int) (int64, error)
	}{
		{"job_history", r.cfg.History, history.Trim},
		{"job_republishes", r.cfg.History, history.TrimRepublishes},
		{"job_links", r.cfg.History, history.TrimLinks},
		{"workflows", r.cfg.Workflows, workflow.Trim},
	}
	for _, t := range batched {
		if t.window <= 0 {
			continue
		}
		before := time.Now().Add(-t.window)
		var total int64
		for {
			n, err := t.trim(ctx, r.cfg.Pool, before, r.cfg.BatchSize)
			total += n
			if err != nil || n < int64(r.cfg.BatchSize) {
				errs = append(errs, err)
				break
			}
		}
		if total > 0 {
			errs = append(errs, r.vacuum(ctx, t.table))
			if r.cfg.OnDeleted != nil {
				r.cfg.OnDeleted(t.table, total)
			}
			r.cfg.Logger.Info("records past their window deleted", "table", t.table, "deleted", total, "retention", t.window)
		}
	}
	// A stored plugin version nothing needs is removed whatever the
	// windows: it is megabytes.
	n, err := workflow.TrimBinaries(ctx, r.cfg.Pool)
	errs = append(errs, err)
	if n > 0 && r.cfg.OnDeleted != nil {
		r.cfg.OnDeleted("workflow_binaries", n)
	}
	if r.cfg.Swaps > 0 {
		n, err := swaps.Trim(ctx, r.cfg.Pool, time.Now().Add(-r.cfg.Swaps))
		errs = append(errs, err)
		if n > 0 && r.cfg.OnDeleted != nil {
			r.cfg.OnDeleted("plugin_swaps", n)
		}
	}
	return errors.Join(errs...)
}

// trimScript trims KEYS[1] behind the oldest entry any group still owes:
// for each group, its oldest pending entry and the first entry after its
// last-delivered id. With no group, nothing is trimmed. It returns the
// entries trimmed, the owed id ("" when none: every entry was read and
// acked by every group) and Redis's clock in milliseconds.
var trimScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, '', now} end
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  if am ~= bm then return am < bm end
  return as < bs
end
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
if #groups == 0 then
  local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
  if #first == 0 then return {0, '', now} end
  return {0, first[1][1], now}
end
local owed = nil
local function consider(id)
  if owed == nil or less(id, owed) then owed = id end
end
for _, g in ipairs(groups) do
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  local p = redis.call('XPENDING', KEYS[1], f['name'])
  if p[1] > 0 then consider(p[2]) end
  local nxt = redis.call('XRANGE', KEYS[1], '(' .. f['last-delivered-id'], '+', 'COUNT', 1)
  if #nxt > 0 then consider(nxt[1][1]) end
end
if ARGV[1] == '0' then return {0, owed or '', now} end
local n
if owed then
  n = redis.call('XTRIM', KEYS[1], 'MINID', '=', owed)
else
  n = redis.call('XTRIM', KEYS[1], 'MAXLEN', '=', 0)
end
return {n, owed or '', now}
`)

// Trimmed is what a trim did and found.
type Trimmed struct {
	// Entries is how many entries it removed.
	Entries int64
	// Owed is the oldest entry id some group still owes (pending or not
	// yet delivered); empty when none.
	Owed string
	// Before is the stream's low-water mark as a time: every entry added
	// before it was read and acked by every group. It is Owed's time, or
	// Redis's clock when nothing is owed.
	Before time.Time
}

// Trim trims every shard of the stream once (unless TrimInterval is
// negative, when it only reads the low-water marks). What it returns is
// over every shard: the entries removed summed, the low-water mark the
// earliest of the shards'.
func (r *Retainer) Trim(ctx context.Context) (Trimmed, error) {
	var all Trimmed
	for i, s := range r.cfg.Streams {
		t, err := r.trim(ctx, s)
		if err != nil {
			return Trimmed{}, err
		}
		all.Entries += t.Entries
		if i == 0 || t.Before.Before(all.Before) {
			all.Owed, all.Before = t.Owed, t.Before
		}
	}
	if all.Entries > 0 && r.cfg.OnTrimmed != nil {
		r.cfg.OnTrimmed(all.Entries)
	}
	return all, nil
}

// trim trims one shard.
func (r *Retainer) trim(ctx context.Context, stream string) (Trimmed, error) {
	trim := "1"
	if r.cfg.TrimInterval < 0 {
		trim = "0"
	}
	res, err := trimScript.Run(ctx, r.cfg.Redis, []string{stream}, trim).Slice()
	if err != nil {
		return Trimmed{}, fmt.Errorf("retention: trim %s: %w", stream, err)
	}
	if len(res) != 3 {
		return Trimmed{}, fmt.Errorf("retention: trim %s: unexpected reply %v", stream, res)
	}
	n, _ := res[0].(int64)
	owed, _ := res[1].(string)
	now, _ := res[2].(int64)
	t := Trimmed{Entries: n, Owed: owed, Before: time.UnixMilli(now)}
	if owed != "" {
		var ms, seq int64
		if _, err := fmt.Sscanf(owed, "%d-%d", &ms, &seq); err != nil {
			return t, fmt.Errorf("retention: owed id %q: %w", owed, err)
		}
		t.Before = time.UnixMilli(ms)
	}
	if n > 0 {
		r.cfg.Logger.Debug("stream trimmed", "stream", stream, "entries", n, "owed", owed)
	}
	return t, nil
}

// removeScript removes the consumers of group ARGV[1] with nothing pending
// and idle at least ARGV[2] ms, except ARGV[3]; the check and the removal
// are atomic, so no pending entry is lost with its consumer.
var removeScript = redis.NewScript(`
local cs = redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
local min = tonumber(ARGV[2])
local gone = {}
for _, c in ipairs(cs) do
  local f = {}
  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end
  if f['pending'] == 0 and tonumber(f['idle']) >= min and f['name'] ~= ARGV[3] then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])
    table.insert(gone, f['name'])
  end
end
return gone
`)

// RemoveIdleConsumers removes, on every shard, Group's consumers with
// nothing pending that were idle for ConsumerIdle (a consumer still alive
// is created again by its next read), and returns their names, once per
// shard they were removed from.
func (r *Retainer) RemoveIdleConsumers(ctx context.Context) ([]string, error) {
	var all []string
	for _, s := range r.cfg.Streams {
		gone, err := r.removeIdleConsumers(ctx, s)
		if err != nil {
			return all, err
		}
		all = append(all, gone...)
	}
	return all, nil
}

func (r *Retainer) removeIdleConsumers(ctx context.Context, stream string) ([]string, error) {
	if r.cfg.ConsumerIdle < 0 {
		return nil, nil
	}
	gone, err := removeScript.Run(ctx, r.cfg.Redis, []string{stream}, r.cfg.Group, r.cfg.ConsumerIdle.Milliseconds(), r.cfg.Self).StringSlice()
	if err != nil {
		if msg := err.Error(); strings.HasPrefix(msg, "NOGROUP") || strings.Contains(msg, "no such key") {
			return nil, nil
		}
		return nil, fmt.Errorf("retention: remove idle consumers: %w", err)
	}
	if len(gone) > 0 {
		if r.cfg.OnConsumersRemoved != nil {
			r.cfg.OnConsumersRemoved(len(gone))
		}
		r.cfg.Logger.Info("removed consumers idle with nothing pending", "stream", stream, "group", r.cfg.Group,
			"consumers", gone, "idle_over", r.cfg.ConsumerIdle)
	}
	return gone, nil
}

// Purge deletes what the retention windows let go, given the stream's
// low-water mark (Trimmed.Before), and returns the rows deleted per table.
func (r *Retainer) Purge(ctx context.Context, streamBefore time.Time) (map[string]int64, error) {
	limit := streamBefore.Add(-r.cfg.Margin)
	deleted := map[string]int64{}
	var errs []error
	for _, p := range []struct {
		table  string
		window time.Duration
		sql    string
	}{
		// Before the outbox rows it is read against.
		{"job_cancels", r.cfg.Outbox, deleteCancels},
		{"outbox", r.cfg.Outbox, deleteOutbox},
		{"scheduled_jobs", r.cfg.Outbox, deleteScheduled},
		{"dead_letters", r.cfg.DeadLetters, deleteDeadLetters},
		{"processed_jobs", r.cfg.ProcessedJobs, deleteProcessed},
	} {
		if p.window == 0 {
			continue
		}
		for ctx.Err() == nil {
			var n int64
			if err := r.cfg.Pool.QueryRow(ctx, p.sql, p.window.Seconds(), limit, r.cfg.BatchSize).Scan(&n); err != nil {
				errs = append(errs, fmt.Errorf("retention: delete from %s: %w", p.table, err))
				break
			}
			deleted[p.table] += n
			if n < int64(r.cfg.BatchSize) {
				break
			}
		}
		n := deleted[p.table]
		if n == 0 {
			delete(deleted, p.table)
			continue
		}
		errs = append(errs, r.vacuum(ctx, p.table))
		if r.cfg.OnDeleted != nil {
			r.cfg.OnDeleted(p.table, n)
		}
		r.cfg.Logger.Info("deleted rows past their retention", "table", p.table, "rows", n, "retention", p.window)
	}
	return deleted, errors.Join(errs...)
}

// The deletes take $1 the window in seconds, $2 the stream's low-water
// mark less Config.Margin and $3 the batch size; a row goes only when it is
// older than both, and each returns how many went. FOR UPDATE SKIP LOCKED
// lets several hosts purge at once.
const (
	cutoff = `least(now() - make_interval(secs => $1), $2::timestamptz)`

	deleteOutbox = `
WITH doomed AS (
	SELECT id FROM outbox
	WHERE done_at IS NOT NULL AND published_at IS NOT NULL AND greatest(done_at, published_at) < ` + cutoff + `
	ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED),
gone AS (
	DELETE FROM outbox o USING doomed d WHERE o.id = d.id
	RETURNING o.id, coalesce(o.job_id, o.id::text) AS job_id, o.parent_job_id, o.kind, o.request_id,
	          coalesce(o.outcome, '') AS outcome, o.created_at, o.attempt),
-- What a job's rows said outlives them, for as long as its history
-- (job_links, trimmed with it): its parent (the request's tree keeps its
-- shape), and its latest row's kind, request, outcome and creation, its
-- row count and highest attempt (its state and attempts read the same).
-- A job whose rows go in several passes adds to its link.
linked AS (
	INSERT INTO job_links AS l (job_id, parent_job_id, kind, request_id, outcome, created_at, last_row, rows, attempt)
	SELECT DISTINCT ON (job_id) job_id, max(parent_job_id) OVER w, kind, request_id, outcome, created_at, id,
	       count(*) OVER w, max(attempt) OVER w
	FROM gone WINDOW w AS (PARTITION BY job_id) ORDER BY job_id, id DESC
	ON CONFLICT (job_id) DO UPDATE SET
		parent_job_id = coalesce(l.parent_job_id, EXCLUDED.parent_job_id),
		kind = CASE WHEN EXCLUDED.last_row > coalesce(l.last_row, 0) THEN EXCLUDED.kind ELSE coalesce(l.kind, EXCLUDED.kind) END,
		request_id = CASE WHEN EXCLUDED.last_row > coalesce(l.last_row, 0) THEN EXCLUDED.request_id ELSE coalesce(l.request_id, EXCLUDED.request_id) END,
		outcome = CASE WHEN EXCLUDED.last_row > coalesce(l.last_row, 0) THEN EXCLUDED.outcome ELSE l.outcome END,
		created_at = CASE WHEN EXCLUDED.last_row > coalesce(l.last_row, 0) THEN EXCLUDED.created_at ELSE l.created_at END,
		last_row = greatest(l.last_row, EXCLUDED.last_row),
		rows = l.rows + EXCLUDED.rows,
		attempt = greatest(l.attempt, EXCLUDED.attempt),
		kept_at = now()),
-- Each of the deleted rows' history records keeps its commit time, which
-- queue wait reads once the row is gone.
stamped AS (
	UPDATE job_history h SET committed_at = g.created_at FROM gone g
	WHERE h.job_id = g.job_id AND h.outbox_id = g.id AND h.committed_at IS NULL)
SELECT count(*) FROM gone`

	deleteScheduled = `
WITH doomed AS (
	SELECT job_id, attempt FROM scheduled_jobs
	WHERE enqueued_at < ` + cutoff + `
	LIMIT $3 FOR UPDATE SKIP LOCKED),
gone AS (DELETE FROM scheduled_jobs s USING doomed d WHERE s.job_id = d.job_id AND s.attempt = d.attempt RETURNING 1)
SELECT count(*) FROM gone`

	deleteDeadLetters = `
WITH doomed AS (
	SELECT id FROM dead_letters WHERE created_at < ` + cutoff + `
	ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED),
gone AS (DELETE FROM dead_letters l USING doomed d WHERE l.id = d.id RETURNING 1)
SELECT count(*) FROM gone`

	// An outbox row still live for the job: unfinished, unpublished (the
	// relay would publish it again) or done or published within the
	// window.
	liveRow = `(o.done_at IS NULL OR o.published_at IS NULL OR greatest(o.done_at, o.published_at) >= ` + cutoff + `)`

	// A cancel asked while its job was on the stream (job_cancels) is kept
	// as a job id is: a redelivery of the job's entry must find it.
	deleteCancels = `
WITH doomed AS (
	SELECT c.job_id FROM job_cancels c
	WHERE c.requested_at < ` + cutoff + `
	  AND NOT EXISTS (SELECT 1 FROM outbox o
	                  WHERE o.id = CASE WHEN c.job_id ~ '^[0-9]{1,18}$' THEN c.job_id::bigint END AND ` + liveRow + `)
	  AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = c.job_id AND ` + liveRow + `)
	  AND NOT EXISTS (SELECT 1 FROM scheduled_jobs s WHERE s.job_id = c.job_id AND (s.enqueued_at IS NULL OR s.enqueued_at >= ` + cutoff + `))
	ORDER BY c.requested_at LIMIT $3 FOR UPDATE OF c SKIP LOCKED),
gone AS (DELETE FROM job_cancels c USING doomed d WHERE c.job_id = d.job_id RETURNING 1)
SELECT count(*) FROM gone`

	deleteProcessed = `
WITH doomed AS (
	SELECT p.kind, p.job_id FROM processed_jobs p
	WHERE p.processed_at < ` + cutoff + `
	  AND NOT EXISTS (SELECT 1 FROM outbox o
	                  WHERE o.id = CASE WHEN p.job_id ~ '^[0-9]{1,18}$' THEN p.job_id::bigint END AND ` + liveRow + `)
	  AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.job_id = p.job_id AND ` + liveRow + `)
	  AND NOT EXISTS (SELECT 1 FROM scheduled_jobs s WHERE s.job_id = p.job_id AND (s.enqueued_at IS NULL OR s.enqueued_at >= ` + cutoff + `))
	  AND NOT EXISTS (SELECT 1 FROM dead_letters l WHERE l.job_id = p.job_id AND l.requeued_at IS NULL AND l.discarded_at IS NULL)
	ORDER BY p.processed_at LIMIT $3 FOR UPDATE OF p SKIP LOCKED),
gone AS (DELETE FROM processed_jobs p USING doomed d WHERE p.kind = d.kind AND p.job_id = d.job_id RETURNING 1)
SELECT count(*) FROM gone`
)
