package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/usherhq/usher/host"
)

// config is every knob of a run; flags fill it, and it is printed to stderr
// at start with passwords masked.
type config struct {
	// AdminURL is a superuser's (or CREATEROLE and CREATEDB) URL: the run's
	// database is created and dropped through it, and sandbox.Setup runs on
	// it. Default postgres://postgres@127.0.0.1:5432/test?sslmode=disable.
	AdminURL string
	// RedisURL is the host's Redis (and the peers' asynq). Default
	// redis://127.0.0.1:6379/0.
	RedisURL string
	// Owner is the runtime's owner role the host logs in as (no password:
	// trust or certificate authentication). Default usher.
	Owner string
	// PluginDir holds the counters plugin and its manifest (make plugins).
	// Default bin/plugins.
	PluginDir string
	// Jobs per throughput run. Default 20,000.
	Jobs int
	// Events the orders spread over. Default 100.
	Events int
	// Warmup jobs run through each host before any clock. Default 500.
	Warmup int
	// Inflight lists the jobs-in-flight levels (host Concurrency). Default 16,64.
	Inflight []int
	// HostPoolSize is the host's own pool size (pool_max_conns); 0 keeps
	// pgx's default, as `host run` does. Default 0.
	HostPoolSize int
	// BatchMax is the host's --batch-max; 0 keeps its default. Default 0.
	BatchMax int
	// PluginPoolSize is the host's --plugin-pool-size; 0 keeps its
	// default. Default 0.
	PluginPoolSize int
	// BatchWait is the host's --batch-wait; 0 keeps its default. Default 0.
	BatchWait time.Duration
	// Rate is the latency run's offered load in jobs/s. Default 1000.
	Rate int
	// RateSeconds is how long the latency run offers it. Default 10.
	RateSeconds int
	// Peers runs bench/cmd/peers on the same workload. Default true.
	Peers bool
	// Mix is the orders of the full Stagedoor mix run (render, send,
	// count through both plugins and a mail provider process); 0 skips
	// it. Default 300.
	Mix int
	// MailProvider is the mail provider binary the mix sends through.
	// Default bin/mailprovider.
	MailProvider string
	// InProcess also runs each level with the counters handler served
	// inside the host (no plugin boundary). Default true.
	InProcess bool
	// BenchDir is the bench module, where peers runs. Default bench.
	BenchDir string
	// JSON is the file the results are written to as JSON. Default none.
	JSON string
	// Plots is the directory the PNG plots go to. Default bench-results.
	Plots string
	// Log is the host's log file (level warn). Default <plots>/host.log.
	Log string
	// Scale are the scale rows' shapes, hosts x shards. Default 1x1,1x6,3x1,3x6.
	Scale []scaleSpec
	// ScaleEvents are the events the scale rows' orders spread over.
	// Default 10,000: over --events' 100, three hosts' batches lock the
	// same rows in different orders, and Postgres's deadlock detection
	// (deadlock_timeout, 1 s) sets the rate, not the hosts.
	ScaleEvents int
	// ScaleCluster also runs the scale rows on a local Redis Cluster
	// (3 primaries, 3 replicas, from redis-server), and the last shape
	// again with WAIT 1. Default true.
	ScaleCluster bool
	// Timeout bounds the whole command. Default 15m.
	Timeout time.Duration
	// CPUProfile is a directory for a CPU profile of the host (this
	// process) over each throughput window, host-inflight-N.pprof (and
	// host-inflight-N-in-process.pprof), and over the mix, host-mix.pprof,
	// for go tool pprof. Default none.
	CPUProfile string
	// Workflows is the tallies (three-step workflows) per throughput run
	// of the workflow rows; 0 skips the rows. WorkflowRate and
	// WorkflowRateSeconds are their latency run's; Sleeping the naps
	// (sleeping workflows) whose idle cost is measured over IdleWindow
	// (0 skips it).
	Workflows, WorkflowRate, WorkflowRateSeconds, Sleeping int
	IdleWindow                                             time.Duration
}

