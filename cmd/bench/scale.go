package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/internal/localcluster"
	"github.com/usherhq/usher/internal/procstat"
)

// scaleSpec is one shape of the scale rows: hosts sharing one stream of
// shards shards (--scale HxS).
type scaleSpec struct{ Hosts, Shards int }

// parseScale reads --scale: comma-separated HOSTSxSHARDS, or "" for none.
func parseScale(v string) ([]scaleSpec, error) {
	var out []scaleSpec
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	for _, part := range strings.Split(v, ",") {
		h, s, ok := strings.Cut(strings.TrimSpace(part), "x")
		hosts, err1 := strconv.Atoi(h)
		shards, err2 := strconv.Atoi(s)
		if !ok || err1 != nil || err2 != nil || hosts < 1 || shards < 1 || shards > stream.MaxShards {
			return nil, fmt.Errorf("--scale: %q is not HOSTSxSHARDS (3x6: three hosts on six shards)", part)
		}
		out = append(out, scaleSpec{hosts, shards})
	}
	return out, nil
}

// scaleRow is one scale run: Hosts hosts in this process (each with its
// plugin process and Concurrency = the largest --inflight level) on one
// stream of Shards shards, on one Redis node or on a local Redis Cluster
// of three primaries and three replicas, with the relay waiting for
// Replicas replicas (WAIT) or not.
type scaleRow struct {
	Redis      string  `json:"redis"` // "node" or "cluster"
	Hosts      int     `json:"hosts"`
	Shards     int     `json:"shards"`
	Replicas   int     `json:"relay_replicas"`
	Inflight   int     `json:"inflight_per_host"`
	Jobs       int     `json:"jobs"`
	Events     int     `json:"events"`
	Seconds    float64 `json:"seconds"`
	JobsPerSec float64 `json:"jobs_per_sec"`
	// CPU per job, in microseconds, over the window: the hosts (this
	// process), their plugin processes, every postgres process of the
	// machine and the Redis servers (INFO cpu). Postgres and a shared
	// Redis node count whatever else runs on them meanwhile.
	HostCPUus     float64 `json:"host_cpu_us_per_job"`
	PluginCPUus   float64 `json:"plugin_cpu_us_per_job"`
	PostgresCPUus float64 `json:"postgres_cpu_us_per_job"`
	RedisCPUus    float64 `json:"redis_cpu_us_per_job"`
	check
}

// redisCPU is the CPU the Redis servers at addrs have used so far (INFO
// cpu: used_cpu_user + used_cpu_sys).
func redisCPU(ctx context.Context, clients []*redis.Client) time.Duration {
	var total time.Duration
	for _, c := range clients {
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
				if f, err := strconv.ParseFloat(v, 64); err == nil {
					total += time.Duration(f * float64(time.Second))
				}
			}
		}
	}
	return total
}

