package main

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/sdktest"
)

// sdktest runs each kind once cleanly, then twice, as two copies at once
// (also held together past the claim, or past the record of the job id),
// and crashed at every step boundary of its guard, on a fresh database
// each time, as the plugin's own role; every run must leave what the test
// states (Want), so a handler that does nothing fails.

// refunded is the one refund rf-4471 leaves at the provider.
var refunded = []performed{{ID: "re_1", Key: "refund-rf-4471", PaymentID: "pay-19", AmountCents: 2500, Currency: "EUR"}}

func TestRefundIsIdempotent(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[Refund]{
		Plugin: "refunds",
		// Its own migrations, installed in plugin_refunds as `host plugins
		// install` does; grants.json declares nothing outside it.
		Migrations: os.DirFS("migrations"),
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[Refund] {
			p := startProvider(tb)
			return sdktest.Setup[Refund]{
				Plugin: newPlugin(p.URL, sdk.DefaultLease),
				Args:   Refund{RefundID: "rf-4471", PaymentID: "pay-19", AmountCents: 2500, Currency: "EUR"},
				// One refund at the provider, its id kept in the claim row.
				Effects: func(ctx context.Context) (any, error) {
					claims, err := rows(ctx, pool, `SELECT refund_id, done_at IS NOT NULL, provider_refund_id FROM plugin_refunds.refund_claims`)
					if err != nil {
						return nil, err
					}
					refunds, err := p.refunds(ctx)
					return []any{claims, refunds}, err
				},
				Want: []any{[][]any{{"rf-4471", true, "re_1"}}, refunded},
			}
		},
	})
}

func TestCreditWalletIsIdempotent(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[CreditWallet]{
		Plugin: "refunds",
		// Its own migrations, installed in plugin_refunds as `host plugins
		// install` does; grants.json declares nothing outside it.
		Migrations: os.DirFS("migrations"),
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[CreditWallet] {
			if _, err := pool.Exec(context.Background(), `INSERT INTO plugin_refunds.wallets (id, balance_cents) VALUES (7, 1000)`); err != nil {
				tb.Fatal(err)
			}
			return sdktest.Setup[CreditWallet]{
				Plugin: newPlugin("", sdk.DefaultLease),
				Args:   CreditWallet{WalletID: 7, AmountCents: 250, Reason: "goodwill"},
				// One credit: the balance and one ledger entry.
				Effects: func(ctx context.Context) (any, error) {
					return rows(ctx, pool, `SELECT w.balance_cents, count(l.*), coalesce(sum(l.amount_cents), 0)
						FROM plugin_refunds.wallets w LEFT JOIN plugin_refunds.wallet_ledger l ON l.wallet_id = w.id GROUP BY w.id`)
				},
				Want: [][]any{{1250, 1, 250}},
				// Another credit to the same wallet at once: both land.
				Race: &sdktest.Race[CreditWallet]{Args: CreditWallet{WalletID: 7, AmountCents: 100, Reason: "apology"},
					Want: [][]any{{1350, 2, 350}}},
			}
		},
	})
}

// rows reads every row of sql.
func rows(ctx context.Context, pool *pgxpool.Pool, sql string) ([][]any, error) {
	r, err := pool.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var out [][]any
	for r.Next() {
		vals, err := r.Values()
		if err != nil {
			return nil, err
		}
		out = append(out, vals)
	}
	return out, r.Err()
}

// A return, proved through the host's decider and guard runner
// (sdktest.RunFlow): the refund at the provider once, the goodwill credit
// once, the workflow completed with both, whatever is run twice or crashed
// and redelivered.
func TestReturnWorkflow(t *testing.T) {
	t.Parallel()
	flow := func() sdktest.Flow[Return] {
		return sdktest.Flow[Return]{
			Plugin: "refunds", Migrations: os.DirFS("migrations"),
			Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.FlowSetup[Return] {
				if _, err := pool.Exec(context.Background(), `INSERT INTO plugin_refunds.wallets (id, balance_cents) VALUES (7, 1000)`); err != nil {
					tb.Fatal(err)
				}
				p := startProvider(tb)
				return sdktest.FlowSetup[Return]{
					Plugin: newPlugin(p.URL, sdk.DefaultLease), Type: "return", ID: "ret-4471",
					Input: Return{Refund: Refund{RefundID: "rf-4471", PaymentID: "pay-19", AmountCents: 2500, Currency: "EUR"},
						WalletID: 7, GoodwillCents: 500},
					Effects: func(ctx context.Context) (any, error) {
						balance, err := rows(ctx, pool, `SELECT balance_cents FROM plugin_refunds.wallets`)
						if err != nil {
							return nil, err
						}
						refunds, err := p.refunds(ctx)
						return []any{balance, refunds}, err
					},
					// The refund once, the goodwill credit once.
					Want: []any{[][]any{{1500}}, refunded},
				}
			},
		}
	}
	run := sdktest.RunFlow(t, flow())
	if run.State != "completed" || string(run.Result) != `{"refund_id": "rf-4471", "credited_cents": 500}` {
		t.Fatalf("the return ended %s with %s", run.State, run.Result)
	}
}
