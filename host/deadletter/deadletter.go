// Package deadletter keeps the jobs usher gave up on, with their reason and
// history, and puts them back on request. Nothing is dropped silently: an
// entry is dead-lettered in Postgres first and acked on the stream after.
package deadletter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/outbox"
	"github.com/usherhq/usher/internal/entry"
)

// ForgedKind is the kind of the dead letter of a forged stream entry (one
// no relay of the cluster signed). Its job id is "forged:<stream id>"; the
// identity and kind it claimed are in its reason. Requeue never requeues
// it.
const ForgedKind = "(forged)"

// Letter is one dead-lettered job.
type Letter struct {
	ID         int64
	JobID      string
	Kind       string
	Payload    []byte
	RequestID  string
	Trace      string
	Reason     string
	LastError  string
	Attempts   int
	StreamID   string
	History    json.RawMessage
	CreatedAt  time.Time
	RequeuedAt *time.Time
	// DiscardedAt is when an operator discarded it (kept, no longer
	// open), with DiscardReason.
	DiscardedAt   *time.Time
	DiscardReason string
	// Raw holds the fields of an entry refused before any plugin saw it,
	// bytes as received, in order (the text columns then hold Text of
	// them); nil otherwise.
	Raw []RawField
	// Priority is the job's (0: entry.DefaultPriority): a requeue keeps it.
	Priority int
}

// Attempt is the number of the job's last attempt, the one dead-lettered,
// as the outbox, the stream entry and the job history number attempts (0
// the first run). Attempts counts them: it is Attempt + 1.
func (l Letter) Attempt() int { return max(l.Attempts-1, 0) }

// RawField is one field of an entry as received. NameBytes and ValueBytes
// are the full lengths: larger than len(Name), len(Value) when only a
// prefix of an oversized entry was read.
type RawField struct {
	Name       []byte `json:"name"`
	Value      []byte `json:"value"`
	NameBytes  int    `json:"name_bytes"`
	ValueBytes int    `json:"value_bytes"`
}

