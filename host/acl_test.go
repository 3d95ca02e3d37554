package host_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
)

// aclUser creates a Redis user of the test's own (unique name, random
// password) with exactly the README's ACL line after its name and
// password, deletes it when the test ends, and returns the URL a host
// logs in with.
func (b *testBundle) aclUser(t *testing.T) (user, redisURL string) {
	t.Helper()
	args := readmeACL(t)
	require.Equal(t, []string{"ACL", "SETUSER", "usher", "on", ">change-me"}, args[:5], "the README's user and password")
	user, pass := "usher_t_"+hosttest.Suffix(), hosttest.Suffix()
	cmd := []any{"ACL", "SETUSER", user, "on", ">" + pass}
	for _, a := range args[5:] {
		cmd = append(cmd, a)
	}
	require.NoError(t, b.rdb.Do(context.Background(), cmd...).Err())
	t.Cleanup(func() { _ = b.rdb.Do(context.Background(), "ACL", "DELUSER", user).Err() })
	return user, fmt.Sprintf("redis://%s:%s@%s/0", user, pass, b.rdb.Options().Addr)
}

// requireNothingRefused fails when Redis's ACL log holds a refusal of
// user's: a command, a key or a command inside a script.
func (b *testBundle) requireNothingRefused(t *testing.T, user string) {
	t.Helper()
	log, err := b.rdb.Do(context.Background(), "ACL", "LOG", "1024").Slice()
	require.NoError(t, err)
	for _, e := range log {
		require.NotContains(t, fmt.Sprint(e), user, "Redis refused the host a command")
	}
}

// A host whose Redis user has exactly the README's ACL line runs every
// Redis command and script it has, not only the job's path: the stream
// trim and the removal of gone consumers (retention), reclaim, parking an
// unhealthy plugin's entries and counting a poison entry's crashes. The
// poison is dead-lettered, every other job applied once, the stream
// trimmed to nothing and the gone consumer removed, and Redis refused the
// user nothing.
func TestACLUserRunsRetentionReclaimParkingPoison(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	user, redisURL := b.aclUser(t)
	want := b.placeOrders(t, 30, 3)
	poisonID := b.armFirstJob(t, "counter.before_apply", faults.Spec{Action: "crash"})
	stalledID := b.armJob(t, 1, "counter.after_apply", faults.Spec{Action: "stall", Duration: "2s", Once: true})
	// A consumer of a host gone for good, for the cleanup to remove.
	require.NoError(t, b.rdb.XGroupCreateMkStream(ctx, b.stream, "usher", "0").Err())
	require.NoError(t, b.rdb.XGroupCreateConsumer(ctx, b.stream, "usher", "gone-host").Err())
	t.Cleanup(func() {
		keys, _ := b.rdb.Keys(context.Background(), b.stream+":crashes:*").Result()
		for _, k := range keys {
			_ = b.rdb.Del(context.Background(), k).Err()
		}
	})

	cfg := b.config()
	cfg.Redis, cfg.RedisURL = nil, redisURL
	cfg.PoisonCrashes = 3
	cfg.PluginCrashLoop = 2 // the poison's crashes mark the plugin unhealthy: its entries are parked
	cfg.PluginUnhealthyRetry = 500 * time.Millisecond
	cfg.StreamTrimInterval = 100 * time.Millisecond
	cfg.CleanupInterval = 200 * time.Millisecond
	cfg.ConsumerIdleRemove = time.Millisecond
	cfg.OutboxRetention = time.Hour // the cleanup reads the low-water mark with the trim script too
	hosttest.Start(t, cfg)

	hosttest.Eventually(t, 90*time.Second, "the poison dead-lettered, the 29 others applied, the stream trimmed to nothing", func() bool {
		n, err := b.rdb.XLen(ctx, b.stream).Result()
		return err == nil && n == 0 &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`) == 1 &&
			hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies`) == 29 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	b.held(t, "counter.after_apply", stalledID) // it stalled past ReclaimIdle: reclaimed while it ran
	letters, err := deadletter.List(ctx, b.pool, "", 10)
	require.NoError(t, err)
	require.Len(t, letters, 1)
	require.Equal(t, poisonID, letters[0].JobID)
	require.Contains(t, letters[0].Reason, "poison: its runs crashed the plugin's process 3 times")
	require.EqualValues(t, 29, hosttest.Count(t, b.pool, `SELECT count(DISTINCT job_id) FROM counter_applies`), "each applied once")
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM counter_applies WHERE job_id = $1`, stalledID), "the reclaimed job applied once")
	var poisonEvent, poisonSeats int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT o.event_id, o.seats FROM outbox x JOIN orders o ON o.id = (x.payload->>'order_id')::bigint WHERE x.id::text = $1`, poisonID).
		Scan(&poisonEvent, &poisonSeats))
	want[poisonEvent] -= poisonSeats
	b.requireCounters(t, want)
	hosttest.Eventually(t, 10*time.Second, "the gone host's consumer removed", func() bool {
		cs, err := b.rdb.XInfoConsumers(ctx, b.stream, "usher").Result()
		if err != nil {
			return false
		}
		for _, c := range cs {
			if c.Name == "gone-host" {
				return false
			}
		}
		return true
	})
	b.requireNothingRefused(t, user)
}
