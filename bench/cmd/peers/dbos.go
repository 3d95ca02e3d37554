package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dbos-inc/dbos-transact-golang/dbos"
	"github.com/jackc/pgx/v5"
)

// dbosModule is the DBOS Transact module; its version goes in the notes.
const dbosModule = "github.com/dbos-inc/dbos-transact-golang"

// dbosDefaultPolling is DBOS's own default base polling interval for a
// queue (models.DefaultBasePollingInterval, internal to DBOS); the idle
// phase puts the queue back on it so it measures DBOS's defaults.
const dbosDefaultPolling = time.Second

// Workflow ID prefixes, one per phase: the throughput phase's workflows
// stop the meter, the others do not.
const (
	wfThroughput = "t-"
	wfRate       = "r-"
	wfSleeper    = "s-"
)

// workflow3Step is one step's transaction: record the step's id in
// processed_jobs and, only if it was not there, add the order's seats to its
// event. It reports whether the effect was applied.
func workflow3Step(ctx context.Context, env *runEnv, stepID string, orderID int64) (bool, error) {
	tx, err := env.pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var recorded string
	err = tx.QueryRow(ctx, recordSQL+` RETURNING job_id`, stepID).Scan(&recorded)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // this step already ran: its effect is in
	}
	if err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, updateSQL, orderID); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// runDBOS runs workflow3 on DBOS Transact in the run's database (DBOS's
