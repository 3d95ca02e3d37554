package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden with the commands' output")

// goldenNow is the clock of the golden runs: 90 minutes after the letters.
var goldenCreated = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// The read commands' output, text and JSON, on a known state: two dead
// letters (one with a raw entry), a job in the outbox unpublished for an
// hour, scheduled runs, processed ids, absorbed duplicates, and a stream
// whose group has three entries pending on two consumers (the oldest 90
// minutes old) and one not yet delivered. Run with -update to rewrite testdata/*.golden.
func TestGoldenOutput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)

	_, err := deadletter.Add(ctx, pool, deadletter.Letter{JobID: "42", Kind: "update_sales_counter", Payload: []byte(`{"order_id":42}`),
		RequestID: "req-42", Reason: "permanent failure: order 42 does not exist", LastError: "order 42 does not exist", Attempts: 3, StreamID: "1-0"})
	require.NoError(t, err)
	_, err = deadletter.Add(ctx, pool, deadletter.Letter{JobID: deadletter.Text("x-\xff"), Kind: "send_tickets", Payload: []byte(`{}`),
		Reason: "malformed entry: field job_id is not valid UTF-8", Attempts: 1, StreamID: "2-0",
		Raw: []deadletter.RawField{{Name: []byte("job_id"), Value: []byte("x-\xff"), NameBytes: 6, ValueBytes: 3}}})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE dead_letters SET created_at = $1`, goldenCreated)
	require.NoError(t, err)
	_, err = outbox.Add(ctx, pool, outbox.Message{Kind: "render_tickets", Payload: []byte(`{"order_id":7}`)})
	require.NoError(t, err)
	// Unpublished for an hour at goldenNow: the relay lag.
	_, err = pool.Exec(ctx, `UPDATE outbox SET created_at = $1`, goldenCreated.Add(30*time.Minute))
	require.NoError(t, err)
	for _, q := range []string{
		`INSERT INTO processed_jobs (job_id, kind) VALUES ('1', 'update_sales_counter'), ('2', 'update_sales_counter')`,
		`INSERT INTO scheduled_jobs (job_id, attempt, kind, payload, run_at) VALUES
			('3', 2, 'send_tickets', '{}', now() - interval '1 minute'),
			('4', 2, 'send_tickets', '{}', now() + interval '1 hour'),
			('5', 3, 'send_tickets', '{}', now() + interval '2 hours')`,
		`INSERT INTO absorbed_duplicates (guard, kind, reason, count) VALUES
			('job id recorded', 'update_sales_counter', 'job id already processed', 4),
			('state first', 'render_tickets', 'already rendered', 2)`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	require.NoError(t, rdb.XGroupCreateMkStream(ctx, stream, "usher", "0").Err())
	// Entries added at the letters' time, a millisecond apart: the oldest
	// pending is 90 minutes old at goldenNow.
	for i := range 4 {
		id := fmt.Sprintf("%d-0", goldenCreated.UnixMilli()+int64(i))
		require.NoError(t, rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, ID: id, Values: []any{"k", "v"}}).Err())
	}
	for consumer, n := range map[string]int64{"host-b": 2, "host-a": 1} {
		require.NoError(t, rdb.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "usher", Consumer: consumer, Streams: []string{stream, ">"}, Count: n}).Err())
	}

	db := []string{"--database-url", dbURL}
	for name, args := range map[string][]string{
		"inspect":                append([]string{"inspect", "--stream", stream}, db...),
		"inspect.json":           append([]string{"inspect", "--json", "--stream", stream}, db...),
		"inspect-no-group":       append([]string{"inspect", "--stream", stream + ":none"}, db...),
		"deadletters-list":       append([]string{"deadletters", "list"}, db...),
		"deadletters-list.json":  append([]string{"deadletters", "list", "--json"}, db...),
		"deadletters-list-kind":  append([]string{"deadletters", "list", "--kind", "send_tickets"}, db...),
		"deadletters-show":       append([]string{"deadletters", "show", "1"}, db...),
		"deadletters-show.json":  append([]string{"deadletters", "show", "1", "--json"}, db...),
		"deadletters-show-raw":   append([]string{"deadletters", "show", "2"}, db...),
		"deadletters-list-empty": append([]string{"deadletters", "list", "--kind", "none"}, db...),
		"help-deadletters":       {"deadletters", "-h"},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout bytes.Buffer
			cl := &cli{stdout: &stdout, stderr: os.Stderr, now: func() time.Time { return goldenCreated.Add(90 * time.Minute) }}
			require.NoError(t, ignoreHelp(cl.run(ctx, args)))
			golden(t, name, strings.ReplaceAll(stdout.String(), stream, "STREAM"))
		})
	}
}

func ignoreHelp(err error) error {
	if err == flag.ErrHelp {
		return nil
	}
	return err
}

// golden compares got with testdata/name.golden, or writes it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./cmd/host -run TestGoldenOutput -update")
	require.Equal(t, string(want), got)
}
