package guard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// capability is what a handle lets a plugin do.
type capability int

const (
	// capReadOnly: queries, each batch in a short read-only transaction.
	capReadOnly capability = iota + 1
	// capCommit: the state-first commit transaction; reads, conditional
	// writes, and plain writes and enqueues only after a write won.
	capCommit
	// capApply: the job-id transaction; reads, writes and enqueues.
	capApply
)

func (c capability) String() string {
	switch c {
	case capReadOnly:
		return "read-only"
	case capCommit:
		return "commit"
	case capApply:
		return "apply"
	}
	return "none"
}

// handle is one phase's capability. A plugin names it in every callback; it
// stops working when the phase returns.
type handle struct {
	id  string
	cap capability
	job *usherv1.Job
	// ctx is the job's: it bounds every statement the plugin sends through
	// the handle, whatever context or settings the plugin's call carries.
	ctx context.Context
	// db is the plugin's own pool (its login role): read-only batches run
	// on it.
	db *pgxpool.Pool
	// role names the plugin's role in refusals.
	role string

	// mu serialises statements on tx: a pgx connection is not safe for
	// concurrent use, and a plugin may call back from several goroutines.
	mu sync.Mutex
	tx txConn
	// txMu, when set, is held around every statement on tx: the
	// handles of a batch share one transaction.
	txMu    *sync.Mutex
	wroteIf bool
	won     bool
	// baseline is rowWrites when the commit transaction began.
	baseline int64
	// opening, when set, is its batch's transaction being opened while
	// the plugin's applies run; slot is the handle's job in it.
	opening *batchOpening
	slot    int
	closed  bool
	// denied is the first statement the plugin's role was refused
	// (SQLSTATE 42501): the job fails permanently with it, whatever the
	// plugin answers.
	denied error
	// failed is the first of the plugin's statements after which the
	// database reported its transaction failed: the transaction is lost
	// with it, so the job cannot apply, whatever the plugin answers.
	failed error
	// broken is set when the plugin stepped outside its phase in a way the
	// database reported (it ended the host's transaction, wrote in a
	// read-only phase or before its conditional write won): the handle
	// refuses every further call and the job fails permanently with it.
	broken error
}

// Handles issues handles and serves the plugins' callbacks against them. It
// is the host side of the capability rules: a plugin that skips the SDK and
// calls the service directly meets the same refusals, and each refusal is
// decided from what the database reports, never from the text of the SQL.
type Handles struct {
	usherv1.UnimplementedHostServer

	logger *slog.Logger
	// schema holds the runtime's functions; the host calls them
	// schema-qualified, so nothing a plugin creates can shadow them.
	schema string
	// statementTimeout bounds each statement a plugin sends, within the
	// job's deadline. Default 10s; a Runner sets its own.
	statementTimeout time.Duration

	mu sync.Mutex
	m  map[string]*handle
}

// NewHandles returns an empty handle table. schema is where the runtime's
// functions live (the host's current_schema()).
func NewHandles(schema string, logger *slog.Logger) *Handles {
	if logger == nil {
		logger = slog.Default()
	}
	if schema == "" {
		schema = "public"
	}
	return &Handles{logger: logger, schema: schema, statementTimeout: 10 * time.Second, m: map[string]*handle{}}
}

var _ usherv1.HostServer = (*Handles)(nil)

// fn is the runtime function name, schema-qualified and quoted.
func (hs *Handles) fn(name string) string { return pgx.Identifier{hs.schema, name}.Sanitize() }

func (hs *Handles) issue(ctx context.Context, c capability, job *usherv1.Job, db *pgxpool.Pool, tx txConn, role string) *handle {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := &handle{id: hex.EncodeToString(b[:]), cap: c, job: job, ctx: ctx, db: db, tx: tx, role: role}
	hs.mu.Lock()
	hs.m[h.id] = h
	hs.mu.Unlock()
	return h
}

// release ends a handle's phase. It waits for a statement in progress, so the
// caller may commit or roll back the transaction right after.
func (hs *Handles) release(h *handle) {
	hs.mu.Lock()
	delete(hs.m, h.id)
	hs.mu.Unlock()
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
}

