package sdk

import (
	"fmt"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
	"github.com/usherhq/usher/sdk/wire"
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
	}
	for _, col := range c.Key {
		v, err := wire.ToValue(col.Value)
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
