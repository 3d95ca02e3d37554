package main

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/internal/doctest"
)

func TestFlagsAreStrict(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"extra"},
		{"--jobs", "10", "extra", "--peers=false"}, // a flag after an argument is misplaced
		{"--inflight", "4,x"},
		{"--inflight", "4,4"},
		{"--jobs", "0"},
		{"--rate", "0"},
		{"--timeout", "0s"},
	} {
		_, err := parseConfig(args, io.Discard)
		require.Error(t, err, "%q", args)
	}
	cfg, err := parseConfig(nil, io.Discard)
	require.NoError(t, err)
	require.Equal(t, []int{16, 64}, cfg.Inflight)
	require.Equal(t, 20000, cfg.Jobs)
	require.Equal(t, filepath.Join("bench-results", "host.log"), cfg.Log)
}

// readmeBench returns docs/benchmarks.md's commands.
func readmeBench(t *testing.T) []string {
	t.Helper()
	var lines []string
	for _, l := range doctest.Block(t, "docs/benchmarks.md", "## Running them", "sh") {
		l, _, _ = strings.Cut(l, "  #") // the README's comment
		lines = append(lines, strings.TrimSpace(l))
	}
	return lines
}

// services are the test's Postgres and Redis (USHER_TEST_*), appended to a
// README command line: the last occurrence of a flag wins.
func services() string {
	return " --admin-url " + hosttest.DatabaseURL() + " --redis-url " + hosttest.RedisURL()
}

