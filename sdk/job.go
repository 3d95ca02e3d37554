package sdk

import "log/slog"

// Args is a job's payload type. Kind names the job kind it serves; it is
// called on the zero value, so it must not depend on fields.
type Args interface {
	Kind() string
}

// SchemaVersioned may be implemented by Args to report its payload schema
// version in the plugin's manifest (default 1).
type SchemaVersioned interface {
	SchemaVersion() int
}

// Job is one delivery of a job to a handler.
type Job[T Args] struct {
	// ID is the job's identity: the outbox id for jobs born in the outbox,
	// a scheduler-minted id for scheduled ones. It is the same on every
	// delivery and every retry of the job; the stream entry id never is.
	ID string
	// Kind is the job kind.
	Kind string
	// Attempt counts retries scheduled for this job, from 0.
	Attempt int
	// RequestID and Trace (a W3C traceparent) follow the job from the
	// request that committed it.
	RequestID string
	Trace     string
	// Args is the decoded payload.
	Args T
	// Log writes to the host's structured log, tagged with the job's id,
	// request_id and trace.
	Log *slog.Logger
}
