package sdk

import (
	"errors"
	"fmt"
	"time"
)

// RetryLaterError asks the host to run the job again after Delay, keeping the
// job's identity. The host acks the current delivery only after the delayed
// run is committed.
type RetryLaterError struct {
	Delay  time.Duration
	Reason string
}

// Error says when the job runs again and why.
func (e *RetryLaterError) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("retry later (in %s)", e.Delay)
	}
	return fmt.Sprintf("retry later (in %s): %s", e.Delay, e.Reason)
}

// RetryLater returns an error that makes the host schedule another run of the
// job after d. Match it with errors.As and *RetryLaterError.
//
// The host keeps d within 100ms and 24h (a shorter or negative one runs
// after 100ms, a longer one after 24h), and every retry counts towards its
// maximum attempts (8 by default): a job that asks to run later every time
// ends as a dead letter that says so.
func RetryLater(d time.Duration, reason string) error {
	if d < 0 {
		d = 0
	}
	return &RetryLaterError{Delay: d, Reason: reason}
}

// PermanentError marks a failure no retry can fix: the host dead-letters the
// job with the error as its reason.
type PermanentError struct {
	Err error
}

// Error is the wrapped error, marked permanent.
func (e *PermanentError) Error() string { return "permanent failure: " + e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the host dead-letters the job instead of
// retrying it. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// ErrNoRows is returned by Row.Scan when a query returned no row.
var ErrNoRows = errors.New("sdk: no rows in result set")

// ErrNotWon is returned when a handler tries to enqueue or write through a
// conditional write that did not win.
var ErrNotWon = errors.New("sdk: the conditional write did not win; follow-on effects are not allowed")
