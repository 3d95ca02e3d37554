package outbox_test

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/internal/entry"
)

// Two relays over the same outbox: every row is published and marked, none
// is lost.
func TestTwoRelaysLoseNothing(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	key := hosttest.SigningKey(t, pool)
	var relays []*outbox.Relay
	for range 2 {
		r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Redis: rdb, Stream: stream, Key: key, BatchSize: 25, PollInterval: 50 * time.Millisecond})
		require.NoError(t, err)
		relays = append(relays, r)
	}
	var wg sync.WaitGroup
	for _, r := range relays {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = r.Run(ctx)
		}()
	}
	const n = 2000
	// Rows committed while both relays run, from several writers.
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range n / 4 {
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := outbox.Add(ctx, tx, outbox.Message{Kind: "k", Payload: json.RawMessage(`{"w":` + strconv.Itoa(w) + `,"i":` + strconv.Itoa(i) + `}`)})
					return err
				})
				require.NoError(t, err)
			}
		}()
	}
	writers.Wait()
	hosttest.Eventually(t, 30*time.Second, "every row marked published", func() bool {
		return hosttest.Count(t, pool, `SELECT count(*) FROM outbox WHERE published_at IS NULL`) == 0
	})
	cancel()
	wg.Wait()

	msgs, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, m := range msgs {
		seen[m.Values[entry.FieldOutboxID].(string)] = true
		sig, _ := m.Values[entry.FieldSig].(string)
		require.True(t, entry.FieldsOf(m.Values).Verify(key, sig), "entry %s is signed", m.ID)
	}
	require.Len(t, seen, n, "every outbox row is on the stream")
	require.EqualValues(t, n, hosttest.Count(t, pool, `SELECT count(*) FROM outbox`))
	require.Len(t, msgs, n, "SKIP LOCKED gave each row to one relay")
}

func TestAddRefusesBadMessages(t *testing.T) {
	t.Parallel()
	pool, _ := hosttest.DB(t)
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Add(ctx, tx, outbox.Message{Kind: "k", Payload: json.RawMessage(`{`)})
		return err
	})
	require.ErrorContains(t, err, "not valid JSON")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := outbox.Add(ctx, tx, outbox.Message{Payload: json.RawMessage(`{}`)})
		return err
	})
	require.ErrorContains(t, err, "no kind")
}