// The README's quick command, run as written by sh in a directory laid out
// as `make build` leaves the repository (bin/bench, bin/plugins with the
// counters plugin and its manifest); then its JSON and plots are checked.
func TestREADMEQuickRun(t *testing.T) {
	t.Parallel()
	lines := readmeBench(t)
	require.Len(t, lines, 2)
	quick := lines[1]
	require.True(t, strings.HasPrefix(quick, "bin/bench "), quick)

	dir := t.TempDir()
	plugins := filepath.Join(dir, "bin", "plugins")
	require.NoError(t, os.MkdirAll(plugins, 0o755))
	for name, kinds := range map[string][]string{"counters": {"update_sales_counter"}, "tickets": {"render_tickets", "send_tickets"}} {
		bin := filepath.Join(plugins, name)
		b, err := os.ReadFile(hosttest.Build(t, "./plugins/"+name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(bin, b, 0o755))
		// As make plugins writes them: the grants, the tickets plugin's
		// migrations beside its binary.
		db := filepath.Join(hosttest.ModuleRoot(t), "plugins", name, "db")
		args := []string{"plugins", "manifest", bin, "--name", name, "--version", "1.0.0", "--write", "--grants", filepath.Join(db, "grants.json")}
		if name == "tickets" {
			require.NoError(t, os.CopyFS(filepath.Join(plugins, "tickets-migrations"), os.DirFS(filepath.Join(db, "migrations"))))
			args = append(args, "--migrations", filepath.Join(plugins, "tickets-migrations"))
		}
		for _, k := range kinds {
			args = append(args, "--kind", k)
		}
		out, err := exec.Command(hosttest.Build(t, "./cmd/host"), args...).CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	require.NoError(t, os.Symlink(hosttest.Build(t, "./cmd/bench"), filepath.Join(dir, "bin", "bench")))
	require.NoError(t, os.Symlink(hosttest.Build(t, "./cmd/mailprovider"), filepath.Join(dir, "bin", "mailprovider")))

	cmd := exec.Command("sh", "-c", quick+services())
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "bench: inflight 4: throughput") // the progress lines

	checkResults(t, filepath.Join(dir, "bench-results"), 4)
	// --cpu-profile: one profile per throughput window, plugin and in-process,
	// and the plugin process's own over its window (SIGUSR1).
	for _, name := range []string{"host-inflight-4.pprof", "host-inflight-4-in-process.pprof", "host-mix.pprof", "plugin-inflight-4.pprof"} {
		fi, err := os.Stat(filepath.Join(dir, "bench-results", "profiles", name))
		require.NoError(t, err)
		require.Greater(t, fi.Size(), int64(0), name)
	}
}

// checkResults reads dir's bench.json: nothing lost or doubled, a
// throughput per level, a latency run, and the plots written.
func checkResults(t *testing.T, dir string, inflight int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "bench.json"))
	require.NoError(t, err)
	var r map[string]any
	require.NoError(t, json.Unmarshal(b, &r), "%s", b)
	require.EqualValues(t, 0, r["lost"])
	require.EqualValues(t, 0, r["doubled"])
	require.Nil(t, r["errors"])
	usher := r["usher"].([]any)
	require.Len(t, usher, 1)
	u := usher[0].(map[string]any)
	require.EqualValues(t, inflight, u["inflight"])
	require.Greater(t, u["jobs_per_sec"], 0.0)
	require.Greater(t, u["cpu_seconds"], 0.0)
	require.Greater(t, u["host_peak_rss_bytes"], 0.0)
	// The window's committed batches, and each step's mean.
	batches, ok := u["batches"].(map[string]any)
	require.True(t, ok, "no batches in %v", u)
	require.Greater(t, batches["batches"], 0.0)
	for _, step := range []string{"record_ms", "invoke_ms", "writes_ms", "commit_ms"} {
		require.Greater(t, batches[step], 0.0, step)
	}
	plugins := u["plugins"].([]any)
	require.Len(t, plugins, 1)
	require.Equal(t, "counters", plugins[0].(map[string]any)["name"])
	require.Greater(t, plugins[0].(map[string]any)["peak_rss_bytes"], 0.0)
	// The same handler inside the host, and the boundary's cost from it.
	inProcess := r["usher_in_process"].([]any)
	require.Len(t, inProcess, 1)
	ip := inProcess[0].(map[string]any)
	require.EqualValues(t, inflight, ip["inflight"])
	require.Greater(t, ip["jobs_per_sec"], 0.0)
	require.Nil(t, ip["plugins"], "an in-process handler has no process of its own")
	bound := r["boundary"].([]any)
	require.Len(t, bound, 1)
	require.Less(t, bound[0].(map[string]any)["cost"], 1.0)
	// The full Stagedoor mix, against the PDFs rendered alone.
	mix := r["mix"].(map[string]any)
	require.Equal(t, mix["orders"], mix["sent"])
	require.Equal(t, mix["orders"], mix["messages"])
	require.Greater(t, mix["render_alone_cpu_seconds"], 0.0)
	require.Greater(t, mix["cpu_seconds"], 0.0)
	// The workflow rows: a throughput per level, the latency run, the
	// idle run with its sleepers asleep.
	wf := r["workflows"].(map[string]any)
	levels := wf["levels"].([]any)
	require.Len(t, levels, 1)
	wl := levels[0].(map[string]any)
	require.Equal(t, "usher", wl["runtime"])
	require.Greater(t, wl["workflows_per_sec"], 0.0)
	require.EqualValues(t, 0, wl["lost"])
	require.EqualValues(t, 0, wl["doubled"])
	wlat := wf["latency"].([]any)[0].(map[string]any)
	require.Greater(t, wlat["p50_ms"], 0.0)
	require.LessOrEqual(t, wlat["p50_ms"], wlat["p99_ms"])
	require.Greater(t, wlat["decision_p50_ms"], 0.0)
	idle := wf["idle"].([]any)[0].(map[string]any)
	require.Greater(t, idle["sleeping"], 0.0)
	require.Greater(t, idle["goroutines"], 0.0)
	// The scale rows (--scale 3x6): three hosts on six shards, each
	// with its rate and CPU per job, nothing lost or doubled.
	scale := r["scale"].([]any)
	require.NotEmpty(t, scale)
	for _, row := range scale {
		sr := row.(map[string]any)
		require.EqualValues(t, 3, sr["hosts"])
		require.EqualValues(t, 6, sr["shards"])
		require.Greater(t, sr["jobs_per_sec"], 0.0)
		require.Greater(t, sr["host_cpu_us_per_job"], 0.0)
		require.Greater(t, sr["plugin_cpu_us_per_job"], 0.0)
		require.EqualValues(t, 0, sr["lost"])
		require.EqualValues(t, 0, sr["lost_jobs"])
		require.EqualValues(t, 0, sr["doubled"])
	}
	lat := r["latency"].(map[string]any)
	for _, k := range []string{"p50_ms", "p95_ms", "p99_ms", "max_ms"} {
		require.Greater(t, lat[k], 0.0, k)
	}
	require.LessOrEqual(t, lat["p50_ms"], lat["p99_ms"])
	require.LessOrEqual(t, lat["p99_ms"], lat["max_ms"])
	for _, f := range []string{"throughput.png", "latency.png"} {
		st, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err)
		require.Greater(t, st.Size(), int64(1000), f)
	}
}

