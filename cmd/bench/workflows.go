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
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/internal/contract"
	"github.com/usherhq/usher/plugins/counters/counter"
	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/sdk"
)

// The workflow rows of the bench: a three-step workflow ("tally", three
// update_sales_counter steps of one order, one after another: four
// decisions and three guarded jobs) end to end, at each in-flight level
// and at a fixed rate, and the idle cost of sleeping workflows ("nap",
// one decision that sets a one-hour timer). The workflows run on the
// counters plugin's role; its plugin process is this binary, started by
// the host with the plugin handshake (servePluginIfAsked), so the
// decisions and steps cross the real process boundary. DBOS Go runs the
// same three steps (bench/cmd/peers --workload workflow3) on the same
// Postgres in the same run.

// tallyInput is a tally's input: the order its three steps count.
type tallyInput struct {
	OrderID int64 `json:"order_id"`
}

// tallySteps are the tally's steps, in order.
var tallySteps = []string{"s1", "s2", "s3"}

// tally counts its order three times, one step after another.
func tally(_ context.Context, h sdk.WorkflowHistory[tallyInput]) (sdk.Decision, error) {
	for _, id := range tallySteps {
		s := h.Step(id)
		switch {
		case !s.Scheduled:
			return sdk.Decision{Steps: []sdk.StepCall{sdk.Step(id, stagedoor.UpdateSalesCounter{OrderID: h.Input.OrderID})}}, nil
		case s.Failed || s.Cancelled:
			return sdk.Fail(id + ": " + s.Error), nil
		case !s.Done():
			return sdk.Decision{}, nil
		}
	}
	return sdk.Complete(nil), nil
}

// napFor is how long a nap sleeps: past any run.
const napFor = time.Hour

// nap sleeps for napFor, then completes.
func nap(_ context.Context, h sdk.WorkflowHistory[struct{}]) (sdk.Decision, error) {
	switch {
	case !h.TimerSet("nap"):
		return sdk.Decision{Timers: []sdk.Timer{{Name: "nap", After: napFor}}}, nil
	case h.TimerFired("nap"):
		return sdk.Complete(nil), nil
	}
	return sdk.Decision{}, nil
}

const workflowPluginVersion = "bench-workflows"

// workflowPlugin is the counters plugin with the bench's two workflow
// types.
func workflowPlugin() *sdk.Plugin {
	p := sdk.New("counters", workflowPluginVersion)
	sdk.HandleRecordJobID(p, counter.Handler{Version: workflowPluginVersion})
	sdk.HandleWorkflow(p, "tally", tally)
	sdk.HandleWorkflow(p, "nap", nap)
	return p
}

// servePluginIfAsked serves workflowPlugin and reports true when this
// process was started by a host as a plugin.
func servePluginIfAsked() bool {
	if os.Getenv(contract.Handshake.MagicCookieKey) != contract.Handshake.MagicCookieValue {
		return false
	}
	sdk.Serve(workflowPlugin())
	return true
}

// stageWorkflowPlugin writes into dir this binary as the counters plugin
// with the bench's workflow kinds: the counters manifest of pluginDir
// (its grants) with this binary, its digest, and the kinds added.
func stageWorkflowPlugin(pluginDir, dir string) error {
	b, err := os.ReadFile(filepath.Join(pluginDir, "counters.plugin.json"))
	if err != nil {
		return fmt.Errorf("the counters plugin's manifest (run make plugins): %w", err)
	}
	var m pluginhost.FileManifest
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	bin := filepath.Join(dir, "counters-workflows")
	if err := copyFile(self, bin); err != nil {
		return err
	}
	if m.SHA256, err = pluginhost.FileSHA256(bin); err != nil {
		return err
	}
	m.Binary, m.Version = filepath.Base(bin), workflowPluginVersion
	m.Kinds = []string{stagedoor.UpdateSalesCounter{}.Kind(), contract.WorkflowKind("tally"), contract.WorkflowKind("nap")}
	_, err = m.Write(dir)
	return err
}

// workflowLevel is the tally's throughput at one in-flight level.
type workflowLevel struct {
	Runtime   string  `json:"runtime"` // usher, usher in-process, dbos
	Inflight  int     `json:"inflight"`
	Workflows int     `json:"workflows"`
	Seconds   float64 `json:"seconds"`
	PerSec    float64 `json:"workflows_per_sec"`
	// CPUSeconds is the host's and the plugin's (usher), or the process's
	// (dbos), over the window.
	CPUSeconds float64  `json:"cpu_seconds"`
	Lost       int64    `json:"lost"`
	Doubled    int64    `json:"doubled"`
	Notes      []string `json:"notes,omitempty"`
}

