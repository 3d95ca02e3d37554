// Package swaps keeps the history of plugin swaps and rollbacks in
// Postgres (the plugin_swaps table): each host writes a row when it swaps,
// rolls back or refuses a version of one of its plugins, and every host's
// console and `host plugins list` read the rows of the whole cluster. The
// rows outlive the host that wrote them and are deleted after a retention
// window (the host's HistoryRetention) by Trim.
//
// Writing a row is best effort: a swap that happened is not undone because
// its record could not be written; the host logs the failure.
package swaps

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/outbox"
)

// Actions a row records.
const (
	Swapped    = "swapped"
	RolledBack = "rolled back"
	Refused    = "refused"
)

// Causes of a swap (a rollback's cause is its own: requested, crash_loop,
// failures, crashes).
const (
	CauseReload    = "reload"                  // an operator asked (plugins reload, the console, the admin API)
	CauseDirChange = "plugin directory change" // the watcher saw a manifest change
	CauseSwap      = "swap"                    // the library's Host.Swap
)

// Swap is one swap, rollback or refusal.
type Swap struct {
	At     time.Time `json:"at"`
	Host   string    `json:"host"`
	Plugin string    `json:"plugin"`
	Action string    `json:"action"`
	From   string    `json:"from"`
	To     string    `json:"to"`
	Cause  string    `json:"cause"`
	Reason string    `json:"reason,omitempty"`
	// SHA256 is the checksum of the version swapped to, when it came
	// from a manifest.
	SHA256 string `json:"sha256,omitempty"`
}

// maxReason bounds a stored reason: a refusal's error can quote a whole
// plugin's output.
const maxReason = 1024

// Record writes s, at now (s.At is ignored).
func Record(ctx context.Context, q outbox.Querier, s Swap) error {
	reason := deadletter.Text(s.Reason)
	if len(reason) > maxReason {
		reason = reason[:maxReason] + "…"
	}
	_, err := q.Exec(ctx, `INSERT INTO plugin_swaps (host, plugin, action, from_version, to_version, cause, reason, sha256)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		deadletter.Text(s.Host), deadletter.Text(s.Plugin), s.Action, deadletter.Text(s.From), deadletter.Text(s.To),
		s.Cause, reason, s.SHA256)
	if err != nil {
		return fmt.Errorf("swaps: record %s of %s: %w", s.Action, s.Plugin, err)
	}
	return nil
}

// Last returns the last n rows of each plugin in plugins (of every plugin
// when plugins is empty), newest first, by plugin.
func Last(ctx context.Context, q outbox.Querier, plugins []string, n int) (map[string][]Swap, error) {
	if n <= 0 {
		n = 10
	}
	rows, err := q.Query(ctx, `SELECT s.at, s.host, s.plugin, s.action, s.from_version, s.to_version, s.cause, s.reason, s.sha256
		FROM (SELECT DISTINCT plugin FROM plugin_swaps WHERE coalesce(cardinality($1::text[]), 0) = 0 OR plugin = ANY($1)) p,
		LATERAL (SELECT * FROM plugin_swaps WHERE plugin = p.plugin ORDER BY at DESC, id DESC LIMIT $2) s
		ORDER BY s.plugin, s.at DESC, s.id DESC`, plugins, n)
	if err != nil {
		return nil, fmt.Errorf("swaps: last: %w", err)
	}
	list, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Swap])
	if err != nil {
		return nil, fmt.Errorf("swaps: last: %w", err)
	}
	out := map[string][]Swap{}
	for _, s := range list {
		out[s.Plugin] = append(out[s.Plugin], s)
	}
	return out, nil
}

// Trim deletes the rows older than before and returns how many.
func Trim(ctx context.Context, q outbox.Querier, before time.Time) (int64, error) {
	tag, err := q.Exec(ctx, `DELETE FROM plugin_swaps WHERE at < $1`, before)
	if err != nil {
		return 0, fmt.Errorf("swaps: trim: %w", err)
	}
	return tag.RowsAffected(), nil
}
