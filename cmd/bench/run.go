package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host"
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "bench: %s\n", cfg)
	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Timeout, fmt.Errorf("--timeout %s reached", cfg.Timeout))
	defer cancel()
	if err := os.MkdirAll(cfg.Plots, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Log), 0o755); err != nil {
		return err
	}
	logf, err := os.Create(cfg.Log)
	if err != nil {
		return err
	}
	defer logf.Close()
	logger := slog.New(slog.NewJSONHandler(logf, &slog.HandlerOptions{Level: slog.LevelWarn}))

	res := &results{Date: time.Now().UTC().Format(time.RFC3339), Command: strings.Join(append([]string{"bin/bench"}, args...), " "),
		Jobs: cfg.Jobs, Events: cfg.Events, Warmup: cfg.Warmup}
	p := newProgress(stderr)
	ms, err := measureUsher(ctx, cfg, res, logger, p)
	if err != nil {
		res.Errors = append(res.Errors, "usher: "+err.Error())
	}
	if cfg.Peers && err == nil {
		p.phase("peers (go run ./cmd/peers in "+cfg.BenchDir+")", 0)
		res.Peers, err = runPeers(ctx, cfg, stderr)
		if err != nil {
			res.Errors = append(res.Errors, err.Error())
		}
		res.Ratios = ratios(res.Usher, res.Peers)
		res.Best = bestRatios(res.Usher, res.Peers)
	}
	if cfg.Workflows > 0 && ctx.Err() == nil {
		res.Workflows = &workflowResults{}
		if err := runWorkflowRows(ctx, cfg, res.Workflows, logger, p, stderr); err != nil {
			res.Errors = append(res.Errors, "workflows: "+err.Error())
		}
	}
	if len(cfg.Scale) > 0 && ctx.Err() == nil {
		res.Scale, err = runScaleRows(ctx, cfg, logger, p)
		if err != nil {
			res.Errors = append(res.Errors, err.Error())
		}
	}
	p.close()
	res.Boundary = boundaries(res.Usher, res.InProcess)
	res.tally()
	res.Plots, err = writePlots(cfg.Plots, res, ms)
	if err != nil {
		res.Errors = append(res.Errors, err.Error())
	}
	res.printTable(stdout)
	if cfg.JSON != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.JSON, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	var errs []error
	if res.Lost != 0 || res.Doubled != 0 {
		errs = append(errs, fmt.Errorf("usher lost %d and doubled %d (seats and jobs): see the table", res.Lost, res.Doubled))
	}
	for _, e := range res.Errors {
		errs = append(errs, errors.New(e))
	}
	return errors.Join(errs...)
}

// measureUsher runs the throughput levels, the latency run (after the
// largest level's throughput, on its warmed host) and the mix, each in a
// fresh database, as the peers run each of theirs: a run does not inherit
// the dead rows of the runs before it (this machine's Postgres runs with
// autovacuum off). It returns the latency run's per-job milliseconds. The
// databases and the stream keys are removed whatever happens.
func measureUsher(ctx context.Context, cfg config, res *results, logger *slog.Logger, p *progress) (ms []float64, err error) {
	opt, err := host.RedisOptions(cfg.RedisURL, "")
	if err != nil {
		return nil, err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	pluginDir, err := os.MkdirTemp("", "usher-bench-plugins-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(pluginDir)
	if err := stagePlugin(cfg.PluginDir, pluginDir, "counters"); err != nil {
		return nil, err
	}
	var streams []string
	defer func() {
		if e := deleteStreams(context.WithoutCancel(ctx), rdb, streams); e != nil {
			err = errors.Join(err, fmt.Errorf("delete stream keys: %w", e))
		}
	}()
	// fresh runs measure in a database of its own, then adds up the
	// duplicates its guards absorbed and drops it.
	fresh := func(what string, measure func(db *database) error) (err error) {
		p.phase(what+": database: create, setup, migrate", 0)
		db, err := createDatabase(ctx, cfg)
		if err != nil {
			return err
		}
		defer func() {
			if e := db.drop(context.WithoutCancel(ctx)); e != nil {
				err = errors.Join(err, fmt.Errorf("drop database %s: %w", db.name, e))
			}
		}()
		if err := measure(db); err != nil {
			return err
		}
		abs, err := absorbedDuplicates(ctx, db.pool)
		res.Absorbed = addAbsorbed(res.Absorbed, abs)
		return err
	}
	// level measures one level's throughput in a fresh database, with the
	// handler in the host or in the plugin process; the plugin's run at
	// the largest level is followed by the latency run on its host.
	level := func(level int, inProcess bool) error {
		what, role := fmt.Sprintf("inflight %d", level), "host"
		if inProcess {
			what, role = what+", in-process", "in-process host"
		}
		err := fresh(what, func(db *database) error {
			p.phase(what+": starting the host", 0)
			rh, err := startHost(ctx, cfg, db, pluginDir, level, inProcess, logger)
			if err != nil {
				return err
			}
			streams = append(streams, rh.stream)
			lr, err := throughput(ctx, cfg, db, rh, rdb, p)
			switch {
			case err != nil:
			case inProcess:
				res.InProcess = append(res.InProcess, lr)
			default:
				res.Usher = append(res.Usher, lr)
				if level == cfg.largest() {
					var lat latencyResult
					lat, ms, err = latency(ctx, cfg, db, rh, rdb, p)
					if err == nil {
						res.Latency = &lat
					}
				}
			}
			if stopErr := rh.stop(); stopErr != nil {
				err = errors.Join(err, fmt.Errorf("%s (inflight %d): %w", role, level, stopErr))
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	for _, l := range cfg.Inflight {
		if cfg.InProcess {
			// The same handler inside the host: what the boundary costs.
			if err := level(l, true); err != nil {
				return ms, err
			}
		}
		if err := level(l, false); err != nil {
			return ms, err
		}
	}
	if cfg.Mix > 0 {
		mixDir, err := os.MkdirTemp("", "usher-bench-mix-plugins-")
		if err != nil {
			return ms, err
		}
		defer os.RemoveAll(mixDir)
		for _, name := range []string{"counters", "tickets"} {
			if err := stagePlugin(cfg.PluginDir, mixDir, name); err != nil {
				return ms, err
			}
		}
		err = fresh("mix", func(db *database) error {
			mix, stream, err := measureMix(ctx, cfg, db, mixDir, logger, p)
			if stream != "" {
				streams = append(streams, stream)
			}
			res.Mix = mix
			return err
		})
		if err != nil {
			return ms, fmt.Errorf("mix: %w", err)
		}
	}
	return ms, nil
}

// addAbsorbed adds the counts of more to sum's, by guard, kind and reason.
func addAbsorbed(sum, more []absorbed) []absorbed {
	for _, m := range more {
		i := slices.IndexFunc(sum, func(a absorbed) bool { return a.Guard == m.Guard && a.Kind == m.Kind && a.Reason == m.Reason })
		if i < 0 {
			sum = append(sum, m)
			continue
		}
		sum[i].Count += m.Count
	}
	return sum
}
