// Package stream is everything the host does with the Redis stream: it
// reads jobs in a consumer group and hands them to a dispatcher with
// bounded concurrency and a byte budget, acks only what the dispatcher says
// is finished (an entry whose handler did not commit stays pending, to be
// reclaimed), reclaims idle entries (XAUTOCLAIM), parks deliveries, counts
// crashes and runs entries again when their plugin is back. Every Lua
// script and every key it touches is in the stream's hash slot. It knows
// nothing of plugins, guards or Postgres.
package stream

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/internal/entry"
)

// Entry is one stream entry decoded into a job. Err is set when the entry is
// malformed; the dispatcher dead-letters it with that reason.
type Entry struct {
	// Stream is the key of the shard the entry was read from: its acks,
	// parks, claims and crash counts go to that key.
	Stream string
	// StreamID is the entry id in its shard: a delivery, never a job
	// identity (two shards can hold the same id).
	StreamID  string
	JobID     string
	OutboxID  int64
	Kind      string
	Payload   []byte
	RequestID string
	Trace     string
	Attempt   int
	// Step: the entry is a workflow step's delivery (entry.FieldStep);
	// the host runs it only if the step was not cancelled before.
	Step bool
	// Priority is the job's priority, entry.HighestPriority to
	// entry.LowestPriority (entry.DefaultPriority when the entry names
	// none): its retries and its dead letter keep it.
	Priority int
	// Deliveries is how many times the group delivered the entry,
	// counting this one (known for reclaimed entries; 1 for new ones).
	Deliveries int64
	// Size is the sum of the entry's field and value lengths.
	Size int
	// Signed are the entry's values exactly as the stream holds them and
	// Sig the relay's signature of them (empty when the entry has none).
	// Decode does not verify them: the dispatcher does, with the cluster's
	// key, before anything else.
	Signed entry.Fields
	Sig    string
	Err    error
	// Fields are the entry's fields in the order Redis holds them, bytes
	// as received (set by the consumer's and reclaimer's reads).
	Fields []Field
	// Cut: the entry was over entry.MaxBytes and only prefixes of its
	// fields were read (Err says so).
	Cut bool
	// Held is what the entry's fields cost the host's memory, in bytes:
	// what it holds of the byte budget while it runs.
	Held int64
	// Arrived, set by the consumer for Dispatch, takes the entry out of
	// the consumer's count of entries arriving (Consumer.Arriving): the
	// dispatcher calls it when the job is in its runner's queue, or when
	// it knows the job joins no batch. The consumer calls it when Dispatch
	// returns. Later calls do nothing.
	Arrived func()
	// Committed, set by the consumer for Dispatch, settles the entry
	// before Dispatch returns: the dispatcher calls it once the job's
	// outcome is committed and nothing more is to be written for it
	// (Dispatch then returns true). The consumer asks for its ack and
	// gives its slot back at once, so the next read need not wait for the
	// dispatcher's goroutine to be scheduled; the entry read into the slot
	// runs when a worker is free (when this Dispatch returns, at the
	// latest), so handlers running stay within Concurrency. Later calls do
	// nothing.
	Committed func()
}

// Key names the entry on this host: its shard's key and its id in it.
func (e Entry) Key() string { return e.Stream + " " + e.StreamID }

// Decode turns a stream message into an Entry. It never fails: a missing or
// malformed field is recorded in Entry.Err.
func Decode(m redis.XMessage) Entry {
	e := Entry{StreamID: m.ID, Deliveries: 1, Signed: entry.FieldsOf(m.Values), Priority: entry.DefaultPriority}
	for k, v := range m.Values {
		s, _ := v.(string)
		e.Size += len(k) + len(s)
	}
	e.Sig, _ = m.Values[entry.FieldSig].(string)
	// Every value used below comes from Signed, so what is verified is
	// what runs.
	f := e.Signed
	e.JobID = f.JobID
	e.Kind = f.Kind
	e.Payload = []byte(f.Payload)
	e.RequestID = f.RequestID
	e.Trace = f.Trace
	e.Step = f.Step != ""
	if err := checkText(m.Values); err != nil {
		e.Err = fmt.Errorf("entry %s: %w", m.ID, err)
		return e
	}
	if s := f.OutboxID; s != "" {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			e.Err = fmt.Errorf("entry %s: outbox_id %q is not a number", m.ID, s)
			return e
		}
		e.OutboxID = id
	}
	if s := f.Attempt; s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			e.Err = fmt.Errorf("entry %s: attempt %q is not a count", m.ID, s)
			return e
		}
		e.Attempt = n
	}
	if s := f.Priority; s != "" {
		p, err := strconv.Atoi(s)
		if err != nil || p < entry.HighestPriority || p > entry.LowestPriority || strconv.Itoa(p) != s {
			e.Err = fmt.Errorf("entry %s: priority %q is not one of %d to %d", m.ID, s, entry.HighestPriority, entry.LowestPriority)
			return e
		}
		e.Priority = p
	}
	switch {
	case e.JobID == "":
		e.Err = fmt.Errorf("entry %s has no job identity (job_id field); the stream entry id is never used as one", m.ID)
	case e.Kind == "":
		e.Err = fmt.Errorf("entry %s (job %s) has no kind", m.ID, e.JobID)
	}
	return e
}

// textFields are the fields whose values must be text: they are stored in
// text columns and logged.
var textFields = []string{entry.FieldJobID, entry.FieldKind, entry.FieldRequestID, entry.FieldTrace,
	entry.FieldAttempt, entry.FieldOutboxID, entry.FieldPayload, entry.FieldStep, entry.FieldPriority}

// checkText refuses what Postgres's text and jsonb cannot hold, and what
// would be retried for ever if it were let through: a value or a field
// name that is not valid UTF-8, or that holds a NUL byte. The error names
// the field (escaped).
func checkText(values map[string]any) error {
	for _, k := range textFields {
		s, _ := values[k].(string)
		if err := textErr(s); err != nil {
			return fmt.Errorf("field %s %w", k, err)
		}
	}
	names := make([]string, 0, len(values))
	for k := range values {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if err := textErr(k); err != nil {
			return fmt.Errorf("field name %s %w", strconv.Quote(k), err)
		}
	}
	return nil
}

func textErr(s string) error {
	switch {
	case !utf8.ValidString(s):
		return errors.New("is not valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("holds a NUL byte")
	}
	return nil
}
