package handlers_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/plugins/stagedoor"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
	"github.com/usherhq/usher/plugins/tickets/blob"
	"github.com/usherhq/usher/plugins/tickets/handlers"
	"github.com/usherhq/usher/plugins/tickets/mail"
	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/sdktest"
)

func placeOrder(tb testing.TB, pool *pgxpool.Pool) orders.Placed {
	ctx := context.Background()
	ev, err := orders.CreateEvent(ctx, pool, "Arooj Aftab", "Barbican")
	require.NoError(tb, err)
	o, err := orders.Place(ctx, pool, orders.Order{EventID: ev, Buyer: "Zoë", Email: "zoe@example.com", Seats: 2}, orders.Jobs{})
	require.NoError(tb, err)
	return o
}

type renderEffects struct {
	TicketsWithKey int64
	SendQueued     int64
	Stored         []string
}

// ticketsGrants are the tickets plugin's grants, the file its manifest is
// written from.
func ticketsGrants(t *testing.T) []pluginhost.Grant {
	t.Helper()
	g, err := pluginhost.ReadGrants("../db/grants.json")
	require.NoError(t, err)
	return g
}

func TestRenderTicketsIsIdempotent(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[stagedoor.RenderTickets]{
		Migrations: os.DirFS("../db/migrations"), Grants: ticketsGrants(t),
		// Served by the same plugin in production; this Plugin serves
		// render_tickets alone.
		Enqueues: []string{"send_tickets"},
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[stagedoor.RenderTickets] {
			o := placeOrder(tb, pool)
			store, err := blob.NewFS(tb.TempDir())
			require.NoError(tb, err)
			p := sdk.New("tickets", "test")
			sdk.HandleStateFirst(p, &handlers.Render{Store: store})
			return sdktest.Setup[stagedoor.RenderTickets]{
				Plugin: p, Args: stagedoor.RenderTickets{OrderID: o.ID},
				Effects: func(ctx context.Context) (any, error) {
					var e renderEffects
					if err := pool.QueryRow(ctx, `SELECT
						(SELECT count(*) FROM tickets WHERE pdf_key IS NOT NULL),
						(SELECT count(*) FROM outbox WHERE kind = 'send_tickets')`).Scan(&e.TicketsWithKey, &e.SendQueued); err != nil {
						return nil, err
					}
					keys, err := store.List(ctx, "tickets/")
					// Public ids differ per database; compare how many.
					e.Stored = []string{fmt.Sprint(len(keys))}
					return e, err
				},
				// Both tickets keyed, one PDF stored, one send queued.
				Want: renderEffects{TicketsWithKey: 2, SendQueued: 1, Stored: []string{"1"}},
			}
		},
	})
}

// A checkout's render (its caller sends the tickets itself) is as
// idempotent, and queues no send_tickets.
func TestRenderTicketsForACheckoutQueuesNoSend(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[stagedoor.RenderTickets]{
		Migrations: os.DirFS("../db/migrations"), Grants: ticketsGrants(t),
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[stagedoor.RenderTickets] {
			o := placeOrder(tb, pool)
			store, err := blob.NewFS(tb.TempDir())
			require.NoError(tb, err)
			p := sdk.New("tickets", "test")
			sdk.HandleStateFirst(p, &handlers.Render{Store: store})
			return sdktest.Setup[stagedoor.RenderTickets]{
				Plugin: p, Args: stagedoor.RenderTickets{OrderID: o.ID, SendSeparately: true},
				Effects: func(ctx context.Context) (any, error) {
					var e renderEffects
					if err := pool.QueryRow(ctx, `SELECT
						(SELECT count(*) FROM tickets WHERE pdf_key IS NOT NULL),
						(SELECT count(*) FROM outbox WHERE kind = 'send_tickets')`).Scan(&e.TicketsWithKey, &e.SendQueued); err != nil {
						return nil, err
					}
					if e.SendQueued != 0 {
						return nil, fmt.Errorf("a render with SendSeparately queued %d send_tickets", e.SendQueued)
					}
					keys, err := store.List(ctx, "tickets/")
					e.Stored = []string{fmt.Sprint(len(keys))}
					return e, err
				},
				Want: renderEffects{TicketsWithKey: 2, SendQueued: 0, Stored: []string{"1"}},
			}
		},
	})
}

type sendEffects struct {
	Messages int
	Keys     []string
	Sent     int64
}

func TestSendTicketsIsIdempotent(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[stagedoor.SendTickets]{
		Migrations: os.DirFS("../db/migrations"), Grants: ticketsGrants(t),
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[stagedoor.SendTickets] {
			ctx := context.Background()
			o := placeOrder(tb, pool)
			store, err := blob.NewFS(tb.TempDir())
			require.NoError(tb, err)
			require.NoError(tb, store.Put(ctx, handlers.PDFKey(o.PublicID), []byte("%PDF-1.4 rendered")))
			_, err = pool.Exec(ctx, `UPDATE tickets SET pdf_key = $1 WHERE order_id = $2`, handlers.PDFKey(o.PublicID), o.ID)
			require.NoError(tb, err)
			mailer := &mail.Client{BaseURL: hosttest.MailProvider(tb), HTTP: &http.Client{Timeout: 5 * time.Second}}
			p := sdk.New("tickets", "test")
			sdk.HandleClaim(p, &handlers.Send{Store: store, Mailer: mailer})
			return sdktest.Setup[stagedoor.SendTickets]{
				Plugin: p, Args: stagedoor.SendTickets{OrderID: o.ID},
				Effects: func(ctx context.Context) (any, error) {
					msgs, err := mailer.Messages(ctx)
					if err != nil {
						return nil, err
					}
					e := sendEffects{Messages: len(msgs)}
					for _, m := range msgs {
						e.Keys = append(e.Keys, m.IdempotencyKey)
					}
					err = pool.QueryRow(ctx, `SELECT count(*) FROM plugin_tickets.email_sends WHERE sent_at IS NOT NULL`).Scan(&e.Sent)
					return e, err
				},
				// One email at the provider, under the intent's key, and
				// its claim marked sent.
				Want: sendEffects{Messages: 1, Keys: []string{"tickets-" + strconv.FormatInt(o.ID, 10)}, Sent: 1},
			}
		},
	})
}
