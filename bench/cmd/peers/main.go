// Command peers runs usher's counter workload on peer job runtimes (River,
// asynq) and on bare Postgres, so `make bench` can put usher's number beside
// theirs, measured the same way in the same run; and a three-step workflow
// workload (workflow3) on a peer workflow runtime (DBOS Transact).
//
// The workload is identical for each runtime: N counter jobs over E events
// (defaults 20,000 and 100); each job adds its order's seats to its event's
// seats_sold exactly once, with the effect and the job's completion record
// committed in one Postgres transaction. Each (runtime, inflight) pair runs in
// a fresh database of its own, created from --database-url and dropped at the
// end, seeded with the events and orders tables. All jobs are enqueued before
// the clock starts; the clock runs from the first job a worker starts to the
// commit of the last job's effect, so the number is work throughput, not
// insert throughput. Then every event's seats_sold is compared with the sum of
// its orders' seats.
//
//   - river: a River worker (riverpgxv5) whose Work opens a transaction, runs
//     the UPDATE and completes the job with river.JobCompleteTx in that same
//     transaction, River's documented exactly-once path. Jobs inserted with
//     InsertMany. One queue with MaxWorkers = inflight, FetchCooldown from
//     --river-fetch-cooldown (default 1ms, River's minimum: the default
//     100ms caps throughput at inflight×10 jobs/s).
//   - asynq: a handler that, in one transaction, inserts the task id into
//     processed_jobs with ON CONFLICT DO NOTHING and only if inserted runs the
//     UPDATE. Tasks enqueued with unique TaskIDs on a queue named for the run,
//     Concurrency = inflight. asynq has no key prefix, so it uses an empty
//     Redis DB (see --redis-db) and deletes its queue's keys at the end; it
//     never flushes.
//   - postgres: Postgres's own limit for usher's guard 4: inflight clients
//     each running one transaction per job (INSERT INTO processed_jobs ... ON
//     CONFLICT DO NOTHING RETURNING, then the UPDATE, commit).
//
// --workload workflow3 (only with --runtimes dbos, and dbos only with it)
// runs a durable workflow per order instead, on DBOS Transact
// (github.com/dbos-inc/dbos-transact-golang): three sequential steps, each a
// dbos.RunAsStep running one transaction (INSERT INTO processed_jobs
// '<workflow id>/<n>' ON CONFLICT DO NOTHING RETURNING, then the UPDATE only
// if inserted), so every order's seats are added three times, once per step;
// verification expects 3 × the sum of each event's orders' seats. DBOS's
// system tables live in the run's database (schema dbos). Three phases:
//
//  1. throughput: --jobs workflows enqueued on a DBOS queue held at worker
//     concurrency 0, then opened to inflight; clocked from the first step
//     start to the last workflow's return (then every workflow must be
//     SUCCESS in dbos.workflow_status). The queue polls every
//     --dbos-polling-interval (10ms; DBOS's 1s default caps throughput near
//     inflight workflows per second).
//  2. latency (first --inflight value's run only): --rate workflows per
//     second for --rate-seconds, each started with RunWorkflow (no queue) in
//     a goroutine of its own; each timed from the RunWorkflow call to
//     GetResult's return (DBOS hands the local handle its outcome after
//     recording it).
//  3. idle (first run only, when --sleeping > 0): --sleeping workflows that
//     each dbos.Sleep an hour; once every one's DBOS.sleep step is recorded,
//     the queue's polling goes back to DBOS's default 1s and this process's
//     CPU, goroutines and peak RSS and the run's database's transactions are
//     measured over --idle-seconds. Then DBOS shuts down (cancelling the
//     sleepers) and the database is dropped.
//
// Usage (from bench/):
//
//	go run ./cmd/peers --jobs 20000 --inflight 16,64 --runtimes river,asynq,postgres [--json]
//	go run ./cmd/peers --workload workflow3 --runtimes dbos --jobs 2000 --inflight 16,64 \
//	    --rate 100 --rate-seconds 5 --sleeping 100000 --idle-seconds 10 [--json]
//
// Without --json it prints a table. With --json it writes one JSON array to
// stdout, one object per (runtime, inflight) run:
//
//	[{"runtime":      "river" | "asynq" | "postgres",
//	  "inflight":     16,      // workers (River MaxWorkers, asynq Concurrency, Postgres clients)
//	  "jobs":         20000,   // jobs in the run
//	  "seconds":      4.2,     // first job started to last job committed
//	  "jobs_per_sec": 4761.9,  // jobs / seconds
//	  "cpu_seconds":  3.1,     // user+system CPU of this process over the same window (getrusage); excludes Postgres and Redis
//	  "lost":         0,       // seats missing from the counters, summed over events (must be 0)
//	  "doubled":      0,       // seats counted twice, summed over events (must be 0)
//	  "notes":        "..."}]  // versions, settings, and any error; empty-ish when all is well
//
// workflow3 adds these fields (omitted for the counter workload, whose JSON
// is as above); jobs, seconds, jobs_per_sec and cpu_seconds are the
// throughput phase's, jobs counting workflows:
//
//	"workload":          "workflow3",
//	"workflows":         2000,    // workflows in the throughput phase (= jobs)
//	"workflows_per_sec": 446.1,   // workflows / seconds (= jobs_per_sec)
//	"rate":              100,     // latency phase: workflows started per second
//	"rate_workflows":    500,     // latency phase: workflows started (rate × rate-seconds)
//	"p50_ms":            5.1,     // latency phase: median RunWorkflow-to-GetResult time
//	"p99_ms":            16.9,    // latency phase: 99th percentile of the same
//	"sleeping":          100000,  // idle phase: workflows asleep in dbos.Sleep(1h)
//	"idle_seconds":      10.0,    // idle phase: the measuring window
//	"idle_cpu_seconds":  0.65,    // user+system CPU of this process over the window (getrusage)
//	"idle_tx_per_sec":   5.3,     // transactions (xact_commit+xact_rollback, pg_stat_database) of the run's database per second
//	"idle_goroutines":   200014,  // runtime.NumGoroutine at the window's end
//	"idle_rss_mb":       2002.7,  // peak RSS of this process so far (getrusage maxrss), MiB
//
// The latency and idle fields appear only in the first --inflight value's
// run.
//
// Progress goes to stderr. The whole run is bounded by --timeout (default
// 10m). The exit status is non-zero when a run failed or lost or doubled
// anything; the results gathered so far are printed first.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}
