package host_test

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pause"
)

const counterKind = "update_sales_counter"

// Paused through one host's admin API, a kind stops on both hosts of the
// group: orders placed while it is paused are relayed, read and parked,
// reclaimed again and again (ReclaimIdle 1s) with MaxDeliveries 2, and
// none runs, is dead-lettered or republished. Resumed, every job drains
// on the two hosts and each counter is exact. Both actions are recorded
// with who did them.
func TestPauseTwoHostsLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.config()
	cfg.PausePollInterval, cfg.MaxDeliveries = 100*time.Millisecond, 2
	cfg.ReconcileAfter, cfg.ReconcileInterval = time.Second, 200*time.Millisecond
	hosts := []*hosttest.Running{}
	for i := range 2 {
		c := cfg
		if i == 0 {
			c.AdminAddr = "127.0.0.1:0"
		}
		hosts = append(hosts, hosttest.Start(t, c))
	}
	a := hosts[0]
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return a.AdminAddr() != "" })

	// Running before the pause.
	before := b.placeOrders(t, 20, 3)
	b.waitDrained(t, 20)
	b.requireCounters(t, before)
	// The rows to come are the paused ones (a row of the first twenty may
	// have been republished: ReconcileAfter is 1s here).
	last := hosttest.Count(t, b.pool, `SELECT max(id) FROM outbox`)

	code, _, body := adminCall{method: "POST", path: "/kinds/pause?kind=" + counterKind + "&by=ada&reason=" + url.QueryEscape("provider outage"),
		token: a.AdminToken}.do(t, a.AdminAddr())
	require.Equal(t, 200, code, body)
	var resp host.PauseResponse
	require.NoError(t, json.Unmarshal([]byte(body), &resp))
	require.True(t, resp.Paused && resp.Changed, body)
	for _, h := range hosts {
		hosttest.Eventually(t, 5*time.Second, "the pause to reach every host", func() bool { return h.Paused(counterKind) })
	}

	more := b.placeOrders(t, 40, 3)
	pausedAt := time.Now()
	hosttest.Eventually(t, 30*time.Second, "the paused jobs relayed and waiting in the stream past several reclaims", func() bool {
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE done_at IS NOT NULL AND id > $1`, last), "a paused job ran")
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`), "a paused job was dead-lettered")
		require.Zero(t, hosttest.Count(t, b.pool, `SELECT coalesce(sum(republished), 0) FROM outbox WHERE id > $1`, last), "a paused job was republished")
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0 &&
			// At least: a republished row of the first twenty waits too.
			hosttest.Pending(t, b.rdb, b.stream, "usher") >= 40 && time.Since(pausedAt) > 5*time.Second
	})
	b.requireCounters(t, before)

	resumed := time.Now()
	changed, err := pause.Resume(ctx, b.pool, counterKind, "grace")
	require.NoError(t, err)
	require.True(t, changed)
	b.waitDrained(t, 60)
	t.Logf("drained %s after the resume", time.Since(resumed).Round(time.Millisecond))
	for ev, n := range more {
		before[ev] += n
	}
	b.requireCounters(t, before)
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))

	acts, total, err := pause.Actions(ctx, b.pool, counterKind, 10)
	require.NoError(t, err)
	require.Len(t, acts, 2)
	require.Equal(t, 2, total)
	require.Equal(t, pause.ActionResume, acts[0].Action)
	require.Equal(t, "grace", acts[0].Actor)
	require.Equal(t, pause.ActionPause, acts[1].Action)
	require.Contains(t, acts[1].Actor, "ada via the admin API from 127.0.0.1:")
	require.Equal(t, "provider outage", acts[1].Detail)
	require.NotEmpty(t, acts[1].DBUser)
}

// The pause endpoints are the admin API's: refused without the token or
// with a wrong one, and nothing is paused then; served with it.
func TestPauseAdminAPIAuth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.AdminAddr = "127.0.0.1:0"
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	for _, path := range []string{"/kinds/pause?kind=k", "/kinds/resume?kind=k"} {
		for _, tok := range []string{"", "wrong-" + h.AdminToken} {
			code, _, body := adminCall{method: "POST", path: path, token: tok}.do(t, h.AdminAddr())
			require.Equal(t, 401, code, "%s with token %q: %s", path, tok, body)
		}
	}
	code, _, _ := adminCall{method: "GET", path: "/kinds/paused"}.do(t, h.AdminAddr())
	require.Equal(t, 401, code)
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM kind_pauses`))
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM operator_actions`))

	code, _, body := adminCall{method: "POST", path: "/kinds/pause?kind=k", token: h.AdminToken}.do(t, h.AdminAddr())
	require.Equal(t, 200, code, body)
	code, _, body = adminCall{method: "POST", path: "/kinds/pause?kind=k", token: h.AdminToken}.do(t, h.AdminAddr())
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"changed":false`, "paused already")
	code, _, body = adminCall{method: "GET", path: "/kinds/paused", token: h.AdminToken}.do(t, h.AdminAddr())
	require.Equal(t, 200, code)
	var list []pause.Paused
	require.NoError(t, json.Unmarshal([]byte(body), &list))
	require.Len(t, list, 1)
	require.Equal(t, "k", list[0].Kind)
	code, _, body = adminCall{method: "POST", path: "/kinds/pause", token: h.AdminToken}.do(t, h.AdminAddr())
	require.Equal(t, 422, code, body)
	code, _, body = adminCall{method: "POST", path: "/kinds/resume?kind=k", token: h.AdminToken}.do(t, h.AdminAddr())
	require.Equal(t, 200, code, body)
	require.Contains(t, body, `"changed":true`)
	require.EqualValues(t, 2, hosttest.Count(t, b.pool, `SELECT count(*) FROM operator_actions`), "a pause and a resume, the repeat not")
}
