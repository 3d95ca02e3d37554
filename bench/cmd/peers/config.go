package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// config is every knob of a run; flags fill it, and it is printed to stderr
// at start.
type config struct {
	// DatabaseURL is an admin URL: each run creates and drops a database of
	// its own through it. Default postgres://postgres@127.0.0.1:5432/test.
	DatabaseURL string
	// RedisURL is where asynq runs. Default redis://127.0.0.1:6379.
	RedisURL string
	// RedisDB is the Redis DB index asynq uses; -1 (default) picks the
	// highest-numbered DB that holds no keys at start.
	RedisDB int
	// Jobs is the number of counter jobs per run. Default 20,000.
	Jobs int
	// Events is the number of events the jobs' orders spread over. Default 100.
	Events int
	// Inflight lists the concurrencies to run each runtime at. Default 16,64.
	Inflight []int
	// Runtimes lists the runtimes to run, in order. Default river,asynq,postgres.
	Runtimes []string
	// JSON writes the results as JSON to stdout instead of a table.
	JSON bool
	// Timeout bounds the whole command. Default 10m.
	Timeout time.Duration
	// RiverFetchCooldown is River's FetchCooldown. Default 1ms (River's
	// minimum); River's own default, 100ms, caps throughput at inflight×10/s.
	RiverFetchCooldown time.Duration
	// Workload is counter (default: one job per order, on river, asynq,
	// postgres) or workflow3 (a durable workflow of three steps per order, on
	// dbos).
	Workload string
	// Rate is the start rate, workflows per second, of workflow3's latency
	// phase. Default 100.
	Rate float64
	// RateSeconds is how long the latency phase starts workflows. Default 5.
	RateSeconds float64
	// Sleeping is the number of durably sleeping workflows of workflow3's
	// idle phase; 0 (default) skips it.
	Sleeping int
	// IdleSeconds is the idle phase's measuring window. Default 10.
	IdleSeconds float64
	// DBOSPollingInterval is the DBOS queue's base polling interval in the
	// throughput phase. Default 10ms; DBOS's own default, 1s, caps
	// throughput near inflight workflows per second.
	DBOSPollingInterval time.Duration
}

var knownRuntimes = map[string]func(context.Context, *runEnv) error{
	"river":    runRiver,
	"asynq":    runAsynq,
	"postgres": runPostgres,
}

// workflowRuntimes run the workflow3 workload.
var workflowRuntimes = map[string]func(context.Context, *runEnv) error{
	"dbos": runDBOS,
}

// runtimeFunc is the function that runs the workload on rt.
func (c config) runtimeFunc(rt string) func(context.Context, *runEnv) error {
	if c.Workload == "workflow3" {
		return workflowRuntimes[rt]
	}
	return knownRuntimes[rt]
}

