package guard_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// scripted is a state-first plugin whose commit phase runs statements
// through its handle, as the SDK's CommitTx would.
type scripted struct {
	hs     *guard.Handles
	commit []*usherv1.Statement
}

func (s scripted) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	c := calls[0]
	if c.GetPhase() == usherv1.Phase_PHASE_COMMIT {
		if _, err := s.hs.Exec(ctx, &usherv1.ExecRequest{Handle: c.GetHandle(), Statements: s.commit}); err != nil {
			return []*usherv1.Result{{Outcome: usherv1.Outcome_OUTCOME_PERMANENT, Error: err.Error()}}, nil
		}
	}
	return []*usherv1.Result{{Outcome: usherv1.Outcome_OUTCOME_OK}}, nil
}

// What a lost conditional write counts itself is not a write after the
// loss: a losing INSERT ... ON CONFLICT that raced another run's insert
// inserted speculatively and took it back, which Postgres's statistics
// count as a row inserted and one deleted (here made deterministic by a
// statement that writes and then matches nothing). The run is absorbed,
// its transaction rolled back. A write in a statement after the loss is
// still the plugin's breach, refused.
func TestLostConditionalWriteCountsOnlyWhatFollows(t *testing.T) {
	t.Parallel()
	owner, _ := hosttest.DB(t)
	ctx := context.Background()
	_, err := owner.Exec(ctx, `CREATE TABLE lw_effects (n int); GRANT SELECT, INSERT, UPDATE ON lw_effects TO usher_plugin_raw`)
	require.NoError(t, err)
	pool := hosttest.RawPool(t, owner, 1)
	hs := guard.NewHandles("public", nil)
	runner, err := guard.NewRunner(guard.Config{Handles: hs})
	require.NoError(t, err)
	db := guard.DB{Pool: pool, Role: "usher_plugin_raw"}
	run := func(id string, commit ...*usherv1.Statement) guard.Outcome {
		return runner.Run(ctx, scripted{hs: hs, commit: commit}, db, usherv1.Guard_GUARD_STATE_FIRST,
			&usherv1.Job{Kind: "raw_job", Id: id}, guard.Delivery{})
	}
	lostWithItsOwnWrite := &usherv1.Statement{Mode: usherv1.Mode_MODE_WRITE_IF,
		Sql: `WITH w AS (INSERT INTO lw_effects VALUES (1) RETURNING n) UPDATE lw_effects SET n = n WHERE n < 0 AND EXISTS (SELECT 1 FROM w) RETURNING n`}
	out := run("lw-1", lostWithItsOwnWrite)
	require.Equal(t, guard.Absorbed, out.Verdict, out.Reason)
	require.Contains(t, out.Reason, "conditional write lost")

	out = run("lw-2", &usherv1.Statement{Mode: usherv1.Mode_MODE_WRITE_IF, Sql: `UPDATE lw_effects SET n = 2 WHERE n < 0 RETURNING n`},
		&usherv1.Statement{Mode: usherv1.Mode_MODE_QUERY, Sql: `INSERT INTO lw_effects VALUES (3)`})
	require.Equal(t, guard.Permanent, out.Verdict, out.Reason)
	require.Contains(t, out.Reason, "the commit phase wrote although its conditional write lost")

	out = run("lw-3", lostWithItsOwnWrite, &usherv1.Statement{Mode: usherv1.Mode_MODE_QUERY, Sql: `INSERT INTO lw_effects VALUES (4)`})
	require.Equal(t, guard.Permanent, out.Verdict, "a write after a loss that wrote itself is still one: %s", out.Reason)
	require.Zero(t, hosttest.Count(t, owner, `SELECT count(*) FROM lw_effects`), "every lost run was rolled back")
}
