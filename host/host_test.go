package host_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

type testBundle struct {
	pool     *pgxpool.Pool
	dbURL    string
	rdb      *redis.Client
	stream   string
	counters string
	faultDir string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool, url := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	return &testBundle{pool: pool, dbURL: url, rdb: rdb, stream: stream,
		counters: hosttest.Build(t, "./plugins/counters/chaos"), faultDir: t.TempDir()}
}

func (b *testBundle) config() host.Config {
	cfg := hostConfig(b.dbURL, b.rdb, b.stream, b.counters)
	cfg.PluginEnv = []string{faults.DirEnv + "=" + b.faultDir}
	return cfg
}

// armFirstJob arms a fault at point for the first outbox row's job and
// returns that job's id.
func (b *testBundle) armFirstJob(t *testing.T, point string, spec faults.Spec) string {
	t.Helper()
	return b.armJob(t, 0, point, spec)
}

// armJob arms a fault at point for the job of the outbox row after the
// first n and returns that job's id.
func (b *testBundle) armJob(t *testing.T, n int, point string, spec faults.Spec) string {
	t.Helper()
	var jobID string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT coalesce(job_id, id::text) FROM outbox ORDER BY id OFFSET $1 LIMIT 1`, n).Scan(&jobID))
	spec.JobIDs = []string{jobID}
	require.NoError(t, faults.Arm(b.faultDir, point, spec))
	return jobID
}

// held waits until the plugin holds jobID at point.
func (b *testBundle) held(t *testing.T, point, jobID string) {
	t.Helper()
	hosttest.Eventually(t, 20*time.Second, "the plugin to hold job "+jobID, func() bool {
		_, err := os.Stat(filepath.Join(b.faultDir, point+"."+jobID+".hit"))
		return err == nil
	})
}

func hostConfig(dbURL string, rdb *redis.Client, stream, plugin string) host.Config {
	return host.Config{
		DatabaseURL: dbURL, Redis: rdb, Stream: stream, Plugins: []string{plugin},
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond,
	}
}

// placeOrders commits n orders spread over events and returns each event's
// expected seat total.
func (b *testBundle) placeOrders(t *testing.T, n, events int) map[int64]int64 {
	t.Helper()
	ctx := context.Background()
	ids := make([]int64, events)
	for i := range ids {
		id, err := orders.CreateEvent(ctx, b.pool, fmt.Sprintf("Event %d", i), "Stagedoor Hall")
		require.NoError(t, err)
		ids[i] = id
	}
	want := map[int64]int64{}
	for i := range n {
		ev := ids[i%events]
		seats := 1 + rand.IntN(6)
		_, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "Buyer", Email: "b@example.com", Seats: seats},
			orders.Jobs{Counter: true})
		require.NoError(t, err)
		want[ev] += int64(seats)
	}
	return want
}

func (b *testBundle) requireCounters(t *testing.T, want map[int64]int64) {
	t.Helper()
	for ev, seats := range want {
		got := hosttest.Count(t, b.pool, `SELECT seats_sold FROM events WHERE id = $1`, ev)
		require.Equal(t, seats, got, "event %d's counter", ev)
	}
}

func (b *testBundle) waitDrained(t *testing.T, jobs int64) {
	t.Helper()
	hosttest.Eventually(t, 60*time.Second, fmt.Sprintf("%d jobs recorded and nothing pending", jobs), func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`) == jobs &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
}

