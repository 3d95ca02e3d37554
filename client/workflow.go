package client

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/usherhq/usher/internal/wfmsg"
)

// Workflow is a started workflow: the one this start made, or the one that
// existed with its type and id.
type Workflow struct {
	// ID is the runtime's number for the workflow (`host workflows show`).
	ID int64
	// State is running, completed, failed or cancelled.
	State string
	// Started is false when the workflow existed already: a start is
	// idempotent, and the existing workflow keeps its own input.
	Started bool
}

// StartWorkflow starts workflow id of type typ with input (JSON-encoded;
// json.RawMessage or []byte taken as the JSON itself), in tx: it exists
// and its first decision is queued if and only if tx commits. Starting an
// id that exists returns that workflow, whatever its state. The role needs
// EXECUTE on usher_start_workflow(text, text, jsonb).
func StartWorkflow(ctx context.Context, tx PgxTx, typ, id string, input any) (Workflow, error) {
	b, err := jsonOf(input)
	if err != nil {
		return Workflow{}, fmt.Errorf("usher: %s workflow %s input: %w", typ, id, err)
	}
	if err := wfmsg.CheckStart(typ, id, b); err != nil {
		return Workflow{}, fmt.Errorf("usher: %w", err)
	}
	var w Workflow
	if err := tx.QueryRow(ctx, `SELECT id, state, started FROM usher_start_workflow($1, $2, $3::jsonb)`, typ, id, string(b)).
		Scan(&w.ID, &w.State, &w.Started); err != nil {
		return Workflow{}, fmt.Errorf("usher: start %s workflow %s: %w", typ, id, err)
	}
	return w, nil
}

// SignalWorkflow sends signal name with payload to the running workflow
// (typ, id), in tx. signalID makes it count once: it reports false, and
// records nothing, when that id was received before. A new signal to an
// unknown or finished workflow is an error. The role needs EXECUTE on
// usher_signal_workflow(text, text, text, text, jsonb).
func SignalWorkflow(ctx context.Context, tx PgxTx, typ, id, signalID, name string, payload any) (bool, error) {
	b, err := jsonOf(payload)
	if err != nil {
		return false, fmt.Errorf("usher: signal %s payload: %w", name, err)
	}
	if err := wfmsg.CheckSignal(signalID, name, b); err != nil {
		return false, fmt.Errorf("usher: %w", err)
	}
	var added bool
	if err := tx.QueryRow(ctx, `SELECT usher_signal_workflow($1, $2, $3, $4, $5::jsonb)`, typ, id, signalID, name, string(b)).
		Scan(&added); err != nil {
		return false, fmt.Errorf("usher: signal %s workflow %s: %w", typ, id, err)
	}
	return added, nil
}

// CancelWorkflow asks the running workflow (typ, id) to cancel, in tx: its
// next decision sees the request (and compensates, then ends). It reports
// false when a cancel was asked before; an unknown or finished workflow is
// an error. The role needs EXECUTE on usher_cancel_workflow(text, text, text).
func CancelWorkflow(ctx context.Context, tx PgxTx, typ, id, reason string) (bool, error) {
	var asked bool
	if err := tx.QueryRow(ctx, `SELECT usher_cancel_workflow($1, $2, $3)`, typ, id, reason).Scan(&asked); err != nil {
		return false, fmt.Errorf("usher: cancel %s workflow %s: %w", typ, id, err)
	}
	return asked, nil
}

// jsonOf is v as JSON: json.RawMessage and []byte as they are, nil as null.
func jsonOf(v any) ([]byte, error) {
	switch p := v.(type) {
	case json.RawMessage:
		if len(p) == 0 {
			return []byte("null"), nil
		}
		return p, nil
	case []byte:
		if len(p) == 0 {
			return []byte("null"), nil
		}
		return p, nil
	}
	return json.Marshal(v)
}
