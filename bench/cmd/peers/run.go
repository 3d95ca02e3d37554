package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"
)

// result is one (runtime, inflight) run; its JSON form is the schema the
// package doc shows.
type result struct {
	Runtime    string  `json:"runtime"`
	Inflight   int     `json:"inflight"`
	Jobs       int     `json:"jobs"`
	Seconds    float64 `json:"seconds"`
	JobsPerSec float64 `json:"jobs_per_sec"`
	CPUSeconds float64 `json:"cpu_seconds"`
	Lost       int64   `json:"lost"`
	Doubled    int64   `json:"doubled"`
	Notes      string  `json:"notes"`

	// workflow3 only (omitted for the counter workload).
	Workload        string  `json:"workload,omitempty"`
	Workflows       int     `json:"workflows,omitempty"`
	WorkflowsPerSec float64 `json:"workflows_per_sec,omitempty"`
	Rate            float64 `json:"rate,omitempty"`
	RateWorkflows   int     `json:"rate_workflows,omitempty"`
	P50Ms           float64 `json:"p50_ms,omitempty"`
	P99Ms           float64 `json:"p99_ms,omitempty"`
	Sleeping        int     `json:"sleeping,omitempty"`
	IdleSeconds     float64 `json:"idle_seconds,omitempty"`
	IdleCPUSeconds  float64 `json:"idle_cpu_seconds,omitempty"`
	IdleTxPerSec    float64 `json:"idle_tx_per_sec,omitempty"`
	IdleGoroutines  int     `json:"idle_goroutines,omitempty"`
	IdleRSSMB       float64 `json:"idle_rss_mb,omitempty"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintln(stderr, "peers: config", cfg)
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Timeout, fmt.Errorf("--timeout %s reached", cfg.Timeout))
	defer cancel()

	var results []result
	var failed []string
	for _, rt := range cfg.Runtimes {
		for i, inflight := range cfg.Inflight {
			r := runOne(ctx, cfg, rt, inflight, i == 0, stderr)
			results = append(results, r)
			if r.Lost != 0 || r.Doubled != 0 || strings.Contains(r.Notes, "error:") {
				failed = append(failed, fmt.Sprintf("%s/%d", rt, inflight))
			}
		}
	}
	if cfg.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(results); err != nil {
			return err
		}
	} else {
		printTable(stdout, results)
	}
	if len(failed) > 0 {
		return fmt.Errorf("runs failed or lost/doubled counts: %s", strings.Join(failed, ", "))
	}
	return nil
}

// runOne runs one runtime at one concurrency in a fresh database and
// verifies the counters. Errors end up in the result's notes. For workflow3,
// the first concurrency's run (first) also runs the latency and idle phases.
func runOne(ctx context.Context, cfg config, rt string, inflight int, first bool, stderr io.Writer) result {
	r := result{Runtime: rt, Inflight: inflight, Jobs: cfg.Jobs}
	env := &runEnv{cfg: cfg, inflight: inflight, meter: newMeter(cfg.Jobs), stderr: stderr, res: &r, factor: 1}
	if cfg.Workload == "workflow3" {
		r.Workload = cfg.Workload
		r.Workflows = cfg.Jobs
		env.factor = 3
		if first {
			env.rateN = int(cfg.Rate * cfg.RateSeconds)
			env.idle = true
		}
	}
	err := func() error {
		dbURL, drop, err := createDatabase(ctx, cfg.DatabaseURL, fmt.Sprintf("%s_%d", rt, inflight))
		if err != nil {
			return err
		}
		defer func() {
			// Drop even when ctx is done, within a bound of its own.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := drop(dctx); err != nil {
				fmt.Fprintf(stderr, "peers: drop database: %v\n", err)
			}
		}()
		env.dbURL = dbURL
		conns, err := poolSize(ctx, dbURL, inflight)
		if err != nil {
			return err
		}
		if conns < inflight {
			env.note("handlers' pool %d connections, not %d: the server's max_connections leaves no more (usher's plugin pool is bounded the same way)", conns, inflight)
		}
		env.pool, err = newPool(ctx, dbURL, conns)
		if err != nil {
			return err
		}
		defer env.pool.Close()
		if err := seed(ctx, env.pool, cfg.Events, cfg.Jobs+env.rateN); err != nil {
			return err
		}
		stopProgress := progress(stderr, rt, inflight, env.meter)
		runErr := cfg.runtimeFunc(rt)(ctx, env)
		stopProgress()
		// Verify even after an error: a partial run still must not double.
		vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		lost, doubled, verr := verify(vctx, env.pool, env.factor)
		r.Lost, r.Doubled = lost, doubled
		return errors.Join(runErr, verr)
	}()
	m := env.meter
	select {
	case <-m.done:
		r.Seconds = m.end.Sub(m.start).Seconds()
		r.CPUSeconds = (m.cpu1 - m.cpu0).Seconds()
		if r.Seconds > 0 {
			r.JobsPerSec = float64(cfg.Jobs) / r.Seconds
			if r.Workflows > 0 {
				r.WorkflowsPerSec = r.JobsPerSec
			}
		}
	default:
	}
	if err != nil {
		env.note("error: %v", err)
	}
	r.Notes = strings.Join(env.notes, "; ")
	fmt.Fprintf(stderr, "peers: %s inflight=%d: %.2fs %.0f jobs/s cpu=%.2fs lost=%d doubled=%d %s\n",
		rt, inflight, r.Seconds, r.JobsPerSec, r.CPUSeconds, r.Lost, r.Doubled, r.Notes)
	if r.Workload != "" {
		fmt.Fprintf(stderr, "peers: %s inflight=%d: p50=%.1fms p99=%.1fms sleeping=%d idle: cpu=%.3fs tx/s=%.1f goroutines=%d rss=%.0fMB\n",
			rt, inflight, r.P50Ms, r.P99Ms, r.Sleeping, r.IdleCPUSeconds, r.IdleTxPerSec, r.IdleGoroutines, r.IdleRSSMB)
	}
	return r
}

// progress writes a line to stderr until the returned func is called: on a
// terminal it rewrites one line every second, elsewhere (a log, cmd/bench)
// it adds a line every 5 seconds.
func progress(stderr io.Writer, rt string, inflight int, m *meter) func() {
	eol, every := "\n", 5*time.Second
	if f, ok := stderr.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			eol, every = "\r", time.Second
		}
	}
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				if eol == "\r" {
					fmt.Fprint(stderr, "\n")
				}
				return
			case <-t.C:
				n := m.applied.Load()
				rate := 0.0
				if m.started.Load() {
					<-m.startCh
					end := time.Now()
					select {
					case <-m.done:
						end = m.end // later phases (workflow3's) must not dilute the rate
					default:
					}
					rate = float64(n) / end.Sub(m.start).Seconds()
				}
				fmt.Fprintf(stderr, "peers: %s inflight=%d: %d/%d jobs, %.0f jobs/s%s", rt, inflight, n, m.jobs, rate, eol)
			}
		}
	}()
	return func() { close(stop); <-stopped }
}

func printTable(w io.Writer, results []result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "runtime\tinflight\tjobs\tseconds\tjobs/s\tcpu s\tlost\tdoubled\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.0f\t%.2f\t%d\t%d\t\n",
			r.Runtime, r.Inflight, r.Jobs, r.Seconds, r.JobsPerSec, r.CPUSeconds, r.Lost, r.Doubled)
	}
	_ = tw.Flush()
	for _, r := range results {
		if r.Notes != "" {
			fmt.Fprintf(w, "%s/%d: %s\n", r.Runtime, r.Inflight, r.Notes)
		}
	}
}

// moduleVersion is the version of a dependency this binary was built with.
func moduleVersion(path string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, d := range bi.Deps {
		if d.Path == path {
			if d.Replace != nil {
				return d.Replace.Version
			}
			return d.Version
		}
	}
	return "unknown"
}

func maskURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}