// 1,000 orders; 10% of their outbox rows are published twice by a relay
// that crashes between publish and mark. Every counter is exact.
func TestRelayDuplicatesAppliedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 1000, 7)

	// The relay runs on its own, one row per batch, "crashing" after
	// publishing every tenth row the first time.
	var mu sync.Mutex
	crashed := map[int64]bool{}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: b.pool, Redis: b.rdb, Stream: b.stream, Key: hosttest.SigningKey(t, b.pool),
		BatchSize: 1, PollInterval: 10 * time.Millisecond,
		AfterPublish: func(ids []int64) error {
			mu.Lock()
			defer mu.Unlock()
			if id := ids[0]; id%10 == 0 && !crashed[id] {
				crashed[id] = true
				return errors.New("relay crashed between publish and mark")
			}
			return nil
		}})
	require.NoError(t, err)
	cfg := b.config()
	cfg.DisableRelay = true
	hosttest.Start(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = relay.Run(ctx) }()

	b.waitDrained(t, 1000)
	b.requireCounters(t, want)
	// Added, that is: the host trims entries every group has acked.
	require.EqualValues(t, 1100, b.rdb.XInfoStream(context.Background(), b.stream).Val().EntriesAdded, "100 duplicate entries on the stream")
	require.EqualValues(t, 1000, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "one apply per order")
	// At least the 100 relay duplicates; on a loaded machine a slow entry
	// may also be reclaimed (the threshold is 1s here) and absorbed. The
	// last duplicate may still be unread when every job is applied and
	// nothing is pending: wait for it.
	hosttest.Eventually(t, 30*time.Second, "the guard to absorb every relay duplicate", func() bool {
		return hosttest.Count(t, b.pool,
			`SELECT coalesce(sum(count), 0)::bigint FROM absorbed_duplicates WHERE guard = 'job_id' AND kind = 'update_sales_counter'`) >= 100
	})
	require.EqualValues(t, 1000, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`), "still one apply per order")
}

// A consumer takes an entry and stalls past the threshold; another consumer
// reclaims it; both finish; the counter moved once.
func TestSlowConsumerReclaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 1, 1)
	jobID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "stall", Duration: "3s", Once: true})

	slow := b.config()
	slow.ReclaimIdle = time.Hour // only the other host reclaims
	slow.Consumer = "slow"
	hosttest.Start(t, slow)
	b.held(t, "counter.before_apply", jobID)
	other := b.config()
	other.Consumer = "other"
	other.DisableRelay = true
	hosttest.Start(t, other)

	b.waitDrained(t, 1)
	hosttest.Eventually(t, 20*time.Second, "both runs to finish", func() bool {
		return hosttest.Count(t, b.pool, `SELECT coalesce(sum(count), 0) FROM absorbed_duplicates`) == 1
	})
	b.requireCounters(t, want)
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
	info, err := b.rdb.XInfoConsumers(context.Background(), b.stream, "usher").Result()
	require.NoError(t, err)
	names := map[string]bool{}
	for _, c := range info {
		names[c.Name] = true
	}
	require.True(t, names["other"], "the entry was claimed by the other consumer")
}

// kill -9 of the plugin process mid-job: the entry stays pending, is
// reclaimed after the plugin restarts, and is applied once.
func TestPluginKilledMidJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 20, 2)
	jobID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "stall", Duration: "1h", Once: true})
	h := hosttest.Start(t, b.config())

	b.held(t, "counter.before_apply", jobID)
	raw, err := os.ReadFile(filepath.Join(b.faultDir, "counter.before_apply."+jobID+".hit"))
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, err)
	require.NotEqual(t, os.Getpid(), pid, "the handler runs in its own process")
	require.Equal(t, h.Plugins()[0].Pid, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))

	b.waitDrained(t, 20)
	b.requireCounters(t, want)
	require.EqualValues(t, 20, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
	require.NotEqual(t, pid, h.Plugins()[0].Pid, "the plugin was restarted")
	require.GreaterOrEqual(t, h.Plugins()[0].Restarts, 1)
}

// With the production reclaim threshold (60 s), the job a plugin's kill -9
// interrupted runs again on the same host as soon as the plugin is back,
// not when the reclaimer would take it. (The bound is a third of the
// threshold: it proves which path ran, not how fast.)
func TestInterruptedJobRunsWhenPluginIsBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 20, 2)
	jobID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "stall", Duration: "1h", Once: true})
	cfg := b.config()
	cfg.ReclaimIdle = 60 * time.Second
	h := hosttest.Start(t, cfg)

	b.held(t, "counter.before_apply", jobID)
	pid := h.Plugins()[0].Pid
	killed := time.Now()
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	hosttest.Eventually(t, 20*time.Second, "every job applied, the interrupted one included, before the reclaimer could run", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM processed_jobs`) == 20 && hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	var applied time.Time
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT processed_at FROM processed_jobs WHERE job_id = $1`, jobID).Scan(&applied))
	t.Logf("kill -9 to the interrupted job applied: %s", applied.Sub(killed).Round(time.Millisecond))
	b.requireCounters(t, want)
	require.EqualValues(t, 20, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`))
	require.NotEqual(t, pid, h.Plugins()[0].Pid, "the plugin was restarted")
}

