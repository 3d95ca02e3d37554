package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// metrics reads the host's Prometheus text from its admin API.
func metricsText(t testing.TB, h *hosttest.Running) string {
	t.Helper()
	// The admin API serves once the host's last phase started (its
	// address is empty until then): a test may ask before, on a slow
	// machine.
	hosttest.Eventually(t, 30*time.Second, "the admin API served", func() bool { return h.AdminAddr() != "" })
	req, err := http.NewRequest(http.MethodGet, "http://"+h.AdminAddr()+"/metrics", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+h.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// flow places orders, one every few milliseconds, until stop is closed, and
// returns how many and each event's seats.
func flow(t *testing.T, b *testBundle, stop <-chan struct{}) <-chan map[int64]int64 {
	t.Helper()
	ctx := context.Background()
	events := make([]int64, 5)
	for i := range events {
		id, err := orders.CreateEvent(ctx, b.pool, fmt.Sprintf("Event %d", i), "Stagedoor Hall")
		require.NoError(t, err)
		events[i] = id
	}
	done := make(chan map[int64]int64, 1)
	go func() {
		want := map[int64]int64{}
		defer func() { done <- want }()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			ev, seats := events[i%len(events)], 1+rand.IntN(6)
			if _, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: seats},
				orders.Jobs{Counter: true}); err != nil {
				t.Errorf("place order: %v", err)
				return
			}
			want[ev] += int64(seats)
		}
	}()
	return done
}

