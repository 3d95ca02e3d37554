package faults_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/sdk"
)

// The middleware's points are <short name>.before_<phase> and
// .after_<phase>; an after point fires only when the phase succeeded, and
// a fault's error is the phase's.
func TestMiddlewarePoints(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(faults.DirEnv, dir)
	ctx := context.Background()
	mw := faults.Middleware{}
	call := &sdk.Call{Kind: "update_sales_counter", Phase: sdk.PhaseApply, JobID: "7"}
	ran := 0
	next := func(context.Context) error { ran++; return nil }

	require.NoError(t, faults.Arm(dir, "counter.before_apply", faults.Spec{Action: "error", JobIDs: []string{"7"}}))
	require.ErrorContains(t, mw.Wrap(ctx, call, next), "fault counter.before_apply: injected transient error")
	require.Zero(t, ran, "a before fault stops the phase")
	require.FileExists(t, filepath.Join(dir, "counter.before_apply.7.hit"))
	require.NoError(t, faults.Disarm(dir, "counter.before_apply"))

	require.NoError(t, faults.Arm(dir, "counter.after_apply", faults.Spec{Action: "permanent"}))
	err := mw.Wrap(ctx, call, next)
	var perm *sdk.PermanentError
	require.ErrorAs(t, err, &perm)
	require.Equal(t, 1, ran, "an after fault fires once the phase ran")

	failed := errors.New("the phase failed")
	require.ErrorIs(t, mw.Wrap(ctx, &sdk.Call{Kind: "update_sales_counter", Phase: sdk.PhaseApply, JobID: "8"},
		func(context.Context) error { return failed }), failed)
	_, statErr := os.Stat(filepath.Join(dir, "counter.after_apply.8.hit"))
	require.ErrorIs(t, statErr, os.ErrNotExist, "no after point when the phase failed")

	// A kind with no short name uses the kind; Names overrides.
	require.NoError(t, faults.Arm(dir, "refund.before_claim", faults.Spec{Action: "error"}))
	require.Error(t, mw.Wrap(ctx, &sdk.Call{Kind: "refund", Phase: sdk.PhaseClaim, JobID: "9"}, next))
	require.NoError(t, faults.Arm(dir, "r.before_claim", faults.Spec{Action: "error"}))
	require.ErrorContains(t, faults.Middleware{Names: map[string]string{"refund": "r"}}.Wrap(ctx,
		&sdk.Call{Kind: "refund", Phase: sdk.PhaseClaim, JobID: "9"}, next), "fault r.before_claim")
}
