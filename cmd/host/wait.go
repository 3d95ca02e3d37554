package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/ops"
)

const waitHelp = `wait --idle polls until nothing is pending, scheduled or unpublished:
every outbox row has its outcome, no run is scheduled (retries, delayed
jobs, a retry waiting out a claim's lease), no running workflow's timer
is still to fire (one waiting only for a signal does not count, nor do
recurring schedules' next ticks), and the group has no entry
delivered and unacked or not yet read on --stream. It exits 0 then, or 1
after --timeout with what is still not done. A paused kind's jobs are
not done: they keep the runtime from idle.`

func (cl *cli) waitFlags(fs *flag.FlagSet) runner {
	conn := &connFlags{}
	conn.register(fs)
	idle := fs.Bool("idle", false, "wait until nothing is pending, scheduled or unpublished (required: the one thing wait waits for)")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long, with exit status 1 and what is not done")
	poll := fs.Duration("poll", 200*time.Millisecond, "how often to look")
	return func(ctx context.Context, pos []string) error {
		switch {
		case len(pos) > 0:
			return usageError{fmt.Sprintf("wait takes no arguments, got %q", pos)}
		case !*idle:
			return usageError{"wait needs --idle"}
		case *timeout <= 0 || *poll <= 0:
			return usageError{"--timeout and --poll must be positive"}
		}
		redisURL, err := conn.redis()
		if err != nil {
			return err
		}
		opt, err := host.RedisOptions(redisURL, conn.redisCAFile)
		if err != nil {
			return err
		}
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		return withPool(ctx, conn, func(pool *pgxpool.Pool) error {
			start := time.Now()
			deadline := time.NewTimer(*timeout)
			defer deadline.Stop()
			tick := time.NewTicker(*poll)
			defer tick.Stop()
			for {
				in, err := ops.ReadIdleness(ctx, pool, rdb, conn.stream, conn.group)
				if err != nil {
					return err
				}
				if in.Idle() {
					_, err := fmt.Fprintf(cl.stdout, "idle after %s: nothing pending, scheduled or unpublished\n", time.Since(start).Round(time.Millisecond))
					return err
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-deadline.C:
					return errors.New("not idle after " + timeout.String() + ": " + in.String())
				case <-tick.C:
				}
			}
		})
	}
}