// workflowLatency is the tally's latency at a fixed rate of starts.
type workflowLatency struct {
	Runtime   string  `json:"runtime"`
	Rate      int     `json:"rate"`
	Seconds   int     `json:"seconds"`
	Workflows int     `json:"workflows"`
	P50MS     float64 `json:"p50_ms"` // start committed to the workflow's end committed
	P99MS     float64 `json:"p99_ms"`
	// DecisionP50MS and DecisionP99MS: from the event that woke the
	// workflow (its start, a step's end) to the decision's commit (the
	// next step scheduled, the end): the decision's round trip through
	// the outbox, the stream, the host and the plugin.
	DecisionP50MS float64 `json:"decision_p50_ms,omitempty"`
	DecisionP99MS float64 `json:"decision_p99_ms,omitempty"`
	Lost          int64   `json:"lost"`
	Doubled       int64   `json:"doubled"`
}

// workflowIdle is what sleeping workflows cost an idle runtime.
type workflowIdle struct {
	Runtime  string  `json:"runtime"`
	Sleeping int     `json:"sleeping"`
	Seconds  float64 `json:"seconds"`
	// StartSeconds is how long starting them all took (to the last one
	// asleep).
	StartSeconds float64 `json:"start_seconds"`
	// CPUSeconds over the window: the host's and the plugin's (usher).
	CPUSeconds float64 `json:"cpu_seconds"`
	// TxPerSec is Postgres's transactions per second in the run's
	// database over the window (pg_stat_database).
	TxPerSec   float64 `json:"tx_per_sec"`
	Goroutines int     `json:"goroutines"`
	RSSMiB     float64 `json:"rss_mib"`
	// Idle is the same window with no workflow sleeping, for scale.
	EmptyCPUSeconds float64 `json:"empty_cpu_seconds"`
	EmptyTxPerSec   float64 `json:"empty_tx_per_sec"`
}

// workflowResults is the bench's workflow section.
type workflowResults struct {
	Levels  []workflowLevel   `json:"levels"`
	Latency []workflowLatency `json:"latency,omitempty"`
	Idle    []workflowIdle    `json:"idle,omitempty"`
}

// measureWorkflows runs the workflow rows in fresh databases.
func measureWorkflows(ctx context.Context, cfg config, res *workflowResults, logger *slog.Logger, p *progress, rdb redis.UniversalClient,
	streams *[]string) error {
	dir, err := os.MkdirTemp("", "usher-bench-workflow-plugins-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := stageWorkflowPlugin(cfg.PluginDir, dir); err != nil {
		return err
	}
	fresh := func(what string, inflight int, measure func(db *database, rh *runningHost) error) (err error) {
		p.phase("workflows, "+what+": database: create, setup, migrate", 0)
		db, err := createDatabase(ctx, cfg)
		if err != nil {
			return err
		}
		defer func() {
			if e := db.drop(context.WithoutCancel(ctx)); e != nil {
				err = errors.Join(err, fmt.Errorf("drop database %s: %w", db.name, e))
			}
		}()
		rh, err := startHostServing(ctx, cfg, db, dir, inflight, nil, logger)
		if err != nil {
			return err
		}
		*streams = append(*streams, rh.stream)
		err = measure(db, rh)
		if stopErr := rh.stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		return err
	}
	for _, level := range cfg.Inflight {
		err := fresh(fmt.Sprintf("inflight %d", level), level, func(db *database, rh *runningHost) error {
			l, err := workflowThroughput(ctx, cfg, db, rh, p)
			res.Levels = append(res.Levels, l)
			if err != nil || level != cfg.largest() {
				return err
			}
			lat, err := workflowRate(ctx, cfg, db, rh, p)
			res.Latency = append(res.Latency, lat)
			return err
		})
		if err != nil {
			return fmt.Errorf("workflows at inflight %d: %w", level, err)
		}
	}
	if cfg.Sleeping > 0 {
		err := fresh("idle", cfg.largest(), func(db *database, rh *runningHost) error {
			idle, err := workflowSleepers(ctx, cfg, db, rh, p)
			res.Idle = append(res.Idle, idle)
			return err
		})
		if err != nil {
			return fmt.Errorf("workflows, idle: %w", err)
		}
	}
	return nil
}

