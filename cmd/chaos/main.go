// Command chaos drives the whole usher system as separate processes and
// proves that nothing is lost or doubled while it breaks things.
//
// It starts its own Redis and its own throwaway Postgres cluster (so it may
// restart both), the mail provider, and N `host run` processes in one
// consumer group, each with its plugin processes. Acting as the Stagedoor
// application, it places orders at a steady rate through orders.Place, and
// starts checkout workflows (orders.PlaceCheckout: most paid, some left to
// time out, some cancelled; checkouts.go), while
// it injects faults on a schedule derived from a printed seed: kill -9 of a
// plugin, kill -9 of a host, SIGSTOP of a host past the reclaim threshold,
// a Redis crash, a Postgres restart, relay duplicates, and mail provider
// errors and slow answers. Then it stops injecting, lets the system drain,
// checks every invariant against the database, the stream and the provider,
// prints a table, and exits non-zero when one does not hold.
//
// With --redis-cluster its Redis is a local cluster of 3 primaries with a
// replica each (internal/localcluster), the hosts run on it with
// --stream-shards 6 and --relay-replicas 1, and the Redis crash becomes a
// failover (redis-failover): kill -9 of a primary serving a shard, its
// replica promoted, the old node back as a replica. Every check reads each
// shard through a client like the hosts'.
//
//	chaos --host-bin bin/host --plugin-dir bin/chaos-plugins --mailprovider bin/mailprovider [--short] [--redis-cluster] [--seed N]
//
// The plugins are their chaos builds (plugins/counters/chaos,
// plugins/tickets/chaos, plugins/checkout/chaos): the shipped handlers wrapped in faults.Middleware,
// which the mid-job kills arm, and a counter_applies row per apply, which
// the checks count. It builds nothing (`make chaos` builds first). Every process logs to a
// file in the work directory it prints; every child is stopped on exit,
// also on SIGINT. Flags: chaos -h.
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
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := parseConfig(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// The first signal stops the run cleanly; a second one kills this
		// process, and its children die with it (parent-death signal).
		<-ctx.Done()
		stop()
	}()
	return runChaos(ctx, cfg, os.Stdout)
}
