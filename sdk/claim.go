package sdk

import (
	"context"
	"errors"
	"fmt"

	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

func claimSpec(c Claim) (*usherv1.ClaimSpec, error) {
	if c.Table == "" {
		return nil, fmt.Errorf("claim has no table")
	}
	if len(c.Key) == 0 {
		return nil, fmt.Errorf("claim on %s has no key columns", c.Table)
	}
	if _, err := intentKey(c.Intent); err != nil {
		return nil, err
	}
	spec := &usherv1.ClaimSpec{
		Table:         c.Table,
		ClaimedColumn: orDefault(c.ClaimedColumn, "claimed_at"),
		DoneColumn:    orDefault(c.DoneColumn, "done_at"),
		LeaseMs:       c.lease().Milliseconds(),
		Intent:        c.Intent,
		ResultColumns: c.Result,
	}
	for _, col := range c.Key {
		v, err := contract.ToValue(col.Value)
		if err != nil {
			return nil, fmt.Errorf("claim key %s: %w", col.Name, err)
		}
		spec.KeyColumns = append(spec.KeyColumns, col.Name)
		spec.KeyValues = append(spec.KeyValues, v)
	}
	return spec, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// resultKey is the context key of an effect's result (KeepResult).
type resultKey struct{}

// effectResult collects what an effect keeps.
type effectResult struct {
	columns []string
	values  []*usherv1.Value
	kept    bool
}

// KeepResult keeps the effect's result in the claim row: one value per
// column of its Claim's Result, in that order, written by the host with the
// mark that records the effect done, e.g. KeepResult(ctx, receipt.ID) for
// Result: []string{"provider_message_id"}. Call it from Effect, once the
// provider has answered. It fails outside an effect, when the claim
// declares no Result, or with the wrong number of values: a programming
// error, which the effect should return (the job is then dead-lettered
// with the effect done, never sent again).
func KeepResult(ctx context.Context, values ...any) error {
	r, _ := ctx.Value(resultKey{}).(*effectResult)
	switch {
	case r == nil:
		return Permanent(errors.New("sdk: KeepResult outside a claim's Effect"))
	case len(r.columns) == 0:
		return Permanent(errors.New("sdk: KeepResult: the claim declares no Result columns"))
	case len(values) != len(r.columns):
		return Permanent(fmt.Errorf("sdk: KeepResult: %d values for the claim's %d Result columns %v", len(values), len(r.columns), r.columns))
	}
	vals, err := contract.ToValues(values)
	if err != nil {
		return Permanent(fmt.Errorf("sdk: KeepResult: %w", err))
	}
	r.values, r.kept = vals, true
	return nil
}
