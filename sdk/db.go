package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// hostCaller is the plugin's view of the host's callback service.
type hostCaller interface {
	exec(ctx context.Context, handle string, stmts []*usherv1.Statement) ([]*usherv1.StatementResult, error)
	enqueue(ctx context.Context, handle string, msgs []*usherv1.OutboxMessage) ([]int64, error)
}

// handle is a capability the host issued for one phase of one job. The host
// checks every statement against it, so a plugin that bypasses the SDK's
// types is refused there as well.
type handle struct {
	host hostCaller
	id   string
}

func (h handle) run(ctx context.Context, mode usherv1.Mode, sql string, args []any) (*usherv1.StatementResult, error) {
	if h.host == nil || h.id == "" {
		return nil, fmt.Errorf("sdk: no database in this phase")
	}
	vals, err := contract.ToValues(args)
	if err != nil {
		return nil, fmt.Errorf("sdk: %w", err)
	}
	res, err := h.host.exec(ctx, h.id, []*usherv1.Statement{{Mode: mode, Sql: sql, Args: vals}})
	if err != nil {
		return nil, err
	}
	if len(res) != 1 {
		return nil, fmt.Errorf("sdk: host answered %d results for 1 statement", len(res))
	}
	return res[0], nil
}

// execAll runs writes in one call to the host, in order; the host stops
// at the first that fails.
func (h handle) execAll(ctx context.Context, stmts []Statement) ([]int64, error) {
	if h.host == nil || h.id == "" {
		return nil, fmt.Errorf("sdk: no database in this phase")
	}
	wst := make([]*usherv1.Statement, len(stmts))
	for i, st := range stmts {
		w, err := st.wire()
		if err != nil {
			return nil, fmt.Errorf("sdk: statement %d: %w", i+1, err)
		}
		wst[i] = w
	}
	res, err := h.host.exec(ctx, h.id, wst)
	if err != nil {
		return nil, err
	}
	if len(res) != len(stmts) {
		return nil, fmt.Errorf("sdk: host answered %d results for %d statements", len(res), len(stmts))
	}
	n := make([]int64, len(res))
	for i, r := range res {
		n[i] = r.GetRowsAffected()
		if err := stmts[i].short(n[i]); err != nil {
			return n, err
		}
	}
	return n, nil
}

// Statement is one write of ExecAll or Queue.
type Statement struct {
	SQL  string
	Args []any
	// MinRows, when above 0, is the fewest rows the write must affect:
	// fewer fail the job permanently with Missing as its error (and roll
	// its transaction back). "UPDATE ... WHERE id = $1" with MinRows 1
	// says the row must exist.
	MinRows int64
	Missing string
}

// short is the error of a write that affected n rows, fewer than its
// MinRows; nil when it affected enough.
func (st Statement) short(n int64) error {
	if n >= st.MinRows {
		return nil
	}
	msg := st.Missing
	if msg == "" {
		msg = fmt.Sprintf("a write affected %d rows, fewer than the %d it needs", n, st.MinRows)
	}
	return Permanent(errors.New(msg))
}

func (st Statement) wire() (*usherv1.Statement, error) {
	vals, err := contract.ToValues(st.Args)
	if err != nil {
		return nil, err
	}
	return &usherv1.Statement{Mode: usherv1.Mode_MODE_EXEC, Sql: st.SQL, Args: vals, MinRows: st.MinRows, Missing: st.Missing}, nil
}

func (h handle) query(ctx context.Context, sql string, args []any) (*Rows, error) {
	res, err := h.run(ctx, usherv1.Mode_MODE_QUERY, sql, args)
	if err != nil {
		return nil, err
	}
	return newRows(res), nil
}

func (h handle) exec(ctx context.Context, sql string, args []any) (int64, error) {
	res, err := h.run(ctx, usherv1.Mode_MODE_EXEC, sql, args)
	if err != nil {
		return 0, err
	}
	return res.GetRowsAffected(), nil
}

func (h handle) enqueue(ctx context.Context, args []Args) error {
	msgs := make([]*usherv1.OutboxMessage, len(args))
	for i, a := range args {
		payload, err := json.Marshal(a)
		if err != nil {
			return fmt.Errorf("sdk: encode %s payload: %w", a.Kind(), err)
		}
		msgs[i] = &usherv1.OutboxMessage{Kind: a.Kind(), Payload: payload}
	}
	_, err := h.host.enqueue(ctx, h.id, msgs)
	return err
}

// ReadOnly runs read-only queries, each in a short read-only transaction of
// the host's: no transaction is held between calls, and Postgres refuses any
// write. It is what the check phase of state first and the effect phase of a
// claim receive.
type ReadOnly struct{ h handle }

// Query runs a query and returns all its rows.
func (db *ReadOnly) Query(ctx context.Context, sql string, args ...any) (*Rows, error) {
	return db.h.query(ctx, sql, args)
}

// QueryRow runs a query expected to return at most one row.
func (db *ReadOnly) QueryRow(ctx context.Context, sql string, args ...any) *Row {
	rows, err := db.h.query(ctx, sql, args)
	return &Row{rows: rows, err: err}
}

