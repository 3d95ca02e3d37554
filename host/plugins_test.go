package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// pluginDir is a plugin directory of one test.
type pluginDir struct {
	t   *testing.T
	dir string
}

func newPluginDir(t *testing.T) *pluginDir {
	return &pluginDir{t: t, dir: t.TempDir()}
}

// kindsOf is what the plugin built as bin serves.
func kindsOf(bin string) []string {
	if strings.Contains(filepath.Base(bin), "hostileplugin") {
		return []string{"hostile_apply", "hostile_state"}
	}
	if strings.Contains(filepath.Base(bin), "rawplugin") {
		return []string{"raw_job"}
	}
	return []string{"update_sales_counter"}
}

// install copies bin into the directory as file (replacing it by rename,
// as a deploy would: a running binary is never written in place) and
// writes the manifest naming it as plugin name at version.
func (d *pluginDir) install(bin, file, name, version string) pluginhost.FileManifest {
	d.t.Helper()
	d.copy(bin, file)
	m, err := pluginhost.NewFileManifest(filepath.Join(d.dir, file), name, version, kindsOf(bin))
	require.NoError(d.t, err)
	hosttest.AddShipped(d.t, &m, d.dir)
	d.writeManifest(m)
	return m
}

func (d *pluginDir) copy(bin, file string) {
	d.t.Helper()
	src, err := os.Open(bin)
	require.NoError(d.t, err)
	defer src.Close()
	tmp, err := os.CreateTemp(d.dir, ".copy-*")
	require.NoError(d.t, err)
	_, err = io.Copy(tmp, src)
	require.NoError(d.t, err)
	require.NoError(d.t, tmp.Chmod(0o755))
	require.NoError(d.t, tmp.Close())
	require.NoError(d.t, os.Rename(tmp.Name(), filepath.Join(d.dir, file)))
}

func (d *pluginDir) writeManifest(m pluginhost.FileManifest) {
	d.t.Helper()
	_, err := m.Write(d.dir)
	require.NoError(d.t, err)
}

// dirConfig serves the plugins of d instead of the bundle's counters.
func (b *testBundle) dirConfig(d *pluginDir) host.Config {
	cfg := b.config()
	cfg.Plugins = nil
	cfg.PluginDir = d.dir
	cfg.DisablePluginWatch = true
	return cfg
}

