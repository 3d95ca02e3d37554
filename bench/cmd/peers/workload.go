package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The workload's schema, identical for every runtime. processed_jobs is used
// by the runtimes that record the job id themselves (asynq, postgres).
const schemaSQL = `
CREATE TABLE events (id bigint PRIMARY KEY, seats_sold bigint NOT NULL DEFAULT 0);
CREATE TABLE orders (id bigint PRIMARY KEY, event_id bigint, seats int);
CREATE TABLE processed_jobs (job_id text PRIMARY KEY);
`

// updateSQL is the effect every runtime applies once per job.
const updateSQL = `UPDATE events SET seats_sold = seats_sold + o.seats FROM orders o WHERE o.id = $1 AND events.id = o.event_id`

// recordSQL is guard 4's job record.
const recordSQL = `INSERT INTO processed_jobs (job_id) VALUES ($1) ON CONFLICT DO NOTHING`

// runEnv is what one (runtime, inflight) run gets: its own database, the
// shared config and a meter. A runtime enqueues its jobs, starts its
// workers, waits for meter.done (or ctx), stops, and notes what it chose.
type runEnv struct {
	cfg      config
	inflight int
	dbURL    string        // the run's own database
	pool     *pgxpool.Pool // MaxConns = inflight, for handlers that bring their own transaction
	meter    *meter
	notes    []string
	stderr   io.Writer // progress
	res      *result   // the run's result, for the fields a runtime fills itself
	factor   int64     // times each order's seats are added: 1 (counter), 3 (workflow3)
	rateN    int       // workflow3: workflows of the latency phase (orders after --jobs), 0 skips it
	idle     bool      // workflow3: run the idle phase
}

func (e *runEnv) note(format string, args ...any) {
	e.notes = append(e.notes, fmt.Sprintf(format, args...))
}

// meter clocks a run: started by the first job a worker begins, stopped by
// the commit of the jobs-th effect. It counts effects applied, not
// deliveries, so a duplicate delivery cannot stop the clock early.
type meter struct {
	jobs    int64
	applied atomic.Int64
	started atomic.Bool
	start   time.Time
	cpu0    time.Duration
	end     time.Time
	cpu1    time.Duration
	startCh chan struct{} // closed when start is set
	done    chan struct{} // closed when end is set
}

func newMeter(jobs int) *meter {
	return &meter{jobs: int64(jobs), startCh: make(chan struct{}), done: make(chan struct{})}
}

// begin is called by a worker as it starts a job.
func (m *meter) begin() {
	if m.started.CompareAndSwap(false, true) {
		m.cpu0 = cpuTime()
		m.start = time.Now()
		close(m.startCh)
	}
}

// commit is called after a job's effect committed.
func (m *meter) commit() {
	if m.applied.Add(1) == m.jobs {
		m.end = time.Now()
		m.cpu1 = cpuTime()
		close(m.done)
	}
}

// cpuTime is this process's user+system CPU so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// wait blocks until every job committed or ctx ends.
func (m *meter) wait(ctx context.Context) error {
	select {
	case <-m.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d of %d jobs applied: %w", m.applied.Load(), m.jobs, context.Cause(ctx))
	}
}

// createDatabase creates a database with a unique name through the admin URL
// and returns its URL and a function that drops it.
func createDatabase(ctx context.Context, adminURL, label string) (string, func(context.Context) error, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("usher_peers_%s_%s", label, hex.EncodeToString(b[:]))
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect admin: %w", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func(ctx context.Context) error {
		admin, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			return err
		}
		defer admin.Close(ctx)
		_, err = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		return err
	}
	return u.String(), drop, nil
}

// poolSize is the handlers' pool for inflight workers: one connection
// each, as far as the server's max_connections leaves room beside the
// connections open now and a reserve for the runtime's own (River's pool
// of 10, the verification). Asked for more, a pool fails its workers with
// "too many clients" and a run at 256 in flight measured the server's
// refusals instead of the runtime.
func poolSize(ctx context.Context, dbURL string, inflight int) (int, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var room int
	if err := conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int
		- current_setting('superuser_reserved_connections')::int
		- (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int`).Scan(&room); err != nil {
		return 0, fmt.Errorf("connection room: %w", err)
	}
	const reserve = 16
	return max(1, min(inflight, room-reserve)), nil
}

func newPool(ctx context.Context, dbURL string, maxConns int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = int32(maxConns)
	return pgxpool.NewWithConfig(ctx, pc)
}

func seed(ctx context.Context, pool *pgxpool.Pool, events, jobs int) error {
	if _, err := pool.Exec(ctx, schemaSQL); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	// Orders get a pseudo-random event and 1..6 seats from a fixed hash of
	// their id, so every runtime sees the same rows.
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO events (id) SELECT g FROM generate_series(1, $1::bigint) g`, events); err != nil {
		return fmt.Errorf("seed events: %w", err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders (id, event_id, seats)
SELECT g, 1 + ((g * 2654435761) % 1000003) % $1::bigint, 1 + ((g * 40503) % 65521) % 6
FROM generate_series(1, $2::bigint) g`, events, jobs); err != nil {
		return fmt.Errorf("seed orders: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, "ANALYZE events; ANALYZE orders")
	return err
}

// verify compares every event's counter with factor times the sum of its
// orders' seats (factor is 3 for workflow3, whose three steps each add the
// seats): lost is the seats missing, doubled the seats counted more than
// that.
func verify(ctx context.Context, pool *pgxpool.Pool, factor int64) (lost, doubled int64, err error) {
	err = pool.QueryRow(ctx, `
SELECT coalesce(sum(greatest(coalesce(x.expected, 0) - e.seats_sold, 0)), 0)::bigint,
       coalesce(sum(greatest(e.seats_sold - coalesce(x.expected, 0), 0)), 0)::bigint
FROM events e
LEFT JOIN (SELECT event_id, $1::bigint * sum(seats) AS expected FROM orders GROUP BY event_id) x ON x.event_id = e.id`, factor).Scan(&lost, &doubled)
	return lost, doubled, err
}

// stopTimeout bounds a runtime's clean stop after its last job.
const stopTimeout = 30 * time.Second
