package main_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
	"github.com/usherhq/usher/plugins/tickets/blob"
	"github.com/usherhq/usher/plugins/tickets/handlers"
	"github.com/usherhq/usher/plugins/tickets/mail"
)

type testBundle struct {
	pool     *pgxpool.Pool
	dbURL    string
	rdb      *redis.Client
	stream   string
	blobDir  string
	faultDir string
	mail     *mail.Client
	mailURL  string
	plugin   string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	pool, url := hosttest.DB(t)
	rdb, stream := hosttest.Redis(t)
	mailURL := hosttest.MailProvider(t)
	return &testBundle{pool: pool, dbURL: url, rdb: rdb, stream: stream, blobDir: t.TempDir(), faultDir: t.TempDir(),
		mail: &mail.Client{BaseURL: mailURL}, mailURL: mailURL, plugin: hosttest.Build(t, "./plugins/tickets/chaos")}
}

func (b *testBundle) config(lease time.Duration) host.Config {
	return host.Config{
		DatabaseURL: b.dbURL, Redis: b.rdb, Stream: b.stream, Plugins: []string{b.plugin},
		PluginEnv: []string{faults.DirEnv + "=" + b.faultDir, "USHER_BLOB_DIR=" + b.blobDir,
			"MAILPROVIDER_URL=" + b.mailURL, "TICKETS_CLAIM_LEASE=" + lease.String()},
		ReclaimIdle: time.Second, RelayPollInterval: 100 * time.Millisecond, RetryBackoff: 200 * time.Millisecond,
	}
}

func (b *testBundle) order(t *testing.T, jobs orders.Jobs) orders.Placed {
	t.Helper()
	ctx := context.Background()
	ev, err := orders.CreateEvent(ctx, b.pool, "Nils Frahm", "Funkhaus")
	require.NoError(t, err)
	p, err := orders.Place(ctx, b.pool, orders.Order{EventID: ev, Buyer: "Zoë", Email: "zoe@example.com", Seats: 3}, jobs)
	require.NoError(t, err)
	return p
}

func (b *testBundle) messages(t *testing.T) []mail.SentMessage {
	t.Helper()
	m, err := b.mail.Messages(context.Background())
	require.NoError(t, err)
	return m
}

func (b *testBundle) absorbed(t *testing.T, reason string) int64 {
	return hosttest.Count(t, b.pool, `SELECT coalesce(sum(count), 0)::bigint FROM absorbed_duplicates WHERE reason = $1`, reason)
}

func (b *testBundle) waitSent(t *testing.T, orderID int64) {
	t.Helper()
	hosttest.Eventually(t, 45*time.Second, "the ticket email marked sent and nothing pending", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM plugin_tickets.email_sends WHERE order_id = $1 AND sent_at IS NOT NULL`, orderID) == 1 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
}

// Two workers pass the null check at once: both render, one PDF is stored,
// one send_tickets is queued, one email leaves.
func TestTwoRendersPassTheNullCheck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.order(t, orders.Jobs{Tickets: true})
	renderJob := fmt.Sprint(p.OutboxIDs[0])
	// Both runs stall after their check, so both see pdf_key null.
	require.NoError(t, faults.Arm(b.faultDir, "render.after_check", faults.Spec{Action: "stall", Duration: "1500ms", JobIDs: []string{renderJob}}))
	cfg := b.config(time.Minute)
	var once sync.Once
	cfg.RelayAfterPublish = func(ids []int64) error { // publish the render job twice
		err := errors.New("relay crashed between publish and mark")
		fired := false
		once.Do(func() { fired = true })
		if fired {
			return err
		}
		return nil
	}
	hosttest.Start(t, cfg)

	b.waitSent(t, p.ID)
	require.EqualValues(t, 1, b.absorbed(t, "conditional write lost to another run"), "the second render's conditional write lost")
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM outbox WHERE kind = 'send_tickets'`), "one send_tickets queued")
	store, err := blob.NewFS(b.blobDir)
	require.NoError(t, err)
	keys, err := store.List(context.Background(), "tickets/")
	require.NoError(t, err)
	require.Equal(t, []string{handlers.PDFKey(p.PublicID)}, keys, "one stored PDF")
	require.EqualValues(t, 0, hosttest.Count(t, b.pool, `SELECT count(*) FROM tickets WHERE order_id = $1 AND pdf_key IS NULL`, p.ID))
	require.Len(t, b.messages(t), 1, "one email at the provider")
}

