package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
)

// The operator commands against a database holding one dead letter.
func TestDeadLetterCommands(t *testing.T) {
	t.Parallel()
	pool, url := hosttest.DB(t)
	_, stream := hosttest.Redis(t)
	bin := hosttest.Build(t, "./cmd/host")
	ctx := context.Background()
	_, err := deadletter.Add(ctx, pool, deadletter.Letter{JobID: "42", Kind: "update_sales_counter", Payload: []byte(`{"order_id":42}`),
		Reason: "permanent failure: order 42 does not exist", LastError: "order 42 does not exist", Attempts: 1, StreamID: "1-0"})
	require.NoError(t, err)
	host := func(args ...string) string {
		t.Helper()
		args = append(args, "--database-url", url)
		if args[0] == "inspect" {
			args = append(args, "--stream", stream)
		}
		cmd := exec.Command(bin, args...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		return string(out)
	}

	out := host("deadletters", "list")
	require.Contains(t, out, "update_sales_counter")
	require.Contains(t, out, "order 42 does not exist")
	var id string
	require.NoError(t, pool.QueryRow(ctx, `SELECT id::text FROM dead_letters`).Scan(&id))
	require.Contains(t, host("deadletters", "show", id, "--json"), `"payload": "{\"order_id\":42}"`)
	require.Contains(t, host("deadletters", "requeue", id), "requeued 1 dead letter(s)")
	require.Contains(t, host("deadletters", "list"), "no open dead letters")
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE job_id = '42'`), "back in the outbox with its identity")
	require.Contains(t, host("inspect"), "outbox unpublished  1")

	// A letter whose entry was not text shows its raw bytes quoted.
	_, err = deadletter.Add(ctx, pool, deadletter.Letter{JobID: deadletter.Text("x-\xff"), Kind: "update_sales_counter", Payload: []byte(`{}`),
		Reason: "malformed entry: field job_id is not valid UTF-8", Attempts: 1, StreamID: "2-0",
		Raw: []deadletter.RawField{{Name: []byte("job_id"), Value: []byte("x-\xff"), NameBytes: 6, ValueBytes: 3}}})
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, `SELECT id::text FROM dead_letters WHERE stream_id = '2-0'`).Scan(&id))
	out = host("deadletters", "show", "--json", id)
	require.Contains(t, out, `"job_id": "\"x-\\xff\""`)
	require.Contains(t, out, `"field": "job_id"`)
	require.Contains(t, out, `"value": "\"x-\\xff\""`)

	bad := exec.Command(bin, "deadletters", "--database-url", url, "requeue", "nope")
	msg, err := bad.CombinedOutput()
	require.Error(t, err)
	require.True(t, strings.Contains(string(msg), `"nope" is not a dead letter ID`), "%s", msg)
}
