package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/sdktest"
)

// sdktest runs each kind once cleanly, then twice, as two copies at once
// (also held together past the claim, or past the record of the job id),
// and crashed at every step boundary of its guard, on a fresh database
// each time, as the plugin's own role; every run must leave what the clean
// run left.

func TestRefundIsIdempotent(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[Refund]{
		Plugin: "refunds",
		Schema: schema(t),
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[Refund] {
			p := startProvider(tb)
			return sdktest.Setup[Refund]{
				Plugin: newPlugin(p.URL, sdk.DefaultLease),
				Args:   Refund{RefundID: "rf-4471", PaymentID: "pay-19", AmountCents: 2500, Currency: "EUR"},
				// One refund at the provider, its id kept in the claim row.
				Effects: func(ctx context.Context) (any, error) {
					claims, err := rows(ctx, pool, `SELECT refund_id, done_at IS NOT NULL, provider_refund_id FROM refund_claims`)
					if err != nil {
						return nil, err
					}
					refunds, err := p.refunds(ctx)
					return []any{claims, refunds}, err
				},
			}
		},
	})
}

func TestCreditWalletIsIdempotent(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, sdktest.Case[CreditWallet]{
		Plugin: "refunds",
		Schema: schema(t),
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[CreditWallet] {
			if _, err := pool.Exec(context.Background(), `INSERT INTO wallets (id, balance_cents) VALUES (7, 1000)`); err != nil {
				tb.Fatal(err)
			}
			return sdktest.Setup[CreditWallet]{
				Plugin: newPlugin("", sdk.DefaultLease),
				Args:   CreditWallet{WalletID: 7, AmountCents: 250, Reason: "goodwill"},
				// One credit: the balance and one ledger entry.
				Effects: func(ctx context.Context) (any, error) {
					return rows(ctx, pool, `SELECT w.balance_cents, count(l.*), coalesce(sum(l.amount_cents), 0)
						FROM wallets w LEFT JOIN wallet_ledger l ON l.wallet_id = w.id GROUP BY w.id`)
				},
			}
		},
	})
}

// schema is the Up half of every migration, in order, then what
// `host plugins install` gives the plugin's role on each table they create.
// sdktest runs it in the public schema, where install would use
// plugin_refunds.
//
// PLUGIN-OWNED SCHEMAS: once sdktest installs a plugin's migrations and
// grants as a host does (Case.Migrations, Case.Grants), this helper goes:
// Migrations: os.DirFS("migrations") and the grants of grants.json replace
// Schema: schema(t).
func schema(tb testing.TB) string {
	tb.Helper()
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		tb.Fatalf("no migrations: %v", err)
	}
	var b strings.Builder
	for _, f := range files {
		sql, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		_, up, _ := strings.Cut(string(sql), "-- +goose Up")
		up, _, _ = strings.Cut(up, "-- +goose Down")
		b.WriteString(up)
		for _, m := range createTable.FindAllStringSubmatch(up, -1) {
			fmt.Fprintf(&b, "\nGRANT SELECT, INSERT, UPDATE, DELETE ON %s TO usher_plugin_refunds;", m[1])
		}
	}
	return b.String()
}

var createTable = regexp.MustCompile(`(?im)^\s*CREATE TABLE (?:IF NOT EXISTS )?([a-z_][a-z0-9_]*)`)

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
