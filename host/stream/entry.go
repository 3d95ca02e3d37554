// Package stream reads jobs from a Redis stream in a consumer group and
// hands them to a dispatcher with bounded concurrency. It acks only what the
// dispatcher says is finished: an entry whose handler did not commit stays
// pending, to be reclaimed.
package stream

import (
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/host/outbox"
)

// Entry is one stream entry decoded into a job. Err is set when the entry is
// malformed; the dispatcher dead-letters it with that reason.
type Entry struct {
	// StreamID is the entry id: a delivery, never a job identity.
	StreamID  string
	JobID     string
	OutboxID  int64
	Kind      string
	Payload   []byte
	RequestID string
	Trace     string
	Attempt   int
	// Deliveries is how many times the group delivered the entry,
	// counting this one (known for reclaimed entries; 1 for new ones).
	Deliveries int64
	// Size is the sum of the entry's field and value lengths.
	Size int
	// Signed are the entry's values exactly as the stream holds them and
	// Sig the relay's signature of them (empty when the entry has none).
	// Decode does not verify them: the dispatcher does, with the cluster's
	// key, before anything else.
	Signed outbox.Fields
	Sig    string
	Err    error
}

// Decode turns a stream message into an Entry. It never fails: a missing or
// malformed field is recorded in Entry.Err.
func Decode(m redis.XMessage) Entry {
	e := Entry{StreamID: m.ID, Deliveries: 1, Signed: outbox.FieldsOf(m.Values)}
	for k, v := range m.Values {
		s, _ := v.(string)
		e.Size += len(k) + len(s)
	}
	e.Sig, _ = m.Values[outbox.FieldSig].(string)
	// Every value used below comes from Signed, so what is verified is
	// what runs.
	f := e.Signed
	e.JobID = f.JobID
	e.Kind = f.Kind
	e.Payload = []byte(f.Payload)
	e.RequestID = f.RequestID
	e.Trace = f.Trace
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
	switch {
	case e.JobID == "":
		e.Err = fmt.Errorf("entry %s has no job identity (job_id field); the stream entry id is never used as one", m.ID)
	case e.Kind == "":
		e.Err = fmt.Errorf("entry %s (job %s) has no kind", m.ID, e.JobID)
	}
	return e
}
