package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/history"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/internal/doctest"
)

// The Operating section's history commands, as written, with and without
// --json: ID is a render job, REQUEST_ID its order's request; the database
// comes from DATABASE_URL.
func TestREADMEHistoryCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, dbURL := hosttest.DB(t)
	ids, err := outbox.Add(ctx, pool, outbox.Message{Kind: "render_tickets", Payload: []byte(`{"order_id":1}`), RequestID: "req-readme"})
	require.NoError(t, err)
	require.NoError(t, history.Write(ctx, pool, history.Record{JobID: "1", Kind: "render_tickets", OutboxID: ids[0], RequestID: "req-readme",
		Deliveries: 1, Consumer: "host-a", Plugin: "tickets", PluginVersion: "1.0.0", Guard: "state_first",
		Verdict: history.Absorbed, Reason: "state already reached at check", StartedAt: time.Now()}))
	dir := binDir(t)
	env := []string{"DATABASE_URL=" + dbURL}

	ran := 0
	for _, line := range doctest.Block(t, "docs/operating.md", "## The commands", "text") {
		if !strings.HasPrefix(line, "bin/host jobs show") && !strings.HasPrefix(line, "bin/host workflows") {
			continue
		}
		for _, l := range expand(line) {
			l = strings.ReplaceAll(strings.ReplaceAll(l, " REQUEST_ID", " req-readme"), " ID", " 1")
			out := readmeShell(t, dir, env, l)
			if strings.Contains(l, "--json") {
				require.True(t, json.Valid([]byte(out)), "%s: %s", l, out)
			}
			require.Contains(t, out, "state already reached at check", l)
			require.Contains(t, out, "render_tickets", l)
			ran++
		}
	}
	require.Equal(t, 4, ran, "jobs show ×2, workflows show ×2")
}
