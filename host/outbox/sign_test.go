package outbox_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/internal/entry"
)

// Hosts starting at once on a new database agree on one generated key, and
// a plugin's role cannot read it.
func TestLoadSigningKeyAgrees(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	const n = 8
	keys := make([][]byte, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := outbox.LoadSigningKey(ctx, pool)
			require.NoError(t, err)
			keys[i] = k
		}()
	}
	wg.Wait()
	for _, k := range keys {
		require.Len(t, k, entry.MinKeyLen)
		require.Equal(t, keys[0], k)
	}
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM runtime_secrets`))

	// A plugin's login role cannot read it.
	for _, p := range []string{"counters", "tickets"} {
		role := sandbox.PluginRole(p)
		ppool, err := sandbox.OpenPluginPool(ctx, sandbox.PoolConfig{Base: pool.Config(), Role: role, Size: 1})
		require.NoError(t, err)
		_, err = ppool.Exec(ctx, `SELECT value FROM runtime_secrets`)
		require.ErrorContains(t, err, "permission denied", "%s reads the signing key", role)
		ppool.Close()
	}
}
