// Package entry is the format of a stream entry, below the host, the SDK
// and the client: its field names, the relay's signature over them (signed
// by the relay, verified by the consumer before anything else) and the
// limit on a whole entry's size. It holds no I/O: the relay writes
// entries, the stream reads them.
package entry

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"sync"
)

// MaxBytes is the limit on a whole stream entry (the sum of its field
// names and values): the largest entry the host runs (a larger one is
// dead-lettered before any plugin sees it), what one entry can cost the
// host's memory, and so the unit its byte budget is reserved in. The one
// name of this limit.
const MaxBytes = 1 << 20

// Stream entry field names. outbox_id and job_id are always present; the
// stream entry id is never a job's identity. FieldSig signs the others.
const (
	FieldJobID     = "job_id"
	FieldOutboxID  = "outbox_id"
	FieldKind      = "kind"
	FieldPayload   = "payload"
	FieldRequestID = "request_id"
	FieldTrace     = "trace"
	FieldAttempt   = "attempt"
	// FieldStep is "1" on a workflow step's delivery (the host asks
	// whether the step was cancelled before it runs it) and absent on
	// every other entry. The signature covers it when present, so a host
	// from before the field refuses a step's entry as unsigned.
	FieldStep = "step"
	// FieldPriority is the job's priority ("1" to "5") when it is not
	// DefaultPriority, and absent on an entry of the default priority.
	// The signature covers it when present.
	FieldPriority = "priority"
)

// A job's priority: HighestPriority runs first, LowestPriority last;
// DefaultPriority is that of a job that names none. The scale and its
// default are Temporal's priority keys' (1 to 5, 3 by default), so a job
// can be raised above the default as well as lowered below it.
const (
	HighestPriority = 1
	DefaultPriority = 3
	LowestPriority  = 5
)

// PriorityOr is p, or DefaultPriority when p is 0 (a job that names none).
func PriorityOr(p int) int {
	if p == 0 {
		return DefaultPriority
	}
	return p
}

// FieldSig holds the entry's signature: hex HMAC-SHA256, by the cluster's
// signing key, of the entry's other fields (Fields.Sign).
const FieldSig = "sig"

// MinKeyLen is the shortest signing key accepted, in bytes.
const MinKeyLen = 32

// Fields are the values of a stream entry that a consumer uses, exactly as
// they are on the stream (outbox_id and attempt as their decimal text). A
// field missing from the entry is the empty string, as the consumer reads
// it.
type Fields struct {
	JobID, OutboxID, Kind, Payload, RequestID, Trace, Attempt string
	// Step is "1" on a workflow step's entry, "" on others.
	Step string
	// Priority is the job's priority when it is not DefaultPriority, ""
	// when it is.
	Priority string
}

// FieldsOf reads the signed fields of a stream entry's values (as go-redis
// returns them); a value that is not a string counts as empty, as it does
// for the consumer.
func FieldsOf(values map[string]any) Fields {
	s := func(k string) string {
		v, _ := values[k].(string)
		return v
	}
	return Fields{JobID: s(FieldJobID), OutboxID: s(FieldOutboxID), Kind: s(FieldKind), Payload: s(FieldPayload),
		RequestID: s(FieldRequestID), Trace: s(FieldTrace), Attempt: s(FieldAttempt), Step: s(FieldStep),
		Priority: s(FieldPriority)}
}

// signDomain separates these signatures from any other use of the key.
const signDomain = "usher stream entry v1"

// Sign returns the hex HMAC-SHA256 of f by key, over an unambiguous
// encoding: the domain, then each field in a fixed order, each preceded by
// its length as 8 bytes big-endian, so no two different entries encode
// alike (moving bytes from the payload into the trace changes the
// signature).
func (f Fields) Sign(key []byte) string {
	var sum [sha256.Size]byte
	return hex.EncodeToString(f.sum(key, sum[:0]))
}

// Verify reports whether sig is f's signature by key, in constant time.
// An empty or malformed sig is not.
func (f Fields) Verify(key []byte, sig string) bool {
	var got, want [sha256.Size]byte
	if len(sig) != hex.EncodedLen(sha256.Size) {
		return false
	}
	if _, err := hex.Decode(got[:], []byte(sig)); err != nil {
		return false
	}
	return hmac.Equal(got[:], f.sum(key, want[:0]))
}

// sum appends f's HMAC by key to b. The keyed hashes are kept between
// calls (macs): making one hashes the key's two pads first, which was
// most of the cost of a small entry's signature, twice per job (relay and
// consumer).
func (f Fields) sum(key []byte, b []byte) []byte {
	v, ok := macs.Load(string(key))
	if !ok {
		k := bytes.Clone(key)
		v, _ = macs.LoadOrStore(string(k), &sync.Pool{New: func() any { return &keyedMAC{mac: hmac.New(sha256.New, k)} }})
	}
	pool := v.(*sync.Pool)
	m := pool.Get().(*keyedMAC)
	defer pool.Put(m)
	m.mac.Reset()
	m.buf = m.buf[:0]
	for _, v := range [...]string{signDomain, f.JobID, f.OutboxID, f.Kind, f.Payload, f.RequestID, f.Trace, f.Attempt} {
		m.buf = binary.BigEndian.AppendUint64(m.buf, uint64(len(v)))
		m.buf = append(m.buf, v...)
	}
	if f.Step != "" {
		// Encoded only when present, so an entry without it is signed as
		// before the field existed; the lengths keep the two encodings
		// apart (one more length-prefixed value).
		m.buf = binary.BigEndian.AppendUint64(m.buf, uint64(len(f.Step)))
		m.buf = append(m.buf, f.Step...)
	}
	if f.Priority != "" {
		// The same, for the priority, named: an entry with a step and
		// none, one with a priority and no step, and one with both
		// encode one, two and three more values.
		for _, v := range [...]string{FieldPriority, f.Priority} {
			m.buf = binary.BigEndian.AppendUint64(m.buf, uint64(len(v)))
			m.buf = append(m.buf, v...)
		}
	}
	m.mac.Write(m.buf)
	if cap(m.buf) > 64<<10 {
		m.buf = nil // a large payload's buffer is not kept
	}
	return m.mac.Sum(b)
}

// keyedMAC is an HMAC-SHA256 keyed once, with the buffer its message is
// encoded in.
type keyedMAC struct {
	mac hash.Hash
	buf []byte
}

// macs holds a pool of keyed HMAC-SHA256 hashes per signing key (a
// cluster has one).
var macs sync.Map

// Values returns the entry's XADD values: every field, then its signature
// by key.
func (f Fields) Values(key []byte) []any {
	v := make([]any, 0, 20)
	v = append(v,
		FieldJobID, f.JobID,
		FieldOutboxID, f.OutboxID,
		FieldKind, f.Kind,
		FieldPayload, f.Payload,
		FieldRequestID, f.RequestID,
		FieldTrace, f.Trace,
		FieldAttempt, f.Attempt)
	if f.Step != "" { // absent on every entry that is no workflow step
		v = append(v, FieldStep, f.Step)
	}
	if f.Priority != "" { // absent on every entry of the default priority
		v = append(v, FieldPriority, f.Priority)
	}
	return append(v, FieldSig, f.Sign(key))
}
