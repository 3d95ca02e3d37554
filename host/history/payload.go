package history

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/outbox"
)

// Payload is a job's payload, read from where it is still kept: its latest
// outbox row, else its scheduled run, else its latest dead letter. Outbox
// retention deletes a done job's rows; then, unless a dead letter holds it,
// the payload is gone and Gone says so.
type Payload struct {
	// From names where it was read: "outbox row 12", "scheduled run",
	// "dead letter 3". Empty when gone.
	From string `json:"from,omitempty"`
	// Bytes is its size as stored.
	Bytes int `json:"bytes"`
	// Value is the payload when it is JSON (outbox rows and scheduled
	// runs always are); Text the dead letter's bytes when they are not
	// (as deadletter.Text makes them readable).
	Value json.RawMessage `json:"value,omitempty"`
	Text  string          `json:"text,omitempty"`
	// Gone says why there is no payload.
	Gone string `json:"gone,omitempty"`
}

// GonePayload is what Payload.Gone says of a job none of whose rows keeps
// its payload.
const GonePayload = "no longer kept: outbox retention deleted the job's rows and no dead letter holds it"

// GetPayload reads job id's payload. A job with no payload kept anywhere
// gives a Payload whose Gone says so, not an error.
func GetPayload(ctx context.Context, q outbox.Querier, id string) (Payload, error) {
	rowID, _ := strconv.ParseInt(id, 10, 64)
	var p Payload
	var row int64
	var b []byte
	err := q.QueryRow(ctx, `SELECT id, payload::text FROM outbox WHERE job_id = $1 OR (job_id IS NULL AND id = $2)
		ORDER BY id DESC LIMIT 1`, id, rowID).Scan(&row, &b)
	if err == nil {
		return Payload{From: fmt.Sprintf("outbox row %d", row), Bytes: len(b), Value: b}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return p, fmt.Errorf("history: payload of job %s: %w", id, err)
	}
	err = q.QueryRow(ctx, `SELECT payload::text FROM scheduled_jobs WHERE job_id = $1 ORDER BY attempt DESC LIMIT 1`, id).Scan(&b)
	if err == nil {
		return Payload{From: "scheduled run", Bytes: len(b), Value: b}, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return p, fmt.Errorf("history: payload of job %s: %w", id, err)
	}
	err = q.QueryRow(ctx, `SELECT id, payload FROM dead_letters WHERE job_id = $1 ORDER BY id DESC LIMIT 1`, id).Scan(&row, &b)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Payload{Gone: GonePayload}, nil
	case err != nil:
		return p, fmt.Errorf("history: payload of job %s: %w", id, err)
	}
	p = Payload{From: fmt.Sprintf("dead letter %d", row), Bytes: len(b)}
	if json.Valid(b) {
		p.Value = b
	} else {
		p.Text = deadletter.Text(string(b))
	}
	return p, nil
}