// The README's `make bench`, as written, in the repository, on a small run:
// BENCH_FLAGS and BENCH_TIME come from the environment (the Makefile takes
// them with ?=). Skipped with -short: it builds everything and runs the
// host's Go benchmarks too.
func TestREADMEMakeBench(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the repository and runs every Go benchmark")
	}
	t.Parallel()
	lines := readmeBench(t)
	require.Equal(t, "make bench", lines[0])
	results := t.TempDir()
	cmd := exec.Command("sh", "-c", lines[0])
	cmd.Dir = hosttest.ModuleRoot(t)
	cmd.Env = append(os.Environ(),
		"BENCH_FLAGS=--jobs 300 --inflight 4 --rate 100 --rate-seconds 2 --warmup 100 --mix 20 --peers=false "+
			"--workflows 30 --workflow-rate 10 --workflow-rate-seconds 1 --sleeping 200 --idle-window 1s --scale 3x6 --plots "+results+
			" --json "+filepath.Join(results, "bench.json")+services(),
		"BENCH_TIME=5x")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "BenchmarkCountersEndToEnd")
	checkResults(t, results, 4)
}

// Every bin/bench command line the documents quote in their prose (how a
// figure was measured) parses as bench's flags: a flag renamed or
// misspelt there is an error here, never a command a reader cannot run.
func TestREADMEQuotedCommandsParse(t *testing.T) {
	t.Parallel()
	n := 0
	for _, file := range doctest.Files(t) {
		// A quoted command may wrap over lines: join them first.
		text := strings.Join(strings.Fields(doctest.Read(t, file)), " ")
		for _, part := range strings.Split(text, "`bin/bench ")[1:] {
			line, _, ok := strings.Cut(part, "`")
			require.True(t, ok, "%s: an unterminated command: %q", file, part[:min(len(part), 80)])
			_, err := parseConfig(strings.Fields(line), io.Discard)
			require.NoError(t, err, "%s: bin/bench %s", file, line)
			n++
		}
	}
	require.GreaterOrEqual(t, n, 3, "docs/benchmarks.md quotes its measuring commands")
}

// The command docs/scaling.md gives for its table parses as bench's
// flags (its numbers come from that line, run as written).
func TestScalingDocCommandParses(t *testing.T) {
	t.Parallel()
	n := 0
	for _, line := range doctest.Block(t, "docs/scaling.md", "## The measurement", "sh") {
		if rest, ok := strings.CutPrefix(line, "bin/bench "); ok {
			cfg, err := parseConfig(strings.Fields(rest), io.Discard)
			require.NoError(t, err, line)
			require.NotEmpty(t, cfg.Scale, "the command runs the scale rows")
			require.True(t, cfg.ScaleCluster, "and on the cluster")
			n++
		}
	}
	require.Equal(t, 1, n, "docs/scaling.md gives its measuring command")
}

// Best against best takes each runtime at its own fastest level, which
// need not be the same level: usher's 256 against asynq's 64.
func TestBestRatios(t *testing.T) {
	usher := []levelResult{{Inflight: 16, JobsPerSec: 4000}, {Inflight: 64, JobsPerSec: 7000}, {Inflight: 256, JobsPerSec: 10000}}
	peers := []peerResult{
		{Runtime: "river", Inflight: 16, JobsPerSec: 1500}, {Runtime: "river", Inflight: 64, JobsPerSec: 2000}, {Runtime: "river", Inflight: 256, JobsPerSec: 1600},
		{Runtime: "asynq", Inflight: 16, JobsPerSec: 3000}, {Runtime: "asynq", Inflight: 64, JobsPerSec: 4000}, {Runtime: "asynq", Inflight: 256, JobsPerSec: 0},
	}
	require.Equal(t, []bestRatio{
		{Peer: "river", UsherInflight: 256, Usher: 10000, PeerInflight: 64, Other: 2000, Ratio: 5},
		{Peer: "asynq", UsherInflight: 256, Usher: 10000, PeerInflight: 64, Other: 4000, Ratio: 2.5},
	}, bestRatios(usher, peers))
	require.Nil(t, bestRatios(nil, peers), "no usher level, no ratio")
}
