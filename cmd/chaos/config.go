package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/usherhq/usher/host/stream"
)

// config is what the command line sets. parseConfig fills the defaults, and
// --short replaces those the command line did not set.
type config struct {
	hostBin   string // the host binary; default bin/host
	pluginDir string // the plugins' chaos builds; default bin/chaos-plugins
	mailBin   string // the mail provider binary; default bin/mailprovider
	pgBinDir  string // Postgres' bin directory; default the newest /usr/lib/postgresql/*/bin

	hosts  int // host processes; default 3
	orders int // orders placed at a steady rate; default 20000 (300 with --short)
	// checkouts are checkout workflows started at a steady rate over
	// duration; default 2000 (40 with --short). hold is their seats'
	// hold, default 3s.
	checkouts int
	hold      time.Duration
	duration  time.Duration // how long orders are placed and faults injected; default 10m (50s with --short)
	rounds    int           // rounds of faults, each injecting every type once; default 12 (3 with --short)
	faults    []faultKind   // the fault types to inject; default all
	seed      uint64        // seed of the order mix and the fault schedule; default time-based

	reclaimIdle  time.Duration // the hosts' reclaim threshold; default 3s
	lease        time.Duration // send_tickets' claim lease; default 4s
	jobTimeout   time.Duration // the hosts' handler deadline; default 20s
	drainTimeout time.Duration // bound of the wait for the system to drain; default 5m (2m with --short)

	redisAOF bool // run the single Redis with appendonly yes, appendfsync always; default true
	// redisCluster runs Redis as a local cluster of 3 primaries with a
	// replica each instead of one node; the hosts get its URL,
	// --relay-replicas 1, and streamShards shards. Default false.
	redisCluster bool
	// streamShards is the hosts' --stream-shards, 1 to stream.MaxShards;
	// default 6 with redisCluster (two per primary), else 1.
	streamShards int
	// maxDeliveries is the hosts' --max-deliveries.
	maxDeliveries int64

	workDir string // where logs and data go; default a new directory under $TMPDIR
	keep    bool   // keep the data (Postgres, Redis, blobs) after a successful run
	short   bool   // the CI mode
}