// A version that crashes on every job, or fails every job with a transient
// error, is deployed by the watcher under a steady flow of orders (its
// binary renamed over the running one's, as `make plugins` does). The host
// rolls it back by itself within the probation window; every order is
// counted once, none by the bad version, and the jobs it held back are done
// within seconds of the rollback (the reclaimer, at two minutes, takes no
// part). The rollback is counted, shown in Plugins, and the watcher does
// not try the rolled-back manifest again until it changes.
func TestBadSwapRollsBack(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, mode string
		// minJobs high: the share of failures never judges, the crash
		// loop (or an entry's crashes) must.
		minJobs int
	}{
		{"crash", "crash", 0},
		{"error", "error", 0},
		{"crash_loop", "crash", 100000},
	}
	for _, tc := range cases {
		mode := tc.mode
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			bad := hosttest.Build(t, "./host/testdata/badcounters", "main.mode="+mode, "main.version=2.0.0")
			d := newPluginDir(t)
			d.install(b.counters, "counters", "counters", "1.0.0")
			cfg := b.dirConfig(d)
			cfg.DisablePluginWatch = false
			cfg.PluginPollInterval = 200 * time.Millisecond
			cfg.AdminAddr = "127.0.0.1:0"
			cfg.ReclaimIdle = 2 * time.Minute
			cfg.RetryBackoff = 100 * time.Millisecond
			cfg.RollbackMinJobs = tc.minJobs
			h := hosttest.Start(t, cfg)
			applied := func(version string) int64 {
				return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE plugin_version = $1`, version)
			}

			stop := make(chan struct{})
			placed := flow(t, b, stop)
			hosttest.Eventually(t, 30*time.Second, "1.0.0 to apply jobs", func() bool { return applied("1.0.0") >= 100 })
			d.install(bad, "counters", "counters", "2.0.0")
			hosttest.Eventually(t, 30*time.Second, "the watcher to swap to 2.0.0", func() bool {
				st := pluginStatus(t, h, "counters")
				return st.Version == "2.0.0" || st.LastRollback != nil
			})
			swapped := time.Now()
			hosttest.Eventually(t, 60*time.Second, "2.0.0 rolled back", func() bool {
				return pluginStatus(t, h, "counters").LastRollback != nil
			})
			rolledBack := time.Now()
			st := pluginStatus(t, h, "counters")
			require.Equal(t, "1.0.0", st.Version)
			require.True(t, st.Healthy)
			rb := st.LastRollback
			require.Equal(t, "2.0.0", rb.From)
			require.Equal(t, "1.0.0", rb.To)
			causes := []string{"crash_loop", "failures", "crashes"}
			if tc.minJobs > 0 {
				causes = []string{"crash_loop", "crashes"}
			}
			require.Contains(t, causes, rb.Cause)
			require.NotEmpty(t, rb.Reason)
			require.Equal(t, "2.0.0", st.Refused)
			require.Contains(t, st.RefusedReason, "rolled back from 2.0.0 to 1.0.0")
			require.Empty(t, st.Previous, "a rollback is not rolled back")
			require.Nil(t, st.ProbationUntil)
			require.Contains(t, metricsText(t, h), fmt.Sprintf(`usher_plugin_rollbacks_total{cause=%q,plugin="counters"} 1`, rb.Cause))
			// The swap history the host wrote: the watcher's swap, then the
			// rollback with its cause.
			hosttest.Eventually(t, 10*time.Second, "the rollback in the swap history", func() bool {
				return hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_swaps WHERE action = 'rolled back'`) == 1
			})
			require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_swaps WHERE plugin = 'counters' AND action = 'swapped'
				AND from_version = '1.0.0' AND to_version = '2.0.0' AND cause = 'plugin directory change'`))
			require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_swaps WHERE plugin = 'counters' AND action = 'rolled back'
				AND from_version = '2.0.0' AND to_version = '1.0.0' AND cause = $1 AND reason = $2`, rb.Cause, rb.Reason))

			// The flow goes on on 1.0.0 for a while, then stops.
			after := applied("1.0.0")
			hosttest.Eventually(t, 30*time.Second, "1.0.0 to apply new jobs after the rollback", func() bool {
				return applied("1.0.0") >= after+100
			})
			close(stop)
			want := <-placed
			jobs := hosttest.Count(t, b.pool, `SELECT count(*) FROM orders`)
			// Well under the reclaimer's two minutes: the held-back
			// jobs run because the host knew them, including one
			// interrupted just as the bad version was marked unhealthy
			// (it waits for the route, which the rollback replaces).
			drainStart := time.Now()
			hosttest.Eventually(t, 30*time.Second, "every job applied", func() bool {
				return hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`) == jobs &&
					hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
			})
			t.Logf("%s: the last held-back job applied %s after the rollback's new jobs ran", tc.name, time.Since(drainStart).Round(10*time.Millisecond))
			drained := time.Now()
			b.requireCounters(t, want)
			require.EqualValues(t, jobs, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "zero lost, zero doubled")
			require.EqualValues(t, jobs, hosttest.Count(t, b.pool, `SELECT count(DISTINCT job_id) FROM counter_applies`))
			require.Zero(t, applied("2.0.0"))
			require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))

			// Another plugin's new manifest makes the watcher reload the
			// directory: 2.0.0 stays refused.
			d.install(hosttest.Build(t, "./host/testdata/hostileplugin"), "hostile", "hostile", "6.6.6")
			hosttest.Eventually(t, 30*time.Second, "the watcher loaded the new plugin", func() bool {
				return len(h.Plugins()) == 2
			})
			st = pluginStatus(t, h, "counters")
			require.Equal(t, "1.0.0", st.Version, "the watcher tried the rolled-back manifest again")
			require.Equal(t, "2.0.0", st.Refused)
			t.Logf("%s on every job: rolled back (%s: %s) %s after the swap was seen; %d jobs, the last applied %s after the rollback; lost 0, doubled 0",
				mode, rb.Cause, rb.Reason, rolledBack.Sub(swapped).Round(time.Millisecond), jobs, drained.Sub(rolledBack).Round(time.Millisecond))
		})
	}
}

// A rollback asked for through the admin API: refused (401, nothing
// rolled back or recorded) without the token; back to the version before,
// counted as requested, and refused again when there is nothing to roll
// back to. A changed manifest is taken by the watcher.
func TestRollbackOnRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := newPluginDir(t)
	d.install(b.counters, "counters", "counters", "1.0.0")
	cfg := b.dirConfig(d)
	cfg.DisablePluginWatch = false
	cfg.PluginPollInterval = 200 * time.Millisecond
	cfg.AdminAddr = "127.0.0.1:0"
	h := hosttest.Start(t, cfg)
	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	post := func(query string) (int, host.ReloadResponse) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, "http://"+h.AdminAddr()+"/plugins/rollback"+query, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+h.AdminToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out host.ReloadResponse
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out
	}

	code, out := post("?name=counters")
	require.Equal(t, http.StatusUnprocessableEntity, code)
	require.Contains(t, out.Error, "no previous version to roll back to")
	code, out = post("")
	require.Equal(t, http.StatusUnprocessableEntity, code)
	require.Contains(t, out.Error, "name the plugin")

	d.install(hosttest.Build(t, "./plugins/counters/chaos", "main.version=2.0.0"), "counters", "counters", "2.0.0")
	// The new version serves a moment before its probation (and the
	// version it replaced) is recorded: wait for both.
	hosttest.Eventually(t, 30*time.Second, "the watcher to swap to 2.0.0 and put it on probation", func() bool {
		st := pluginStatus(t, h, "counters")
		return st.Version == "2.0.0" && st.Previous == "1.0.0"
	})
	st := pluginStatus(t, h, "counters")
	require.NotNil(t, st.ProbationUntil)

	// Without the token, or with a wrong one: refused, nothing rolled
	// back, nothing recorded.
	for _, token := range []string{"", strings.Repeat("0", 64)} {
		req, err := http.NewRequest(http.MethodPost, "http://"+h.AdminAddr()+"/plugins/rollback?name=counters&by=mallory", nil)
		require.NoError(t, err)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "token %q", token)
	}
	require.Equal(t, "2.0.0", pluginStatus(t, h, "counters").Version, "not rolled back")
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_swaps WHERE action = 'rolled back'`))
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM operator_actions`), "a refused call is not recorded")

	code, out = post("?name=counters")
	require.Equal(t, http.StatusOK, code, out.Error)
	require.Len(t, out.Results, 1)
	r := out.Results[0]
	require.Equal(t, "rolled back", r.Action)
	require.Equal(t, "2.0.0", r.From)
	require.Equal(t, "1.0.0", r.To)
	st = pluginStatus(t, h, "counters")
	require.Equal(t, "1.0.0", st.Version)
	require.Equal(t, "requested", st.LastRollback.Cause)
	require.Equal(t, "2.0.0", st.Refused)
	require.Contains(t, metricsText(t, h), `usher_plugin_rollbacks_total{cause="requested",plugin="counters"} 1`)
	b.placeOrders(t, 10, 2)
	b.waitDrained(t, 10)
	require.EqualValues(t, 10, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE plugin_version = '1.0.0'`))

	code, out = post("?name=counters")
	require.Equal(t, http.StatusUnprocessableEntity, code)
	require.Contains(t, out.Error, "no previous version to roll back to")

	// A new manifest is not the refused one: the watcher swaps to it.
	d.install(hosttest.Build(t, "./plugins/counters/chaos", "main.version=2.0.1"), "counters", "counters", "2.0.1")
	// The new version serves a moment before the swap's answer clears the
	// refusal it replaces: wait for both.
	hosttest.Eventually(t, 30*time.Second, "the watcher to swap to 2.0.1 and forget the refusal", func() bool {
		st := pluginStatus(t, h, "counters")
		return st.Version == "2.0.1" && st.Refused == ""
	})
	require.True(t, strings.HasPrefix(pluginStatus(t, h, "counters").Previous, "1.0.0"))
}

