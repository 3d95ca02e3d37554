// Package flowlib holds decision code of another package: its facts carry
// what it reaches to the package that registers it.
package flowlib

import (
	"context"
	"database/sql"

	"github.com/usherhq/usher/sdk"
)

// Trip is a workflow's input.
type Trip struct{ Order string }

// Decide opens a database of its own: a decision may not.
func Decide(ctx context.Context, h sdk.WorkflowHistory[Trip]) (sdk.Decision, error) { // want Decide:`impure: database call sql.Open`
	db, err := sql.Open("pgx", "postgres://")
	if err != nil {
		return sdk.Decision{}, err
	}
	_ = db
	return sdk.Decision{}, nil
}

// Clean decides from its history alone.
func Clean(_ context.Context, h sdk.WorkflowHistory[Trip]) (sdk.Decision, error) {
	if h.TimerFired("grace") {
		return sdk.Complete(nil), nil
	}
	return sdk.Decision{}, nil
}
