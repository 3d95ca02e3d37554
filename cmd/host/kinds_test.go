package main

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/internal/doctest"
)

// host kinds pause, resume and paused, as an operator types them: each
// change recorded with who (--by, else $USER@hostname) and the database
// login, a repeat reported and not recorded, inspect showing the paused
// kind, a job of it shown as held by the pause (and no longer once
// resumed), and wrong command lines refused with exit status 2.
func TestPauseCLI(t *testing.T) {
	t.Parallel()
	pool, db := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	require.NoError(t, rdb.XGroupCreateMkStream(t.Context(), stream, "usher", "0").Err())
	bin := hosttest.Build(t, "./cmd/host")
	env := []string{"DATABASE_URL=" + db, "USHER_STREAM=" + stream, "REDIS_URL=" + hosttest.RedisURL(), "USER=grace"}
	ids, err := outbox.Add(t.Context(), pool, outbox.Message{Kind: "update_sales_counter", Payload: []byte(`{"order_id":1}`)})
	require.NoError(t, err)
	job := strconv.FormatInt(ids[0], 10)
	held := "state       pending, held: kind update_sales_counter paused by ada since "
	for _, tc := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"kinds", "paused"}, 0, []string{"no kind is paused"}},
		{[]string{"jobs", "show", job}, 0, []string{"state       pending\n"}},
		{[]string{"kinds", "pause", "update_sales_counter", "--by", "ada", "--reason", "provider outage"}, 0, []string{"paused update_sales_counter: every host"}},
		{[]string{"jobs", "show", job}, 0, []string{held, " (provider outage); no host starts it until `host kinds resume update_sales_counter`"}},
		{[]string{"kinds", "pause", "update_sales_counter"}, 0, []string{"update_sales_counter is paused already, since ", " by ada"}},
		{[]string{"kinds", "paused"}, 0, []string{"update_sales_counter", "ada", "provider outage", "\n1 operator action(s)", "pause_kind"}},
		{[]string{"inspect"}, 0, []string{"paused kinds (their deliveries wait in the stream)", "update_sales_counter", "provider outage"}},
		{[]string{"kinds", "resume", "update_sales_counter"}, 0, []string{"resumed update_sales_counter"}},
		{[]string{"jobs", "show", job}, 0, []string{"state       pending\n"}},
		{[]string{"kinds", "resume", "update_sales_counter"}, 0, []string{"update_sales_counter was not paused"}},
		{[]string{"kinds", "paused"}, 0, []string{"no kind is paused", "\n2 operator action(s)", "resume_kind", "grace@"}},
		{[]string{"kinds", "paused", "--limit", "1"}, 0, []string{"the last 1 of 2 operator actions: --limit 2 shows them all", "resume_kind"}},
		{[]string{"kinds", "pause"}, 2, []string{"kinds pause takes one kind, got []"}},
		{[]string{"kinds", "resume", "a", "b"}, 2, []string{"kinds resume takes one kind"}},
		{[]string{"kinds", "resume", "a", "--reason", "x"}, 2, []string{"kinds resume: unknown flag --reason"}},
		{[]string{"kinds", "paused", "x"}, 2, []string{"kinds paused takes no arguments"}},
	} {
		r := runHost(t, bin, env, tc.args...)
		require.Equal(t, tc.code, r.code, "%q: %s%s", tc.args, r.stdout, r.stderr)
		out := r.stdout
		if tc.code != 0 {
			out = r.stderr
		}
		for _, w := range tc.want {
			require.Contains(t, out, w, "%q", tc.args)
		}
	}
	require.NotContains(t, runHost(t, bin, env, "inspect").stdout, "paused kinds", "resumed: no section")

	r := runHost(t, bin, env, "kinds", "paused", "--json", "--limit", "1")
	require.Zero(t, r.code, r.stderr)
	var shown pausedShown
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown))
	require.Empty(t, shown.Paused)
	require.Len(t, shown.Actions, 1)
	require.Equal(t, "resume_kind", shown.Actions[0].Action)
	require.NotEmpty(t, shown.Actions[0].DBUser)
	require.EqualValues(t, 2, hosttest.Count(t, pool, `SELECT count(*) FROM operator_actions WHERE target = 'update_sales_counter'`))
}

// The README's pause commands, run as written by sh on the database
// DATABASE_URL names.
func TestREADMEPauseCommands(t *testing.T) {
	t.Parallel()
	pool, dbURL := hosttest.DB(t)
	dir := binDir(t)
	lines := doctest.Block(t, "docs/operating.md", "**Pause a kind.**", "sh")
	require.Len(t, lines, 3)
	env := []string{"DATABASE_URL=" + dbURL, "USER=ada"}
	require.Contains(t, readmeShell(t, dir, env, lines[0]), "paused update_sales_counter")
	out := readmeShell(t, dir, env, lines[1])
	require.Contains(t, out, "provider outage")
	require.Contains(t, out, "ada@")
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM kind_pauses WHERE resumed_at IS NULL`))
	require.Contains(t, readmeShell(t, dir, env, lines[2]), "resumed update_sales_counter")
	require.EqualValues(t, 0, hosttest.Count(t, pool, `SELECT count(*) FROM kind_pauses WHERE resumed_at IS NULL`))
}
