package guard

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/usherhq/usher/host/sandbox"
)

// txConn is what a handle runs statements on: a job's transaction.
type txConn interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Conn() *pgx.Conn
}

var (
	_ txConn = (*jobTx)(nil)
	_ txConn = pgx.Tx(nil)
)

// jobTx is a job's transaction on a connection of the plugin's pool, with
// two round trips fewer than pgx.Tx: it begins in the same round trip as
// its first statement (the host's), and commits in the same round trip as
// the connection's reset (sandbox.ResetSession, which then need not run when the
// connection goes back to its pool).
type jobTx struct {
	conn *pgxpool.Conn
	done bool
	// gate is the schema-qualified usher_gate_close and key the secret
	// that closes this transaction's commit gate (see beginWith); schema
	// is the runtime's.
	gate, key, schema string
}

// opening is a statement sent with a transaction's BEGIN; scan receives
// its one row.
type opening struct {
	sql  string
	args []any
	scan func(pgx.Row) error
}

// beginWith acquires a connection and sends BEGIN, the opening of the
// transaction's commit gate, and the statements first in one round trip
// (acquireTx, then begin).
func beginWith(ctx context.Context, pool *pgxpool.Pool, schema string, first ...opening) (*jobTx, error) {
	tx, err := acquireTx(ctx, pool, schema)
	if err != nil {
		return nil, err
	}
	if err := tx.begin(ctx, first...); err != nil {
		tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	return tx, nil
}

// acquireTx acquires a connection for a transaction that begin opens.
func acquireTx(ctx context.Context, pool *pgxpool.Pool, schema string) (*jobTx, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	var k [16]byte
	_, _ = rand.Read(k[:])
	return &jobTx{conn: conn, gate: pgx.Identifier{schema, "usher_gate_close"}.Sanitize(), key: hex.EncodeToString(k[:]), schema: schema}, nil
}

// begin sends BEGIN, the opening of the transaction's commit gate, and
// the statements first in one round trip. The gate (usher_gate_open,
// schema the runtime's) holds the hash of a random key: until Commit
// closes it with the key, which only this process knows, a COMMIT the
// plugin sends fails and rolls everything back. On an error the caller
// rolls back.
func (t *jobTx) begin(ctx context.Context, first ...opening) error {
	sum := sha256.Sum256([]byte(t.key))
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SELECT "+pgx.Identifier{t.schema, "usher_gate_open"}.Sanitize()+"($1)", sum[:])
	for _, f := range first {
		b.Queue(f.sql, f.args...)
	}
	br := t.conn.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	for _, f := range first {
		if err != nil {
			break
		}
		err = f.scan(br.QueryRow())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return err
}

func (t *jobTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *jobTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *jobTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *jobTx) Conn() *pgx.Conn { return t.conn.Conn() }

// Commit commits and resets the connection in one round trip, then gives
// it back to its pool. last, when set, is a statement run in the
// transaction just before its COMMIT, in the same round trip (its
// arguments in text form); its failure rolls everything back. Commit
// returns once COMMIT's answer is in: the server flushes it at its sync,
// before it runs the reset, whose answers a goroutine reads before the
// connection goes back to its pool. From then on the reset no longer
// ends with ctx (a connection cancelled in the middle of a reset is
// closed, not reused); the job's deadline still bounds it.
func (t *jobTx) Commit(ctx context.Context, last ...lastStatement) error {
	if t.done {
		return errors.New("guard: transaction already ended")
	}
	t.done = true
	pc := t.conn.Conn().PgConn()
	if pc.TxStatus() != 'T' {
		// Failed ('E'), or ended by something else ('I'): no commit.
		_ = pc.Exec(ctx, "ROLLBACK").Close()
		t.conn.Release()
		return errors.New("commit: the transaction had failed or was no longer open; rolled back")
	}
	pctx, cancelCause := context.WithCancelCause(context.WithoutCancel(ctx))
	cancel := func() { cancelCause(nil) }
	if dl, ok := ctx.Deadline(); ok {
		var stop context.CancelFunc
		pctx, stop = context.WithDeadline(pctx, dl)
		cancel = func() { stop(); cancelCause(nil) }
	}
	unwatch := context.AfterFunc(ctx, func() { cancelCause(context.Cause(ctx)) })
	p := pc.StartPipeline(pctx)
	r := &commitReader{p: p}
	handed := false // to the reset's goroutine
	defer func() {
		if handed {
			return
		}
		unwatch()
		cancel()
		t.conn.Release()
	}()
	// Holdable cursors run their query at COMMIT: none of the plugin's
	// may run after the host's checks. Then the host's last statements,
	// and the gate's key.
	last = append(append([]lastStatement{{sql: "CLOSE ALL"}}, last...),
		lastStatement{sql: "SELECT " + t.gate + "($1)", args: [][]byte{[]byte(t.key)}})
	for _, l := range last {
		p.SendQueryParams(l.sql, l.args, nil, nil, nil)
	}
	p.SendQueryParams("COMMIT", nil, nil, nil, nil)
	p.SendPipelineSync()
	// Its own Sync: the reset is not part of the transaction. Then the
	// check of the session's prepared statements, with a Sync of its own
	// so that its failure does not undo the reset.
	for _, st := range sandbox.ResetSession {
		p.SendQueryParams(st, nil, nil, nil, nil)
	}
	p.SendPipelineSync()
	p.SendQueryParams(sandbox.StatementsCheck(t.conn.Conn(), t.schema), nil, nil, nil, nil)
	p.SendPipelineSync()
	r.err = p.Flush()
	r.read(1)
	if r.err == nil && r.commitErr == nil && !r.committed {
		r.commitErr = errors.New("the transaction was rolled back")
	}
	if r.err == nil && r.commitErr == nil && unwatch() {
		// Committed, and ctx was not done: the reset's answers are read
		// apart, and the connection released after them.
		conn := t.conn
		go func() {
			defer conn.Release()
			defer cancel()
			r.read(3)
			if cerr := p.Close(); r.err == nil && r.resetErr == nil && cerr == nil {
				sandbox.MarkReset(conn.Conn())
			}
			// Otherwise the connection is not marked reset, so its pool
			// resets it again (or destroys it), and deallocates
			// statements that are not the host's.
		}()
		handed = true
		return nil
	}
	r.read(3)
	if cerr := p.Close(); r.err == nil {
		r.err = cerr
	}
	switch {
	case r.committed && (r.err != nil || r.resetErr != nil):
		// Committed; only the reset, the check or their reading failed:
		// the connection is not marked reset (see above).
		return nil
	case r.err != nil:
		return fmt.Errorf("commit: %w", r.err)
	case r.commitErr != nil:
		// A failed statement left the block aborted: end it, so the
		// connection goes back clean (its pool resets it).
		if pc.TxStatus() != 'I' {
			_ = pc.Exec(context.WithoutCancel(ctx), "ROLLBACK").Close()
		}
		return fmt.Errorf("commit: %w", r.commitErr)
	case r.resetErr == nil:
		sandbox.MarkReset(t.conn.Conn())
	}
	return nil
}

// commitReader reads the answers of Commit's pipeline: up to its first
// sync, last's and COMMIT's; after it, the reset's, then the check's.
// After an error the server skips to the next sync.
type commitReader struct {
	p                   *pgconn.Pipeline
	syncs               int
	committed           bool
	err                 error // reading failed: the connection is broken
	commitErr, resetErr error
}

// read reads answers until the syncs'th sync, or an error of the
// connection.
func (r *commitReader) read(syncs int) {
	for r.err == nil && r.syncs < syncs {
		res, err := r.p.GetResults()
		var pgErr *pgconn.PgError
		switch res := res.(type) {
		case *pgconn.PipelineSync:
			r.syncs++
		case *pgconn.ResultReader:
			tag, rerr := res.Close()
			if rerr != nil {
				r.note(rerr)
			} else if r.syncs == 0 && tag.String() == "COMMIT" {
				r.committed = true
			}
		case nil:
			if !errors.As(err, &pgErr) {
				r.err = err // no more results (nil), or a broken connection
				return
			}
			r.note(err)
		}
	}
}

// note keeps the first error of the part it falls in.
func (r *commitReader) note(e error) {
	switch {
	case r.syncs == 0 && r.commitErr == nil:
		r.commitErr = e
	case r.syncs >= 1 && r.resetErr == nil:
		r.resetErr = e
	}
}

// Rollback rolls back and gives the connection back to its pool, which
// resets it. It is safe to call after Commit.
func (t *jobTx) Rollback(ctx context.Context) {
	if t.done {
		return
	}
	t.done = true
	if t.conn.Conn().PgConn().TxStatus() != 'I' {
		_ = t.conn.Conn().PgConn().Exec(ctx, "ROLLBACK").Close()
	}
	t.conn.Release()
}

// lastStatement is a statement Commit sends before COMMIT.
type lastStatement struct {
	sql  string
	args [][]byte
}