// system tables in its schema "dbos", beside the workload's tables):
// throughput on a queue, then (when env.rateN or cfg.Sleeping ask for it)
// latency at a fixed rate and the idle cost of sleeping workflows.
func runDBOS(ctx context.Context, env *runEnv) error {
	cfg := env.cfg
	logger := slog.New(slog.NewTextHandler(env.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// A failed workflow ends the run at once instead of leaving the meter
	// to wait for --timeout.
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	dctx, err := dbos.NewContext(context.WithoutCancel(ctx), dbos.Config{
		AppName:     "usher-peers",
		DatabaseURL: env.dbURL, // DBOS's own pool: 20 connections by default
		Logger:      logger,
	})
	if err != nil {
		return fmt.Errorf("dbos.NewContext: %w", err)
	}

	workflow3 := func(wctx dbos.Context, orderID int64) (int64, error) {
		id, err := dbos.GetWorkflowID(wctx)
		if err != nil {
			return 0, err
		}
		throughput := strings.HasPrefix(id, wfThroughput)
		for n := 1; n <= 3; n++ {
			stepID := id + "/" + strconv.Itoa(n)
			_, err := dbos.RunAsStep(wctx, func(sctx context.Context) (bool, error) {
				if throughput {
					env.meter.begin()
				}
				return workflow3Step(sctx, env, stepID, orderID)
			}, dbos.WithStepName("step"+strconv.Itoa(n)))
			if err != nil {
				err = fmt.Errorf("workflow %s step %d: %w", id, n, err)
				fail(err)
				return 0, err
			}
		}
		if throughput {
			env.meter.commit()
		}
		return orderID, nil
	}
	sleeper := func(wctx dbos.Context, _ int) (int, error) {
		_, err := dbos.Sleep(wctx, time.Hour)
		return 0, err
	}
	dbos.RegisterWorkflow(dctx, workflow3, dbos.WithWorkflowName("workflow3"))
	dbos.RegisterWorkflow(dctx, sleeper, dbos.WithWorkflowName("sleeper"))
	// Worker concurrency 0 until every workflow is enqueued, so the clock
	// measures work, not enqueueing (as for the other runtimes).
	queue, err := dbos.RegisterQueue(dctx, "usher-peers",
		dbos.WithWorkerConcurrency(0),
		dbos.WithQueueBasePollingInterval(cfg.DBOSPollingInterval))
	if err != nil {
		return fmt.Errorf("dbos.RegisterQueue: %w", err)
	}
	if err := dbos.Launch(dctx); err != nil {
		return fmt.Errorf("dbos.Launch: %w", err)
	}
	defer func() {
		// Shutdown cancels the root context: sleepers wake with an error and
		// are not recorded as finished; the database is dropped next anyway.
		if err := dbos.Shutdown(dctx, 10*time.Second); err != nil {
			fmt.Fprintf(env.stderr, "peers: dbos shutdown: %v\n", err)
		}
	}()
	env.note("dbos %s, workflow3: 3 steps (dbos.RunAsStep), each one transaction: INSERT processed_jobs '<workflow id>/<n>' ON CONFLICT DO NOTHING RETURNING, UPDATE if inserted, COMMIT", moduleVersion(dbosModule))
	env.note("queue worker concurrency %d, base polling interval %s (DBOS default 1s), DBOS's system pool at its default (20 connections), steps' pool %d", env.inflight, cfg.DBOSPollingInterval, env.inflight)

	// 1. Throughput.
	fmt.Fprintf(env.stderr, "peers: dbos inflight=%d: enqueueing %d workflows\n", env.inflight, cfg.Jobs)
	err = parallel(ctx, 8, cfg.Jobs, func(i int) error {
		order := int64(i + 1)
		_, err := dbos.RunWorkflow(dctx, workflow3, order,
			dbos.WithQueue(queue), dbos.WithWorkflowID(wfThroughput+strconv.FormatInt(order, 10)))
		return err
	})
	if err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	inflight := env.inflight
	if err := queue.SetWorkerConcurrency(dctx, &inflight); err != nil {
		return fmt.Errorf("set worker concurrency: %w", err)
	}
	if err := env.meter.wait(ctx); err != nil {
		return err
	}
	if err := waitRecorded(ctx, env, wfThroughput, cfg.Jobs); err != nil {
		return err
	}

	// 2. Latency at a fixed rate.
	if env.rateN > 0 {
		if err := dbosRate(ctx, dctx, env, workflow3); err != nil {
			return fmt.Errorf("rate phase: %w", err)
		}
	}

	// 3. Idle cost of sleeping workflows.
	if cfg.Sleeping > 0 && env.idle {
		if err := queue.SetPollingInterval(dctx, dbosDefaultPolling); err != nil {
			return fmt.Errorf("set polling interval: %w", err)
		}
		if err := dbosIdle(ctx, dctx, env, sleeper); err != nil {
			return fmt.Errorf("idle phase: %w", err)
		}
	}
	return nil
}

// dbosRate starts env.rateN workflows at cfg.Rate per second, each with
// RunWorkflow (no queue) in a goroutine of its own so a slow start does not
// delay the next, and records from the call to RunWorkflow to the return of
// GetResult (a local handle: DBOS delivers the outcome after it recorded it).
func dbosRate(ctx context.Context, dctx dbos.Context, env *runEnv, wf dbos.Workflow[int64, int64]) error {
	n := env.rateN
	fmt.Fprintf(env.stderr, "peers: dbos: %d workflows at %.0f/s\n", n, env.cfg.Rate)
	lat := make([]time.Duration, n)
	errs := make([]error, n)
	interval := time.Duration(float64(time.Second) / env.cfg.Rate)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				wg.Wait()
				return context.Cause(ctx)
			}
		}
		order := int64(env.cfg.Jobs + i + 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t0 := time.Now()
			h, err := dbos.RunWorkflow(dctx, wf, order, dbos.WithWorkflowID(wfRate+strconv.FormatInt(order, 10)))
			if err != nil {
				errs[i] = err
				return
			}
			if _, err := h.GetResult(); err != nil {
				errs[i] = err
				return
			}
			lat[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	slices.Sort(lat)
	env.res.RateWorkflows = n
	env.res.Rate = env.cfg.Rate
	env.res.P50Ms = ms(percentile(lat, 0.50))
	env.res.P99Ms = ms(percentile(lat, 0.99))
	env.note("rate: %d workflows started with RunWorkflow (no queue) at %.0f/s; latency from RunWorkflow called to GetResult returned", n, env.cfg.Rate)
	return nil
}

// idleSettle is the wait between the last sleeper asleep and the idle
// window.
const idleSettle = 12 * time.Second

// dbosIdle starts cfg.Sleeping workflows that each sleep an hour durably,
// waits until every one has checkpointed its sleep, then measures this
// process and the run's database over cfg.IdleSeconds.
func dbosIdle(ctx context.Context, dctx dbos.Context, env *runEnv, wf dbos.Workflow[int, int]) error {
	k := env.cfg.Sleeping
	fmt.Fprintf(env.stderr, "peers: dbos: starting %d sleeping workflows\n", k)
	t0 := time.Now()
	err := parallel(ctx, 16, k, func(i int) error {
		_, err := dbos.RunWorkflow(dctx, wf, i, dbos.WithWorkflowID(wfSleeper+strconv.Itoa(i)))
		return err
	})
	if err != nil {
		return fmt.Errorf("start sleepers: %w", err)
	}
	// A sleeper is asleep once its DBOS.sleep step (the wake-up time) is
	// recorded: after that it only waits on its timer.
	for {
		var n int
		if err := env.pool.QueryRow(ctx, `SELECT count(*) FROM dbos.operation_outputs WHERE function_name = 'DBOS.sleep'`).Scan(&n); err != nil {
			return err
		}
		if n >= k {
			break
		}
		fmt.Fprintf(env.stderr, "peers: dbos: %d/%d asleep\n", n, k)
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return fmt.Errorf("%d of %d asleep: %w", n, k, context.Cause(ctx))
		}
	}
	asleepAfter := time.Since(t0).Seconds()
	fmt.Fprintf(env.stderr, "peers: dbos: %d asleep after %.1fs; settling %s, then measuring %.0fs idle\n", k, asleepAfter, idleSettle, env.cfg.IdleSeconds)
	env.res.Sleeping = k
	// Let the start's stragglers settle: a Postgres backend that went idle
	// with unflushed statistics flushes them up to 10s later (PG 15+), which
	// would count the start's last transactions in the window.
	select {
	case <-time.After(idleSettle):
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	// Transactions are counted from the admin database, so the measuring
	// queries do not count in the run's.
	admin, err := pgx.Connect(ctx, env.cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	dbName := dbNameOf(env.dbURL)
	txCount := func() (int64, error) {
		var n int64
		err := admin.QueryRow(ctx, `SELECT coalesce(sum(xact_commit + xact_rollback), 0)::bigint FROM pg_stat_database WHERE datname = $1`, dbName).Scan(&n)
		return n, err
	}
	tx0, err := txCount()
	if err != nil {
		return err
	}
	cpu0, w0 := cpuTime(), time.Now()
	select {
	case <-time.After(time.Duration(env.cfg.IdleSeconds * float64(time.Second))):
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	cpu1, secs := cpuTime(), time.Since(w0).Seconds()
	goroutines := runtime.NumGoroutine()
	tx1, err := txCount()
	if err != nil {
		return err
	}
	env.res.IdleSeconds = secs
	env.res.IdleCPUSeconds = (cpu1 - cpu0).Seconds()
	env.res.IdleTxPerSec = float64(tx1-tx0) / secs
	env.res.IdleGoroutines = goroutines
	env.res.IdleRSSMB = maxRSSMB()
	env.note("idle: %d workflows in dbos.Sleep(1h), started with RunWorkflow (no queue) in %.1fs; idle_tx_per_sec counts transactions (xact_commit+xact_rollback in pg_stat_database for the run's database, which holds DBOS's system tables), not statements; idle_rss_mb is getrusage maxrss, the peak of the whole process so far", k, asleepAfter)
	return nil
}

// waitRecorded waits until n workflows with the ID prefix are SUCCESS in
// DBOS's workflow_status: the meter stops when the last workflow function
// returns, and DBOS records the outcome just after.
func waitRecorded(ctx context.Context, env *runEnv, prefix string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, stopTimeout)
	defer cancel()
	for {
		var ok, failed int
		err := env.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'SUCCESS'), count(*) FILTER (WHERE status IN ('ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED'))
FROM dbos.workflow_status WHERE workflow_uuid LIKE $1 || '%'`, prefix).Scan(&ok, &failed)
		if err != nil {
			return err
		}
		if failed > 0 {
			return fmt.Errorf("%d workflows did not succeed", failed)
		}
		if ok >= n {
			return nil
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return fmt.Errorf("%d of %d workflows recorded SUCCESS: %w", ok, n, context.Cause(ctx))
		}
	}
}

// parallel runs fn(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, workers, n int, fn func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := fn(i); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return context.Cause(ctx)
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// maxRSSMB is this process's peak resident set (getrusage maxrss, KiB on
// Linux) in MiB.
func maxRSSMB() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Maxrss) / 1024
}

func dbNameOf(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return ""
	}
	return u.Path[1:]
}
