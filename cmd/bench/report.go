package main

import (
	"cmp"
	"fmt"
	"image/color"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// results is everything one run measured: the JSON --json writes.
type results struct {
	Date    string        `json:"date"`    // RFC 3339, when the run started
	Command string        `json:"command"` // bin/bench and its arguments
	Jobs    int           `json:"jobs"`
	Events  int           `json:"events"`
	Warmup  int           `json:"warmup"`
	Usher   []levelResult `json:"usher"`
	// InProcess is each level with the counters handler inside the
	// host (host.LoadInProcess): no process, gRPC or broker between host
	// and handler; Boundary compares the two.
	InProcess []levelResult `json:"usher_in_process,omitempty"`
	Boundary  []boundary    `json:"boundary,omitempty"`
	// Mix is the full Stagedoor mix against the PDFs rendered alone.
	Mix      *mixResult     `json:"mix,omitempty"`
	Latency  *latencyResult `json:"latency"`
	Absorbed []absorbed     `json:"absorbed_duplicates"`
	// Lost and Doubled add up every check's seats and jobs: both must be 0.
	Lost    int64        `json:"lost"`
	Doubled int64        `json:"doubled"`
	Peers   []peerResult `json:"peers,omitempty"`
	// Workflows are the workflow rows: usher's and DBOS's.
	Workflows *workflowResults `json:"workflows,omitempty"`
	// Scale are the scale rows: hosts x shards, on one Redis node and on
	// a Redis Cluster.
	Scale  []scaleRow `json:"scale,omitempty"`
	Ratios []ratio    `json:"ratios,omitempty"`
	// Best compares each runtime at its fastest level: usher's best over
	// each peer's best.
	Best   []bestRatio `json:"best,omitempty"`
	Plots  []string    `json:"plots"`
	Errors []string    `json:"errors,omitempty"`
}

// boundary is the plugin boundary's cost at one level: Cost is the share
// of the in-process rate the plugin process loses, 1 - plugin/in-process.
type boundary struct {
	Inflight  int     `json:"inflight"`
	Plugin    float64 `json:"plugin_jobs_per_sec"`
	InProcess float64 `json:"in_process_jobs_per_sec"`
	Cost      float64 `json:"cost"`
}

func boundaries(plugin, inProcess []levelResult) []boundary {
	var out []boundary
	for _, u := range plugin {
		for _, i := range inProcess {
			if u.Inflight == i.Inflight && u.JobsPerSec > 0 && i.JobsPerSec > 0 {
				out = append(out, boundary{Inflight: u.Inflight, Plugin: u.JobsPerSec, InProcess: i.JobsPerSec, Cost: 1 - u.JobsPerSec/i.JobsPerSec})
			}
		}
	}
	return out
}

// levelResult is one throughput run.
type levelResult struct {
	Inflight   int     `json:"inflight"`
	Jobs       int     `json:"jobs"`
	Seconds    float64 `json:"seconds"` // outbox commit to every job applied and acked
	JobsPerSec float64 `json:"jobs_per_sec"`
	// HostCPUSeconds is this process's user+system CPU over the window
	// (the host, and this command's poller); CPUSeconds adds the plugins'.
	HostCPUSeconds   float64      `json:"host_cpu_seconds"`
	HostPeakRSSBytes int64        `json:"host_peak_rss_bytes"`
	Plugins          []procResult `json:"plugins"`
	CPUSeconds       float64      `json:"cpu_seconds"`
	// Batches are the window's committed batches and the mean of each of
	// their steps.
	Batches *batchSteps `json:"batches,omitempty"`
	check
	Notes []string `json:"notes,omitempty"`
}

type procResult struct {
	Name         string  `json:"name"`
	Pid          int     `json:"pid"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	PeakRSSBytes int64   `json:"peak_rss_bytes"`
}

// latencyResult is the fixed-rate run: per job, outbox.done_at -
// outbox.created_at, in milliseconds.
type latencyResult struct {
	Inflight      int     `json:"inflight"`
	Rate          int     `json:"rate"`            // offered jobs/s asked for
	OfferedPerSec float64 `json:"offered_per_sec"` // what the producer achieved
	// AppliedPerSec is jobs over first commit to last outcome: below
	// OfferedPerSec, the host fell behind and latency includes a backlog.
	AppliedPerSec float64 `json:"applied_per_sec"`
	Seconds       int     `json:"seconds"`
	Jobs          int     `json:"jobs"`
	P50Ms         float64 `json:"p50_ms"`
	P95Ms         float64 `json:"p95_ms"`
	P99Ms         float64 `json:"p99_ms"`
	MaxMs         float64 `json:"max_ms"`
	MeanMs        float64 `json:"mean_ms"`
	// The three legs of each job's latency: outbox commit to the relay's
	// pick-up (published_at, its transaction's start); from there to the
	// host's start of the applied delivery (its history row's
	// started_at: the relay's publish, the stream, the read); and from
	// there to the outcome (the batch, the plugin's call, the commit).
	RelayP50Ms  float64 `json:"relay_p50_ms"`
	RelayP99Ms  float64 `json:"relay_p99_ms"`
	StreamP50Ms float64 `json:"stream_p50_ms"`
	StreamP99Ms float64 `json:"stream_p99_ms"`
	RunP50Ms    float64 `json:"run_p50_ms"`
	RunP99Ms    float64 `json:"run_p99_ms"`
	// Batches are the run's committed batches and the mean of each of
	// their steps.
	Batches *batchSteps `json:"batches,omitempty"`
	check
}

type absorbed struct {
	Guard  string `json:"guard"`
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
}

func (r *results) tally() {
	add := func(c check) {
		r.Lost += c.Lost + c.LostJobs
		r.Doubled += c.Doubled
	}
	r.Lost, r.Doubled = 0, 0
	for _, u := range append(slices.Clone(r.Usher), r.InProcess...) {
		add(u.check)
	}
	if r.Latency != nil {
		add(r.Latency.check)
	}
	if m := r.Mix; m != nil {
		add(m.check)
		r.Lost += m.LostEmails
		r.Doubled += m.DoubledMails
	}
	r.Workflows.tally(&r.Lost, &r.Doubled)
	for _, s := range r.Scale {
		add(s.check)
	}
}

func mib(b int64) string { return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20)) }

// printTable writes the human-readable report.
func (r *results) printTable(w io.Writer) {
	fmt.Fprintf(w, "usher: update_sales_counter (guard: job id recorded), %d jobs over %d events, %s\n", r.Jobs, r.Events, r.Date)
	fmt.Fprintf(w, "command: %s\n\n", r.Command)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "inflight\tjobs/s\tseconds\thost cpu s\tplugin cpu s\thost peak rss\tplugin peak rss\tlost\tdoubled\t")
	for _, u := range r.Usher {
		var pcpu float64
		var prss []string
		for _, p := range u.Plugins {
			pcpu += p.CPUSeconds
			prss = append(prss, mib(p.PeakRSSBytes))
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%d\t%d\t\n", u.Inflight, u.JobsPerSec, u.Seconds, u.HostCPUSeconds, pcpu,
			mib(u.HostPeakRSSBytes), strings.Join(prss, ","), u.Lost+u.LostJobs, u.Doubled)
	}
	_ = tw.Flush()
	for _, u := range r.Usher {
		if u.Batches != nil {
			fmt.Fprintf(w, "  %d in flight, %s (means)\n", u.Inflight, u.Batches)
		}
	}
	if len(r.Boundary) > 0 {
		fmt.Fprintln(w, "\nthe plugin boundary: the same handler inside the host (no process, no gRPC) against the plugin process:")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "inflight\tin-process jobs/s\tplugin jobs/s\tboundary cost\tin-process host cpu s\t")
		for _, b := range r.Boundary {
			cpu := 0.0
			for _, i := range r.InProcess {
				if i.Inflight == b.Inflight {
					cpu = i.HostCPUSeconds
				}
			}
			fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.0f%%\t%.2f\t\n", b.Inflight, b.InProcess, b.Plugin, 100*b.Cost, cpu)
		}
		_ = tw.Flush()
	}
	if m := r.Mix; m != nil {
		fmt.Fprintf(w, "\nthe full Stagedoor mix: %d orders rendered, mailed and counted in %.1fs (%d marked sent, %d messages at the provider, %d counted; lost %d, doubled %d)\n",
			m.Orders, m.Seconds, m.Sent, m.Messages, m.Counted, m.Lost+m.LostJobs+m.LostEmails, m.Doubled+m.DoubledMails)
		fmt.Fprintf(w, "  host + plugins cpu %.2fs, the same PDFs rendered and stored alone %.2fs: the runtime adds %.0f%% (mail provider, not counted: %.2fs)\n",
			m.CPUSeconds, m.RenderAloneCPUSeconds, 100*m.Overhead, m.MailProviderCPUSeconds)
	}
	if l := r.Latency; l != nil {
		fmt.Fprintf(w, "\nlatency (outbox commit -> outcome recorded), %d jobs/s offered (%.0f achieved, %.0f applied) for %ds, inflight %d:\n",
			l.Rate, l.OfferedPerSec, l.AppliedPerSec, l.Seconds, l.Inflight)
		fmt.Fprintf(w, "  p50 %.1f ms  p95 %.1f ms  p99 %.1f ms  max %.1f ms  mean %.1f ms  lost %d  doubled %d\n",
			l.P50Ms, l.P95Ms, l.P99Ms, l.MaxMs, l.MeanMs, l.Lost+l.LostJobs, l.Doubled)
		fmt.Fprintf(w, "  of which commit -> relay pick-up p50 %.1f ms  p99 %.1f ms; pick-up -> host start p50 %.1f ms  p99 %.1f ms; start -> outcome p50 %.1f ms  p99 %.1f ms\n",
			l.RelayP50Ms, l.RelayP99Ms, l.StreamP50Ms, l.StreamP99Ms, l.RunP50Ms, l.RunP99Ms)
		if l.Batches != nil {
			fmt.Fprintf(w, "  %s (means)\n", l.Batches)
		}
	}
	fmt.Fprintln(w, "\nduplicates absorbed per guard:")
	if len(r.Absorbed) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, a := range r.Absorbed {
		fmt.Fprintf(w, "  %s %s (%s): %d\n", a.Guard, a.Kind, a.Reason, a.Count)
	}
	if len(r.Peers) > 0 {
		fmt.Fprintln(w, "\npeers, same workload (ratio = usher jobs/s ÷ peer jobs/s; postgres = one transaction per job, no queue):")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "runtime\tinflight\tjobs/s\tcpu s\tlost\tdoubled\tusher ÷ it\t")
		for _, p := range r.Peers {
			rt := "-"
			for _, x := range r.Ratios {
				if x.Peer == p.Runtime && x.Inflight == p.Inflight {
					rt = fmt.Sprintf("%.2f", x.Ratio)
				}
			}
			fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%d\t%d\t%s\t\n", p.Runtime, p.Inflight, p.JobsPerSec, p.CPUSeconds, p.Lost, p.Doubled, rt)
		}
		_ = tw.Flush()
		for _, b := range r.Best {
			fmt.Fprintf(w, "  best against best: usher %.0f jobs/s (%d in flight) ÷ %s %.0f (%d in flight) = %.2f\n",
				b.Usher, b.UsherInflight, b.Peer, b.Other, b.PeerInflight, b.Ratio)
		}
	}
	r.Workflows.print(w)
	printScale(w, r.Scale)
	if len(r.Plots) > 0 {
		fmt.Fprintf(w, "\nplots: %s\n", strings.Join(r.Plots, ", "))
	}
	for _, e := range r.Errors {
		fmt.Fprintf(w, "error: %s\n", e)
	}
}

// plotThroughput draws jobs/s against jobs in flight, one line per runtime.
func plotThroughput(path string, usher []levelResult, peers []peerResult) error {
	series := map[string]plotter.XYs{}
	var names []string
	addPoint := func(name string, x int, y float64) {
		if y <= 0 {
			return
		}
		if _, ok := series[name]; !ok {
			names = append(names, name)
		}
		series[name] = append(series[name], plotter.XY{X: float64(x), Y: y})
	}
	var levels []int
	for _, u := range usher {
		addPoint("usher", u.Inflight, u.JobsPerSec)
		levels = append(levels, u.Inflight)
	}
	for _, p := range peers {
		addPoint(p.Runtime, p.Inflight, p.JobsPerSec)
		levels = append(levels, p.Inflight)
	}
	if len(names) == 0 {
		return fmt.Errorf("no throughput to plot")
	}
	p := plot.New()
	p.Title.Text = "update_sales_counter: throughput"
	p.X.Label.Text = "jobs in flight"
	p.Y.Label.Text = "jobs/s"
	p.Y.Min = 0
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs = vg.Centimeter
	slices.Sort(levels)
	var ticks []plot.Tick
	for _, l := range slices.Compact(levels) {
		ticks = append(ticks, plot.Tick{Value: float64(l), Label: fmt.Sprint(l)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = 0, float64(slices.Max(levels))*1.1
	var lines []any
	var top float64
	for _, n := range names {
		for _, xy := range series[n] {
			top = max(top, xy.Y)
		}
		xys := series[n]
		slices.SortFunc(xys, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		lines = append(lines, n, xys)
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return err
	}
	p.Y.Max = top * 1.3 // room for the legend
	return p.Save(16*vg.Centimeter, 10*vg.Centimeter, path)
}

// plotLatency draws the latency CDF (ms sorted ascending), with the
// percentiles reported marked.
func plotLatency(path string, ms []float64, l latencyResult) error {
	if len(ms) == 0 {
		return fmt.Errorf("no latency to plot")
	}
	step := max(1, len(ms)/2000)
	var xys plotter.XYs
	for i := 0; i < len(ms); i += step {
		xys = append(xys, plotter.XY{X: ms[i], Y: float64(i+1) / float64(len(ms))})
	}
	xys = append(xys, plotter.XY{X: ms[len(ms)-1], Y: 1})
	p := plot.New()
	p.Title.Text = fmt.Sprintf("update_sales_counter: latency at %d jobs/s offered (inflight %d)", l.Rate, l.Inflight)
	p.X.Label.Text = "outbox commit -> outcome recorded (ms)"
	p.Y.Label.Text = "fraction of jobs"
	p.Y.Min, p.Y.Max = 0, 1
	p.X.Min = 0
	p.Add(plotter.NewGrid())
	line, err := plotter.NewLine(xys)
	if err != nil {
		return err
	}
	line.Color = color.RGBA{B: 200, A: 255}
	p.Add(line)
	p.Legend.Add(fmt.Sprintf("p50 %.1f  p95 %.1f  p99 %.1f  max %.1f ms", l.P50Ms, l.P95Ms, l.P99Ms, l.MaxMs), line)
	p.Legend.Left, p.Legend.Top = false, false
	return p.Save(16*vg.Centimeter, 10*vg.Centimeter, path)
}

// writePlots writes what there is to plot into dir and returns the files.
func writePlots(dir string, r *results, ms []float64) ([]string, error) {
	var files []string
	var errs []string
	if len(r.Usher) > 0 {
		f := filepath.Join(dir, "throughput.png")
		if err := plotThroughput(f, r.Usher, r.Peers); err != nil {
			errs = append(errs, err.Error())
		} else {
			files = append(files, f)
		}
	}
	if r.Latency != nil && len(ms) > 0 {
		f := filepath.Join(dir, "latency.png")
		if err := plotLatency(f, ms, *r.Latency); err != nil {
			errs = append(errs, err.Error())
		} else {
			files = append(files, f)
		}
	}
	if len(errs) > 0 {
		return files, fmt.Errorf("plots: %s", strings.Join(errs, "; "))
	}
	return files, nil
}