// appliedPerTally is what one tally applies: four decision tasks and three
// steps.
const appliedPerTally = 4 + 3

// startTallies starts a tally for each order in one transaction, with ids
// prefix-<order>.
func startTallies(ctx context.Context, pool *pgxpool.Pool, prefix string, ids []int64) error {
	_, err := pool.Exec(ctx, `SELECT usher_start_workflow('tally', $1 || o, jsonb_build_object('order_id', o)) FROM unnest($2::bigint[]) AS o`,
		prefix, ids)
	return err
}

// workflowThroughput warms the host, then times cfg.Workflows tallies
// started in one transaction, from its commit to the last tally's end.
func workflowThroughput(ctx context.Context, cfg config, db *database, rh *runningHost, p *progress) (workflowLevel, error) {
	res := workflowLevel{Runtime: "usher", Inflight: rh.concurrency, Workflows: cfg.Workflows}
	w := waiter{h: rh.h}
	evs, err := createEvents(ctx, db.pool, fmt.Sprintf("workflows %d", res.Inflight), cfg.Events)
	if err != nil {
		return res, err
	}
	warm := min(100, cfg.Workflows)
	ids, err := placeOrders(ctx, db.pool, evs, warm+cfg.Workflows, p)
	if err != nil {
		return res, err
	}
	base := w.applied()
	p.phase(fmt.Sprintf("workflows, inflight %d: warm-up", res.Inflight), int64(warm*appliedPerTally))
	if err := startTallies(ctx, db.pool, "warm-", ids[:warm]); err != nil {
		return res, err
	}
	if err := w.waitApplied(ctx, base+int64(warm*appliedPerTally), base, p); err != nil {
		return res, fmt.Errorf("warm-up: %w", err)
	}
	base = w.applied()
	p.phase(fmt.Sprintf("workflows, inflight %d: %d tallies", res.Inflight, cfg.Workflows), int64(cfg.Workflows*appliedPerTally))
	before := takeSample(rh.h)
	start := time.Now()
	if err := startTallies(ctx, db.pool, "t-", ids[warm:]); err != nil {
		return res, err
	}
	if err := w.waitApplied(ctx, base+int64(cfg.Workflows*appliedPerTally), base, p); err != nil {
		return res, err
	}
	end := time.Now()
	after := takeSample(rh.h)
	var lr levelResult
	lr.usage(before, after)
	res.Seconds = end.Sub(start).Seconds()
	res.PerSec = float64(cfg.Workflows) / res.Seconds
	res.CPUSeconds = lr.CPUSeconds
	res.Lost, res.Doubled, err = verifyTallies(ctx, db.pool, evs, "", warm+cfg.Workflows)
	return res, err
}

