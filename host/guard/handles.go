package guard

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/usherhq/usher/host/outbox"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
	"github.com/usherhq/usher/sdk/wire"
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
	// role is the plugin's Postgres role ("" for the host's own): tx is
	// already switched to it, and a read-only batch switches to it.
	role string

	// mu serialises statements on tx: a pgx connection is not safe for
	// concurrent use, and a plugin may call back from several goroutines.
	mu      sync.Mutex
	tx      pgx.Tx
	wroteIf bool
	won     bool
	closed  bool
	// denied is the first statement the plugin's role was refused
	// (SQLSTATE 42501): the job fails permanently with it, whatever the
	// plugin answers.
	denied error
}

// Handles issues handles and serves the plugins' callbacks against them. It
// is the host side of the capability rules: a plugin that skips the SDK and
// calls the service directly meets the same refusals.
type Handles struct {
	usherv1.UnimplementedHostServer

	pool   *pgxpool.Pool
	logger *slog.Logger
	// statementTimeout bounds each statement of a read-only batch. Default
	// 10s; a Runner sets its own.
	statementTimeout time.Duration

	mu sync.Mutex
	m  map[string]*handle
}

// NewHandles returns an empty handle table over pool.
func NewHandles(pool *pgxpool.Pool, logger *slog.Logger) *Handles {
	if logger == nil {
		logger = slog.Default()
	}
	return &Handles{pool: pool, logger: logger, statementTimeout: 10 * time.Second, m: map[string]*handle{}}
}

var _ usherv1.HostServer = (*Handles)(nil)

func (hs *Handles) issue(c capability, job *usherv1.Job, tx pgx.Tx, role string) *handle {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := &handle{id: hex.EncodeToString(b[:]), cap: c, job: job, tx: tx, role: role}
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

// Exec runs a batch of statements under a handle.
func (hs *Handles) Exec(ctx context.Context, req *usherv1.ExecRequest) (*usherv1.ExecResponse, error) {
	h, err := hs.lookup(req.GetHandle())
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, status.Error(codes.PermissionDenied, "the phase of this handle has ended")
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

// noteDenied records the first statement the database refused to the
// plugin's role. The capability refusals of this file are not recorded:
// they are answered to the plugin, which fails its phase with them.
func (h *handle) noteDenied(err error) error {
	if err == nil || h.denied != nil || h.role == "" {
		return err
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42501" {
		h.denied = fmt.Errorf("role %s was refused: %s (SQLSTATE %s)", h.role, pg.Message, pg.Code)
	}
	return err
}

func (hs *Handles) execReadOnly(ctx context.Context, h *handle, stmts []*usherv1.Statement) (*usherv1.ExecResponse, error) {
	for _, st := range stmts {
		if st.GetMode() != usherv1.Mode_MODE_QUERY {
			return nil, status.Errorf(codes.PermissionDenied,
				"%s job %s: only queries are allowed in a read-only phase; writes belong to the commit phase or to the host's mark", h.job.GetKind(), h.job.GetId())
		}
	}
	tx, err := hs.pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "begin read-only transaction: %v", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := setLocal(ctx, tx, hs.statementTimeout, h.role); err != nil {
		return nil, status.Errorf(codes.Unavailable, "read-only transaction: %v", err)
	}
	out := &usherv1.ExecResponse{}
	for i, st := range stmts {
		res, err := runStatement(ctx, tx, st, false)
		if err != nil {
			return nil, fmt.Errorf("statement %d: %w", i+1, err)
		}
		out.Results = append(out.Results, res)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, status.Errorf(codes.Unavailable, "commit read-only transaction: %v", err)
	}
	return out, nil
}

func (hs *Handles) execInTx(ctx context.Context, h *handle, st *usherv1.Statement) (*usherv1.StatementResult, error) {
	switch st.GetMode() {
	case usherv1.Mode_MODE_QUERY:
		return runStatement(ctx, h.tx, st, false)
	case usherv1.Mode_MODE_WRITE_IF:
		if err := checkConditionalWrite(st.GetSql()); err != nil {
			return nil, err
		}
		res, err := runStatement(ctx, h.tx, st, true)
		if err != nil {
			return nil, err
		}
		h.wroteIf = true
		h.won = h.won || res.Won
		return res, nil
	case usherv1.Mode_MODE_EXEC:
		if h.cap == capCommit && !h.won {
			return nil, status.Errorf(codes.PermissionDenied,
				"%s job %s: a plain write in the commit phase needs a conditional write that won first", h.job.GetKind(), h.job.GetId())
		}
		return runStatement(ctx, h.tx, st, false)
	default:
		return nil, status.Errorf(codes.InvalidArgument, "unknown statement mode %v", st.GetMode())
	}
}

var (
	leadingComments = regexp.MustCompile(`^(\s+|--[^\n]*\n|/\*.*?\*/)+`)
	returningClause = regexp.MustCompile(`(?i)\bRETURNING\b`)
)

// checkConditionalWrite refuses a "conditional write" that cannot tell a
// winner from a loser: it must be a DML statement with RETURNING.
func checkConditionalWrite(sql string) error {
	s := leadingComments.ReplaceAllString(sql, "")
	word := strings.ToUpper(strings.SplitN(strings.TrimSpace(s), " ", 2)[0])
	switch word {
	case "UPDATE", "INSERT", "DELETE", "WITH":
	default:
		return status.Errorf(codes.InvalidArgument, "a conditional write must be UPDATE, INSERT or DELETE, not %q", word)
	}
	if !returningClause.MatchString(s) {
		return status.Error(codes.InvalidArgument, "a conditional write needs a RETURNING clause, so the host can tell whether it won")
	}
	return nil
}

type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

func runStatement(ctx context.Context, q queryer, st *usherv1.Statement, conditional bool) (*usherv1.StatementResult, error) {
	rows, err := q.Query(ctx, st.GetSql(), wire.FromValues(st.GetArgs())...)
	if err != nil {
		return nil, sqlStatus(err)
	}
	defer rows.Close()
	res := &usherv1.StatementResult{}
	for _, fd := range rows.FieldDescriptions() {
		res.Columns = append(res.Columns, fd.Name)
	}
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, sqlStatus(err)
		}
		wv, err := wire.ToValues(vals)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "result: %v", err)
		}
		res.Rows = append(res.Rows, &usherv1.Row{Values: wv})
	}
	if err := rows.Err(); err != nil {
		return nil, sqlStatus(err)
	}
	res.RowsAffected = rows.CommandTag().RowsAffected()
	res.Won = conditional && len(res.Rows) > 0
	return res, nil
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
		case pg.Code == "57014": // statement timeout
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