func parseConfig(args []string, usageOut io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(usageOut)
	fs.StringVar(&c.hostBin, "host-bin", "bin/host", "the host binary (make build)")
	fs.StringVar(&c.pluginDir, "plugin-dir", "bin/chaos-plugins", "directory of the plugins' chaos builds, whose faults chaos arms (make chaos-plugins)")
	fs.StringVar(&c.mailBin, "mailprovider", "bin/mailprovider", "the mail provider binary")
	fs.StringVar(&c.pgBinDir, "pg-bin", "", "Postgres bin directory (default: the newest /usr/lib/postgresql/*/bin)")
	fs.IntVar(&c.hosts, "hosts", 3, "host processes in the consumer group")
	fs.IntVar(&c.orders, "orders", 20000, "orders to place at a steady rate over --duration")
	fs.IntVar(&c.checkouts, "checkouts", 2000, "checkout workflows to start at a steady rate over --duration (70% paid, 15% left to time out, 15% cancelled)")
	fs.DurationVar(&c.hold, "checkout-hold", 3*time.Second, "how long a checkout holds its seats waiting for the payment (15m in production)")
	fs.DurationVar(&c.duration, "duration", 10*time.Minute, "how long orders are placed and faults injected")
	fs.IntVar(&c.rounds, "rounds", 12, "rounds of faults; each round injects every fault type once, in a random order")
	faults := fs.String("faults", "all", "comma-separated fault types to inject, or all (every type of the Redis mode): "+faultHelp())
	fs.Uint64Var(&c.seed, "seed", uint64(time.Now().UnixNano()%1_000_000_000), "seed of the order mix and the fault schedule (printed; pass it to replay)")
	fs.DurationVar(&c.reclaimIdle, "reclaim-idle", 3*time.Second, "the hosts' reclaim threshold (60s in production)")
	fs.DurationVar(&c.lease, "lease", 4*time.Second, "send_tickets' claim lease (2m in production)")
	fs.DurationVar(&c.jobTimeout, "job-timeout", 20*time.Second, "the hosts' deadline for one handler run")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 5*time.Minute, "how long to wait for the system to drain after the faults")
	fs.BoolVar(&c.redisAOF, "redis-aof", true, "run the single Redis with appendonly yes and appendfsync always; false loses the stream on a Redis crash (not with --redis-cluster)")
	fs.BoolVar(&c.redisCluster, "redis-cluster", false, "run Redis as a local cluster of 3 primaries with a replica each (redis-failover replaces redis-restart); the hosts relay with --relay-replicas 1")
	fs.Int64Var(&c.maxDeliveries, "max-deliveries", 0, "the hosts' --max-deliveries (default 10; 30 with --redis-cluster, where a failover hands back what was in flight and counts a delivery of each)")
	fs.IntVar(&c.streamShards, "stream-shards", 1, fmt.Sprintf("the hosts' --stream-shards, 1-%d (default 6 with --redis-cluster, else 1)", stream.MaxShards))
	fs.StringVar(&c.workDir, "workdir", "", "directory for logs and data (default: a new one under $TMPDIR)")
	fs.BoolVar(&c.keep, "keep", false, "keep the data directories after a successful run")
	fs.BoolVar(&c.short, "short", false, "CI mode: 50s of load and faults, 300 orders, every fault type 3 times")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.short {
		c.shorten(set)
	}
	if c.redisCluster && !set["stream-shards"] {
		c.streamShards = 6
	}
	if !set["max-deliveries"] {
		// A failover can hand a shard's group back as the replica last
		// saw it and redeliver what was in flight, each redelivery
		// counted: in TestChaosShortCluster a job met 3 failovers, 3
		// SIGSTOPs and 3 host kills in 50 s and was delivered 11 times.
		c.maxDeliveries = 10
		if c.redisCluster {
			c.maxDeliveries = 30
		}
	}
	if c.redisCluster && set["redis-aof"] {
		return c, errors.New("--redis-aof is the single Redis node's: the cluster's nodes keep no files, a failed primary's replica holds the stream")
	}
	var err error
	if c.faults, err = parseFaults(*faults, c.redisCluster); err != nil {
		return c, err
	}
	return c, c.validate()
}

// shorten applies --short to the flags the command line left alone.
func (c *config) shorten(set map[string]bool) {
	if !set["orders"] {
		c.orders = 300
	}
	if !set["checkouts"] {
		c.checkouts = 40
	}
	if !set["duration"] {
		c.duration = 50 * time.Second
	}
	if !set["rounds"] {
		c.rounds = 3
	}
	if !set["drain-timeout"] {
		c.drainTimeout = 2 * time.Minute
	}
}

func (c *config) validate() error {
	switch {
	case c.hosts < 2:
		return errors.New("--hosts must be at least 2: a stalled or killed host's entries are reclaimed by another")
	case c.orders < 10:
		return errors.New("--orders must be at least 10")
	case c.checkouts < 0 || c.hold <= 0:
		return errors.New("--checkouts must not be negative, --checkout-hold must be positive")
	case c.duration < 10*time.Second:
		return errors.New("--duration must be at least 10s")
	case c.rounds < 1:
		return errors.New("--rounds must be at least 1")
	case c.reclaimIdle < 500*time.Millisecond:
		return errors.New("--reclaim-idle must be at least 500ms")
	case c.lease <= 0 || c.jobTimeout <= 0 || c.drainTimeout <= 0:
		return errors.New("--lease, --job-timeout and --drain-timeout must be positive")
	case c.maxDeliveries < 0:
		return errors.New("--max-deliveries must not be negative")
	case c.streamShards < 1 || c.streamShards > stream.MaxShards:
		return fmt.Errorf("--stream-shards %d is outside 1-%d: a stream has at least one shard, and every host reads every shard in turn", c.streamShards, stream.MaxShards)
	}
	return nil
}
