package sdktest_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/sdktest"
)

// Bonus is a job that credits a customer's wallet.
type Bonus struct {
	Customer int64 `json:"customer"`
}

func (Bonus) Kind() string { return "credit_bonus" }

const schema = `
CREATE TABLE wallets (customer bigint PRIMARY KEY, balance bigint NOT NULL DEFAULT 0, bonus_job text);
INSERT INTO wallets (customer) VALUES (7);`

// grants are the bonus plugin's, as its manifest would declare them.
var grants = []pluginhost.Grant{{Table: "wallets", Select: []string{"customer", "balance", "bonus_job"}, Update: []string{"balance", "bonus_job"}}}

// wrongBonus is deliberately not idempotent: its "conditional" write is
// always true, so every run credits again. The kit must catch it.
type wrongBonus struct{}

func (wrongBonus) Check(ctx context.Context, job sdk.Job[Bonus], db *sdk.ReadOnly) (struct{}, bool, error) {
	return struct{}{}, false, nil
}

func (wrongBonus) Prepare(ctx context.Context, job sdk.Job[Bonus], s struct{}) (struct{}, error) {
	return s, nil
}

func (wrongBonus) Commit(ctx context.Context, job sdk.Job[Bonus], tx *sdk.CommitTx, s struct{}) error {
	_, err := tx.WriteIf(ctx, `UPDATE wallets SET balance = balance + 10 WHERE customer = $1 RETURNING customer`, job.Args.Customer)
	return err
}

// rightBonus writes the state it reaches: the bonus is credited where no
// bonus job is recorded yet.
type rightBonus struct{ wrongBonus }

func (rightBonus) Commit(ctx context.Context, job sdk.Job[Bonus], tx *sdk.CommitTx, s struct{}) error {
	_, err := tx.WriteIf(ctx, `UPDATE wallets SET balance = balance + 10, bonus_job = $2
		WHERE customer = $1 AND bonus_job IS NULL RETURNING customer`, job.Args.Customer, job.ID)
	return err
}

// bonusCase runs the bonus plugin as its own role, usher_plugin_bonus
// (cluster-wide; made before a scenario's schema grants it).
func bonusCase(tb testing.TB, h sdk.StateFirst[Bonus, struct{}]) sdktest.Case[Bonus] {
	hosttest.EnsureRoles(tb, "bonus")
	return sdktest.Case[Bonus]{
		Schema: schema, Grants: grants,
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[Bonus] {
			p := sdk.New("bonus", "1")
			sdk.HandleStateFirst(p, h)
			return sdktest.Setup[Bonus]{Plugin: p, Args: Bonus{Customer: 7},
				Effects: func(ctx context.Context) (any, error) {
					var balance int64
					err := pool.QueryRow(ctx, `SELECT balance FROM wallets WHERE customer = 7`).Scan(&balance)
					return balance, err
				}}
		},
	}
}

func TestKitCatchesTheWrongHandler(t *testing.T) {
	t.Parallel()
	failures := sdktest.Check(t, bonusCase(t, wrongBonus{}))
	require.NotEmpty(t, failures, "the kit let a handler that credits twice pass")
	all := strings.Join(failures, "\n")
	require.Contains(t, all, "credit_bonus is not idempotent when it runs twice")
	require.Contains(t, all, "when two copies run at once")
	require.Contains(t, all, "clean run: 10")
	require.Contains(t, all, "this run:  20")
}

func TestKitPassesTheRightHandler(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, bonusCase(t, rightBonus{}))
}

// The kit runs the handler as its plugin's role with the grants its
// manifest declares: a grant the manifest lacks fails the test with the
// database's refusal, as the host would dead-letter the job.
func TestKitFailsAMissingGrant(t *testing.T) {
	t.Parallel()
	c := bonusCase(t, rightBonus{})
	c.Grants = []pluginhost.Grant{{Table: "wallets", Select: []string{"customer", "balance", "bonus_job"}}}
	failures := sdktest.Check(t, c)
	require.NotEmpty(t, failures)
	require.Contains(t, strings.Join(failures, "\n"), "permission denied for table wallets")
}

// sendingBonus sends its notice from Prepare: checked, sent, then marked.
// Run twice in a row, the second run's check finds the mark and sends
// nothing; only two copies that both pass the check before either marks
// send twice. The kit must force that interleaving, every time.
type sendingBonus struct {
	rightBonus
	sends *atomic.Int64
}

func (b sendingBonus) Check(ctx context.Context, job sdk.Job[Bonus], db *sdk.ReadOnly) (struct{}, bool, error) {
	var done *string
	err := db.QueryRow(ctx, `SELECT bonus_job FROM wallets WHERE customer = $1`, job.Args.Customer).Scan(&done)
	return struct{}{}, done != nil, err
}

func (b sendingBonus) Prepare(ctx context.Context, job sdk.Job[Bonus], s struct{}) (struct{}, error) {
	b.sends.Add(1) // the "provider call", in the wrong phase
	return s, nil
}

func TestKitForcesTheInterleavingThatCatchesASendInPrepare(t *testing.T) {
	t.Parallel()
	hosttest.EnsureRoles(t, "bonus")
	c := sdktest.Case[Bonus]{
		Schema: schema, Grants: grants,
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[Bonus] {
			sends := new(atomic.Int64)
			p := sdk.New("bonus", "1")
			sdk.HandleStateFirst(p, sendingBonus{sends: sends})
			return sdktest.Setup[Bonus]{Plugin: p, Args: Bonus{Customer: 7},
				Effects: func(ctx context.Context) (any, error) { return sends.Load(), nil }}
		},
	}
	failures := sdktest.Check(t, c)
	all := strings.Join(failures, "\n")
	require.Contains(t, all, "when two copies run at once, both past check before either goes on", "the forced interleaving caught the send")
	require.NotContains(t, all, "when it runs twice", "run one after the other, the check sees the mark")
}