func parseConfig(args []string, stderr io.Writer) (config, error) {
	var cfg config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.AdminURL, "admin-url", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "administrator's Postgres URL: creates and drops the run's database, runs sandbox.Setup")
	fs.StringVar(&cfg.RedisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis URL")
	fs.StringVar(&cfg.Owner, "owner", "", "the runtime's owner role, the host's login (default: the run's own deployment's, usher_b<hex>, made and dropped with the run's database)")
	fs.StringVar(&cfg.PluginDir, "plugin-dir", "bin/plugins", "directory with the counters plugin and its manifest (make plugins)")
	fs.IntVar(&cfg.Jobs, "jobs", 20000, "counter jobs per throughput run")
	fs.IntVar(&cfg.Events, "events", 100, "events the orders spread over")
	fs.IntVar(&cfg.Warmup, "warmup", 500, "jobs run through each host before any clock")
	inflight := fs.String("inflight", "16,64", "comma-separated jobs-in-flight levels (the host's Concurrency)")
	fs.IntVar(&cfg.HostPoolSize, "host-pool-size", 0, "the host's own Postgres pool size; 0 keeps pgx's default, as host run does")
	fs.IntVar(&cfg.BatchMax, "batch-max", 0, "the host's --batch-max (the most jobs one batch commits); 0 keeps host run's default")
	fs.IntVar(&cfg.PluginPoolSize, "plugin-pool-size", 0, "the host's --plugin-pool-size (Postgres connections per plugin); 0 keeps host run's default")
	fs.DurationVar(&cfg.BatchWait, "batch-wait", 0, "the host's --batch-wait (how long a batch waits for the jobs on their way; negative: none); 0 keeps host run's default")
	fs.IntVar(&cfg.Rate, "rate", 1000, "latency run: offered jobs per second")
	fs.IntVar(&cfg.RateSeconds, "rate-seconds", 10, "latency run: seconds of offered load")
	fs.IntVar(&cfg.Mix, "mix", 300, "orders of the full Stagedoor mix (render, send, count; the PDFs also rendered alone); 0 skips it")
	fs.StringVar(&cfg.MailProvider, "mailprovider", "bin/mailprovider", "the mail provider binary the mix sends through")
	fs.BoolVar(&cfg.InProcess, "in-process", true, "also run each level with the counters handler inside the host (no plugin boundary) and print the boundary's cost")
	fs.BoolVar(&cfg.Peers, "peers", true, "run bench/cmd/peers on the same workload and print usher's ratio to each")
	fs.StringVar(&cfg.BenchDir, "bench-dir", "bench", "the bench module's directory (where go run ./cmd/peers runs)")
	fs.StringVar(&cfg.JSON, "json", "", "write the results as JSON to this file")
	fs.StringVar(&cfg.Plots, "plots", "bench-results", "directory for the PNG plots")
	fs.StringVar(&cfg.Log, "log", "", "the host's log file, level warn (default <plots>/host.log)")
	fs.DurationVar(&cfg.Timeout, "timeout", 15*time.Minute, "hard bound on the whole command")
	fs.StringVar(&cfg.CPUProfile, "cpu-profile", "", "directory for a CPU profile of the host over each throughput window (host-inflight-N.pprof) and over the mix (host-mix.pprof)")
	fs.IntVar(&cfg.Workflows, "workflows", 2000, "workflow rows: three-step workflows per throughput run (0 skips the workflow rows)")
	fs.IntVar(&cfg.WorkflowRate, "workflow-rate", 100, "workflow rows' latency run: workflows started per second")
	fs.IntVar(&cfg.WorkflowRateSeconds, "workflow-rate-seconds", 5, "workflow rows' latency run: seconds of starts")
	fs.IntVar(&cfg.Sleeping, "sleeping", 100000, "workflow rows' idle run: sleeping workflows (0 skips it)")
	fs.DurationVar(&cfg.IdleWindow, "idle-window", 10*time.Second, "workflow rows' idle run: the measured window")
	scale := fs.String("scale", "1x1,1x6,3x1,3x6", "scale rows: comma-separated HOSTSxSHARDS, hosts sharing one stream of shards; empty skips them")
	fs.IntVar(&cfg.ScaleEvents, "scale-events", 10000, "scale rows: events the orders spread over (few events: the hosts' batches deadlock on their rows)")
	fs.BoolVar(&cfg.ScaleCluster, "scale-cluster", true, "also run the scale rows on a local Redis Cluster (redis-server, 3 primaries and 3 replicas), the last shape again with --relay-replicas 1")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	ownerSet := false
	fs.Visit(func(f *flag.Flag) { ownerSet = ownerSet || f.Name == "owner" })
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q (flags go before any argument, and bench takes none)", fs.Args())
	}
	for _, s := range strings.Split(*inflight, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("--inflight: %q is not a positive integer", s)
		}
		if slices.Contains(cfg.Inflight, n) {
			return cfg, fmt.Errorf("--inflight: %d given twice", n)
		}
		cfg.Inflight = append(cfg.Inflight, n)
	}
	var err error
	if cfg.Scale, err = parseScale(*scale); err != nil {
		return cfg, err
	}
	if cfg.Log == "" {
		cfg.Log = filepath.Join(cfg.Plots, "host.log")
	}
	switch {
	case cfg.Jobs < 1:
		return cfg, errors.New("--jobs must be at least 1")
	case cfg.Events < 1 || cfg.ScaleEvents < 1:
		return cfg, errors.New("--events and --scale-events must be at least 1")
	case cfg.Warmup < 0:
		return cfg, errors.New("--warmup must not be negative")
	case cfg.HostPoolSize < 0:
		return cfg, errors.New("--host-pool-size must not be negative")
	case cfg.BatchMax < 0 || cfg.PluginPoolSize < 0:
		return cfg, errors.New("--batch-max and --plugin-pool-size must not be negative")
	case cfg.Rate < 1:
		return cfg, errors.New("--rate must be at least 1")
	case cfg.RateSeconds < 1:
		return cfg, errors.New("--rate-seconds must be at least 1")
	case cfg.Timeout <= 0:
		return cfg, errors.New("--timeout must be positive")
	case cfg.Workflows < 0 || cfg.Sleeping < 0:
		return cfg, errors.New("--workflows and --sleeping must not be negative")
	case cfg.Workflows > 0 && (cfg.WorkflowRate < 1 || cfg.WorkflowRateSeconds < 1):
		return cfg, errors.New("--workflow-rate and --workflow-rate-seconds must be at least 1")
	case cfg.Sleeping > 0 && cfg.IdleWindow < time.Second:
		return cfg, errors.New("--idle-window must be at least 1s")
	case ownerSet && cfg.Owner == "":
		return cfg, errors.New("--owner must not be empty")
	case cfg.Plots == "":
		return cfg, errors.New("--plots must not be empty")
	}
	if _, err := url.Parse(cfg.AdminURL); err != nil {
		return cfg, fmt.Errorf("--admin-url: %w", err)
	}
	return cfg, nil
}