func (hs *Handles) lookup(id string) (*handle, error) {
	hs.mu.Lock()
	h := hs.m[id]
	hs.mu.Unlock()
	if h == nil {
		return nil, status.Errorf(codes.PermissionDenied, "no database in this phase (handle %q is unknown or its phase has ended)", id)
	}
	return h, nil
}

// bound returns the context a plugin's statement runs under: the plugin's
// call may cancel it early, but the job's deadline and the statement
// timeout are the host's.
func (hs *Handles) bound(ctx context.Context, h *handle) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(ctx, hs.statementTimeout)
	stop := context.AfterFunc(h.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// usable reports why h can take no more statements, as the status the
// plugin is answered with.
func (h *handle) usable() error {
	switch {
	case h.closed:
		return status.Error(codes.PermissionDenied, "the phase of this handle has ended")
	case h.broken != nil:
		return status.Error(codes.PermissionDenied, h.broken.Error())
	}
	return nil
}

// opened waits until h's batch transaction is open (handle.opening), and
// reports why h may not run statements in it: it did not open, or h's job
// was recorded before (its run is absorbed; only the batch-mates apply).
func (h *handle) opened(ctx context.Context) error {
	o := h.opening
	if o == nil {
		return nil
	}
	select {
	case <-o.done:
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	switch {
	case o.err != nil:
		return status.Errorf(codes.Unavailable, "%s job %s: its transaction did not open: %v", h.job.GetKind(), h.job.GetId(), o.err)
	case !o.recorded[h.slot]:
		return status.Errorf(codes.Aborted, "%s job %s was applied before: this run is absorbed and runs no statement", h.job.GetKind(), h.job.GetId())
	}
	return nil
}

// breach records that the plugin stepped outside its phase and returns the
// refusal to answer it with.
func (h *handle) breach(format string, a ...any) error {
	if h.broken == nil {
		h.broken = fmt.Errorf("%s job %s: %s", h.job.GetKind(), h.job.GetId(), fmt.Sprintf(format, a...))
	}
	return status.Error(codes.PermissionDenied, h.broken.Error())
}

// Exec runs a batch of statements under a handle, one at a time: after each
// the host asks the connection whether it is still inside the transaction
// the host opened.
func (hs *Handles) Exec(ctx context.Context, req *usherv1.ExecRequest) (*usherv1.ExecResponse, error) {
	h, err := hs.lookup(req.GetHandle())
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.usable(); err != nil {
		return nil, err
	}
	ctx, cancel := hs.bound(ctx, h)
	defer cancel()
	if err := h.opened(ctx); err != nil {
		return nil, err
	}
	if h.txMu != nil {
		h.txMu.Lock()
		defer h.txMu.Unlock()
	}
	if h.cap == capReadOnly {
		out, err := hs.execReadOnly(ctx, h, req.GetStatements())
		return out, h.noteDenied(err)
	}
	out := &usherv1.ExecResponse{}
	for i, st := range req.GetStatements() {
		res, err := hs.execInTx(ctx, h, st)
		if err != nil {
			return nil, h.noteDenied(fmt.Errorf("statement %d: %w", i+1, err))
		}
		out.Results = append(out.Results, res)
	}
	return out, nil
}

// writePart is the writes one job's apply phase returned, under its
// handle.
type writePart struct {
	h  *handle
	ws []*usherv1.Statement
	// rows is what each write affected, up to the one that failed (err).
	rows []int64
	err  error
}

// writeAll runs parts' writes, in order, in their transaction (one
// transaction for all of them) in one round trip, each write sent by its
// SQL followed by usher_gate_check: a write that ended the host's
// transaction fails the check after it, and the server skips the writes
// after that instead of running them in a transaction of their own. (One
// check after all the writes is not enough: after a ROLLBACK, a write and
// a COMMIT would commit that write for good before the check ran.) A write
// sent by the name it was prepared under needs no check: the host prepares
// only SQL that ran here as a write answered with the tag of a SELECT,
// INSERT, UPDATE, DELETE or MERGE (notable), the same text always parses
// to the same command, and a plugin that prepares the name over with SQL
// PREPARE can put there only a SELECT, INSERT, UPDATE, DELETE, MERGE or
// VALUES; none of these ends a transaction (a function, trigger or rule
// they run cannot commit inside one). The writes are sent only inside a
// transaction: in none, a prepared write would run in the server's
// implicit one. It stops at the first write that fails, whose part gets
// the error, and reports whether every write ran.
func (hs *Handles) writeAll(parts []*writePart) bool {
	n := 0
	for _, p := range parts {
		p.h.mu.Lock()
		defer p.h.mu.Unlock()
		if err := p.h.usable(); err != nil {
			p.err = err
			return false
		}
		for _, st := range p.ws {
			if st.GetMode() != usherv1.Mode_MODE_EXEC {
				p.err = status.Errorf(codes.InvalidArgument, "%s job %s: only plain writes can be returned with the answer, not %v",
					p.h.job.GetKind(), p.h.job.GetId(), st.GetMode())
				return false
			}
		}
		n += len(p.ws)
	}
	if n == 0 {
		return true
	}
	first := parts[0].h
	if first.txMu != nil {
		first.txMu.Lock()
		defer first.txMu.Unlock()
	}
	ctx, cancel := hs.bound(first.ctx, first)
	defer cancel()
	check := "SELECT " + hs.fn("usher_gate_check") + "()"
	conn := first.tx.Conn()
	if ts := conn.PgConn().TxStatus(); ts == 'I' {
		// Not inside a transaction (the check after each plugin
		// statement says so already; this does not rest on it):
		// prepared writes, which have no check after them, would run
		// in the server's implicit transaction. (In a failed one, 'E',
		// the server refuses every write.)
		parts[0].err = first.breach("the host's transaction was no longer open before its writes; the job is aborted")
		return false
	}
	// A write this connection ran before goes by the name it was
	// prepared under (sandbox.WriteName): parsed and planned once.
	named := false
	// checked[i]: write i has a gate check after it (it went unnamed);
	// noted[i]: it may be prepared (notable).
	checked, noted := make([]bool, 0, n), make([]bool, n)
	b := &pgx.Batch{}
	for _, p := range parts {
		for _, st := range p.ws {
			sql := st.GetSql()
			name, prepared := sandbox.WriteName(conn, sql)
			if prepared {
				sql, named = name, true
			}
			b.Queue(sql, contract.FromValues(st.GetArgs())...)
			if !prepared {
				b.Queue(check)
			}
			checked = append(checked, !prepared)
		}
	}
	br := conn.SendBatch(ctx, b)
	var last *writePart
	ok := true
	i := 0
results:
	for _, p := range parts {
		last = p
		p.rows = make([]int64, 0, len(p.ws))
		for range p.ws {
			tag, werr := br.Exec()
			switch {
			case werr != nil:
				p.err = p.h.noteDenied(sqlStatus(werr))
			case controlsTransaction(tag):
				p.err = p.h.breach("a statement controlled the host's transaction (%s)", tag.String())
			case refusedCommand(tag):
				p.err = p.h.breach("a plugin may not run %s in a job (it changes roles, privileges or the schema); rolled back", tag.String())
			case checked[i]:
				if _, cerr := br.Exec(); cerr != nil {
					p.err = p.h.breach("a statement ended the host's transaction (%v); the job is aborted", cerr)
				}
			}
			if p.err != nil {
				ok = false
				break results
			}
			noted[i] = notable(tag)
			i++
			p.rows = append(p.rows, tag.RowsAffected())
		}
	}
	if cerr := br.Close(); ok && cerr != nil {
		last.err, ok = sqlStatus(cerr), false
	}
	if ts := conn.PgConn().TxStatus(); ts != 'T' && ts != 'E' {
		last.err = last.h.breach("a statement ended the host's transaction (the connection reports status %q, not inside a transaction); the job is aborted", string(ts))
		ok = false
	}
	switch {
	case ok:
		// Each write ran and parsed: prepared when the connection is
		// next idle, if it is not already.
		i = 0
		for _, p := range parts {
			for _, st := range p.ws {
				if noted[i] {
					sandbox.NoteWrite(conn, st.GetSql())
				}
				i++
			}
		}
	case named:
		sandbox.SpoilWrites(conn)
	}
	return ok
}

// noteDenied records the first statement the database refused to the
// plugin's role. The capability refusals of this file are not recorded:
// they are answered to the plugin, which fails its phase with them.
func (h *handle) noteDenied(err error) error {
	if err == nil || h.denied != nil {
		return err
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42501" {
		h.denied = fmt.Errorf("role %s was refused: %s (SQLSTATE %s)", h.role, pg.Message, pg.Code)
	}
	return err
}

// noteFailed records err, a statement's error, when it is the first after
// which the database reports tx failed.
func (h *handle) noteFailed(tx txConn, err error) {
	if err != nil && h.failed == nil && tx.Conn().PgConn().TxStatus() == 'E' {
		h.failed = err
	}
}

// execReadOnly runs a read-only batch in a transaction of its own on the
// plugin's pool. The transaction is READ ONLY, and is always rolled back;
// should a statement lift that (SET TRANSACTION READ WRITE), the database's
// own record of a write (an assigned transaction id) refuses the batch.
func (hs *Handles) execReadOnly(ctx context.Context, h *handle, stmts []*usherv1.Statement) (*usherv1.ExecResponse, error) {
	for _, st := range stmts {
		if st.GetMode() != usherv1.Mode_MODE_QUERY {
			return nil, status.Errorf(codes.PermissionDenied,
				"%s job %s: only queries are allowed in a read-only phase; writes belong to the commit phase or to the host's mark", h.job.GetKind(), h.job.GetId())
		}
	}
	if len(stmts) == 1 {
		return hs.queryReadOnly(ctx, h, stmts[0])
	}
	tx, err := h.db.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "begin read-only transaction: %v", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	out := &usherv1.ExecResponse{}
	for i, st := range stmts {
		res, err := hs.runPlugin(ctx, h, tx, st)
		if err != nil {
			return nil, fmt.Errorf("statement %d: %w", i+1, err)
		}
		out.Results = append(out.Results, res)
	}
	wrote, err := wrote(ctx, tx)
	if err != nil {
		return nil, sqlStatus(err)
	}
	if wrote {
		return nil, h.breach("a read-only phase wrote (the database assigned its transaction an id); the write was rolled back")
	}
	return out, nil
}

// queryReadOnly runs a read-only batch of one statement in two round trips
// where execReadOnly's transaction and its connection's reset take six:
// BEGIN READ ONLY, then the statement, the check that nothing was written,
// ROLLBACK and the session's reset (withReset). BEGIN goes first by
// itself because the pool describes a statement it has not seen on the
// connection before sending it, and parsing can run the plugin's code (a
// domain's check on a cast the server folds): that must happen inside
// the read-only transaction, not in one of the server's own that commits.
// One statement cannot both end the transaction and do something after
// it: when it ends it (its tag says so), it is refused as in
// execReadOnly, and the statements after it are the host's own (the
// check, which writes nothing, and a ROLLBACK that finds no transaction).
// When a statement fails, the server skips the rest: the transaction is
// rolled back, and the pool resets the connection.
func (hs *Handles) queryReadOnly(ctx context.Context, h *handle, st *usherv1.Statement) (*usherv1.ExecResponse, error) {
	var res *usherv1.StatementResult
	err := withReset(ctx, h.db, hs.schema, "BEGIN READ ONLY", func(b *pgx.Batch) {
		b.Queue(st.GetSql(), contract.FromValues(st.GetArgs())...)
		b.Queue(wroteSQL)
		b.Queue("ROLLBACK")
	}, func(br pgx.BatchResults) error {
		var tag pgconn.CommandTag
		var err error
		if res, tag, err = collect(br.Query()); err != nil {
			return h.noteDenied(fmt.Errorf("statement 1: %w", err))
		}
		if controlsTransaction(tag) {
			return h.breach("a statement controlled the host's transaction (%s)", tag.String())
		}
		if refusedCommand(tag) {
			return h.breach("a plugin may not run %s in a job (it changes roles, privileges or the schema); rolled back", tag.String())
		}
		var w bool
		if err := br.QueryRow().Scan(&w); err != nil {
			return sqlStatus(err)
		}
		if w {
			return h.breach("a read-only phase wrote (the database assigned its transaction an id); the write was rolled back")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &usherv1.ExecResponse{Results: []*usherv1.StatementResult{res}}, nil
}

// withReset runs the statements queue adds on a connection of pool, as its
// role, in one round trip with the session's reset after them
// (sandbox.ResetSession and its check of prepared statements), and gives
// the connection back marked reset when all of it ran: the pool's own
// reset, two round trips more, is then skipped. read reads the results of
// queue's statements, every one of them, in order; its error is returned.
// When a statement failed (the server skipped the rest), the reset failed
// or the round trip did not finish, an open transaction is rolled back
// and the pool resets the connection (or closes it). The statements must
// end any transaction they begin: the reset is not part of it, but runs in
// the implicit transaction after it, and its failure undoes nothing of
// theirs. begin, when set, runs first in a round trip of its own: the
// pool describes statements it has not seen on the connection before it
// sends the batch (a parse, which can run the plugin's code), and begin
// puts that inside the transaction.
func withReset(ctx context.Context, pool *pgxpool.Pool, schema, begin string, queue func(*pgx.Batch), read func(pgx.BatchResults) error) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return status.Errorf(codes.Unavailable, "acquire a connection: %v", err)
	}
	defer conn.Release()
	pc := conn.Conn().PgConn()
	if begin != "" {
		if err := pc.Exec(ctx, begin).Close(); err != nil {
			if pc.TxStatus() != 'I' {
				_ = pc.Exec(context.WithoutCancel(ctx), "ROLLBACK").Close()
			}
			return status.Errorf(codes.Unavailable, "%s: %v", begin, err)
		}
	}
	b := &pgx.Batch{}
	queue(b)
	for _, r := range sandbox.ResetSession {
		b.Queue(r)
	}
	b.Queue(sandbox.StatementsCheck(conn.Conn(), schema))
	br := conn.SendBatch(ctx, b)
	err = read(br)
	switch reset := br.Close() == nil; {
	case pc.TxStatus() != 'I':
		_ = pc.Exec(context.WithoutCancel(ctx), "ROLLBACK").Close()
	case reset:
		sandbox.MarkReset(conn.Conn())
	}
	return err
}

// wrote asks the database whether tx has written anything (or taken a row
// lock): only then does it assign the transaction an id. For a read-only
// phase, where nothing may even try.
func wrote(ctx context.Context, tx txConn) (bool, error) {
	var w bool
	err := tx.QueryRow(ctx, wroteSQL).Scan(&w)
	return w, err
}

const wroteSQL = `SELECT pg_catalog.pg_current_xact_id_if_assigned() IS NOT NULL`

// rowWrites is the database's count of rows this backend inserted, updated
// or deleted and has not yet reported to the statistics collector. It only
// grows inside a transaction (pending counts are flushed between
// transactions, never inside one), so its growth since the transaction
// began is what the transaction wrote. Unlike an assigned transaction id,
// a conditional write that lost a race (it waited on the row's lock, then
// found it no longer matching) adds nothing.
func rowWrites(ctx context.Context, tx txConn) (int64, error) {
	var n int64
	err := tx.QueryRow(ctx, rowWritesSQL).Scan(&n)
	return n, err
}

// Every function and operator qualified: a plugin's search_path (SET, or
// ALTER ROLE ... SET) must not reach the host's own check.
const rowWritesSQL = `SELECT coalesce(pg_catalog.sum(n_tup_ins OPERATOR(pg_catalog.+) n_tup_upd OPERATOR(pg_catalog.+) n_tup_del), 0)::pg_catalog.int8
	FROM pg_catalog.pg_stat_xact_all_tables`

func (hs *Handles) execInTx(ctx context.Context, h *handle, st *usherv1.Statement) (*usherv1.StatementResult, error) {
	switch st.GetMode() {
	case usherv1.Mode_MODE_QUERY:
		return hs.runPlugin(ctx, h, h.tx, st)
	case usherv1.Mode_MODE_WRITE_IF:
		// Nothing may be written before the conditional write wins: the
		// database says whether something was, in the write's round
		// trip, before the write runs. (When something was, the write
		// has run too, in a transaction the breach rolls back.)
		var before, after *int64
		if h.cap == capCommit && !h.won {
			before, after = new(int64), new(int64)
		}
		res, tag, err := hs.run(ctx, h, h.tx, st, before, after)
		if before != nil && *before > h.baseline {
			return nil, h.breach("the commit phase wrote before its conditional write won")
		}
		if err != nil {
			return nil, err
		}
		if !(tag.Insert() || tag.Update() || tag.Delete() || strings.HasPrefix(tag.String(), "MERGE")) {
			return nil, h.breach("a conditional write must be an INSERT, UPDATE, DELETE or MERGE; the database ran %q", tag.String())
		}
		res.Won = tag.RowsAffected() > 0
		if !res.Won && after != nil {
			// What a lost write itself counts is not a write after the
			// loss: an INSERT ... ON CONFLICT DO NOTHING that raced
			// another run's insert inserted speculatively and took it
			// back, which the statistics count as a row inserted and one
			// deleted. Whatever it did is rolled back with the lost
			// transaction; only what comes after it is the plugin's
			// breach.
			h.baseline = *after
		}
		h.wroteIf = true
		h.won = h.won || res.Won
		return res, nil
	case usherv1.Mode_MODE_EXEC:
		if h.cap == capCommit && !h.won {
			return nil, status.Errorf(codes.PermissionDenied,
				"%s job %s: a plain write in the commit phase needs a conditional write that won first", h.job.GetKind(), h.job.GetId())
		}
		return hs.runPlugin(ctx, h, h.tx, st)
	default:
		return nil, status.Errorf(codes.InvalidArgument, "unknown statement mode %v", st.GetMode())
	}
}

func (hs *Handles) runPlugin(ctx context.Context, h *handle, tx txConn, st *usherv1.Statement) (*usherv1.StatementResult, error) {
	res, _, err := hs.run(ctx, h, tx, st, nil, nil)
	return res, err
}

// notable reports whether a write answered with tag may be prepared (and
// then run without a gate check after it): a SELECT, INSERT, UPDATE,
// DELETE or MERGE, none of which can end a transaction. Anything else a
// write may be (CALL, DO, SET, PREPARE, DECLARE, COPY ...) always runs by
// its text, with the check after it.
func notable(tag pgconn.CommandTag) bool {
	return tag.Select() || tag.Insert() || tag.Update() || tag.Delete() || strings.HasPrefix(tag.String(), "MERGE ")
}

// transactionControl are the command tags of statements that end or carve
// up the host's transaction: a plugin may send none of them.
var transactionControl = map[string]bool{"BEGIN": true, "START TRANSACTION": true, "COMMIT": true, "ROLLBACK": true,
	"SAVEPOINT": true, "RELEASE": true, "PREPARE TRANSACTION": true, "COMMIT PREPARED": true, "ROLLBACK PREPARED": true}

// controlsTransaction reports whether a statement answered with tag ended
// or carved up its transaction (a ROLLBACK's tag may carry more words).
func controlsTransaction(tag pgconn.CommandTag) bool {
	return transactionControl[tag.String()] || strings.HasPrefix(tag.String(), "ROLLBACK")
}

// refusedCommands are the first words of the command tags of statements a
// plugin may not run in a job: they change roles (ALTER ROLE ... PASSWORD
// would give it a login of its own), privileges, the schema or comments.
// A job reads and writes rows. The database itself refuses most of them
// to a plugin's role; what it allows any role (its own password and
// settings, objects in pg_temp, grants on what it owns) is refused here,
// by the tag the database answered with, and the job's transaction is
// rolled back with it. The same change made from a DO block or a function
// is refused at commit by the gate (usher_gate_close counts what the
// transaction wrote to the catalogs of roles, settings and large objects).
var refusedCommands = map[string]bool{"ALTER": true, "CREATE": true, "DROP": true, "GRANT": true, "REVOKE": true,
	"COMMENT": true, "SECURITY": true, "REASSIGN": true, "IMPORT": true, "REFRESH": true}

// refusedCommand reports whether a statement answered with tag is one of
// refusedCommands.
func refusedCommand(tag pgconn.CommandTag) bool {
	word, _, _ := strings.Cut(tag.String(), " ")
	return refusedCommands[word]
}

// run runs one plugin statement in tx, then checks with the connection that
// tx is still the transaction the host opened. When before is set, the
// rows tx wrote so far (rowWrites) are read into it first, in the same
// round trip.
func (hs *Handles) run(ctx context.Context, h *handle, tx txConn, st *usherv1.Statement, before, after *int64) (*usherv1.StatementResult, pgconn.CommandTag, error) {
	if tx.Conn().PgConn().TxStatus() == 'I' {
		// Another handle's statement on a shared transaction ended it.
		return nil, pgconn.CommandTag{}, h.breach("the host's transaction had ended before this statement; it is not run")
	}
	var res *usherv1.StatementResult
	var tag pgconn.CommandTag
	var err error
	if before == nil {
		res, tag, err = runStatement(ctx, tx, st)
	} else {
		res, tag, err = runCounted(ctx, tx.Conn(), st, before, after)
	}
	h.noteFailed(tx, err)
	switch ts := tx.Conn().PgConn().TxStatus(); {
	case ts != 'T' && ts != 'E':
		return nil, tag, h.breach("a statement ended the host's transaction (the connection reports status %q, not inside a transaction); the job is aborted", string(ts))
	case err == nil && controlsTransaction(tag):
		return nil, tag, h.breach("a statement controlled the host's transaction (%s)", tag.String())
	case err == nil && refusedCommand(tag):
		return nil, tag, h.breach("a plugin may not run %s in a job (it changes roles, privileges or the schema); rolled back", tag.String())
	}
	return res, tag, err
}

type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func runStatement(ctx context.Context, q queryer, st *usherv1.Statement) (*usherv1.StatementResult, pgconn.CommandTag, error) {
	return collect(q.Query(ctx, st.GetSql(), contract.FromValues(st.GetArgs())...))
}

// runCounted runs st after the query of the rows its transaction wrote so
// far (rowWrites), in one round trip, and reads that count into written;
// with after, the count once st ran too, in the same round trip.
func runCounted(ctx context.Context, conn *pgx.Conn, st *usherv1.Statement, written, after *int64) (*usherv1.StatementResult, pgconn.CommandTag, error) {
	b := &pgx.Batch{}
	b.Queue(rowWritesSQL)
	b.Queue(st.GetSql(), contract.FromValues(st.GetArgs())...)
	if after != nil {
		b.Queue(rowWritesSQL)
	}
	br := conn.SendBatch(ctx, b)
	if err := br.QueryRow().Scan(written); err != nil {
		_ = br.Close()
		return nil, pgconn.CommandTag{}, sqlStatus(err)
	}
	res, tag, err := collect(br.Query())
	if err == nil && after != nil {
		if err = br.QueryRow().Scan(after); err != nil {
			res, err = nil, sqlStatus(err)
		}
	}
	if cerr := br.Close(); err == nil && cerr != nil {
		res, err = nil, sqlStatus(cerr)
	}
	return res, tag, err
}

// collect reads a statement's rows into its result.
func collect(rows pgx.Rows, err error) (*usherv1.StatementResult, pgconn.CommandTag, error) {
	if err != nil {
		return nil, pgconn.CommandTag{}, sqlStatus(err)
	}
	defer rows.Close()
	res := &usherv1.StatementResult{}
	for _, fd := range rows.FieldDescriptions() {
		res.Columns = append(res.Columns, fd.Name)
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, pgconn.CommandTag{}, sqlStatus(err)
		}
		wv, err := contract.ToValues(vals)
		if err != nil {
			return nil, pgconn.CommandTag{}, status.Errorf(codes.InvalidArgument, "result: %v", err)
		}
		res.Rows = append(res.Rows, &usherv1.Row{Values: wv})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, rows.CommandTag(), sqlStatus(err)
	}
	res.RowsAffected = rows.CommandTag().RowsAffected()
	return res, rows.CommandTag(), nil
}

// sqlStatus maps a database error onto a gRPC status whose code tells the
// plugin whether retrying could help.
func sqlStatus(err error) error {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		msg := fmt.Sprintf("%s (SQLSTATE %s)", pg.Message, pg.Code)
		switch {
		case pg.Code == "42501": // insufficient privilege: the plugin's role
			return &pgStatusError{st: status.New(codes.PermissionDenied, msg), pg: pg}
		case pg.Code == "25006": // read-only transaction
			return status.Error(codes.PermissionDenied, msg)
		case strings.HasPrefix(pg.Code, "42"), strings.HasPrefix(pg.Code, "22"), strings.HasPrefix(pg.Code, "23"):
			// syntax, undefined object, data exception, constraint
			return status.Error(codes.InvalidArgument, msg)
		case pg.Code == "57014": // statement timeout, or cancelled at the job's deadline
			return status.Error(codes.DeadlineExceeded, msg)
		default:
			return status.Error(codes.Aborted, msg)
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}

// pgStatusError is a gRPC status that keeps the database error it came
// from, so the host can still tell what the database refused.
type pgStatusError struct {
	st *status.Status
	pg *pgconn.PgError
}

func (e *pgStatusError) Error() string              { return e.st.Err().Error() }
func (e *pgStatusError) GRPCStatus() *status.Status { return e.st }
func (e *pgStatusError) Unwrap() error              { return e.pg }

// Enqueue adds follow-on jobs in the handle's transaction, through the
// runtime's usher_enqueue: the plugin's role inserts no outbox row itself,
// and the function refuses a kind the role may not enqueue.
func (hs *Handles) Enqueue(ctx context.Context, req *usherv1.EnqueueRequest) (*usherv1.EnqueueResponse, error) {
	h, err := hs.lookup(req.GetHandle())
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.usable(); err != nil {
		return nil, err
	}
	switch {
	case h.cap == capCommit && !h.won:
		return nil, status.Errorf(codes.PermissionDenied,
			"%s job %s: follow-on jobs can only be enqueued after a conditional write won", h.job.GetKind(), h.job.GetId())
	case h.cap != capCommit && h.cap != capApply:
		return nil, status.Errorf(codes.PermissionDenied, "enqueue is not allowed in a %s phase", h.cap)
	}
	ctx, cancel := hs.bound(ctx, h)
	defer cancel()
	if err := h.opened(ctx); err != nil {
		return nil, err
	}
	// The handles of a batch share its transaction's connection.
	if h.txMu != nil {
		h.txMu.Lock()
		defer h.txMu.Unlock()
	}
	out := &usherv1.EnqueueResponse{}
	for _, m := range req.GetMessages() {
		if m.GetKind() == "" || !json.Valid(m.GetPayload()) {
			return nil, status.Errorf(codes.InvalidArgument, "enqueue: a message needs a kind and a JSON payload")
		}
		var id int64
		// The enqueuing job is the follow-on's parent in its workflow.
		err := h.tx.QueryRow(ctx, "SELECT "+hs.fn("usher_enqueue")+"($1, $2, $3, $4, $5, $6)",
			h.job.GetKind(), m.GetKind(), string(m.GetPayload()), h.job.GetRequestId(), h.job.GetTrace(), h.job.GetId()).Scan(&id)
		if err != nil {
			err = h.noteDenied(sqlStatus(err))
			h.noteFailed(h.tx, err)
			return nil, err
		}
		out.OutboxIds = append(out.OutboxIds, id)
	}
	return out, nil
}

// Log writes a plugin's records into the host's log with the job's identity,
// request_id and trace.
func (hs *Handles) Log(ctx context.Context, req *usherv1.LogRequest) (*usherv1.LogResponse, error) {
	for _, r := range req.GetRecords() {
		attrs := []any{"job_id", r.GetJobId(), "request_id", r.GetRequestId(), "trace", r.GetTrace(), "source", "plugin"}
		for k, v := range r.GetAttrs() {
			attrs = append(attrs, k, v)
		}
		for k, v := range r.GetValues() {
			attrs = append(attrs, k, contract.FromValue(v))
		}
		hs.logger.Log(ctx, slog.Level(r.GetLevel()), r.GetMessage(), attrs...)
	}
	return &usherv1.LogResponse{}, nil
}