// An entry that crashes a version on probation PoisonCrashes times is not
// dead-lettered as poison: the version is suspected first and rolled back,
// and the entry, one crash short of the limit, is applied by the version
// before.
func TestProbationSuspectsVersionBeforeEntry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := newPluginDir(t)
	d.install(b.counters, "counters", "counters", "1.0.0")
	cfg := b.dirConfig(d)
	cfg.ReclaimIdle = 2 * time.Minute
	h := hosttest.Start(t, cfg)
	want := b.placeOrders(t, 5, 1)
	b.waitDrained(t, 5)

	// The next order's job is the one 2.0.0 crashes on.
	next := hosttest.Count(t, b.pool, `SELECT max(id) + 1 FROM outbox`)
	bad := hosttest.Build(t, "./host/testdata/badcounters", "main.mode=crashjob", fmt.Sprintf("main.crashJob=%d", next), "main.version=2.0.0")
	d.install(bad, "counters", "counters", "2.0.0")
	res, err := h.Reload(context.Background(), "counters")
	require.NoError(t, err)
	require.Equal(t, "swapped", res[0].Action, res[0].Error)
	for ev, seats := range b.placeOrders(t, 1, 1) {
		want[ev] += seats
	}
	require.EqualValues(t, next, hosttest.Count(t, b.pool, `SELECT max(id) FROM outbox`))

	hosttest.Eventually(t, 60*time.Second, "2.0.0 rolled back", func() bool {
		return pluginStatus(t, h, "counters").LastRollback != nil
	})
	rb := pluginStatus(t, h, "counters").LastRollback
	require.Equal(t, "crashes", rb.Cause, rb.Reason)
	require.Contains(t, rb.Reason, fmt.Sprintf("job %d crashed it 3 times", next))
	b.waitDrained(t, 6)
	b.requireCounters(t, want)
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1 AND plugin_version = '1.0.0'`, fmt.Sprint(next)))
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
}
