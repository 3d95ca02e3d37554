package sdk_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/usherhq/usher/sdk"
)

func TestErrorsMatch(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("wrapped: %w", sdk.RetryLater(2*time.Minute, "claim held"))
	var rl *sdk.RetryLaterError
	require.ErrorAs(t, err, &rl)
	require.Equal(t, 2*time.Minute, rl.Delay)

	base := errors.New("card declined")
	perm := sdk.Permanent(base)
	var pe *sdk.PermanentError
	require.ErrorAs(t, fmt.Errorf("x: %w", perm), &pe)
	require.ErrorIs(t, perm, base)
	require.NoError(t, sdk.Permanent(nil))
}

func TestProviderRequestNeedsAnIntentKey(t *testing.T) {
	t.Parallel()
	_, err := sdk.NewProviderRequest(context.Background(), "POST", "http://x/", nil, sdk.IdempotencyKey{})
	require.ErrorContains(t, err, "without an idempotency key derived from the intent")
	req, err := sdk.NewProviderRequest(context.Background(), "POST", "http://x/", nil, sdk.KeyForTest("tickets-4471"))
	require.NoError(t, err)
	require.Equal(t, "tickets-4471", req.Header.Get(sdk.IdempotencyHeader))
}

func TestNilWinRefusesFollowOns(t *testing.T) {
	t.Parallel()
	var w *sdk.Win // what WriteIf returns when the write lost
	require.ErrorIs(t, w.Enqueue(context.Background()), sdk.ErrNotWon)
	_, err := w.Exec(context.Background(), "UPDATE x SET y = 1")
	require.ErrorIs(t, err, sdk.ErrNotWon)
}

type dupArgs struct{}

func (dupArgs) Kind() string { return "dup" }

type dupHandler struct{}

func (dupHandler) Apply(context.Context, sdk.Job[dupArgs], *sdk.Tx) error { return nil }

func TestOneGuardPerKind(t *testing.T) {
	t.Parallel()
	p := sdk.New("p", "1")
	sdk.HandleRecordJobID[dupArgs](p, dupHandler{})
	sdk.HandleRecordJobID[dupArgs](p, dupHandler{})
	require.ErrorContains(t, p.Err(), `kind "dup" registered twice`)
}

// KeepResult belongs to a claim's Effect: outside one it is a permanent
// error, never a silent no-op. (Inside one, plugins/tickets'
// TestCrashAfterProviderAccepted checks the kept message id.)
func TestKeepResultOutsideAnEffect(t *testing.T) {
	t.Parallel()
	err := sdk.KeepResult(context.Background(), "msg-1")
	var pe *sdk.PermanentError
	require.ErrorAs(t, err, &pe)
	require.ErrorContains(t, err, "outside a claim's Effect")
}
