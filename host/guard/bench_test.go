package guard_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/sandbox"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
	"github.com/usherhq/usher/sdk/wire"
)

// BenchmarkClaimStatement measures the claim guard's one statement (insert
// the claim row, or re-claim a stale one), as the host runs it: in a
// transaction of its own on the plugin's pool, as the plugin's role. Each
// op claims a new row. ns/op is per claim.
func BenchmarkClaimStatement(b *testing.B) {
	owner, _ := hosttest.DB(b)
	ctx := context.Background()
	if _, err := owner.Exec(ctx, `CREATE TABLE sends (order_id bigint, kind text, claimed_at timestamptz NOT NULL, sent_at timestamptz,
		UNIQUE (order_id, kind)); GRANT SELECT, INSERT, UPDATE ON sends TO usher_plugin_raw`); err != nil {
		b.Fatal(err)
	}
	pool, err := sandbox.OpenPluginPool(ctx, sandbox.PoolConfig{Base: owner.Config(), Role: "usher_plugin_raw", Size: 4})
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	b.ResetTimer()
	for i := range b.N {
		kv, err := wire.ToValues([]any{int64(i), "tickets"})
		if err != nil {
			b.Fatal(err)
		}
		sql, args, err := guard.ClaimStatement(&usherv1.ClaimSpec{Table: "sends", KeyColumns: []string{"order_id", "kind"},
			KeyValues: kv, ClaimedColumn: "claimed_at", DoneColumn: "sent_at", LeaseMs: 120_000, Intent: "tickets"})
		if err != nil {
			b.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var at any
			return tx.QueryRow(ctx, sql, args...).Scan(&at)
		}); err != nil {
			b.Fatal(err)
		}
	}
}