// runScaleRows measures every --scale shape on the Redis of --redis-url
// and, with --scale-cluster, on a local Redis Cluster; on the cluster the
// largest shape runs again with --relay-replicas 1, for WAIT's cost.
func runScaleRows(ctx context.Context, cfg config, logger *slog.Logger, p *progress) (rows []scaleRow, err error) {
	pluginDir, err := os.MkdirTemp("", "usher-bench-scale-plugins-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(pluginDir)
	if err := stagePlugin(cfg.PluginDir, pluginDir, "counters"); err != nil {
		return nil, err
	}
	opt, err := host.RedisOptions(cfg.RedisURL, "")
	if err != nil {
		return nil, err
	}
	node := redis.NewClient(opt)
	defer node.Close()
	type target struct {
		name, url string
		rdb       redis.UniversalClient
		servers   []*redis.Client
		replicas  []int
	}
	targets := []target{{name: "node", url: cfg.RedisURL, rdb: node, servers: []*redis.Client{node}, replicas: []int{0}}}
	if cfg.ScaleCluster {
		p.phase("scale: starting a local Redis Cluster", 0)
		dir, err := os.MkdirTemp("", "usher-bench-cluster-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		c, err := localcluster.Start(dir)
		if err != nil {
			return nil, err
		}
		defer c.Stop()
		crdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
		defer crdb.Close()
		var servers []*redis.Client
		for _, a := range c.Addrs() {
			s := redis.NewClient(&redis.Options{Addr: a})
			defer s.Close()
			servers = append(servers, s)
		}
		targets = append(targets, target{name: "cluster", url: c.URL(), rdb: crdb, servers: servers, replicas: []int{0, 1}})
	}
	for _, t := range targets {
		for i, spec := range cfg.Scale {
			for _, replicas := range t.replicas {
				if replicas > 0 && i != len(cfg.Scale)-1 {
					continue // WAIT's cost, on the last shape only
				}
				row, err := scaleRun(ctx, cfg, pluginDir, logger, p, spec, replicas, t.name, t.url, t.rdb, t.servers)
				if err != nil {
					return rows, fmt.Errorf("scale %dx%d on %s: %w", spec.Hosts, spec.Shards, t.name, err)
				}
				rows = append(rows, row)
			}
		}
	}
	return rows, nil
}

// scaleRun is one scale row, in a fresh database.
func scaleRun(ctx context.Context, cfg config, pluginDir string, logger *slog.Logger, p *progress, spec scaleSpec, replicas int,
	redisName, redisURL string, rdb redis.UniversalClient, servers []*redis.Client) (row scaleRow, err error) {
	row = scaleRow{Redis: redisName, Hosts: spec.Hosts, Shards: spec.Shards, Replicas: replicas, Inflight: cfg.largest(), Jobs: cfg.Jobs, Events: cfg.ScaleEvents}
	what := fmt.Sprintf("scale %d hosts x %d shards on %s", spec.Hosts, spec.Shards, redisName)
	if replicas > 0 {
		what += fmt.Sprintf(", WAIT %d", replicas)
	}
	p.phase(what+": database: create, setup, migrate", 0)
	db, err := createDatabase(ctx, cfg)
	if err != nil {
		return row, err
	}
	defer func() {
		if e := db.drop(context.WithoutCancel(ctx)); e != nil {
			err = errors.Join(err, fmt.Errorf("drop database %s: %w", db.name, e))
		}
	}()
	base := "usher:bench:{" + suffix() + "}"
	defer func() {
		if e := deleteStreams(context.WithoutCancel(ctx), rdb, stream.ShardKeys(base, spec.Shards)); e != nil {
			err = errors.Join(err, fmt.Errorf("delete stream keys: %w", e))
		}
	}()
	p.phase(what+": starting the hosts", 0)
	var hosts []*runningHost
	defer func() {
		for _, rh := range hosts {
			if e := rh.stop(); e != nil {
				err = errors.Join(err, e)
			}
		}
	}()
	for range spec.Hosts {
		hcfg, err := benchHostConfig(cfg, db, pluginDir, cfg.largest(), logger)
		if err != nil {
			return row, err
		}
		hcfg.Stream, hcfg.StreamShards, hcfg.RedisURL, hcfg.RelayReplicas = base, spec.Shards, redisURL, replicas
		rh, err := launchHost(ctx, hcfg, nil)
		if err != nil {
			return row, err
		}
		hosts = append(hosts, rh)
	}
	applied := func() int64 {
		var n int64
		for _, rh := range hosts {
			n += rh.h.Verdicts()["applied"]
		}
		return n
	}
	pending := func() (int64, error) {
		var n int64
		for _, key := range stream.ShardKeys(base, spec.Shards) {
			x, err := rdb.XPending(ctx, key, group).Result()
			if err != nil {
				return 0, fmt.Errorf("xpending %s: %w", key, err)
			}
			n += x.Count
		}
		return n, nil
	}
	// Done when the hosts' applied verdicts say so or, read 4 times a
	// second, processed_jobs does: hosts in one process have been seen to
	// count a batch of 32 committed jobs, whose history says applied, as
	// absorbed duplicates (the note of issue 29 has it).
	recorded := func() int64 {
		var n int64
		_ = db.pool.QueryRow(ctx, `SELECT count(*) FROM processed_jobs`).Scan(&n)
		return n
	}
	wait := func(want int64) error {
		t := time.NewTicker(pollEvery)
		defer t.Stop()
		for i := 0; ; i++ {
			n := applied()
			if n < want && i%25 == 0 {
				n = max(n, recorded())
			}
			p.set(n)
			if n >= want {
				left, err := pending()
				if err != nil {
					return err
				}
				if left == 0 {
					return nil
				}
			}
			select {
			case <-ctx.Done():
				all := map[string]int64{}
				for _, rh := range hosts {
					for v, c := range rh.h.Verdicts() {
						all[v] += c
					}
				}
				return fmt.Errorf("%d of %d jobs applied (verdicts %v): %w", n, want, all, context.Cause(ctx))
			case <-t.C:
			}
		}
	}
	evs, err := createEvents(ctx, db.pool, what, cfg.ScaleEvents)
	if err != nil {
		return row, err
	}
	if cfg.Warmup > 0 {
		p.phase(what+": warm-up", int64(cfg.Warmup))
		if err := placeAll(ctx, db.pool, evs, cfg.Warmup, p, nil); err != nil {
			return row, fmt.Errorf("warm-up: %w", err)
		}
		if err := wait(int64(cfg.Warmup)); err != nil {
			return row, fmt.Errorf("warm-up: %w", err)
		}
	}
	pluginCPU := func() time.Duration {
		var total time.Duration
		for _, rh := range hosts {
			for _, pl := range rh.h.Plugins() {
				if cpu, err := procstat.CPU(pl.Pid); err == nil {
					total += cpu
				}
			}
		}
		return total
	}
	p.phase(what+": committing", int64(cfg.Jobs))
	var hostBefore, pluginBefore, pgBefore, redisBefore time.Duration
	err = placeAll(ctx, db.pool, evs, cfg.Jobs, p, func() {
		hostBefore, pluginBefore, pgBefore, redisBefore = procstat.SelfCPU(), pluginCPU(), procstat.CommandCPU("postgres"), redisCPU(ctx, servers)
	})
	if err != nil {
		return row, fmt.Errorf("commit the jobs: %w", err)
	}
	start := time.Now()
	p.phase(what+": throughput", int64(cfg.Jobs))
	if err := wait(int64(cfg.Warmup + cfg.Jobs)); err != nil {
		return row, err
	}
	row.Seconds = time.Since(start).Seconds()
	row.JobsPerSec = float64(cfg.Jobs) / row.Seconds
	perJob := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(cfg.Jobs) }
	row.HostCPUus = perJob(procstat.SelfCPU() - hostBefore)
	row.PluginCPUus = perJob(pluginCPU() - pluginBefore)
	row.PostgresCPUus = perJob(procstat.CommandCPU("postgres") - pgBefore)
	row.RedisCPUus = perJob(redisCPU(ctx, servers) - redisBefore)
	row.check, err = verify(ctx, db.pool, evs)
	return row, err
}

// printScale prints the scale rows.
func printScale(w io.Writer, rows []scaleRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nscale: hosts sharing one stream of shards (every host in this process, each with its plugin process, %d in flight each), %d jobs over %d events committed at once:\n",
		rows[0].Inflight, rows[0].Jobs, rows[0].Events)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "redis\thosts\tshards\tWAIT\tjobs/s\thost µs/job\tplugin µs/job\tpostgres µs/job\tredis µs/job\tlost\tdoubled\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%d\t%d\t\n", r.Redis, r.Hosts, r.Shards, r.Replicas, r.JobsPerSec,
			r.HostCPUus, r.PluginCPUus, r.PostgresCPUus, r.RedisCPUus, r.Lost+r.LostJobs, r.Doubled)
	}
	_ = tw.Flush()
}