// Malformed entries are dead-lettered with a clear reason, acked only after,
// and the other jobs flow. An entry whose fields are not text (invalid
// UTF-8, a NUL byte) or that is oversized is dead-lettered with its bytes
// kept as received, never redelivered for ever.
func TestMalformedEntriesDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	want := b.placeOrders(t, 30, 3)
	ctx := context.Background()
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, "usher", "0").Err())
	// Signed as a relay would: each is bad in another way than its origin.
	key := hosttest.SigningKey(t, b.pool)
	add := func(vals ...any) string {
		id, err := b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.stream, Values: hosttest.Signed(key, vals...)}).Result()
		require.NoError(t, err)
		return id
	}
	big := `{"pad":"` + strings.Repeat("a", 2<<20) + `"}`
	add("kind", "update_sales_counter", "payload", `{"order_id":1}`)                        // no identity
	add("job_id", "x-1", "kind", "reticulate_splines", "payload", `{}`)                     // unknown kind
	add("job_id", "x-2", "kind", "update_sales_counter", "payload", `{"order_id":`)         // not JSON
	add("job_id", "x-3", "kind", "update_sales_counter", "payload", `{"order_id":"seven"}`) // does not decode
	oversized := add("job_id", "x-4", "kind", "update_sales_counter", "payload", big)
	add("job_id", "x-5", "kind", "update_sales_counter", "payload", `{"order_id":999999}`) // no such order
	// Not text, field by field: each is dead-lettered naming the field.
	hostile := map[string]string{
		add("job_id", "x-\xff6", "kind", "update_sales_counter", "payload", `{}`):                    `field job_id is not valid UTF-8`,
		add("job_id", "x-7", "kind", "update\xfe", "payload", `{}`):                                  `field kind is not valid UTF-8`,
		add("job_id", "x-8", "kind", "update_sales_counter", "payload", "{\"a\":\"\xc3\x28\"}"):      `field payload is not valid UTF-8`,
		add("job_id", "x-9", "kind", "update_sales_counter", "payload", `{}`, "request_id", "r\xff"): `field request_id is not valid UTF-8`,
		add("job_id", "x-10", "kind", "update_sales_counter", "payload", `{}`, "trace", "00-\xff"):   `field trace is not valid UTF-8`,
		add("job_id", "x-11", "kind", "update_sales_counter", "payload", `{}`, "attempt", "1\xff"):   `field attempt is not valid UTF-8`,
		add("job_id", "x-12", "kind", "update_sales_counter", "payload", `{}`, "outbox_id", "\xff1"): `field outbox_id is not valid UTF-8`,
		add("job_id", "x-13", "kind", "update_sales_counter", "payload", `{}`, "na\xffme", "v"):      `field name "na\xffme" is not valid UTF-8`,
		add("job_id", "x-\x0014", "kind", "update_sales_counter", "payload", `{}`):                   `field job_id holds a NUL byte`,
	}
	cfg := b.config()
	cfg.UnknownKindWait = -1    // x-1 at once; the wait has its own tests (unknownkind_test.go)
	cfg.StreamTrimInterval = -1 // the entries are read back below
	h := hosttest.Start(t, cfg)

	hosttest.Eventually(t, 30*time.Second, "15 dead letters and 30 applied jobs", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`) == 15 &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 30 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	b.requireCounters(t, want)
	letters, err := deadletter.List(ctx, b.pool, "", 100)
	require.NoError(t, err)
	reasons := map[string]string{}
	byStream := map[string]deadletter.Letter{}
	for _, l := range letters {
		reasons[l.JobID] = l.Reason
		byStream[l.StreamID] = l
	}
	for id, r := range reasons {
		if strings.HasPrefix(id, "entry:") {
			require.Contains(t, r, "no job identity")
		}
	}
	require.Contains(t, reasons["x-1"], `unknown kind "reticulate_splines"`)
	require.Contains(t, reasons["x-2"], "not valid JSON")
	require.Contains(t, reasons["x-3"], "does not parse")
	require.Contains(t, reasons["x-5"], "order 999999 does not exist")

	// The oversized entry was never read whole: its letter keeps a
	// prefix of each field and says how long each was.
	// Nothing can verify it, so it is filed as a forgery is: under no
	// job's identity.
	l := byStream[oversized]
	require.Contains(t, l.Reason, "cannot be verified")
	require.Contains(t, l.Reason, fmt.Sprintf("only the first %d bytes of each field", stream.KeptBytes))
	require.Equal(t, deadletter.ForgedKind, l.Kind)
	require.Equal(t, []byte(big[:stream.KeptBytes]), l.Payload)
	var payload *deadletter.RawField
	for i, f := range l.Raw {
		if string(f.Name) == "payload" {
			payload = &l.Raw[i]
		}
	}
	require.NotNil(t, payload)
	require.Equal(t, len(big), payload.ValueBytes)
	require.Equal(t, []byte(big[:stream.KeptBytes]), payload.Value)

	for id, reason := range hostile {
		l, ok := byStream[id]
		require.True(t, ok, "entry %s dead-lettered", id)
		require.Contains(t, l.Reason, reason, "entry %s", id)
		got, err := b.rdb.XRange(ctx, b.stream, id, id).Result()
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Len(t, l.Raw, len(got[0].Values), "entry %s: every field kept", id)
		for _, f := range l.Raw {
			require.Equal(t, got[0].Values[string(f.Name)], string(f.Value), "entry %s: field %q kept as received", id, f.Name)
			require.Equal(t, len(f.Value), f.ValueBytes)
		}
	}
	require.Contains(t, reasons, `"x-\xff6"`, "an identity that is not text is stored escaped")
	require.Contains(t, reasons, `"x-\x0014"`, "as is one holding a NUL")
	_, peak := h.EntryBytes()
	require.LessOrEqual(t, peak, int64(64<<20))
}