func pluginStatus(t *testing.T, h *hosttest.Running, name string) host.PluginStatus {
	t.Helper()
	for _, p := range h.Plugins() {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("plugin %s is not loaded (loaded: %v)", name, h.Plugins())
	return host.PluginStatus{}
}

// The counters plugin is swapped from 1.0.0 to 2.0.0 while 3,000 orders
// are placed: every order is counted once, and every job committed after
// the swap returned ran on 2.0.0.
func TestSwapUnderLoad(t *testing.T) {
	t.Parallel()
	const n, swapAfter = 3000, 1000
	b := setup(t)
	v2 := hosttest.Build(t, "./plugins/counters/chaos", "main.version=2.0.0")
	d := newPluginDir(t)
	d.install(b.counters, "counters", "counters", "1.0.0")
	h := hosttest.Start(t, b.dirConfig(d))
	ctx := context.Background()

	events := make([]int64, 7)
	for i := range events {
		id, err := orders.CreateEvent(ctx, b.pool, fmt.Sprintf("Event %d", i), "Stagedoor Hall")
		require.NoError(t, err)
		events[i] = id
	}
	type placed struct {
		want map[int64]int64
		err  error
	}
	halfway := make(chan struct{})
	done := make(chan placed, 1)
	go func() {
		want := map[int64]int64{}
		for i := range n {
			if i == swapAfter {
				close(halfway)
			}
			ev, seats := events[i%len(events)], 1+rand.IntN(6)
			if _, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: seats},
				orders.Jobs{Counter: true}); err != nil {
				done <- placed{err: err}
				return
			}
			want[ev] += int64(seats)
		}
		done <- placed{want: want}
	}()

	<-halfway
	hosttest.Eventually(t, 30*time.Second, "version 1.0.0 to apply jobs", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) >= 200
	})
	d.install(v2, "counters", "counters", "2.0.0")
	began := time.Now()
	res, err := h.Reload(ctx, "counters")
	took := time.Since(began)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Equal(t, "swapped", res[0].Action, res[0].Error)
	swapPoint := hosttest.Count(t, b.pool, `SELECT coalesce(max(id), 0) FROM outbox`)
	require.Equal(t, "2.0.0", pluginStatus(t, h, "counters").Version)

	p := <-done
	require.NoError(t, p.err)
	require.Less(t, swapPoint, int64(n), "orders were still being placed when the swap returned")
	b.waitDrained(t, n)
	b.requireCounters(t, p.want)
	require.EqualValues(t, n, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "zero lost, zero doubled")
	require.EqualValues(t, n, hosttest.Count(t, b.pool, `SELECT count(DISTINCT job_id) FROM counter_applies`))
	require.EqualValues(t, 0, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
	require.EqualValues(t, 0, hosttest.Count(t, b.pool,
		`SELECT count(*) FROM counter_applies WHERE job_id::bigint > $1 AND plugin_version <> '2.0.0'`, swapPoint),
		"every job committed after the swap returned ran on 2.0.0")
	onV1 := hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE plugin_version = '1.0.0'`)
	onV2 := hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE plugin_version = '2.0.0'`)
	require.Positive(t, onV1)
	require.Positive(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id::bigint > $1`, swapPoint))
	t.Logf("swap under load: %d jobs, %d on 1.0.0 and %d on 2.0.0; swap %s (2.0.0 up in %s, old version drained=%v in %s); jobs after the swap point (outbox id > %d) all on 2.0.0; lost 0, doubled 0",
		n, onV1, onV2, took.Round(time.Millisecond), res[0].StartTime.Round(time.Millisecond), res[0].Drained,
		res[0].DrainTime.Round(time.Microsecond), swapPoint)
}

// A broken 2.0.0 is refused with the reason, and 1.0.0 keeps serving.
func TestBrokenSwapKeepsServing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// install puts the broken version into d as the binary
		// "counters-v2" with a manifest for counters 2.0.0, and returns
		// what the refusal must say besides want.
		install func(t *testing.T, d *pluginDir) []string
		want    []string
	}{
		{"crashes at start", func(t *testing.T, d *pluginDir) []string {
			script := filepath.Join(t.TempDir(), "counters-v2")
			require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho 'counters 2.0.0: no configuration found' >&2\nexit 1\n"), 0o755))
			d.install(script, "counters-v2", "counters", "2.0.0")
			return nil
		}, []string{"swap refused, old version keeps serving", "the plugin exited at start", "counters 2.0.0: no configuration found"}},
		{"fails its checksum", func(t *testing.T, d *pluginDir) []string {
			m := d.install(hosttest.Build(t, "./plugins/counters/chaos", "main.version=2.0.0"), "counters-v2", "counters", "2.0.0")
			actual := m.SHA256
			m.SHA256 = strings.Repeat("ab", 32)
			d.writeManifest(m)
			return []string{"counters-v2 has SHA-256 " + actual}
		}, []string{"counters.plugin.json", "but " + strings.Repeat("ab", 32) + " was expected"}},
		{"declares a kind without a guard", func(t *testing.T, d *pluginDir) []string {
			d.install(hosttest.Build(t, "./host/testdata/rawplugin", "main.name=counters", "main.version=2.0.0", "main.buildMode=noguard"),
				"counters-v2", "counters", "2.0.0")
			return nil
		}, []string{`declares kind "raw_job" without a guard`}},
		{"is another plugin", func(t *testing.T, d *pluginDir) []string {
			d.install(hosttest.Build(t, "./host/testdata/rawplugin"), "counters-v2", "counters", "2.0.0")
			return nil
		}, []string{`the binary reports plugin "raw" version "0.0.1", its manifest says "counters" version "2.0.0"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			d := newPluginDir(t)
			d.install(b.counters, "counters", "counters", "1.0.0")
			h := hosttest.Start(t, b.dirConfig(d))
			want := b.placeOrders(t, 20, 2)
			b.waitDrained(t, 20)
			pid := pluginStatus(t, h, "counters").Pid

			extra := tc.install(t, d)
			res, err := h.Reload(context.Background(), "counters")
			require.NoError(t, err)
			require.Len(t, res, 1)
			require.Equal(t, "refused", res[0].Action)
			for _, w := range append(tc.want, extra...) {
				require.Contains(t, res[0].Error, w)
			}
			t.Logf("refused: %s", res[0].Error)

			st := pluginStatus(t, h, "counters")
			require.Equal(t, "1.0.0", st.Version)
			require.Equal(t, pid, st.Pid)
			require.True(t, st.Healthy)
			more := b.placeOrders(t, 20, 2)
			b.waitDrained(t, 40)
			for ev, s := range more {
				want[ev] += s
			}
			b.requireCounters(t, want)
			require.EqualValues(t, 40, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE plugin_version = '1.0.0'`))
		})
	}
}

// A plugin whose manifest does not match it, or that cannot run here, is
// refused at load with a message that says why.
func TestManifestRefusedAtLoad(t *testing.T) {
	t.Parallel()
	raw := func(t *testing.T, x ...string) string { return hosttest.Build(t, "./host/testdata/rawplugin", x...) }
	cases := []struct {
		name string
		// setup fills the plugin directory and returns what the refusal
		// must say besides want.
		setup func(t *testing.T, b *testBundle, d *pluginDir, cfg *host.Config) []string
		want  []string
	}{
		{"version differs", func(t *testing.T, b *testBundle, d *pluginDir, cfg *host.Config) []string {
			d.install(b.counters, "counters", "counters", "9.9.9")
			return nil
		}, []string{"counters.plugin.json", `the binary reports plugin "counters" version "1.0.0", its manifest says "counters" version "9.9.9"`}},
		{"name differs", func(t *testing.T, b *testBundle, d *pluginDir, cfg *host.Config) []string {
			d.install(b.counters, "counters", "tally", "1.0.0")
			return nil
		}, []string{"tally.plugin.json", `reports plugin "counters"`, `its manifest says "tally"`}},
		{"checksum", func(t *testing.T, b *testBundle, d *pluginDir, cfg *host.Config) []string {
			m := d.install(b.counters, "counters", "counters", "1.0.0")
			sum := m.SHA256
			m.SHA256 = strings.Repeat("0", 64)
			d.writeManifest(m)
			return []string{"counters has SHA-256 " + sum}
		}, []string{"counters.plugin.json", "but " + strings.Repeat("0", 64) + " was expected"}},
		{"unknown protocol", func(t *testing.T, b *testBundle, d *pluginDir, cfg *host.Config) []string {
			d.install(raw(t), "raw", "raw", "0.0.1")
			cfg.PluginEnv = append(cfg.PluginEnv, "RAW_PROTOCOL=7")
			return nil
		}, []string{"the plugin speaks host-plugin protocol 7, this host speaks protocol 1"}},
		{"a name that takes another plugin's role", func(t *testing.T, b *testBundle, d *pluginDir, cfg *host.Config) []string {
			d.install(raw(t, "main.name=Counters"), "Counters", "Counters", "0.0.1")
			return nil
		}, []string{`plugin name "Counters" is refused`}},
		{"no role", func(t *testing.T, b *testBundle, d *pluginDir, cfg *host.Config) []string {
			d.install(raw(t, "main.name=stranger"), "stranger", "stranger", "0.0.1")
			return nil
		}, []string{"plugin stranger has no Postgres role usher_plugin_stranger"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			d := newPluginDir(t)
			cfg := b.dirConfig(d)
			cfg.Logger = hosttest.Logger(t, 100)
			extra := tc.setup(t, b, d, &cfg)
			// A plugin that cannot load never stops the host: it starts
			// without it and says why.
			h, err := host.New(context.Background(), cfg)
			require.NoError(t, err)
			defer h.Close()
			require.Empty(t, h.Plugins())
			refusals := h.Refusals()
			require.Len(t, refusals, 1)
			t.Logf("refused: %+v", refusals[0])
			for _, w := range append(tc.want, extra...) {
				require.Contains(t, refusals[0].Source+": "+refusals[0].Error, w)
			}
		})
	}
}

// A plugin that speaks an older protocol besides a newer one the host does
// not know is loaded on the one both speak.
func TestProtocolNegotiated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config()
	cfg.Plugins = append(cfg.Plugins, hosttest.Build(t, "./host/testdata/rawplugin"))
	cfg.PluginEnv = append(cfg.PluginEnv, "RAW_PROTOCOL=1,2")
	h := hosttest.Start(t, cfg)
	require.Equal(t, []int{1}, pluginhost.Protocols())
	require.Equal(t, 1, pluginStatus(t, h, "raw").Protocol)
}

// rolePlugin builds the raw test plugin as "rolecheck" and gives it a role
// of its own, as an operator would for a third-party plugin: created once
// in the cluster, granted in this test's database only the events counter.
// (Another name than "raw": roles are cluster-wide, and the tests that run
// the raw plugin as the host must not find one.)
func rolePlugin(t *testing.T, b *testBundle) string {
	t.Helper()
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `GRANT SELECT (id, seats_sold), UPDATE (seats_sold) ON events TO usher_plugin_rolecheck`)
	require.NoError(t, err)
	return hosttest.Build(t, "./host/testdata/rawplugin", "main.name=rolecheck")
}

// A plugin's statements run as its own role: one that writes a table it
// was not granted (the runtime's, or another plugin's) is refused by the
// database, and its job is dead-lettered with the refusal while the other
// plugin's jobs flow.
func TestPluginRoleRefusesOtherTables(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, sql string
		want      []string // in the dead letter; none: the job succeeds
	}{
		{"runtime table processed_jobs", `UPDATE processed_jobs SET kind = kind RETURNING job_id`,
			[]string{"role usher_plugin_rolecheck was refused: permission denied for table processed_jobs (SQLSTATE 42501)"}},
		{"runtime table dead_letters", `DELETE FROM dead_letters RETURNING id`,
			[]string{"role usher_plugin_rolecheck was refused: permission denied for table dead_letters"}},
		{"runtime table outbox", `INSERT INTO outbox (kind, payload) VALUES ('update_sales_counter', '{"order_id":1}') RETURNING id`,
			[]string{"permission denied for table outbox"}},
		{"another plugin's table", `INSERT INTO counter_applies (job_id, order_id, plugin_version) VALUES ('forged', 1, 'raw') RETURNING job_id`,
			[]string{"permission denied for table counter_applies"}},
		{"its own grant", `UPDATE events SET seats_sold = seats_sold WHERE false RETURNING id`, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			raw := rolePlugin(t, b)
			want := b.placeOrders(t, 10, 2)
			ctx := context.Background()
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				_, err := outbox.Add(ctx, tx, outbox.Message{Kind: "raw_job", Payload: json.RawMessage(`{}`)})
				return err
			}))
			cfg := b.config()
			cfg.Plugins = append(cfg.Plugins, raw)
			cfg.PluginEnv = append(cfg.PluginEnv, "RAW_MODE=sql", "RAW_SQL="+tc.sql)
			h := hosttest.Start(t, cfg)
			require.Equal(t, "usher_plugin_rolecheck", pluginStatus(t, h, "rolecheck").DBRole)
			require.Equal(t, "usher_plugin_counters", pluginStatus(t, h, "counters").DBRole)

			b.waitDrained(t, 10)
			hosttest.Eventually(t, 30*time.Second, "the raw job to finish", func() bool {
				return hosttest.Pending(t, b.rdb, b.stream, "usher") == 0 &&
					hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`)+
						hosttest.Count(t, b.pool, `SELECT coalesce(sum(count), 0) FROM absorbed_duplicates WHERE kind = 'raw_job'`) == 1
			})
			b.requireCounters(t, want)
			require.EqualValues(t, 0, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = 'forged'`))
			require.EqualValues(t, 10, hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`))
			if tc.want == nil {
				require.EqualValues(t, 0, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
				return
			}
			var reason string
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT reason FROM dead_letters WHERE kind = 'raw_job'`).Scan(&reason))
			t.Logf("dead letter: %s", reason)
			for _, w := range tc.want {
				require.Contains(t, reason, w)
			}
		})
	}
}

// Every handle of a plugin with a role runs as that role, under the
// statement timeout: the read-only one of the check phase (its own
// transaction) and the commit's.
func TestPluginHandlesRunAsRoleUnderTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	raw := rolePlugin(t, b)
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := outbox.Add(ctx, tx, outbox.Message{Kind: "raw_job", Payload: json.RawMessage(`{}`)})
		return err
	}))
	cfg := b.config()
	cfg.Plugins = []string{raw}
	cfg.PluginEnv = append(cfg.PluginEnv, "RAW_MODE=whoami")
	cfg.StatementTimeout = 7 * time.Second
	hosttest.Start(t, cfg)
	hosttest.Eventually(t, 30*time.Second, "the whoami job dead-lettered", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`) == 1
	})
	var reason string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT reason FROM dead_letters`).Scan(&reason))
	require.Contains(t, reason, "check ran as usher_plugin_rolecheck (statement_timeout 7s); commit ran as usher_plugin_rolecheck (statement_timeout 7s)")
}

// A plugin that crash-loops is marked unhealthy; its job waits in the
// stream (not in dead letters, however long it waits; parked now once,
// however often it was parked) while the other plugin's jobs flow, and a
// reload of a fixed binary runs it.
func TestUnhealthyPluginWaitsInStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := newPluginDir(t)
	d.install(b.counters, "counters", "counters", "1.0.0")
	// Named "flaky", not "raw": a plugin role is cluster-wide, and this
	// test's plugin runs as the host, so no role of its name may exist.
	d.install(hosttest.Build(t, "./host/testdata/rawplugin", "main.name=flaky", "main.buildMode=panic"), "raw", "flaky", "0.0.1")
	ctx := context.Background()
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := outbox.Add(ctx, tx, outbox.Message{Kind: "raw_job", Payload: json.RawMessage(`{}`)})
		return err
	}))
	cfg := b.dirConfig(d)
	cfg.ReclaimIdle = 500 * time.Millisecond
	cfg.PluginCrashLoop = 2
	cfg.PluginUnhealthyRetry = time.Hour // this test's fix is the operator's reload
	cfg.MaxDeliveries = 5
	h := hosttest.Start(t, cfg)

	hosttest.Eventually(t, 30*time.Second, "the flaky plugin marked unhealthy", func() bool {
		return !pluginStatus(t, h, "flaky").Healthy
	})
	want := b.placeOrders(t, 10, 2)
	// Parked more often than MaxDeliveries: counted, it would have been
	// dead-lettered.
	hosttest.Eventually(t, 30*time.Second, "the raw job parked 8 times", func() bool {
		return pluginStatus(t, h, "flaky").Parked >= 8
	})
	require.EqualValues(t, 1, pluginStatus(t, h, "flaky").ParkedNow, "one entry waits, however often it was parked")
	b.requireCountersEventually(t, want)
	require.EqualValues(t, 0, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`), "no dead letter while unhealthy")
	pending, err := b.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: b.stream, Group: "usher", Start: "-", End: "+", Count: 10}).Result()
	require.NoError(t, err)
	require.Len(t, pending, 1, "the raw job waits in the stream")
	require.LessOrEqual(t, pending[0].RetryCount, cfg.MaxDeliveries, "parked deliveries are given back")

	d.install(hosttest.Build(t, "./host/testdata/rawplugin", "main.name=flaky"), "raw", "flaky", "0.0.1") // the fix
	res, err := h.Reload(ctx, "flaky")
	require.NoError(t, err)
	require.Equal(t, "swapped", res[0].Action, res[0].Error)
	require.True(t, pluginStatus(t, h, "flaky").Healthy)
	hosttest.Eventually(t, 30*time.Second, "the raw job run by the fixed plugin", func() bool {
		return hosttest.Pending(t, b.rdb, b.stream, "usher") == 0 &&
			hosttest.Count(t, b.pool, `SELECT coalesce(sum(count), 0) FROM absorbed_duplicates WHERE kind = 'raw_job'`) == 1
	})
	require.EqualValues(t, 0, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
	require.Zero(t, pluginStatus(t, h, "flaky").ParkedNow, "run: parked no longer")
	require.GreaterOrEqual(t, pluginStatus(t, h, "flaky").Parked, int64(8), "the total stays")
}