// waitApplied polls the host's applied count until it reaches want.
func (w waiter) waitApplied(ctx context.Context, want, base int64, p *progress) error {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	for {
		v := w.h.Verdicts()
		p.set(v["applied"] - base)
		if v["applied"] >= want {
			return nil
		}
		if dead := v["dead_letter"]; dead > 0 {
			return fmt.Errorf("%d jobs dead-lettered (see the host's log)", dead)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d runs applied: %w", v["applied"]-base, want-base, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// verifyTallies checks that the n tallies whose ids start with prefix
// completed and that every one of events' seats_sold is three times its
// orders' seats.
func verifyTallies(ctx context.Context, pool *pgxpool.Pool, events []int64, prefix string, n int) (lost, doubled int64, err error) {
	var done int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM workflows WHERE type = 'tally' AND state = 'completed' AND starts_with(workflow_id, $1)`,
		prefix).Scan(&done); err != nil {
		return 0, 0, err
	}
	if err := pool.QueryRow(ctx, `
SELECT coalesce(sum(greatest(coalesce(x.expected, 0) - e.seats_sold, 0)), 0)::bigint,
       coalesce(sum(greatest(e.seats_sold - coalesce(x.expected, 0), 0)), 0)::bigint
FROM events e
LEFT JOIN (SELECT event_id, 3 * sum(seats) AS expected FROM orders GROUP BY event_id) x ON x.event_id = e.id
WHERE e.id = ANY($1)`, events).Scan(&lost, &doubled); err != nil {
		return 0, 0, err
	}
	if done != n {
		err = fmt.Errorf("%d of %d tallies completed", done, n)
	}
	return lost, doubled, err
}

// workflowRate starts tallies at cfg.WorkflowRate a second for
// cfg.WorkflowRateSeconds, each in its own transaction, and reads each
// one's start-to-end time and its decisions' round trips from the
// database's own clock.
func workflowRate(ctx context.Context, cfg config, db *database, rh *runningHost, p *progress) (workflowLatency, error) {
	res := workflowLatency{Runtime: "usher", Rate: cfg.WorkflowRate, Seconds: cfg.WorkflowRateSeconds}
	n := cfg.WorkflowRate * cfg.WorkflowRateSeconds
	res.Workflows = n
	evs, err := createEvents(ctx, db.pool, "workflow latency", cfg.Events)
	if err != nil {
		return res, err
	}
	ids, err := placeOrders(ctx, db.pool, evs, n, p)
	if err != nil {
		return res, err
	}
	w := waiter{h: rh.h}
	base := w.applied()
	p.phase(fmt.Sprintf("workflows: %d a second for %ds", cfg.WorkflowRate, cfg.WorkflowRateSeconds), int64(n*appliedPerTally))
	every := time.Second / time.Duration(cfg.WorkflowRate)
	t0 := time.Now()
	for i, id := range ids {
		if d := time.Until(t0.Add(time.Duration(i) * every)); d > 0 {
			time.Sleep(d)
		}
		if err := startTallies(ctx, db.pool, "r-", []int64{id}); err != nil {
			return res, err
		}
	}
	if err := w.waitApplied(ctx, base+int64(n*appliedPerTally), base, p); err != nil {
		return res, err
	}
	err = db.pool.QueryRow(ctx, `
		SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
		FROM (SELECT extract(epoch FROM finished_at - created_at) * 1000 AS ms FROM workflows
		      WHERE type = 'tally' AND workflow_id LIKE 'r-%') x`).Scan(&res.P50MS, &res.P99MS)
	if err != nil {
		return res, err
	}
	err = db.pool.QueryRow(ctx, `
		SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
		FROM (SELECT extract(epoch FROM e.at - lag(e.at) OVER (PARTITION BY e.workflow ORDER BY e.seq)) * 1000 AS ms, e.type,
		             lag(e.type) OVER (PARTITION BY e.workflow ORDER BY e.seq) AS woke
		      FROM workflow_events e JOIN workflows w ON w.id = e.workflow
		      WHERE w.type = 'tally' AND w.workflow_id LIKE 'r-%') x
		WHERE type IN ('step_scheduled', 'completed') AND woke IN ('started', 'step_completed')`).Scan(&res.DecisionP50MS, &res.DecisionP99MS)
	if err != nil {
		return res, err
	}
	res.Lost, res.Doubled, err = verifyTallies(ctx, db.pool, evs, "r-", n)
	return res, err
}

// workflowSleepers measures the idle host, then starts cfg.Sleeping naps
// (each one decision that sets a one-hour timer) and measures it again.
func workflowSleepers(ctx context.Context, cfg config, db *database, rh *runningHost, p *progress) (workflowIdle, error) {
	res := workflowIdle{Runtime: "usher", Sleeping: cfg.Sleeping, Seconds: cfg.IdleWindow.Seconds()}
	var err error
	p.phase("workflows: idle, none sleeping", 0)
	if res.EmptyCPUSeconds, res.EmptyTxPerSec, _, _, err = idleWindow(ctx, db, rh, cfg.IdleWindow); err != nil {
		return res, err
	}
	p.phase(fmt.Sprintf("workflows: starting %d sleepers", cfg.Sleeping), int64(cfg.Sleeping))
	start := time.Now()
	const chunk = 10_000
	for i := 0; i < cfg.Sleeping; i += chunk {
		if _, err := db.pool.Exec(ctx, `SELECT usher_start_workflow('nap', 'nap-' || g, '{}') FROM generate_series($1::int, $2::int) g`,
			i+1, min(i+chunk, cfg.Sleeping)); err != nil {
			return res, err
		}
	}
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		var asleep int
		if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM workflow_timers WHERE name = 'nap' AND fired_at IS NULL`).Scan(&asleep); err != nil {
			return res, err
		}
		p.set(int64(asleep))
		if asleep >= cfg.Sleeping {
			break
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("%d of %d asleep: %w", asleep, cfg.Sleeping, context.Cause(ctx))
		case <-t.C:
		}
	}
	res.StartSeconds = time.Since(start).Seconds()
	p.phase(fmt.Sprintf("workflows: idle, %d sleeping", cfg.Sleeping), 0)
	var rss int64
	res.CPUSeconds, res.TxPerSec, res.Goroutines, rss, err = idleWindow(ctx, db, rh, cfg.IdleWindow)
	res.RSSMiB = float64(rss) / (1 << 20)
	return res, err
}

// idleWindow measures, over d, the host's and plugin's CPU, the
// database's transactions a second, the host's goroutines and its peak RSS.
func idleWindow(ctx context.Context, db *database, rh *runningHost, d time.Duration) (cpu, txPerSec float64, goroutines int, rss int64, err error) {
	txs := func() (int64, error) {
		var n int64
		err := db.pool.QueryRow(ctx, `SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
		return n, err
	}
	// Postgres counts an idle backend's transactions up to some seconds
	// late: let what came before the window be counted before it opens.
	settle := time.Second
	if d >= 5*time.Second {
		settle = 11 * time.Second
	}
	select {
	case <-ctx.Done():
		return 0, 0, 0, 0, context.Cause(ctx)
	case <-time.After(settle):
	}
	tx0, err := txs()
	if err != nil {
		return 0, 0, 0, 0, err
	}
	before := takeSample(rh.h)
	select {
	case <-ctx.Done():
		return 0, 0, 0, 0, context.Cause(ctx)
	case <-time.After(d):
	}
	after := takeSample(rh.h)
	tx1, err := txs()
	if err != nil {
		return 0, 0, 0, 0, err
	}
	var lr levelResult
	lr.usage(before, after)
	// The statistics collector's counts lag by up to a second (its
	// flush): a window of some seconds averages that out. The two reads
	// are two transactions of ours.
	return lr.CPUSeconds, float64(tx1-tx0-2) / d.Seconds(), runtime.NumGoroutine(), lr.HostPeakRSSBytes, nil
}

// printWorkflows writes the workflow tables.
func (r *workflowResults) print(w io.Writer) {
	if r == nil || len(r.Levels) == 0 {
		return
	}
	fmt.Fprintln(w, "\nworkflows: tally, 3 update_sales_counter steps one after another (4 decisions, 3 guarded jobs each):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "runtime\tinflight\tworkflows/s\tseconds\tcpu s\tlost\tdoubled\t")
	levels := slices.Clone(r.Levels)
	slices.SortStableFunc(levels, func(a, b workflowLevel) int { return a.Inflight - b.Inflight })
	for _, l := range levels {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%.2f\t%d\t%d\t\n", l.Runtime, l.Inflight, l.PerSec, l.Seconds, l.CPUSeconds, l.Lost, l.Doubled)
	}
	_ = tw.Flush()
	if len(r.Latency) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "runtime\trate/s\tworkflows\tp50 ms\tp99 ms\tdecision p50 ms\tdecision p99 ms\t")
		for _, l := range r.Latency {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%s\t%s\t\n", l.Runtime, l.Rate, l.Workflows, l.P50MS, l.P99MS, orDash(l.DecisionP50MS), orDash(l.DecisionP99MS))
		}
		_ = tw.Flush()
	}
	if len(r.Idle) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "runtime\tsleeping\tstart s\tcpu s\ttx/s\tgoroutines\trss MiB\tempty cpu s\tempty tx/s\t")
		for _, l := range r.Idle {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%.2f\t%.1f\t%d\t%.0f\t%s\t%s\t\n", l.Runtime, l.Sleeping, orDash(l.StartSeconds), l.CPUSeconds, l.TxPerSec,
				l.Goroutines, l.RSSMiB, orDash(l.EmptyCPUSeconds), orDash(l.EmptyTxPerSec))
		}
		_ = tw.Flush()
		fmt.Fprintf(w, "  (cpu and tx/s over %.0fs idle windows; usher's cpu is the host's and the plugin's)\n", r.Idle[0].Seconds)
	}
}

// orDash prints x, or - for a figure the runtime does not report.
func orDash(x float64) string {
	if x == 0 {
		return "-"
	}
	return strconv.FormatFloat(x, 'f', 1, 64)
}

// tally adds the workflow rows' checks to r's totals.
func (r *workflowResults) tally(lost, doubled *int64) {
	if r == nil {
		return
	}
	for _, l := range r.Levels {
		*lost += l.Lost
		*doubled += l.Doubled
	}
	for _, l := range r.Latency {
		*lost += l.Lost
		*doubled += l.Doubled
	}
}

// runWorkflowRows measures usher's workflow rows, then DBOS's (peers
// --workload workflow3) when cfg.Peers, in the same run.
func runWorkflowRows(ctx context.Context, cfg config, res *workflowResults, logger *slog.Logger, p *progress, stderr io.Writer) error {
	opt, err := host.RedisOptions(cfg.RedisURL, "")
	if err != nil {
		return err
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	var streams []string
	err = measureWorkflows(ctx, cfg, res, logger, p, rdb, &streams)
	if e := deleteStreams(context.WithoutCancel(ctx), rdb, streams); e != nil {
		err = errors.Join(err, fmt.Errorf("delete stream keys: %w", e))
	}
	if err != nil || !cfg.Peers {
		return err
	}
	p.phase("workflows: DBOS (go run ./cmd/peers --workload workflow3 in "+cfg.BenchDir+")", 0)
	return runDBOS(ctx, cfg, res, stderr)
}

// dbosResult is one object of `peers --workload workflow3 --json`
// (bench/README.md's schema).
type dbosResult struct {
	Runtime        string  `json:"runtime"`
	Inflight       int     `json:"inflight"`
	Workflows      int     `json:"workflows"`
	Seconds        float64 `json:"seconds"`
	PerSec         float64 `json:"workflows_per_sec"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	Lost           int64   `json:"lost"`
	Doubled        int64   `json:"doubled"`
	Rate           float64 `json:"rate"`
	RateWorkflows  int     `json:"rate_workflows"`
	P50MS          float64 `json:"p50_ms"`
	P99MS          float64 `json:"p99_ms"`
	Sleeping       int     `json:"sleeping"`
	IdleSeconds    float64 `json:"idle_seconds"`
	IdleCPUSeconds float64 `json:"idle_cpu_seconds"`
	IdleTxPerSec   float64 `json:"idle_tx_per_sec"`
	IdleGoroutines int     `json:"idle_goroutines"`
	IdleRSSMiB     float64 `json:"idle_rss_mb"`
	Notes          string  `json:"notes"`
}

// runDBOS runs DBOS's workflow3 on the same settings and adds its rows.
func runDBOS(ctx context.Context, cfg config, res *workflowResults, stderr io.Writer) error {
	levels := make([]string, len(cfg.Inflight))
	for i, n := range cfg.Inflight {
		levels[i] = strconv.Itoa(n)
	}
	args := []string{"run", "./cmd/peers", "--json", "--workload", "workflow3", "--runtimes", "dbos",
		"--jobs", strconv.Itoa(cfg.Workflows), "--events", strconv.Itoa(cfg.Events), "--inflight", strings.Join(levels, ","),
		"--rate", strconv.Itoa(cfg.WorkflowRate), "--rate-seconds", strconv.Itoa(cfg.WorkflowRateSeconds),
		"--sleeping", strconv.Itoa(cfg.Sleeping), "--idle-seconds", strconv.Itoa(int(cfg.IdleWindow.Seconds())),
		"--database-url", cfg.AdminURL}
	var out []dbosResult
	if err := runPeerCommand(ctx, cfg, args, stderr, &out); err != nil {
		return err
	}
	for _, d := range out {
		notes := []string(nil)
		if d.Notes != "" {
			notes = []string{d.Notes}
		}
		res.Levels = append(res.Levels, workflowLevel{Runtime: d.Runtime, Inflight: d.Inflight, Workflows: d.Workflows, Seconds: d.Seconds,
			PerSec: d.PerSec, CPUSeconds: d.CPUSeconds, Lost: d.Lost, Doubled: d.Doubled, Notes: notes})
		// peers runs the latency and idle phases in its first level's row.
		if d.P50MS > 0 {
			res.Latency = append(res.Latency, workflowLatency{Runtime: d.Runtime, Rate: int(d.Rate), Seconds: cfg.WorkflowRateSeconds,
				Workflows: d.RateWorkflows, P50MS: d.P50MS, P99MS: d.P99MS})
		}
		if d.Sleeping > 0 {
			res.Idle = append(res.Idle, workflowIdle{Runtime: d.Runtime, Sleeping: d.Sleeping, Seconds: d.IdleSeconds,
				CPUSeconds: d.IdleCPUSeconds, TxPerSec: d.IdleTxPerSec, Goroutines: d.IdleGoroutines, RSSMiB: d.IdleRSSMiB})
		}
	}
	return nil
}
