package limits_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/limits"
)

type bundle struct {
	pool   *pgxpool.Pool
	rdb    *redis.Client
	stream string
}

func setup(t *testing.T) bundle {
	t.Helper()
	pool, _ := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	return bundle{pool: pool, rdb: rdb, stream: stream}
}

// limiter is holder's Limiter on b, its limits read once.
func (b bundle) limiter(t *testing.T, holder string, lease time.Duration) *limits.Limiter {
	t.Helper()
	l, err := limits.New(limits.Config{Pool: b.pool, Redis: b.rdb, Stream: b.stream, Holder: holder, Lease: lease})
	require.NoError(t, err)
	require.NoError(t, l.Read(context.Background()))
	return l
}

// A host that dies holding permits frees them with their lease: host a
// takes both permits of a concurrency-2 kind and never releases them; host
// b is refused until the lease (600ms) ends, then takes one. A host that
// lives renews its permits (Run), and keeps them past the lease.
func TestPermitsOfADeadHostEndWithTheirLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := limits.Set(ctx, b.pool, limits.Limit{Kind: "k", Concurrency: 2}, "ada")
	require.NoError(t, err)
	const lease = 600 * time.Millisecond
	a, other := b.limiter(t, "a", lease), b.limiter(t, "b", lease)
	for _, id := range []string{"1-0", "2-0"} {
		_, ok, err := a.Acquire(ctx, "k", id)
		require.NoError(t, err)
		require.True(t, ok)
	}
	_, ok, err := other.Acquire(ctx, "k", "3-0")
	require.NoError(t, err)
	require.False(t, ok, "both permits held")
	require.False(t, other.Ready("k"), "refused just now")
	taken := time.Now()
	var release func()
	hosttest.Eventually(t, 10*time.Second, "a's permits to end with their lease", func() bool {
		var err error
		release, ok, err = other.Acquire(ctx, "k", "3-0")
		require.NoError(t, err)
		return ok
	})
	t.Logf("b took a permit %s after a stopped renewing (lease %s)", time.Since(taken).Round(10*time.Millisecond), lease)
	require.GreaterOrEqual(t, time.Since(taken), lease-100*time.Millisecond, "not before the lease ran out (less the Redis clock's slack)")
	release()

	// Alive, both renew what they hold: b one permit, a the other; a is
	// then refused for the whole of three leases.
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- other.Run(runCtx, func() {}) }()
	go func() { done <- a.Run(runCtx, func() {}) }()
	defer func() { stop(); <-done; <-done }()
	rel, ok, err := other.Acquire(ctx, "k", "4-0")
	require.NoError(t, err)
	require.True(t, ok)
	defer rel()
	_, ok, err = a.Acquire(ctx, "k", "5-0")
	require.NoError(t, err)
	require.True(t, ok)
	for end := time.Now().Add(3 * lease); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		_, ok, err := a.Acquire(ctx, "k", "6-0")
		require.NoError(t, err)
		require.False(t, ok, "b's renewed permit and a's own: none free")
	}
}

// A rate of 5/s with burst 2, asked from two limiters as fast as they
// can: 2 at once, then one each 200ms on Redis's clock.
func TestRateAcrossLimiters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	l, err := limits.Set(ctx, b.pool, limits.Limit{Kind: "k", Rate: 5, Burst: 2}, "ada")
	require.NoError(t, err)
	require.Equal(t, "rate 5/s burst 2", l.String())
	hosts := []*limits.Limiter{b.limiter(t, "a", time.Second), b.limiter(t, "b", time.Second)}
	start := time.Now()
	granted := 0
	for i := 0; time.Since(start) < 2*time.Second; i++ {
		_, ok, err := hosts[i%2].Acquire(ctx, "k", "x")
		require.NoError(t, err)
		if ok {
			granted++
		}
	}
	elapsed := time.Since(start)
	t.Logf("%d starts granted in %s at 5/s burst 2", granted, elapsed.Round(time.Millisecond))
	require.LessOrEqual(t, granted, 2+int(5*elapsed.Seconds())+1)
	require.GreaterOrEqual(t, granted, 2+int(5*2)-1, "the bucket refills")
}

func TestParseRate(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]float64{"10/s": 10, "10": 10, "600/m": 10, "3600/h": 1, "0.5/s": 0.5} {
		got, err := limits.ParseRate(in)
		require.NoError(t, err, in)
		require.InDelta(t, want, got, 1e-9, in)
	}
	for _, in := range []string{"", "0", "-1/s", "ten", "10/d", "NaN", "Inf"} {
		_, err := limits.ParseRate(in)
		require.Error(t, err, in)
	}
}
