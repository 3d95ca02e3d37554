package host_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/client"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
)

// outbox.Add takes the same key as the client: keyed and unkeyed messages
// in one batch keep their order, a key already held (by a client enqueue
// too: one key space per kind) answers the holder's id, and a job added
// twice by key runs once on a host.
func TestDedupOutboxAdd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	ev, err := orders.CreateEvent(ctx, b.pool, "Event", "Stagedoor Hall")
	require.NoError(t, err)
	placed, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "Ada", Email: "a@example.com", Seats: 3}, orders.Jobs{})
	require.NoError(t, err)
	payload := json.RawMessage(`{"order_id": ` + strconv.FormatInt(placed.ID, 10) + `}`)
	msg := outbox.Message{Kind: counterKind, Payload: payload, DedupKey: "order-" + strconv.FormatInt(placed.ID, 10)}

	first, err := client.Enqueue(ctx, b.pool, client.Job{Kind: counterKind, Payload: payload, DedupKey: msg.DedupKey})
	require.NoError(t, err)
	ids, err := outbox.Add(ctx, b.pool, outbox.Message{Kind: "other_kind", Payload: json.RawMessage(`{}`)}, msg,
		outbox.Message{Kind: "other_kind", Payload: json.RawMessage(`{}`), DedupKey: msg.DedupKey, DedupWindow: time.Hour}, msg)
	require.NoError(t, err)
	require.Len(t, ids, 4)
	require.Equal(t, first, ids[1], "held by the client's enqueue")
	require.Equal(t, first, ids[3])
	require.NotEqual(t, ids[0], ids[2])
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = $1`, counterKind))
	require.EqualValues(t, 3, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox`))
	_, err = outbox.Add(ctx, b.pool, outbox.Message{Kind: "k", Payload: json.RawMessage(`{}`), DedupWindow: time.Hour})
	require.ErrorContains(t, err, "DedupWindow and no DedupKey")

	// The counters plugin runs the one job: the seats are counted once.
	cfg := b.config()
	hosttest.Start(t, cfg)
	hosttest.Eventually(t, 30*time.Second, "the job applied", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = $1 AND outcome = 'applied'`, counterKind) == 1
	})
	require.EqualValues(t, 3, hosttest.Count(t, b.pool, `SELECT seats_sold FROM events WHERE id = $1`, ev))
}