// Enqueue adds follow-on jobs in the handle's transaction.
func (hs *Handles) Enqueue(ctx context.Context, req *usherv1.EnqueueRequest) (*usherv1.EnqueueResponse, error) {
	h, err := hs.lookup(req.GetHandle())
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return nil, status.Error(codes.PermissionDenied, "the phase of this handle has ended")
	case h.cap == capCommit && !h.won:
		return nil, status.Errorf(codes.PermissionDenied,
			"%s job %s: follow-on jobs can only be enqueued after a conditional write won", h.job.GetKind(), h.job.GetId())
	case h.cap != capCommit && h.cap != capApply:
		return nil, status.Errorf(codes.PermissionDenied, "enqueue is not allowed in a %s phase", h.cap)
	}
	msgs := make([]outbox.Message, len(req.GetMessages()))
	for i, m := range req.GetMessages() {
		msgs[i] = outbox.Message{Kind: m.GetKind(), Payload: m.GetPayload(),
			RequestID: h.job.GetRequestId(), Trace: h.job.GetTrace()}
	}
	ids, err := hs.enqueueAsHost(ctx, h, msgs)
	if err != nil {
		return nil, err
	}
	return &usherv1.EnqueueResponse{OutboxIds: ids}, nil
}

// enqueueAsHost adds msgs to the outbox in h's transaction. The outbox is
// the host's table, never granted to a plugin's role: the insert runs as
// the host, and the transaction goes back to the plugin's role after it.
func (hs *Handles) enqueueAsHost(ctx context.Context, h *handle, msgs []outbox.Message) ([]int64, error) {
	if h.role == "" {
		ids, err := outbox.Add(ctx, h.tx, msgs...)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return ids, nil
	}
	if err := switchRole(ctx, h.tx, ""); err != nil {
		return nil, status.Errorf(codes.Unavailable, "enqueue: %v", err)
	}
	ids, err := outbox.Add(ctx, h.tx, msgs...)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := switchRole(ctx, h.tx, h.role); err != nil {
		return nil, status.Errorf(codes.Unavailable, "enqueue: %v", err)
	}
	return ids, nil
}

// setLocal bounds tx's statements by timeout and switches it to role (none
// when empty), both for this transaction only.
func setLocal(ctx context.Context, tx pgx.Tx, timeout time.Duration, role string) error {
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL statement_timeout = %d", timeout.Milliseconds())); err != nil {
		return fmt.Errorf("set statement_timeout: %w", err)
	}
	if role == "" {
		return nil
	}
	return switchRole(ctx, tx, role)
}

// switchRole runs tx's next statements as role, or as the host (the
// session's role) when role is empty. SET LOCAL: nothing outlives the
// transaction, so a pooled connection always goes back as the host.
func switchRole(ctx context.Context, tx pgx.Tx, role string) error {
	target := "NONE"
	if role != "" {
		target = pgx.Identifier{role}.Sanitize()
	}
	if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+target); err != nil {
		return fmt.Errorf("set role %s: %w", target, err)
	}
	return nil
}

// Log writes a plugin's records into the host's log with the job's identity,
// request_id and trace.
func (hs *Handles) Log(ctx context.Context, req *usherv1.LogRequest) (*usherv1.LogResponse, error) {
	for _, r := range req.GetRecords() {
		attrs := []any{"job_id", r.GetJobId(), "request_id", r.GetRequestId(), "trace", r.GetTrace(), "source", "plugin"}
		for k, v := range r.GetAttrs() {
			attrs = append(attrs, k, v)
		}
		hs.logger.Log(ctx, slog.Level(r.GetLevel()), r.GetMessage(), attrs...)
	}
	return &usherv1.LogResponse{}, nil
}
