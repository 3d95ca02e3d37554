package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// TestPeersSmall runs the command as `make bench` does (--json), on a small
// workload, against real Postgres and Redis, and checks every runtime applied
// every job exactly once.
func TestPeersSmall(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{
		"--database-url", envOr("USHER_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
		"--redis-url", envOr("USHER_TEST_REDIS_URL", "redis://127.0.0.1:6379"),
		"--jobs", "300", "--events", "10", "--inflight", "4",
		"--runtimes", "river,asynq,postgres", "--json", "--timeout", "2m",
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	var results []result
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil {
		t.Fatalf("stdout is not the JSON schema: %v\n%s", err, stdout.String())
	}
	if len(results) != 3 {
		t.Fatalf("got %d results, want 3: %+v", len(results), results)
	}
	for i, want := range []string{"river", "asynq", "postgres"} {
		r := results[i]
		if r.Runtime != want || r.Inflight != 4 || r.Jobs != 300 {
			t.Errorf("result %d: got %s/%d/%d, want %s/4/300", i, r.Runtime, r.Inflight, r.Jobs, want)
		}
		if r.Lost != 0 || r.Doubled != 0 {
			t.Errorf("%s: lost=%d doubled=%d, want 0 and 0", r.Runtime, r.Lost, r.Doubled)
		}
		if r.Seconds <= 0 || r.JobsPerSec <= 0 || strings.Contains(r.Notes, "error:") {
			t.Errorf("%s: seconds=%v jobs_per_sec=%v notes=%q", r.Runtime, r.Seconds, r.JobsPerSec, r.Notes)
		}
	}
}

// TestDBOSWorkflow3Small runs workflow3 on DBOS small, every phase, and
// checks each step applied its seats once and every measurement is there.
func TestDBOSWorkflow3Small(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{
		"--database-url", envOr("USHER_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test"),
		"--workload", "workflow3", "--runtimes", "dbos",
		"--jobs", "50", "--events", "10", "--inflight", "4",
		"--rate", "20", "--rate-seconds", "1", "--sleeping", "200", "--idle-seconds", "1",
		"--json", "--timeout", "2m",
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	var results []result
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil {
		t.Fatalf("stdout is not the JSON schema: %v\n%s", err, stdout.String())
	}
	if len(results) != 1 {
		t.Fatalf("got %d results, want 1: %+v", len(results), results)
	}
	r := results[0]
	if r.Runtime != "dbos" || r.Workload != "workflow3" || r.Inflight != 4 || r.Workflows != 50 {
		t.Errorf("got %s/%s/%d/%d, want dbos/workflow3/4/50", r.Runtime, r.Workload, r.Inflight, r.Workflows)
	}
	if r.Lost != 0 || r.Doubled != 0 {
		t.Errorf("lost=%d doubled=%d, want 0 and 0", r.Lost, r.Doubled)
	}
	if r.Seconds <= 0 || r.WorkflowsPerSec <= 0 || strings.Contains(r.Notes, "error:") {
		t.Errorf("seconds=%v workflows_per_sec=%v notes=%q", r.Seconds, r.WorkflowsPerSec, r.Notes)
	}
	if r.RateWorkflows != 20 || r.P50Ms <= 0 || r.P99Ms < r.P50Ms {
		t.Errorf("rate_workflows=%d p50_ms=%v p99_ms=%v, want 20 and 0 < p50 <= p99", r.RateWorkflows, r.P50Ms, r.P99Ms)
	}
	if r.Sleeping != 200 || r.IdleSeconds <= 0 || r.IdleGoroutines <= 0 || r.IdleRSSMB <= 0 {
		t.Errorf("sleeping=%d idle_seconds=%v idle_goroutines=%d idle_rss_mb=%v", r.Sleeping, r.IdleSeconds, r.IdleGoroutines, r.IdleRSSMB)
	}
}

func TestParseConfigRejects(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--runtimes", "sidekiq"},
		{"--inflight", "0"},
		{"--inflight", "16,x"},
		{"--jobs", "0"},
		{"--river-fetch-cooldown", "0s"},
		{"--workload", "saga"},
		{"--runtimes", "dbos"},      // dbos runs only workflow3
		{"--workload", "workflow3"}, // default runtimes are counter runtimes
		{"--workload", "workflow3", "--runtimes", "dbos,river"},
		{"--workload", "workflow3", "--runtimes", "dbos", "--rate", "0"},
		{"--workload", "workflow3", "--runtimes", "dbos", "--sleeping", "-1"},
		{"extra"},
	} {
		if _, err := parseConfig(args, &bytes.Buffer{}); err == nil {
			t.Errorf("parseConfig(%q): no error", args)
		}
	}
}
