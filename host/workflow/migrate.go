package workflow

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// MaxMigrate bounds the workflows one migration asks about.
const MaxMigrate = 10000

// MigrateRequest selects the running workflows of Type to move to the
// version now serving it: those pinned to From (any other version when
// empty), only IDs when set, at most Limit (default 100, at most
// MaxMigrate), oldest first.
type MigrateRequest struct {
	Type  string   `json:"type"`
	From  string   `json:"from,omitempty"`
	IDs   []string `json:"ids,omitempty"`
	Limit int      `json:"limit,omitempty"`
}

// MigrateResult is what a migration did. Selected counts the workflows
// it asked about; More says the selection was cut at the limit.
type MigrateResult struct {
	Type     string           `json:"type"`
	Plugin   string           `json:"plugin"`
	To       string           `json:"to"`
	Selected int              `json:"selected"`
	More     bool             `json:"more,omitempty"`
	Migrated []Migrated       `json:"migrated"`
	Refused  []MigrateRefusal `json:"refused"`
}

// Migrated is a workflow moved from a version.
type Migrated struct {
	ID   string `json:"id"`
	From string `json:"from"`
}

// MigrateRefusal is a workflow left on its version, and why.
type MigrateRefusal struct {
	ID     string `json:"id"`
	From   string `json:"from"`
	Reason string `json:"reason"`
}

// Migrate moves the running workflows req selects to version of plugin,
// which serves their type now and answers through inv: each one's history
// goes to that version (WorkflowHistory.MigrateFrom set), whose
// sdk.AcceptMigration accepts or refuses it; an accepted workflow is
// pinned to version in a transaction that records a migrated event in its
// history, unless it changed meanwhile (ended, or moved by another
// migration: then it is reported refused). Its next decision runs on
// version. Workflows no decision pinned yet start on the serving version
// anyway and are not selected.
func (dc *Decider) Migrate(ctx context.Context, inv guard.Invoker, plugin, version string, req MigrateRequest) (MigrateResult, error) {
	out := MigrateResult{Type: req.Type, Plugin: plugin, To: version, Migrated: []Migrated{}, Refused: []MigrateRefusal{}}
	switch {
	case req.Type == "":
		return out, errors.New("workflow: migrate needs a workflow type")
	case req.Limit < 0 || req.Limit > MaxMigrate:
		return out, fmt.Errorf("workflow: a migration's limit is 1 to %d, got %d", MaxMigrate, req.Limit)
	case req.From == version:
		return out, fmt.Errorf("workflow: %s version %s serves %s already; migrate from another version", plugin, version, req.Type)
	}
	limit := req.Limit
	if limit == 0 {
		limit = 100
	}
	rows, err := dc.cfg.Pool.Query(ctx, `SELECT id FROM workflows
		WHERE type = $1 AND state = 'running' AND plugin = $2 AND plugin_version IS NOT NULL AND plugin_version <> $3
		  AND ($4 = '' OR plugin_version = $4) AND (coalesce(cardinality($5::text[]), 0) = 0 OR workflow_id = ANY($5))
		ORDER BY id LIMIT $6`, req.Type, plugin, version, req.From, req.IDs, limit+1)
	if err != nil {
		return out, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return out, err
	}
	if len(ids) > limit {
		ids, out.More = ids[:limit], true
	}
	out.Selected = len(ids)
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		s, err := dc.read(ctx, id)
		if err != nil {
			return out, err
		}
		if reason := dc.accepts(ctx, inv, s); reason != "" {
			out.Refused = append(out.Refused, MigrateRefusal{ID: s.wfID, From: s.version, Reason: reason})
			continue
		}
		moved, err := dc.move(ctx, s, version)
		if err != nil {
			return out, err
		}
		if !moved {
			out.Refused = append(out.Refused, MigrateRefusal{ID: s.wfID, From: s.version,
				Reason: "it changed while it was being asked (it ended, or another migration moved it)"})
			continue
		}
		out.Migrated = append(out.Migrated, Migrated{ID: s.wfID, From: s.version})
	}
	dc.cfg.Logger.Info("workflows migrated", "type", req.Type, "plugin", plugin, "to", version,
		"migrated", len(out.Migrated), "refused", len(out.Refused), "more", out.More)
	return out, nil
}

// accepts asks inv's version whether it takes over s; "" is yes, else
// why not.
func (dc *Decider) accepts(ctx context.Context, inv guard.Invoker, s *snapshot) string {
	h := s.history
	h.MigrateFrom = s.version
	job := &usherv1.Job{Id: fmt.Sprintf("migrate-%d", s.id), Kind: contract.WorkflowKind(s.typ)}
	res, err := inv.Invoke(ctx, []*usherv1.Call{{Phase: usherv1.Phase_PHASE_DECIDE, Job: job, Workflow: h}})
	switch {
	case err != nil:
		return "the plugin did not answer: " + err.Error()
	case len(res) != 1 || res[0] == nil:
		return fmt.Sprintf("plugin answered garbage: %d results for 1 question", len(res))
	case res[0].GetOutcome() == usherv1.Outcome_OUTCOME_OK && res[0].GetDecision() == nil:
		return ""
	case res[0].GetOutcome() == usherv1.Outcome_OUTCOME_OK:
		return "plugin answered garbage: a decision to a migration's question"
	case res[0].GetError() != "":
		return res[0].GetError()
	}
	return fmt.Sprintf("plugin answered %v", res[0].GetOutcome())
}

// move pins s to version, unless it ended or moved since it was read.
func (dc *Decider) move(ctx context.Context, s *snapshot, version string) (bool, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Commit)
	defer cancel()
	var moved bool
	err := pgx.BeginFunc(ctx, dc.cfg.Pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE workflows SET plugin_version = $2, updated_at = now()
			WHERE id = $1 AND state = 'running' AND plugin_version = $3`, s.id, version, s.version)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		moved = true
		_, err = tx.Exec(ctx, `SELECT usher_workflow_append($1, 'migrated', $2, $3, NULL)`,
			s.id, version, fmt.Sprintf("from %s to %s (host workflows migrate)", s.version, version))
		return err
	})
	return moved, err
}