func (b *testBundle) requireCountersEventually(t *testing.T, want map[int64]int64) {
	t.Helper()
	hosttest.Eventually(t, 30*time.Second, "the counters to reach their sums", func() bool {
		for ev, seats := range want {
			if hosttest.Count(t, b.pool, `SELECT seats_sold FROM events WHERE id = $1`, ev) != seats {
				return false
			}
		}
		return true
	})
}

// The host watches its plugin directory: a changed manifest hot-swaps its
// plugin, a new one loads a new plugin, an executable without one is
// ignored; and the admin API reloads on request.
func TestPluginDirWatched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := newPluginDir(t)
	d.install(b.counters, "counters", "counters", "1.0.0")
	raw := hosttest.Build(t, "./host/testdata/rawplugin")
	d.copy(raw, "stray")
	cfg := b.dirConfig(d)
	cfg.DisablePluginWatch = false
	cfg.PluginPollInterval = 200 * time.Millisecond
	cfg.AdminAddr = "127.0.0.1:0"
	h := hosttest.Start(t, cfg)
	require.Len(t, h.Plugins(), 1, "the executable without a manifest is ignored")

	d.install(hosttest.Build(t, "./plugins/counters/chaos", "main.version=2.0.0"), "counters", "counters", "2.0.0")
	hosttest.Eventually(t, 30*time.Second, "counters swapped to 2.0.0", func() bool {
		return pluginStatus(t, h, "counters").Version == "2.0.0"
	})
	b.placeOrders(t, 10, 2)
	b.waitDrained(t, 10)
	require.EqualValues(t, 10, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE plugin_version = '2.0.0'`))

	m, err := pluginhost.NewFileManifest(filepath.Join(d.dir, "stray"), "raw", "0.0.1", []string{"raw_job"})
	require.NoError(t, err)
	d.writeManifest(m)
	hosttest.Eventually(t, 30*time.Second, "the raw plugin loaded from its new manifest", func() bool {
		return len(h.Plugins()) == 2 && strings.Contains(strings.Join(h.Kinds(), ","), "raw_job")
	})

	hosttest.Eventually(t, 10*time.Second, "the admin API listening", func() bool { return h.AdminAddr() != "" })
	do := func(method, path string) *http.Response {
		req, err := http.NewRequest(method, "http://"+h.AdminAddr()+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+h.AdminToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		return resp
	}
	post := func(query string) (int, host.ReloadResponse) {
		resp := do(http.MethodPost, "/plugins/reload"+query)
		defer resp.Body.Close()
		var out host.ReloadResponse
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out
	}
	code, out := post("?name=counters")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, []host.ReloadResult{{Plugin: "counters", Action: "unchanged", From: "2.0.0", To: "2.0.0"}}, out.Results)
	code, out = post("?name=nope")
	require.Equal(t, http.StatusUnprocessableEntity, code)
	require.Contains(t, out.Error, `names plugin "nope"`)
	resp := do(http.MethodGet, "/plugins/reload")
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

// A manifest refused once is not tried again behind the operator's back:
// the watcher, reloading the directory for another plugin's new manifest,
// leaves it refused although what refused it (a missing role) was fixed
// meanwhile; the operator's reload of that plugin loads it.
func TestRefusedManifestStaysRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A name of this run's own: roles are the cluster's, and this one is
	// created half-way.
	name := "latecomer" + hosttest.Suffix()
	role := host.PluginRole(name)
	t.Cleanup(func() {
		admin, err := pgx.Connect(context.Background(), hosttest.AdminURL(t, b.dbURL))
		if err != nil {
			return
		}
		defer admin.Close(context.Background())
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
		// Setup made its schema role too, and its schema on the database
		// roles are set up from.
		test, err := pgx.Connect(context.Background(), hosttest.DatabaseURL())
		if err != nil {
			return
		}
		defer test.Close(context.Background())
		schemaRole := sandbox.SchemaRole(name)
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+schemaRole)
		_, _ = test.Exec(context.Background(), "DROP OWNED BY "+schemaRole)
		_, _ = test.Exec(context.Background(), "DROP ROLE IF EXISTS "+schemaRole)
	})
	d := newPluginDir(t)
	d.install(b.counters, "counters", "counters", "1.0.0")
	d.install(hosttest.Build(t, "./host/testdata/rawplugin", "main.name="+name), name, name, "0.0.1")
	cfg := b.dirConfig(d)
	cfg.DisablePluginWatch = false
	cfg.PluginPollInterval = 200 * time.Millisecond
	h := hosttest.Start(t, cfg)
	require.Len(t, h.Refusals(), 1)
	require.Contains(t, h.Refusals()[0].Error, "no Postgres role "+role)

	hosttest.EnsureRoles(t, name)
	_, err := b.pool.Exec(context.Background(), `GRANT SELECT (id, seats_sold), UPDATE (seats_sold) ON events TO `+role)
	require.NoError(t, err)
	d.install(hosttest.Build(t, "./host/testdata/hostileplugin"), "hostile", "hostile", "6.6.6")
	hosttest.Eventually(t, 30*time.Second, "the watcher loaded the new plugin", func() bool {
		for _, p := range h.Plugins() {
			if p.Name == "hostile" {
				return true
			}
		}
		return false
	})
	for _, p := range h.Plugins() {
		require.NotEqual(t, name, p.Name, "the watcher tried the refused manifest again")
	}

	res, err := h.Reload(context.Background(), name)
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Equal(t, "loaded", res[0].Action, res[0].Error)
	require.Equal(t, role, pluginStatus(t, h, name).DBRole)
}

// A binary left in the plugin directory without a manifest is logged once,
// not again at every re-read of the directory.
func TestDirProblemLoggedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	d := newPluginDir(t)
	d.install(b.counters, "counters", "counters", "1.0.0")
	d.copy(b.counters, "stray")
	var logs syncBuffer
	cfg := b.dirConfig(d)
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	h := hosttest.Start(t, cfg)
	for range 3 {
		_, err := h.Reload(context.Background(), "")
		require.NoError(t, err)
	}
	require.Equal(t, 1, strings.Count(logs.String(), "plugin directory: skipped"), logs.String())
}