// Text is s as a text column (and a JSON string in jsonb) can hold it: s
// itself when it is valid UTF-8 with no NUL byte, else its Go-quoted form,
// in which a byte that is not UTF-8 reads \xff and NUL \x00.
func Text(s string) string {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// Add records l. A second Add for the same stream entry (its ack was lost
// and it came back) is absorbed; it reports whether a row was written.
func Add(ctx context.Context, q outbox.Querier, l Letter) (bool, error) {
	if l.Reason == "" {
		return false, errors.New("deadletter: a letter needs a reason")
	}
	hist := l.History
	if len(hist) == 0 {
		hist = json.RawMessage("[]")
	}
	var raw *string
	if l.Raw != nil {
		b, err := json.Marshal(l.Raw)
		if err != nil {
			return false, fmt.Errorf("deadletter: raw fields: %w", err)
		}
		s := string(b)
		raw = &s
	}
	// Every text column goes through Text: a letter that cannot be
	// written leaves its entry pending, redelivered for ever.
	tag, err := q.Exec(ctx, `
		INSERT INTO dead_letters (job_id, kind, payload, request_id, trace, reason, last_error, attempts, stream_id, history, raw, priority)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11::jsonb, $12)
		ON CONFLICT (stream_id) DO NOTHING`,
		Text(l.JobID), Text(l.Kind), l.Payload, Text(l.RequestID), Text(l.Trace), Text(l.Reason), Text(l.LastError),
		l.Attempts, Text(l.StreamID), string(hist), raw, entry.PriorityOr(l.Priority))
	if err != nil {
		return false, fmt.Errorf("deadletter: add: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

const columns = `id, job_id, kind, payload, request_id, trace, reason, last_error, attempts, stream_id, history::text, created_at, requeued_at, discarded_at, discard_reason, raw::text`

func scan(r pgx.CollectableRow) (Letter, error) {
	var l Letter
	var hist string
	var raw *string
	err := r.Scan(&l.ID, &l.JobID, &l.Kind, &l.Payload, &l.RequestID, &l.Trace, &l.Reason, &l.LastError,
		&l.Attempts, &l.StreamID, &hist, &l.CreatedAt, &l.RequeuedAt, &l.DiscardedAt, &l.DiscardReason, &raw)
	l.History = json.RawMessage(hist)
	if err == nil && raw != nil {
		if err := json.Unmarshal([]byte(*raw), &l.Raw); err != nil {
			return l, fmt.Errorf("deadletter: raw fields of letter %d: %w", l.ID, err)
		}
	}
	return l, err
}

// Open is the SQL condition of an open letter: neither requeued nor
// discarded.
const Open = `requeued_at IS NULL AND discarded_at IS NULL`

// List returns open letters, of one kind when kind is set.
func List(ctx context.Context, q outbox.Querier, kind string, limit int) ([]Letter, error) {
	return ListAfter(ctx, q, kind, 0, limit)
}

// ListAfter returns up to limit open letters (of one kind when kind is
// set) with an id above after, oldest first: the page after the one
// that ended with letter after.
func ListAfter(ctx context.Context, q outbox.Querier, kind string, after int64, limit int) ([]Letter, error) {
	rows, err := q.Query(ctx, `SELECT `+columns+` FROM dead_letters
		WHERE `+Open+` AND ($1 = '' OR kind = $1) AND id > $3 ORDER BY id LIMIT $2`, kind, limit, after)
	if err != nil {
		return nil, fmt.Errorf("deadletter: list: %w", err)
	}
	return pgx.CollectRows(rows, scan)
}

// CountOpen is how many letters are open (of one kind when kind is set),
// and how many of them have an id up to through: a list's honest total,
// and where a page of it starts.
func CountOpen(ctx context.Context, q outbox.Querier, kind string, through int64) (total, before int64, err error) {
	err = q.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE id <= $2) FROM dead_letters
		WHERE `+Open+` AND ($1 = '' OR kind = $1)`, kind, through).Scan(&total, &before)
	if err != nil {
		return 0, 0, fmt.Errorf("deadletter: count: %w", err)
	}
	return total, before, nil
}

// Get returns one letter.
func Get(ctx context.Context, q outbox.Querier, id int64) (Letter, error) {
	rows, err := q.Query(ctx, `SELECT `+columns+` FROM dead_letters WHERE id = $1`, id)
	if err != nil {
		return Letter{}, fmt.Errorf("deadletter: get: %w", err)
	}
	l, err := pgx.CollectExactlyOneRow(rows, scan)
	if errors.Is(err, pgx.ErrNoRows) {
		return Letter{}, fmt.Errorf("deadletter: no dead letter %d", id)
	}
	return l, err
}

// Requeue puts open letters back through the outbox with their identity
// kept, so the guards still recognise a job that had partly run. It takes
// either one id, or every open letter of kind (id 0). It returns how many
// it requeued. A forged entry's letter (ForgedKind) is never requeued: its
// payload is an attacker's.
func Requeue(ctx context.Context, tx pgx.Tx, id int64, kind string) (int, error) {
	if id == 0 && kind == "" {
		return 0, errors.New("deadletter: requeue needs an id or a kind")
	}
	if id != 0 {
		l, err := RequeueIDs(ctx, tx, []int64{id})
		return len(l), err
	}
	l, err := RequeueKind(ctx, tx, kind)
	return len(l), err
}

// RequeueKind requeues every open letter of kind as Requeue does and
// returns them.
func RequeueKind(ctx context.Context, tx pgx.Tx, kind string) ([]Requeued, error) {
	if kind == "" {
		return nil, errors.New("deadletter: requeue needs a kind")
	}
	return requeue(ctx, tx, `kind = $1`, kind)
}

// Requeued is a letter Requeue put back.
type Requeued struct {
	ID    int64
	JobID string
}

// RequeueIDs requeues the open letters ids as Requeue does, all or none:
// an id that is no open letter (or a forged entry's) fails the set, named.
func RequeueIDs(ctx context.Context, tx pgx.Tx, ids []int64) ([]Requeued, error) {
	if len(ids) == 0 {
		return nil, errors.New("deadletter: requeue needs an id")
	}
	done, err := requeue(ctx, tx, `id = ANY($1::bigint[])`, ids)
	if err != nil {
		return nil, err
	}
	if len(done) < len(ids) {
		got := make(map[int64]bool, len(done))
		for _, r := range done {
			got[r.ID] = true
		}
		var missing []string
		for _, id := range ids {
			if !got[id] {
				missing = append(missing, strconv.FormatInt(id, 10))
			}
		}
		return nil, fmt.Errorf("deadletter: no open dead letter %s (a requeued or discarded letter is not open; forged entries are never requeued); nothing requeued",
			strings.Join(missing, ", "))
	}
	order := make(map[int64]int, len(ids))
	for i, id := range ids {
		order[id] = i
	}
	slices.SortFunc(done, func(a, b Requeued) int { return order[a.ID] - order[b.ID] })
	return done, nil
}

func requeue(ctx context.Context, tx pgx.Tx, which string, arg any) ([]Requeued, error) {
	rows, err := tx.Query(ctx, `UPDATE dead_letters SET requeued_at = now()
		WHERE `+Open+` AND kind <> $2 AND `+which+`
		RETURNING id, job_id, kind, convert_from(payload, 'UTF8'), request_id, trace, attempts, priority`, arg, ForgedKind)
	if err != nil {
		return nil, fmt.Errorf("deadletter: requeue: %w", err)
	}
	var done []Requeued
	msgs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outbox.Message, error) {
		var m outbox.Message
		var payload string
		var id int64
		err := r.Scan(&id, &m.JobID, &m.Kind, &payload, &m.RequestID, &m.Trace, &m.Attempt, &m.Priority)
		m.Payload = json.RawMessage(payload)
		if err == nil && !json.Valid(m.Payload) {
			err = fmt.Errorf("the payload of dead letter %d for job %s is not JSON and cannot be requeued as it is", id, m.JobID)
		}
		done = append(done, Requeued{ID: id, JobID: m.JobID})
		return m, err
	})
	if err != nil {
		return nil, fmt.Errorf("deadletter: requeue: %w", err)
	}
	if _, err := outbox.Add(ctx, tx, msgs...); err != nil {
		return nil, err
	}
	return done, nil
}
