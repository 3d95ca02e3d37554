package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/limits"
	"github.com/usherhq/usher/internal/doctest"
)

// host kinds limit, unlimit and limits, as an operator types them: the
// limits written as kind_limits holds them, each change recorded, a
// second limit replacing the first whole, and wrong command lines
// refused with exit status 2.
func TestLimitCLI(t *testing.T) {
	t.Parallel()
	pool, db := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	require.NoError(t, rdb.XGroupCreateMkStream(t.Context(), stream, "usher", "0").Err())
	bin := hosttest.Build(t, "./cmd/host")
	env := []string{"DATABASE_URL=" + db, "USHER_STREAM=" + stream, "REDIS_URL=" + hosttest.RedisURL(), "USER=grace"}
	for _, tc := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"kinds", "limits"}, 0, []string{"no kind is limited"}},
		{[]string{"kinds", "limit", "send_tickets", "--concurrency", "4", "--rate", "10/s", "--by", "ada"}, 0,
			[]string{"limited send_tickets to concurrency 4, rate 10/s burst 10"}},
		{[]string{"kinds", "limit", "render_tickets", "--rate", "600/m", "--burst", "3"}, 0, []string{"limited render_tickets to rate 10/s burst 3"}},
		{[]string{"kinds", "limits"}, 0, []string{"KIND", "render_tickets  -", "10/s", "grace@", "send_tickets    4", "ada"}},
		{[]string{"inspect"}, 0, []string{"limited kinds (across every host)", "send_tickets    concurrency 4, rate 10/s burst 10", "render_tickets  rate 10/s burst 3"}},
		{[]string{"kinds", "limit", "send_tickets", "--concurrency", "2"}, 0, []string{"limited send_tickets to concurrency 2: "}},
		{[]string{"kinds", "unlimit", "render_tickets"}, 0, []string{"removed render_tickets's limits"}},
		{[]string{"kinds", "unlimit", "render_tickets"}, 0, []string{"render_tickets had no limit"}},
		{[]string{"kinds", "limit", "k"}, 2, []string{"kinds limit needs --concurrency, --rate or both"}},
		{[]string{"kinds", "limit", "k", "--rate", "ten"}, 2, []string{`--rate "ten": want a positive number`}},
		{[]string{"kinds", "limit", "k", "--rate", "10/d"}, 2, []string{"the unit is /s, /m or /h"}},
		{[]string{"kinds", "limit", "k", "--concurrency", "-1"}, 2, []string{"--concurrency must be positive"}},
		{[]string{"kinds", "limit", "k", "--concurrency", "1", "--burst", "2"}, 2, []string{"--burst needs --rate"}},
		{[]string{"kinds", "limit"}, 2, []string{"kinds limit takes one kind, got []"}},
		{[]string{"kinds", "unlimit", "a", "b"}, 2, []string{"kinds unlimit takes one kind"}},
		{[]string{"kinds", "limits", "x"}, 2, []string{"kinds limits takes no arguments"}},
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
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM kind_limits WHERE kind = 'send_tickets' AND concurrency = 2 AND rate IS NULL AND burst IS NULL`),
		"the second limit replaced the first whole: no rate left")
	require.NotContains(t, runHost(t, bin, env, "kinds", "unlimit", "send_tickets").stdout, "had no limit")
	require.NotContains(t, runHost(t, bin, env, "inspect").stdout, "limited kinds", "none left: no section")
	_, err := limits.Set(t.Context(), pool, limits.Limit{Kind: "send_tickets", Concurrency: 2}, "ada")
	require.NoError(t, err)
	r := runHost(t, bin, env, "kinds", "limits", "--json")
	require.Zero(t, r.code, r.stderr)
	var shown []limits.Limit
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &shown))
	require.Len(t, shown, 1)
	require.Equal(t, limits.Limit{Kind: "send_tickets", Concurrency: 2, SetAt: shown[0].SetAt, SetBy: "ada"}, shown[0])
	require.EqualValues(t, 6, hosttest.Count(t, pool, `SELECT count(*) FROM operator_actions WHERE action IN ('limit_kind', 'unlimit_kind')`),
		"four limits and two unlimits; the repeat not")
}

// The README's limit commands, run as written by sh on the database
// DATABASE_URL names.
func TestREADMELimitCommands(t *testing.T) {
	t.Parallel()
	pool, dbURL := hosttest.DB(t)
	dir := binDir(t)
	lines := doctest.Block(t, "docs/operating.md", "**Limit a kind.**", "sh")
	require.Len(t, lines, 3)
	env := []string{"DATABASE_URL=" + dbURL, "USER=ada"}
	require.Contains(t, readmeShell(t, dir, env, lines[0]), "limited send_tickets to concurrency 4, rate 10/s burst 10")
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM kind_limits WHERE kind = 'send_tickets' AND concurrency = 4 AND rate = 10`))
	out := readmeShell(t, dir, env, lines[1])
	require.Contains(t, out, "send_tickets")
	require.Contains(t, out, "ada@")
	require.Contains(t, readmeShell(t, dir, env, lines[2]), "removed send_tickets's limits")
	require.Zero(t, hosttest.Count(t, pool, `SELECT count(*) FROM kind_limits`))
}
