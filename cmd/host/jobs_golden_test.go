package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
)

// The history commands' output, text and JSON, on a known state: request
// req-7's order started a counter job (applied after a retry, a duplicate
// absorbed) and a render (applied) whose send failed once and waits to
// retry; request req-8's counter job was dead-lettered. Run with -update
// to rewrite testdata/*.golden.
func TestGoldenHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	at := func(sec int) time.Time { return goldenCreated.Add(time.Duration(sec) * time.Second) }
	for _, q := range []string{
		`INSERT INTO outbox (id, kind, payload, request_id, job_id, attempt, parent_job_id, published_at, done_at, outcome) VALUES
			(1, 'update_sales_counter', '{"order_id":7}', 'req-7', NULL, 0, NULL, $1, $1, 'retry_scheduled'),
			(2, 'render_tickets', '{"order_id":7}', 'req-7', NULL, 0, NULL, $1, $1, 'applied'),
			(3, 'update_sales_counter', '{"order_id":7}', 'req-7', '1', 1, NULL, $1, $1, 'applied'),
			(4, 'send_tickets', '{"order_id":7}', 'req-7', NULL, 0, '2', $1, $1, 'retry_scheduled'),
			(5, 'update_sales_counter', '{"order_id":8}', 'req-8', NULL, 0, NULL, $1, $1, 'dead_letter')`,
		`INSERT INTO scheduled_jobs (job_id, attempt, kind, payload, request_id, reason, run_at) VALUES
			('4', 1, 'send_tickets', '{"order_id":7}', 'req-7', 'mail provider unavailable', $1::timestamptz + interval '1 hour')`,
		`INSERT INTO dead_letters (job_id, kind, payload, request_id, reason, last_error, attempts, stream_id, created_at) VALUES
			('5', 'update_sales_counter', '{"order_id":8}', 'req-8', 'permanent: order 8 does not exist', 'order 8 does not exist', 1, '5-0', $1)`,
	} {
		_, err := pool.Exec(ctx, q, at(0))
		require.NoError(t, err)
	}
	type rec struct {
		job, kind, req                        string
		outbox, attempt, deliveries           int
		stream, consumer, plugin, guard, verd string
		reason, err                           string
		start, took                           int // seconds after goldenCreated, milliseconds
	}
	for _, r := range []rec{
		{"1", "update_sales_counter", "req-7", 1, 0, 1, "1-0", "host-a", "counters", "job_id", "retry_scheduled", "apply: fault: injected transient error; runs again in 200ms", "apply: fault: injected transient error", 1, 12},
		{"1", "update_sales_counter", "req-7", 1, 0, 1, "2-0", "host-b", "counters", "job_id", "applied", "", "", 2, 8},
		{"1", "update_sales_counter", "req-7", 3, 1, 1, "6-0", "host-a", "counters", "job_id", "absorbed", "job id already recorded", "", 3, 3},
		{"2", "render_tickets", "req-7", 2, 0, 1, "3-0", "host-a", "tickets", "state_first", "abandoned", "", "commit of render_tickets job 2 did not complete: plugin tickets crashed", 4, 950},
		{"2", "render_tickets", "req-7", 2, 0, 2, "3-0", "host-b", "tickets", "state_first", "applied", "", "", 6, 420},
		{"4", "send_tickets", "req-7", 4, 0, 1, "7-0", "host-b", "tickets", "claim", "retry_scheduled", "effect: mail provider unavailable; runs again in 1h0m0s", "effect: mail provider unavailable", 7, 31},
		{"5", "update_sales_counter", "req-8", 5, 0, 1, "5-0", "host-a", "counters", "job_id", "dead_letter", "permanent: order 8 does not exist", "order 8 does not exist", 8, 5},
		// Job 9's outbox row is gone (retention): only its history is left,
		// and its payload with the row.
		{"9", "update_sales_counter", "req-9", 9, 0, 1, "9-0", "host-a", "counters", "job_id", "applied", "", "", 9, 4},
	} {
		_, err := pool.Exec(ctx, `INSERT INTO job_history (job_id, kind, outbox_id, request_id, attempt, deliveries, stream_id, consumer,
			plugin, plugin_version, guard, verdict, reason, error, started_at, finished_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, '1.0.0', $10, $11, $12, $13, $14, $15)`,
			r.job, r.kind, r.outbox, r.req, r.attempt, r.deliveries, r.stream, r.consumer, r.plugin, r.guard, r.verd, r.reason, r.err,
			at(r.start), at(r.start).Add(time.Duration(r.took)*time.Millisecond))
		require.NoError(t, err)
	}

	db := []string{"--database-url", dbURL}
	for name, args := range map[string][]string{
		"jobs-show":           append([]string{"jobs", "show", "1"}, db...),
		"jobs-show.json":      append([]string{"jobs", "--json", "show", "1"}, db...),
		"jobs-show-dead":      append([]string{"jobs", "show", "5"}, db...),
		"jobs-show-gone.json": append([]string{"jobs", "--json", "show", "9"}, db...),
		"workflows-show":      append([]string{"workflows", "show", "req-7"}, db...),
		"workflows-show.json": append([]string{"workflows", "show", "req-7", "--json"}, db...),
		"help-jobs":           {"jobs", "-h"},
		"help-workflows-show": {"workflows", "show", "-h"},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout bytes.Buffer
			cl := &cli{stdout: &stdout, stderr: os.Stderr, now: func() time.Time { return goldenCreated.Add(90 * time.Minute) }}
			require.NoError(t, ignoreHelp(cl.run(ctx, args)))
			golden(t, name, stdout.String())
		})
	}
	for _, args := range [][]string{{"jobs", "show", "99"}, {"workflows", "show", "req-none"}} {
		var stdout bytes.Buffer
		cl := &cli{stdout: &stdout, stderr: os.Stderr, now: time.Now}
		err := cl.run(ctx, append(args, db...))
		require.ErrorContains(t, err, "no ")
	}
}
