package main_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// A run whose send failed released its claim ('-infinity'); a concurrent run
// whose send went through then marked the row sent. A later duplicate must
// be absorbed, not fail on "cannot subtract infinite timestamps" until it
// is dead-lettered for its deliveries.
func TestDuplicateAfterReleasedClaimMarkedSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.order(t, orders.Jobs{})
	ctx := context.Background()
	_, err := b.pool.Exec(ctx, `UPDATE tickets SET pdf_key = 'tickets/x.pdf' WHERE order_id = $1`, p.ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO plugin_tickets.email_sends (order_id, kind, claimed_at, sent_at) VALUES ($1, 'tickets', '-infinity', now())`, p.ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO outbox (kind, payload) VALUES ('send_tickets', json_build_object('order_id', $1::bigint))`, p.ID)
	require.NoError(t, err)
	hosttest.Start(t, b.config(2*time.Second))

	hosttest.Eventually(t, 20*time.Second, "the duplicate absorbed and nothing pending", func() bool {
		return b.absorbed(t, "effect already done") == 1 && hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	require.Zero(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM dead_letters`))
	require.Empty(t, b.messages(t), "nothing was sent again")
}
