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
INSERT INTO wallets (customer) VALUES (7);
CREATE TABLE credits (job_id text PRIMARY KEY);`

// grants are the bonus plugin's, as its manifest would declare them.
var grants = []pluginhost.Grant{
	{Table: "wallets", Select: []string{"customer", "balance", "bonus_job"}, Update: []string{"balance", "bonus_job"}},
	{Table: "credits", Select: []string{"job_id"}, Insert: []string{"job_id"}},
}

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
				},
				// One bonus of 10, never 20, never none.
				Want: 10}
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
	require.Contains(t, all, "want:     10")
	require.Contains(t, all, "this run: 20")
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
				Effects: func(ctx context.Context) (any, error) { return sends.Load(), nil },
				Want:    1}
		},
	}
	failures := sdktest.Check(t, c)
	all := strings.Join(failures, "\n")
	require.Contains(t, all, "when two copies run at once, both past check before either goes on", "the forced interleaving caught the send")
	require.NotContains(t, all, "when it runs twice", "run one after the other, the check sees the mark")
}

// A Case must state what a clean run leaves: without Setup.Want, or with
// one the database shows before the job runs, no handler passes.
func TestKitRefusesACaseThatStatesNoEffects(t *testing.T) {
	t.Parallel()
	c := bonusCase(t, rightBonus{})
	start := c.Start
	c.Start = func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[Bonus] {
		s := start(tb, pool)
		s.Want = nil
		return s
	}
	failures := sdktest.Check(t, c)
	require.Len(t, failures, 1)
	require.Contains(t, failures[0], "Setup.Want is not set: state what a single clean run must leave")

	c.Start = func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[Bonus] {
		s := start(tb, pool)
		s.Want = 0 // the balance before the bonus
		return s
	}
	failures = sdktest.Check(t, c)
	require.Len(t, failures, 1)
	require.Contains(t, failures[0], "is what Effects reads before the job runs: the test cannot tell a handler that does nothing from one that works")
}

// Topup credits Amount to a customer's wallet, its job id recorded.
type Topup struct {
	Customer int64 `json:"customer"`
	Amount   int64 `json:"amount"`
}

func (Topup) Kind() string { return "topup" }

// topupNothing does nothing: idempotent, and wrong. Before expected
// effects, every scenario matched the clean run (nothing) and it passed.
type topupNothing struct{}

func (topupNothing) Apply(ctx context.Context, job sdk.Job[Topup], tx *sdk.Tx) error { return nil }

// topupDoubled credits twice in one run: every scenario matches its clean
// run, and the clean run is wrong.
type topupDoubled struct{}

func (topupDoubled) Apply(ctx context.Context, job sdk.Job[Topup], tx *sdk.Tx) error {
	add := sdk.Statement{SQL: `UPDATE wallets SET balance = balance + $2 WHERE customer = $1`, Args: []any{job.Args.Customer, job.Args.Amount}}
	tx.Queue(add, add)
	return nil
}

// topupAdds lets the database add: two jobs at once both land.
type topupAdds struct{}

func (topupAdds) Apply(ctx context.Context, job sdk.Job[Topup], tx *sdk.Tx) error {
	tx.Queue(sdk.Statement{SQL: `UPDATE wallets SET balance = balance + $2 WHERE customer = $1`,
		Args: []any{job.Args.Customer, job.Args.Amount}, MinRows: 1})
	return nil
}

// topupLostUpdate reads the balance and writes the sum back: idempotent
// per job (its id is recorded), but two jobs that both read before either
// writes leave one credit: a lost update.
type topupLostUpdate struct{}

func (topupLostUpdate) Apply(ctx context.Context, job sdk.Job[Topup], tx *sdk.Tx) error {
	return readThenWrite(ctx, job, tx, `SELECT balance FROM wallets WHERE customer = $1`)
}

// topupLocked reads the balance FOR UPDATE: the second job's read waits
// for the first's commit, so no update is lost.
type topupLocked struct{}

func (topupLocked) Apply(ctx context.Context, job sdk.Job[Topup], tx *sdk.Tx) error {
	return readThenWrite(ctx, job, tx, `SELECT balance FROM wallets WHERE customer = $1 FOR UPDATE`)
}

func readThenWrite(ctx context.Context, job sdk.Job[Topup], tx *sdk.Tx, read string) error {
	var balance int64
	if err := tx.QueryRow(ctx, read, job.Args.Customer).Scan(&balance); err != nil {
		return err
	}
	tx.Queue(sdk.Statement{SQL: `UPDATE wallets SET balance = $2 WHERE customer = $1`,
		Args: []any{job.Args.Customer, balance + job.Args.Amount}, MinRows: 1})
	return nil
}

// topupCase credits 10 to customer 7 (balance 0) with h; its race is
// another job crediting 5 to the same wallet.
func topupCase(tb testing.TB, h sdk.RecordJobID[Topup]) sdktest.Case[Topup] {
	return topupCaseOf(tb, func(p *sdk.Plugin) { sdk.HandleRecordJobID(p, h) })
}

func topupCaseOf(tb testing.TB, register func(*sdk.Plugin)) sdktest.Case[Topup] {
	hosttest.EnsureRoles(tb, "bonus")
	return sdktest.Case[Topup]{
		Schema: schema, Grants: grants,
		Start: func(tb testing.TB, pool *pgxpool.Pool) sdktest.Setup[Topup] {
			p := sdk.New("bonus", "1")
			register(p)
			return sdktest.Setup[Topup]{Plugin: p, Args: Topup{Customer: 7, Amount: 10},
				Effects: func(ctx context.Context) (any, error) {
					var balance int64
					err := pool.QueryRow(ctx, `SELECT balance FROM wallets WHERE customer = 7`).Scan(&balance)
					return balance, err
				},
				Want: 10,
				Race: &sdktest.Race[Topup]{Args: Topup{Customer: 7, Amount: 5}, Want: 15}}
		},
	}
}

func TestKitFailsAHandlerThatDoesNothing(t *testing.T) {
	t.Parallel()
	failures := sdktest.Check(t, topupCase(t, topupNothing{}))
	require.Len(t, failures, 1, "the clean run fails, nothing else runs")
	require.Contains(t, failures[0], "topup: a single clean run left other effects than the test states (Setup.Want)")
	require.Contains(t, failures[0], "want:     10\n  this run: 0")
}

func TestKitFailsAHandlerThatDoubles(t *testing.T) {
	t.Parallel()
	failures := sdktest.Check(t, topupCase(t, topupDoubled{}))
	require.Len(t, failures, 1)
	require.Contains(t, failures[0], "want:     10\n  this run: 20")
}

// Two jobs on the same wallet, both reading before either writes: the
// read-then-write loses the first credit, and only that scenario fails.
func TestKitCatchesALostUpdateBetweenTwoJobs(t *testing.T) {
	t.Parallel()
	failures := sdktest.Check(t, topupCase(t, topupLostUpdate{}))
	require.Len(t, failures, 1, "%s", strings.Join(failures, "\n"))
	require.Contains(t, failures[0], "topup is not idempotent when another job on the same rows runs at once, both reading before either writes")
	require.Contains(t, failures[0], "(Setup.Race.Want)")
	require.Contains(t, failures[0], "want:     15")
}

func TestKitPassesTwoJobsThatLetTheDatabaseAdd(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, topupCase(t, topupAdds{}))
}

func TestKitPassesTwoJobsThatLockTheRow(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, topupCase(t, topupLocked{}))
}

// stateCredit is a top-up under the state-first guard: the state is the
// job's row in credits. Check reads the balance; Commit records the job
// and, where it won, writes the balance: with lost, the one Check read
// plus the amount (a read in one phase, a write in another).
type stateCredit struct{ lost bool }

type creditState struct {
	Balance int64 `json:"balance"`
}

func (stateCredit) Check(ctx context.Context, job sdk.Job[Topup], db *sdk.ReadOnly) (creditState, bool, error) {
	var st creditState
	var done bool
	err := db.QueryRow(ctx, `SELECT balance, EXISTS (SELECT 1 FROM credits WHERE job_id = $2) FROM wallets WHERE customer = $1`,
		job.Args.Customer, job.ID).Scan(&st.Balance, &done)
	return st, done, err
}

func (stateCredit) Prepare(ctx context.Context, job sdk.Job[Topup], st creditState) (creditState, error) {
	return st, nil
}

func (h stateCredit) Commit(ctx context.Context, job sdk.Job[Topup], tx *sdk.CommitTx, st creditState) error {
	win, err := tx.WriteIf(ctx, `INSERT INTO credits (job_id) VALUES ($1) ON CONFLICT DO NOTHING RETURNING job_id`, job.ID)
	if err != nil || win == nil {
		return err
	}
	if h.lost {
		_, err = win.Exec(ctx, `UPDATE wallets SET balance = $2 WHERE customer = $1`, job.Args.Customer, st.Balance+job.Args.Amount)
		return err
	}
	_, err = win.Exec(ctx, `UPDATE wallets SET balance = balance + $2 WHERE customer = $1`, job.Args.Customer, job.Args.Amount)
	return err
}

// The race holds each job before its first write, Commit's conditional
// write, so both Checks read the balance first: the balance Check read,
// written back in Commit, loses the other job's credit.
func TestKitCatchesALostUpdateAcrossPhases(t *testing.T) {
	t.Parallel()
	failures := sdktest.Check(t, topupCaseOf(t, func(p *sdk.Plugin) { sdk.HandleStateFirst(p, stateCredit{lost: true}) }))
	require.Len(t, failures, 1, "%s", strings.Join(failures, "\n"))
	require.Contains(t, failures[0], "topup is not idempotent when another job on the same rows runs at once, both reading before either writes")
	require.Contains(t, failures[0], "want:     15")
}

func TestKitPassesAStateFirstCreditThatLetsTheDatabaseAdd(t *testing.T) {
	t.Parallel()
	sdktest.Run(t, topupCaseOf(t, func(p *sdk.Plugin) { sdk.HandleStateFirst(p, stateCredit{}) }))
}
