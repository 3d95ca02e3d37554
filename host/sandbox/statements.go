package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Prepared writes.
//
// The writes a plugin returns with its answer run on its own connections,
// and without help the server parses and plans each one every time it runs
// (an unnamed statement): under cmd/bench the planning of the counters
// plugin's one UPDATE cost more server time than running it. So a
// connection keeps the writes it has run before as prepared statements, up
// to MaxPreparedWrites of them, prepared by the host while the connection
// is idle in its pool (never inside a job's transaction, where a statement
// that does not parse would abort it): a write's SQL that ran unnamed once
// (NoteWrite) is prepared when the connection goes back to its pool, and
// from then on runs by name (WriteName).
//
// What a plugin can do to them gains it nothing. Its SQL can DEALLOCATE
// them or PREPARE a statement under one of their names, so a named write
// may run SQL the plugin chose: it could have returned that SQL itself,
// and it runs the same way, as the plugin's role, in the same place, with
// the host's commit-gate check after it. The host's own statements (the
// gate, the records, the outcomes) are never prepared: a prepared
// statement is found by its name, and a host statement is sent by its
// text, which is never a name made here. A plugin's own statements must
// not outlive its call, nor the host's be changed behind its back: at every
// reset (StatementsCheck) the session must hold exactly the statements the
// host prepared and none from SQL PREPARE, or the pool deallocates them all
// (and forgets them) before the connection is used again.
//
// What a connection keeps is bounded, since it outlives the call: at most
// MaxPreparedWrites statements of at most MaxPreparedWriteBytes of SQL
// each (a plan of a long statement can hold many times its size in server
// memory); a longer write always runs unnamed.

// MaxPreparedWrites bounds the writes one connection keeps prepared (a
// plugin that returns distinct SQL every time holds no more than this).
const MaxPreparedWrites = 64

// MaxPreparedWriteBytes bounds the SQL of a write that is prepared.
const MaxPreparedWriteBytes = 8 << 10

// writes is what the host prepared on one connection.
type writes struct {
	mu sync.Mutex
	// names maps a write's SQL to the name it is prepared under.
	names map[string]string
	// noted holds SQL that ran unnamed and parsed, to prepare when the
	// connection is next idle.
	noted map[string]bool
	// spoiled: a batch that ran named writes failed; they are all
	// deallocated before the connection is used again.
	spoiled bool
}

var prepared sync.Map // *pgx.Conn → *writes

func writesOf(conn *pgx.Conn) *writes {
	if w, ok := prepared.Load(conn); ok {
		return w.(*writes)
	}
	w, _ := prepared.LoadOrStore(conn, &writes{names: map[string]string{}, noted: map[string]bool{}})
	return w.(*writes)
}

// WriteName is the name sql is prepared under on conn, which pgx runs as
// that prepared statement when it is queued in its place; ok is false when
// it is not prepared there.
func WriteName(conn *pgx.Conn, sql string) (name string, ok bool) {
	w := writesOf(conn)
	w.mu.Lock()
	defer w.mu.Unlock()
	name, ok = w.names[sql]
	return name, ok
}

// NoteWrite records that sql ran unnamed on conn as a write answered with
// the tag of a SELECT, INSERT, UPDATE, DELETE or MERGE (the host runs a
// prepared write without a gate check after it, see guard's writeAll): it
// is prepared when conn is next idle in its pool, if there is room.
func NoteWrite(conn *pgx.Conn, sql string) {
	w := writesOf(conn)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(sql) > MaxPreparedWriteBytes {
		return
	}
	if _, ok := w.names[sql]; !ok && len(w.names)+len(w.noted) < MaxPreparedWrites {
		w.noted[sql] = true
	}
}

// SpoilWrites deallocates conn's prepared writes before it is used again:
// a batch that ran them failed, and one of them may be why (a write with
// RETURNING whose table changed, say).
func SpoilWrites(conn *pgx.Conn) {
	w := writesOf(conn)
	w.mu.Lock()
	w.spoiled = true
	w.mu.Unlock()
}

// StatementsCheck is the last statement of a reset: it fails unless conn's
// session holds exactly the statements the host prepared there, none made
// with SQL PREPARE, and none of them spoiled. schema is the runtime's: the
// check is its function usher_statements_check, whose plan the session
// keeps (as a statement of its own it was planned at every reset, ten
// times longer than it ran).
func StatementsCheck(conn *pgx.Conn, schema string) string {
	w := writesOf(conn)
	w.mu.Lock()
	n := len(w.names)
	if w.spoiled {
		n = -1
	}
	w.mu.Unlock()
	return fmt.Sprintf("SELECT %s(%d)", pgx.Identifier{schema, "usher_statements_check"}.Sanitize(), n)
}

// forgetWrites deallocates every prepared statement of conn's session
// and forgets them, on the server and in pgx.
func forgetWrites(ctx context.Context, conn *pgx.Conn) error {
	w := writesOf(conn)
	w.mu.Lock()
	w.names, w.noted, w.spoiled = map[string]string{}, map[string]bool{}, false
	w.mu.Unlock()
	return conn.DeallocateAll(ctx)
}

// prepareNoted prepares the writes noted on conn, which is idle. A write
// the server refuses to prepare (its table gone since, say) is dropped: it
// runs unnamed, and is noted again if it runs. Any other failure (the
// time ran out and the connection was closed, say) is returned: the
// connection is not fit to go back to its pool. The writes are prepared
// inside a READ ONLY transaction, rolled back (a prepared statement
// outlives it): parsing can run the plugin's code (a domain's check on a
// cast the server folds), and outside a job's transaction nothing of it
// may be written.
func prepareNoted(ctx context.Context, conn *pgx.Conn) error {
	w := writesOf(conn)
	w.mu.Lock()
	noted := w.noted
	w.noted = map[string]bool{}
	w.mu.Unlock()
	if len(noted) == 0 {
		return nil
	}
	pc := conn.PgConn()
	begin := func() error {
		if err := pc.Exec(ctx, "BEGIN READ ONLY").Close(); err != nil {
			return fmt.Errorf("prepare a write: %w", err)
		}
		return nil
	}
	if err := begin(); err != nil {
		return err
	}
	for sql := range noted {
		name := writeName(sql)
		if _, err := conn.Prepare(ctx, name, sql); err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || conn.IsClosed() || pc.TxStatus() == 'I' {
				return fmt.Errorf("prepare a write: %w", err)
			}
			// The failure aborted the transaction: a new one for the
			// writes left.
			if err := pc.Exec(ctx, "ROLLBACK").Close(); err != nil {
				return fmt.Errorf("prepare a write: %w", err)
			}
			if err := begin(); err != nil {
				return err
			}
			continue
		}
		w.mu.Lock()
		w.names[sql] = name
		w.mu.Unlock()
	}
	if err := pc.Exec(ctx, "ROLLBACK").Close(); err != nil || pc.TxStatus() != 'I' {
		return fmt.Errorf("prepare a write: end its transaction: %v", err)
	}
	return nil
}

// writeName is the name a write's SQL is prepared under: no host
// statement's text has this form.
func writeName(sql string) string {
	sum := sha256.Sum256([]byte(sql))
	return "usher_w_" + hex.EncodeToString(sum[:16])
}
