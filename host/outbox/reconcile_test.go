package outbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
)

// A row whose entry a host saw lately, waiting for a host that serves its
// kind, is not republished: its entry is still in the stream. One whose
// wait was seen longer ago than StaleAfter is, like any stale row.
func TestReconcileSkipsRowsWaitingForTheirKind(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO outbox (kind, payload, published_at, kind_waited_at) VALUES
		('waiting', '{}', now() - interval '1 hour', now()),
		('waited_long_ago', '{}', now() - interval '1 hour', now() - interval '1 hour'),
		('lost', '{}', now() - interval '1 hour', NULL)`)
	require.NoError(t, err)
	r, err := outbox.NewReconciler(outbox.ReconcilerConfig{Pool: pool, StaleAfter: 15 * time.Minute})
	require.NoError(t, err)
	n, err := r.Reconcile(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	require.EqualValues(t, 1, hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NOT NULL AND kind = 'waiting'`))
}