// CommitTx is the host's transaction in the commit phase of state first. It
// can read, and it can write only conditionally: WriteIf reports whether the
// write won, and only a [Win] can write further or enqueue follow-on jobs.
// The host refuses a commit phase that made no conditional write.
type CommitTx struct{ h handle }

// Query runs a query inside the transaction.
func (tx *CommitTx) Query(ctx context.Context, sql string, args ...any) (*Rows, error) {
	return tx.h.query(ctx, sql, args)
}

// QueryRow runs a query inside the transaction, expecting at most one row.
func (tx *CommitTx) QueryRow(ctx context.Context, sql string, args ...any) *Row {
	rows, err := tx.h.query(ctx, sql, args)
	return &Row{rows: rows, err: err}
}

// WriteIf runs a conditional write: an UPDATE, INSERT, DELETE or MERGE
// whose condition holds only while the state is not yet reached (`UPDATE
// tickets SET pdf_key = $1 WHERE order_id = $2 AND pdf_key IS NULL
// RETURNING id`; RETURNING is optional). It returns a *Win when the
// database reports rows affected, and nil (with a nil error) when another
// run reached the state first. Nothing may be written before it: the host
// counts the rows the transaction wrote and refuses the job if any were.
func (tx *CommitTx) WriteIf(ctx context.Context, sql string, args ...any) (*Win, error) {
	res, err := tx.h.run(ctx, usherv1.Mode_MODE_WRITE_IF, sql, args)
	if err != nil {
		return nil, err
	}
	if !res.GetWon() {
		return nil, nil
	}
	return &Win{h: tx.h, returned: newRows(res)}, nil
}

// Win is the proof that this run's conditional write reached the state. It
// is the only way to make further writes or enqueue follow-on jobs in the
// commit phase, so a follow-on job is queued once however many runs commit.
type Win struct {
	h        handle
	returned *Rows
}

// Returned is what the conditional write's RETURNING clause returned, if
// it had one.
func (w *Win) Returned() *Rows { return w.returned }

// Exec runs a further write in the same transaction.
func (w *Win) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	if w == nil {
		return 0, ErrNotWon
	}
	return w.h.exec(ctx, sql, args)
}

// ExecAll runs several further writes in one call to the host (see
// Tx.ExecAll).
func (w *Win) ExecAll(ctx context.Context, stmts ...Statement) ([]int64, error) {
	if w == nil {
		return nil, ErrNotWon
	}
	return w.h.execAll(ctx, stmts)
}

// Enqueue adds follow-on jobs to the outbox in the same transaction, carrying
// this job's request_id and trace.
func (w *Win) Enqueue(ctx context.Context, jobs ...Args) error {
	if w == nil {
		return ErrNotWon
	}
	return w.h.enqueue(ctx, jobs)
}

// Tx is the host's transaction in the apply phase of a job whose identity
// the host records in processed_jobs. Everything here commits together with
// that record, or not at all.
type Tx struct {
	h handle
	// queued are the writes Queue queued, sent with Apply's answer.
	queued []*usherv1.Statement
	err    error
}

// Query runs a query inside the transaction.
func (tx *Tx) Query(ctx context.Context, sql string, args ...any) (*Rows, error) {
	return tx.h.query(ctx, sql, args)
}

// QueryRow runs a query inside the transaction, expecting at most one row.
func (tx *Tx) QueryRow(ctx context.Context, sql string, args ...any) *Row {
	rows, err := tx.h.query(ctx, sql, args)
	return &Row{rows: rows, err: err}
}

// Exec runs a write inside the transaction and returns the rows affected.
func (tx *Tx) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	return tx.h.exec(ctx, sql, args)
}

// ExecAll runs several writes inside the transaction in one call to the
// host, in order, and returns each one's rows affected. It stops at the
// first that fails. A handler whose writes do not depend on each other's
// results saves a round trip per statement this way.
func (tx *Tx) ExecAll(ctx context.Context, stmts ...Statement) ([]int64, error) {
	return tx.h.execAll(ctx, stmts)
}

// Queue queues writes that the host runs in the transaction once Apply
// has returned nil, in order, after any Exec: they cost no round trip to
// the host, which is what makes a write-only handler (a counter) cheap. Apply
// cannot see what they do; a write that affects fewer rows than its
// MinRows fails the job permanently with its Missing error, and the job's
// transaction, its record included, is rolled back. If Apply returns an
// error, nothing queued runs.
func (tx *Tx) Queue(stmts ...Statement) {
	for i, st := range stmts {
		w, err := st.wire()
		if err != nil && tx.err == nil {
			tx.err = Permanent(fmt.Errorf("sdk: queued write %d: %w", len(tx.queued)+i+1, err))
		}
		tx.queued = append(tx.queued, w)
	}
}

// Enqueue adds follow-on jobs to the outbox inside the transaction.
func (tx *Tx) Enqueue(ctx context.Context, jobs ...Args) error {
	return tx.h.enqueue(ctx, jobs)
}