// The plugin crashes after the provider accepted the send and before the
// host wrote sent_at. After the lease the retry re-claims, sends with the
// same key, and the provider holds one message.
func TestCrashAfterProviderAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.order(t, orders.Jobs{Tickets: true})
	require.NoError(t, faults.Arm(b.faultDir, "send.after_effect", faults.Spec{Action: "crash", Once: true}))
	hosttest.Start(t, b.config(2*time.Second))

	b.waitSent(t, p.ID)
	msgs := b.messages(t)
	require.Len(t, msgs, 1, "the provider holds one message")
	require.Equal(t, fmt.Sprintf("tickets-%d", p.ID), msgs[0].IdempotencyKey, "the key is derived from the intent")
	// The effect's result is kept with the mark: the provider's id of the
	// one message, which the replay answered again.
	var kept string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT provider_message_id FROM plugin_tickets.email_sends WHERE order_id = $1`, p.ID).Scan(&kept))
	require.Equal(t, msgs[0].ID, kept, "the provider's message id is kept in the claim row")
	stats, err := b.mail.Stats(context.Background())
	require.NoError(t, err)
	require.GreaterOrEqual(t, stats.Replayed, 1, "the retry's send was a replay of the first")
	require.GreaterOrEqual(t, hosttest.Count(t, b.pool, `SELECT count(*) FROM scheduled_jobs WHERE reason = 'claim held by another run'`), int64(1),
		"the reclaimed run found the crashed run's claim fresh and retried after the lease")
}

// A fresh claim held by another run makes this run retry after the lease;
// the retry survives a host restart, finds the claim stale, re-claims it and
// sends once.
func TestFreshClaimRetriesAfterLeaseAcrossRestart(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	p := b.order(t, orders.Jobs{})
	// The tickets are rendered; another run claimed the send a moment ago.
	store, err := blob.NewFS(b.blobDir)
	require.NoError(t, err)
	require.NoError(t, store.Put(ctx, handlers.PDFKey(p.PublicID), []byte("%PDF-1.4 test")))
	_, err = b.pool.Exec(ctx, `UPDATE tickets SET pdf_key = $1 WHERE order_id = $2`, handlers.PDFKey(p.PublicID), p.ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO plugin_tickets.email_sends (order_id, kind, claimed_at) VALUES ($1, 'tickets', now())`, p.ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `INSERT INTO outbox (kind, payload) VALUES ('send_tickets', jsonb_build_object('order_id', $1::bigint))`, p.ID)
	require.NoError(t, err)

	first := hosttest.Start(t, b.config(3*time.Second))
	hosttest.Eventually(t, 20*time.Second, "the run to schedule a retry after the lease", func() bool {
		return hosttest.Count(t, b.pool, `SELECT count(*) FROM scheduled_jobs WHERE reason = 'claim held by another run'`) == 1 &&
			hosttest.Pending(t, b.rdb, b.stream, "usher") == 0
	})
	require.Empty(t, b.messages(t), "nothing was sent while another run held the claim")
	require.NoError(t, first.Stop())

	hosttest.Start(t, b.config(3*time.Second))
	b.waitSent(t, p.ID)
	require.Len(t, b.messages(t), 1)
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM scheduled_jobs`), "the retry was scheduled once")
	require.EqualValues(t, 1, hosttest.Count(t, b.pool, `SELECT count(*) FROM scheduled_jobs WHERE enqueued_at IS NOT NULL`), "and ran once")
	require.EqualValues(t, 0, b.absorbed(t, "effect already done"))
}

// A second delivery after the send is marked finds the effect done.
func TestSendAfterDoneIsAbsorbed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.order(t, orders.Jobs{Tickets: true})
	hosttest.Start(t, b.config(time.Minute))
	b.waitSent(t, p.ID)
	_, err := b.pool.Exec(context.Background(), `INSERT INTO outbox (kind, payload) VALUES ('send_tickets', jsonb_build_object('order_id', $1::bigint))`, p.ID)
	require.NoError(t, err)
	hosttest.Eventually(t, 20*time.Second, "the duplicate send absorbed", func() bool {
		return b.absorbed(t, "effect already done") == 1
	})
	require.Len(t, b.messages(t), 1)
}
