// Command peers runs usher's counter workload on peer job runtimes (River,
// asynq) and on bare Postgres, so `make bench` can put usher's number beside
// theirs, measured the same way in the same run.
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
// Usage (from bench/):
//
//	go run ./cmd/peers --jobs 20000 --inflight 16,64 --runtimes river,asynq,postgres [--json]
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