// String prints the config with the URLs' passwords masked.
func (c config) String() string {
	return fmt.Sprintf("admin-url=%s redis-url=%s owner=%s plugin-dir=%s jobs=%d events=%d warmup=%d inflight=%v host-pool-size=%d rate=%d rate-seconds=%d mix=%d mailprovider=%s in-process=%t peers=%t bench-dir=%s json=%q plots=%s log=%s timeout=%s cpu-profile=%q workflows=%d workflow-rate=%d workflow-rate-seconds=%d sleeping=%d idle-window=%s scale=%v scale-events=%d scale-cluster=%t",
		host.MaskURL(c.AdminURL), host.MaskURL(c.RedisURL), c.Owner, c.PluginDir, c.Jobs, c.Events, c.Warmup, c.Inflight, c.HostPoolSize,
		c.Rate, c.RateSeconds, c.Mix, c.MailProvider, c.InProcess, c.Peers, c.BenchDir, c.JSON, c.Plots, c.Log, c.Timeout, c.CPUProfile,
		c.Workflows, c.WorkflowRate, c.WorkflowRateSeconds, c.Sleeping, c.IdleWindow, c.Scale, c.ScaleEvents, c.ScaleCluster)
}

// largest is the level the latency run uses.
func (c config) largest() int { return slices.Max(c.Inflight) }