func parseConfig(args []string, stderr io.Writer) (config, error) {
	cfg := config{}
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.DatabaseURL, "database-url", "postgres://postgres@127.0.0.1:5432/test", "admin Postgres URL; each run creates and drops its own database")
	fs.StringVar(&cfg.RedisURL, "redis-url", "redis://127.0.0.1:6379", "Redis URL for asynq")
	fs.IntVar(&cfg.RedisDB, "redis-db", -1, "Redis DB index for asynq; -1 picks the highest-numbered empty DB")
	fs.IntVar(&cfg.Jobs, "jobs", 20000, "counter jobs per run")
	fs.IntVar(&cfg.Events, "events", 100, "events the orders spread over")
	inflight := fs.String("inflight", "16,64", "comma-separated concurrencies (workers in flight)")
	runtimes := fs.String("runtimes", "river,asynq,postgres", "comma-separated runtimes: river, asynq, postgres (counter); dbos (workflow3)")
	fs.BoolVar(&cfg.JSON, "json", false, "write results as a JSON array to stdout")
	fs.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "hard bound on the whole command")
	fs.DurationVar(&cfg.RiverFetchCooldown, "river-fetch-cooldown", time.Millisecond, "River's FetchCooldown (River's default is 100ms)")
	fs.StringVar(&cfg.Workload, "workload", "counter", "counter (river, asynq, postgres) or workflow3 (dbos)")
	fs.Float64Var(&cfg.Rate, "rate", 100, "workflow3: workflows per second started in the latency phase")
	fs.Float64Var(&cfg.RateSeconds, "rate-seconds", 5, "workflow3: seconds the latency phase starts workflows (0 skips it)")
	fs.IntVar(&cfg.Sleeping, "sleeping", 0, "workflow3: durably sleeping workflows in the idle phase (0 skips it)")
	fs.Float64Var(&cfg.IdleSeconds, "idle-seconds", 10, "workflow3: seconds the idle phase measures")
	fs.DurationVar(&cfg.DBOSPollingInterval, "dbos-polling-interval", 10*time.Millisecond, "DBOS queue base polling interval in the throughput phase (DBOS's default is 1s)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	for _, s := range strings.Split(*inflight, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("--inflight: %q is not a positive integer", s)
		}
		cfg.Inflight = append(cfg.Inflight, n)
	}
	if cfg.Workload != "counter" && cfg.Workload != "workflow3" {
		return cfg, fmt.Errorf("--workload: unknown workload %q (counter, workflow3)", cfg.Workload)
	}
	for _, s := range strings.Split(*runtimes, ",") {
		s = strings.TrimSpace(s)
		switch {
		case cfg.Workload == "counter" && workflowRuntimes[s] != nil:
			return cfg, fmt.Errorf("--runtimes: %s runs only --workload workflow3", s)
		case cfg.Workload == "workflow3" && knownRuntimes[s] != nil:
			return cfg, fmt.Errorf("--workload workflow3 runs only on --runtimes dbos, not %s", s)
		case cfg.runtimeFunc(s) == nil:
			return cfg, fmt.Errorf("--runtimes: unknown runtime %q (river, asynq, postgres; dbos with --workload workflow3)", s)
		}
		cfg.Runtimes = append(cfg.Runtimes, s)
	}
	switch {
	case cfg.Jobs < 1:
		return cfg, errors.New("--jobs must be at least 1")
	case cfg.Events < 1:
		return cfg, errors.New("--events must be at least 1")
	case cfg.Timeout <= 0:
		return cfg, errors.New("--timeout must be positive")
	case cfg.RiverFetchCooldown < time.Millisecond:
		return cfg, errors.New("--river-fetch-cooldown must be at least 1ms (River's minimum)")
	case cfg.Rate <= 0:
		return cfg, errors.New("--rate must be positive")
	case cfg.RateSeconds < 0:
		return cfg, errors.New("--rate-seconds must not be negative")
	case cfg.Sleeping < 0:
		return cfg, errors.New("--sleeping must not be negative")
	case cfg.IdleSeconds <= 0:
		return cfg, errors.New("--idle-seconds must be positive")
	case cfg.DBOSPollingInterval <= 0:
		return cfg, errors.New("--dbos-polling-interval must be positive")
	}
	return cfg, nil
}

// String prints the config with the URLs' passwords masked.
func (c config) String() string {
	s := fmt.Sprintf("database-url=%s redis-url=%s redis-db=%d jobs=%d events=%d inflight=%v runtimes=%v json=%t timeout=%s river-fetch-cooldown=%s",
		maskURL(c.DatabaseURL), maskURL(c.RedisURL), c.RedisDB, c.Jobs, c.Events, c.Inflight, c.Runtimes, c.JSON, c.Timeout, c.RiverFetchCooldown)
	if c.Workload == "workflow3" {
		s += fmt.Sprintf(" workload=%s rate=%g rate-seconds=%g sleeping=%d idle-seconds=%g dbos-polling-interval=%s",
			c.Workload, c.Rate, c.RateSeconds, c.Sleeping, c.IdleSeconds, c.DBOSPollingInterval)
	}
	return s
}
