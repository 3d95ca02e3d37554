package ops

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/outbox"
)

// Idleness is what stands between the runtime and "everything is done".
type Idleness struct {
	// Unfinished counts outbox rows with no outcome yet, Unpublished those
	// of them not yet on the stream.
	Unfinished  int64 `json:"outbox_unfinished"`
	Unpublished int64 `json:"outbox_unpublished"`
	// Scheduled counts runs scheduled (retries, delayed and scheduler-born
	// jobs) not yet moved to the outbox; NextDue the first of them.
	Scheduled int64      `json:"scheduled"`
	NextDue   *time.Time `json:"next_due,omitempty"`
	// Timers counts the running workflows' timers not yet fired. A
	// workflow waiting only for a signal keeps nothing from idle; nor do
	// recurring schedules, which always have a next tick.
	Timers int64 `json:"workflow_timers"`
	// StreamPending counts the group's entries delivered and not acked,
	// StreamLag those not yet delivered (-1: Redis does not say).
	StreamPending int64 `json:"stream_pending"`
	StreamLag     int64 `json:"stream_lag"`
}

// Idle reports whether nothing is pending, scheduled or unpublished.
func (i Idleness) Idle() bool {
	return i.Unfinished == 0 && i.Unpublished == 0 && i.Scheduled == 0 && i.Timers == 0 && i.StreamPending == 0 && i.StreamLag <= 0
}

// String says what is not done, or "idle".
func (i Idleness) String() string {
	var parts []string
	if i.Unfinished > 0 {
		parts = append(parts, fmt.Sprintf("%d outbox row(s) unfinished (%d unpublished)", i.Unfinished, i.Unpublished))
	}
	if i.Scheduled > 0 {
		s := fmt.Sprintf("%d scheduled run(s)", i.Scheduled)
		if i.NextDue != nil {
			s += " (next due " + i.NextDue.UTC().Format(time.RFC3339) + ")"
		}
		parts = append(parts, s)
	}
	if i.Timers > 0 {
		parts = append(parts, fmt.Sprintf("%d workflow timer(s) not yet fired", i.Timers))
	}
	if i.StreamPending > 0 {
		parts = append(parts, fmt.Sprintf("%d stream entr(ies) delivered and not acked", i.StreamPending))
	}
	if i.StreamLag > 0 {
		parts = append(parts, fmt.Sprintf("%d stream entr(ies) not yet read", i.StreamLag))
	}
	if len(parts) == 0 {
		return "idle"
	}
	return strings.Join(parts, ", ")
}

// ReadIdleness reads what stands between the runtime and idle, from the
// outbox, the scheduled runs and the group on stream.
func ReadIdleness(ctx context.Context, q outbox.Querier, rdb redis.UniversalClient, stream, group string) (Idleness, error) {
	var i Idleness
	if err := q.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM outbox WHERE done_at IS NULL),
		       (SELECT count(*) FROM outbox WHERE published_at IS NULL),
		       (SELECT count(*) FROM scheduled_jobs WHERE enqueued_at IS NULL),
		       (SELECT min(run_at) FROM scheduled_jobs WHERE enqueued_at IS NULL),
		       (SELECT count(*) FROM workflow_timers t JOIN workflows w ON w.id = t.workflow
		        WHERE t.fired_at IS NULL AND w.state = 'running')`).
		Scan(&i.Unfinished, &i.Unpublished, &i.Scheduled, &i.NextDue, &i.Timers); err != nil {
		return i, fmt.Errorf("idle: %w", err)
	}
	i.StreamLag = -1
	groups, err := rdb.XInfoGroups(ctx, stream).Result()
	if err != nil && !strings.Contains(err.Error(), "no such key") {
		return i, fmt.Errorf("redis: XINFO GROUPS %s: %w", stream, err)
	}
	if err != nil {
		i.StreamLag = 0 // no stream: nothing on it
	}
	for _, g := range groups {
		if g.Name == group {
			i.StreamPending, i.StreamLag = g.Pending, g.Lag
		}
	}
	return i, nil
}
