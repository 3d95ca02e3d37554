// Package jobmsg holds the rules every way into the outbox shares: the
// host's outbox.Add, the application's client.Enqueue, and (restated in
// SQL, tested to agree) the usher_enqueue_job function. It imports nothing
// of the host's or Redis's, so the client stays free of both.
package jobmsg

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/usherhq/usher/internal/entry"
)

// Limits of a message, so that its stream entry always fits entry.MaxBytes: an
// entry over it cannot be verified and is dead-lettered as a forgery
// would be.
const (
	MaxPayloadBytes = entry.MaxBytes - 16<<10
	MaxKindBytes    = 200
	MaxMetaBytes    = 2 << 10 // request_id, trace, job_id each
)

// Check refuses a message the host could not run: no kind, a payload that
// is not JSON, or a field over its limit.
func Check(kind string, payload []byte, requestID, trace, jobID string) error {
	switch {
	case kind == "":
		return fmt.Errorf("the job has no kind")
	case len(kind) > MaxKindBytes:
		return fmt.Errorf("kind of %d bytes is over the %d-byte limit", len(kind), MaxKindBytes)
	case len(payload) > MaxPayloadBytes:
		return fmt.Errorf("%s payload of %d bytes is over the %d-byte limit", kind, len(payload), MaxPayloadBytes)
	case !json.Valid(payload):
		return fmt.Errorf("%s payload is not valid JSON", kind)
	case len(requestID) > MaxMetaBytes || len(trace) > MaxMetaBytes || len(jobID) > MaxMetaBytes:
		return fmt.Errorf("%s request_id, trace or job_id is over the %d-byte limit", kind, MaxMetaBytes)
	}
	return nil
}

// CheckPriority refuses a priority outside entry.HighestPriority to
// entry.LowestPriority; 0 is the default's.
func CheckPriority(kind string, p int) error {
	if p != 0 && (p < entry.HighestPriority || p > entry.LowestPriority) {
		return fmt.Errorf("%s job has priority %d: a priority is %d (the highest) to %d (the lowest), %d by default",
			kind, p, entry.HighestPriority, entry.LowestPriority, entry.DefaultPriority)
	}
	return nil
}

// Trace is trace, or a new W3C traceparent (version 00, random trace and
// parent ids, sampled) when it is empty: every delivery and retry of the
// job then continues one trace, and its log lines share it.
func Trace(trace string) string {
	if trace != "" {
		return trace
	}
	b := make([]byte, 24)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return "00-" + hex.EncodeToString(b[:16]) + "-" + hex.EncodeToString(b[16:]) + "-01"
}
