// Package history keeps and reads the record of every delivery of a job:
// its attempt, the host consumer that ran it, the plugin and version, the
// guard, the verdict and why (applied, absorbed, retry, dead-lettered,
// abandoned), how long it took and its error.
//
// An applied run of a job with an outbox row writes its record in the
// job's own transaction, through the runtime's usher_applied_logged
// (migrations/00016_job_history.sql), so a run whose transaction rolled
// back leaves none; the host writes every other record (Write) with the
// delivery's outcome. Plugin roles hold no privilege on the table.
//
// Job and Workflow are the one read path: the CLI's `jobs show` and
// `workflows show` print what they return, and a console reads the same.
// Trimmer deletes records older than the retention window.
package history
