// Command bench measures usher on the counter workload of issue 9 and puts
// the numbers beside its peers' (bench/cmd/peers: River, asynq and bare
// Postgres on the same workload).
//
// For each run it measures (each level in-process and through the plugin,
// the mix), as the administrator (--admin-url) it creates a fresh database, runs
// sandbox.Setup (the owner role, default usher, and the counters plugin's
// role), and from then on works as the owner: the host refuses a superuser.
// It starts one host in this process per --inflight level (host.New + Run,
// Concurrency = the level, the counters plugin from --plugin-dir's
// manifests, no admin API, its log at warn to --log), warms it with
// --warmup jobs, and then measures:
//
//   - throughput: --jobs update_sales_counter jobs over --events events,
//     the peers' workload (each order 1..6 seats, spread by the same fixed
//     hash). The orders and their outbox rows are committed in one
//     transaction; the clock starts when that commit returns and stops
//     when every job is recorded in processed_jobs and the stream has no
//     pending entry (polled every 10ms);
//   - CPU seconds and peak RSS over the same window, of this process (the
//     host, plus this command's small poller) and of each plugin process;
//   - latency, on the host of the largest level: a producer commits one
//     order and its outbox row per transaction at --rate jobs/s for
//     --rate-seconds; each job's latency is outbox.done_at -
//     outbox.created_at, both stamped by Postgres. created_at is now() of
//     the producer's transaction, i.e. its start, a little before its
//     commit; done_at is now() of the host's statement recording the
//     outcome, which follows the effect's commit and precedes the ack. So
//     the number covers relay, stream, dispatch, plugin, guard and effect
//     commit, plus the producer's own transaction, and leaves out the
//     XACK;
//   - lost and doubled, from what the application and the runtime store
//     (the shipped plugin records nothing for the benchmark): every
//     event's seats_sold against the sum of its orders' seats (a doubled
//     apply adds its order's seats again), and each order's counter job
//     in processed_jobs, written in the increment's transaction (missing:
//     a lost job); duplicates absorbed per guard from
//     absorbed_duplicates.
//
// Unless --peers=false it then runs `go run ./cmd/peers --json` in
// --bench-dir with the same --jobs, --events and --inflight, and prints
// usher's jobs/s divided by each peer's at each level (Postgres's own
// one-transaction-per-job rate included).
//
// Output: a table on stdout, JSON with --json FILE, PNG plots in --plots
// (throughput.png: jobs/s against jobs in flight per runtime; latency.png:
// the latency CDF). A progress line goes to stderr every second. The
// whole command is bounded by --timeout. The exit status is 1 when
// anything was lost or doubled or a run failed; results gathered so far
// are printed first. The database and the stream keys are removed at the
// end.
//
// Usage:
//
//	bin/bench [--jobs 20000] [--inflight 16,64] [--rate 1000] [--rate-seconds 10] [--peers=false] [--json FILE] [--plots DIR]
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
	if servePluginIfAsked() {
		return // started by a host as the workflow rows' plugin
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
