// Command hostileplugin is a plugin written against the protobuf contract
// with no SDK, by an author who means harm. Each job's payload names the
// attack it makes ({"case": "..."}); it ignores every error the host
// answers and reports success, so whatever stops it is the host or the
// database, never its own good manners. TestHostilePlugin runs it.
//
// Kinds: hostile_apply (job id recorded: the attack runs in apply) and
// hostile_state (state first: the attack runs in check or commit).
// HOSTILE_KINDS (comma-separated) replaces the kinds it declares, and
// HOSTILE_NAME its name (so a test can give it a role of its own).
// HOSTILE_DSN is where it tries to log in to Postgres by itself (the
// "flood" and "own-password" attacks): the server, database and its own
// role, with no password.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/usherhq/usher/host/testdata/rawcontract"
	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

var (
	name    = "hostile"
	version = "6.6.6"
)

type server struct {
	usherv1.UnimplementedPluginServer
	broker *rawcontract.Broker
}

func (s *server) Manifest(context.Context, *usherv1.ManifestRequest) (*usherv1.ManifestResponse, error) {
	if n := os.Getenv("HOSTILE_NAME"); n != "" {
		name = n
	}
	kinds := []*usherv1.KindInfo{
		{Kind: "hostile_apply", Guard: usherv1.Guard_GUARD_JOB_ID},
		{Kind: "hostile_state", Guard: usherv1.Guard_GUARD_STATE_FIRST},
	}
	if ks := os.Getenv("HOSTILE_KINDS"); ks != "" {
		kinds = nil
		for _, k := range strings.Split(ks, ",") {
			kinds = append(kinds, &usherv1.KindInfo{Kind: k, Guard: usherv1.Guard_GUARD_JOB_ID})
		}
	}
	return &usherv1.ManifestResponse{Name: name, Version: version, ProtocolVersion: contract.ProtocolVersion, Kinds: kinds}, nil
}

func (s *server) Invoke(ctx context.Context, req *usherv1.InvokeRequest) (*usherv1.InvokeResponse, error) {
	if _, err := s.broker.Host(req.GetHostBrokerId()); err != nil {
		return nil, err
	}
	var out []*usherv1.Result
	for _, c := range req.GetCalls() {
		out = append(out, s.phase(c))
	}
	return &usherv1.InvokeResponse{Results: out}, nil
}

// exec sends statements and ignores what the host answers. It uses a
// context of its own with no deadline: the job's deadline must be the
// host's to keep.
func (s *server) exec(handle string, mode usherv1.Mode, sqls ...string) {
	for _, q := range sqls {
		_, _ = s.broker.Client().Exec(context.Background(), &usherv1.ExecRequest{Handle: handle,
			Statements: []*usherv1.Statement{{Mode: mode, Sql: q}}})
	}
}

const query, writeIf, plain = usherv1.Mode_MODE_QUERY, usherv1.Mode_MODE_WRITE_IF, usherv1.Mode_MODE_EXEC

// effect is the plugin's one honest write: a row per job in its own table.
func effect(job *usherv1.Job) string {
	return fmt.Sprintf("INSERT INTO hostile_effects (job_id) VALUES ('%s')", strings.ReplaceAll(job.GetId(), "'", "''"))
}

// dirty lists what an earlier job left on the connection; a clean
// connection answers an empty string.
const dirty = `SELECT concat_ws(', ',
	CASE WHEN current_setting('search_path') <> 'plugin_' || regexp_replace(session_user, '^usher_plugin_', '') || ', public' THEN 'search_path ' || current_setting('search_path') END,
	CASE WHEN current_setting('default_transaction_read_only') = 'on' THEN 'default_transaction_read_only' END,
	CASE WHEN current_setting('application_name') = 'hostile' THEN 'application_name' END,
	CASE WHEN current_user <> session_user THEN 'role ' || current_user END,
	CASE WHEN to_regclass('pg_temp.outbox') IS NOT NULL THEN 'temp table outbox' END,
	CASE WHEN EXISTS (SELECT 1 FROM pg_listening_channels()) THEN 'LISTEN' END,
	CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()) THEN 'advisory lock' END,
	CASE WHEN EXISTS (SELECT 1 FROM pg_prepared_statements WHERE from_sql) THEN 'prepared statement' END)`

// argWrite is the honest write with the job id as its argument: the same
// SQL for every job, which the host prepares on a connection once it has
// run there.
const argWrite = "INSERT INTO hostile_effects (job_id) VALUES ($1)"

// hijack prepares, on this session, argWrite's name (where the host
// prepares it: "usher_w_" and the first 16 bytes of its SHA-256 in hex) as
// the statement as, dropping what was there.
func hijack(as string) []string {
	sum := sha256.Sum256([]byte(argWrite))
	name := "usher_w_" + hex.EncodeToString(sum[:16])
	return []string{
		fmt.Sprintf(`DO $$ BEGIN IF EXISTS (SELECT 1 FROM pg_prepared_statements WHERE name = '%s') THEN EXECUTE 'DEALLOCATE %s'; END IF; END $$`, name, name),
		fmt.Sprintf("PREPARE %s (text) AS %s", name, as),
	}
}

func argWriteOf(job *usherv1.Job) *usherv1.Statement {
	v, _ := contract.ToValue(job.GetId())
	return &usherv1.Statement{Mode: plain, Sql: argWrite, Args: []*usherv1.Value{v}}
}

// enqueueAny enqueues a job of its own kind, as the host's own enqueue
// would, but from SQL and whenever it likes.
const enqueueAny = `SELECT usher_enqueue('hostile_apply', 'hostile_apply', '{"case": "clean"}', '', '')`

// poison is everything a session can keep after a call.
var poison = []string{
	"SET search_path = pg_temp, public",
	"SET default_transaction_read_only = on",
	"SET application_name = 'hostile'",
	// CREATE is refused by its tag: from a DO block, which may create in
	// pg_temp, a temporary table that would shadow the runtime's.
	"DO $$ BEGIN CREATE TEMP TABLE outbox (id bigint, kind text, payload jsonb, request_id text, trace text, job_id text, attempt int, enqueued_by name); END $$",
	"LISTEN hostile",
	"SELECT pg_try_advisory_lock(666)",
	"PREPARE hostile AS SELECT 1",
}

// attacks are statements that each try to leave the plugin's role, read or
// write what is not its own, or forge the host's bookkeeping.
var attacks = map[string][]string{
	"reset-role":      {"RESET ROLE", "INSERT INTO outbox (kind, payload) VALUES ('update_sales_counter', '{\"order_id\": 1}')"},
	"set-role-owner":  {"SET ROLE usher_test_owner", "DELETE FROM processed_jobs"},
	"session-auth":    {"SET SESSION AUTHORIZATION usher_test_owner", "DELETE FROM processed_jobs"},
	"set-config-role": {"SELECT set_config('role', 'usher_test_owner', false)", "DELETE FROM dead_letters"},
	"other-role":      {"SET ROLE usher_plugin_counters", "INSERT INTO counter_applies (job_id, order_id, plugin_version) VALUES ('forged', 1, 'hostile')"},
	"copy-program":    {"COPY (SELECT 1) TO PROGRAM 'touch /tmp/usher-hostile-was-here'"},
	"read-outbox":     {"SELECT * FROM outbox"},
	"other-table":     {"UPDATE events SET seats_sold = seats_sold + 1000"},
	"record-other":    {"SELECT usher_record_job('999999', 'update_sales_counter')"},
	"enqueue-other":   {"SELECT usher_enqueue('hostile_apply', 'update_sales_counter', '{\"order_id\": 1}', '', '')"},
	"write-history":   {"INSERT INTO job_history (job_id, kind, verdict, started_at) VALUES ('999999', 'hostile_apply', 'applied', now())"},
	"history-other":   {"SELECT usher_applied_logged(1, 'update_sales_counter', '1', 0, 1, '', '', '', '', '', '', now())"},
	// The batch forms check what the single ones do, row for row.
	"record-others": {"SELECT usher_record_jobs(ARRAY['999999'], ARRAY['update_sales_counter'])"},
	"record-mixed":  {"SELECT usher_record_jobs(ARRAY['999998', '999999'], ARRAY['hostile_apply', 'update_sales_counter'])"},
	"history-batch-other": {"SELECT usher_applied_batch(ARRAY[1], ARRAY['update_sales_counter'], ARRAY['1'], ARRAY[0], ARRAY[1], " +
		"ARRAY[''], ARRAY[''], '', '', '', '', ARRAY[now()])"},
	"history-batch-row": {"SELECT usher_applied_batch(ARRAY[1], ARRAY['hostile_apply'], ARRAY['1'], ARRAY[0], ARRAY[1], " +
		"ARRAY[''], ARRAY[''], '', '', '', '', ARRAY[now()])"},
	"pin-kind":     {"INSERT INTO plugin_kinds (kind, plugin, db_role) VALUES ('stolen', 'hostile', 'usher_plugin_hostile')"},
	"alter-role":   {"ALTER ROLE usher_plugin_hostile SUPERUSER"},
	"create-table": {"CREATE TABLE public.processed_jobs_shadow (job_id text)"},
	// An error it ignores: its transaction is lost with it.
	"swallow-error": {"SELECT 1/0"},
	// A login of its own: any role may change its own password and
	// settings, by the statement or from a DO block; and large objects
	// persist outside any schema.
	"alter-password":    {"ALTER ROLE CURRENT_USER PASSWORD 'hostile'"},
	"alter-password-do": {"DO $$ BEGIN EXECUTE format('ALTER ROLE %I PASSWORD %L', current_user, 'hostile'); END $$"},
	"role-setting":      {"ALTER ROLE CURRENT_USER SET statement_timeout = 0"},
	"role-setting-do":   {"DO $$ BEGIN EXECUTE format('ALTER ROLE %I SET search_path = pg_temp', current_user); END $$"},
	"large-object":      {"SELECT lo_from_bytea(0, 'hostile')"},
	"grant":             {"GRANT SELECT ON hostile_effects TO PUBLIC"},
}

type args struct {
	Case string `json:"case"`
}

func (s *server) phase(c *usherv1.Call) *usherv1.Result {
	ok := &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK}
	var a args
	_ = json.Unmarshal(c.GetJob().GetPayload(), &a)
	h := c.GetHandle()
	job := c.GetJob()
	switch c.GetPhase() {
	case usherv1.Phase_PHASE_APPLY:
		// Whatever came before, the connection must be clean now.
		if left := s.query(h, dirty); left != "" {
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT, Error: "poisoned: " + left}
		}
		switch a.Case {
		case "clean":
		case "poison":
			s.exec(h, plain, poison...)
		case "commit", "commit-chain":
			// Write, enqueue, then end the host's transaction to keep
			// them, and write outside it.
			end := "COMMIT"
			if a.Case == "commit-chain" {
				end = "COMMIT AND CHAIN"
			}
			s.exec(h, plain, effect(job), enqueueAny, end, effect(job)+"-- after commit")
			return ok
		case "commit-one-call":
			// The same, in one Exec: the host must check the
			// transaction after each statement of a call, not once
			// per call, or the last write commits on its own.
			_, _ = s.broker.Client().Exec(context.Background(), &usherv1.ExecRequest{Handle: h, Statements: []*usherv1.Statement{
				{Mode: plain, Sql: effect(job)}, {Mode: plain, Sql: "COMMIT"}, {Mode: plain, Sql: effect(job) + "-- after commit"}}})
			return ok
		case "returned-commit":
			// Writes returned with the answer run under the same
			// checks as those sent through Exec.
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{
				{Mode: plain, Sql: effect(job)}, {Mode: plain, Sql: "COMMIT"}, {Mode: plain, Sql: effect(job) + "-- after commit"}}}
		case "returned-rollback", "returned-abort", "returned-rollback-commit":
			// In one round trip the writes after a ROLLBACK would run
			// in a transaction of their own, and a COMMIT after them
			// would keep them: the host's check after each write
			// stops them.
			end := "ROLLBACK"
			if a.Case == "returned-abort" {
				end = "ABORT"
			}
			ws := []*usherv1.Statement{{Mode: plain, Sql: effect(job)}, {Mode: plain, Sql: end}, {Mode: plain, Sql: effect(job) + "-- after rollback"}}
			if a.Case == "returned-rollback-commit" {
				ws = append(ws, &usherv1.Statement{Mode: plain, Sql: "COMMIT"})
			}
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: ws}
		case "returned-args":
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{argWriteOf(job)}}
		case "hijack-write":
			// The host's name for argWrite now runs other SQL of the
			// plugin's: its own effect, marked.
			s.exec(h, plain, hijack("INSERT INTO hostile_effects (job_id) VALUES ($1 || '-hijacked')")...)
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{argWriteOf(job)}}
		case "hijack-commit":
			// The host sends a prepared write with no gate check after
			// it: a name taken over with SQL PREPARE cannot hold
			// transaction control (the server refuses the PREPARE).
			s.exec(h, plain, hijack("COMMIT")...)
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{argWriteOf(job)}}
		case "hijack-gate":
			// A hijacked name between a ROLLBACK and a COMMIT: the
			// host's checks are not prepared statements.
			s.exec(h, plain, hijack("SELECT $1")...)
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{
				argWriteOf(job), {Mode: plain, Sql: "ROLLBACK"}, argWriteOf(job), {Mode: plain, Sql: "COMMIT"}}}
		case "huge-answer":
			// A write of 17 MiB: the answer is over the host's message
			// cap (contract.MaxMessageBytes), whatever the batch.
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{
				{Mode: plain, Sql: effect(job) + " -- " + strings.Repeat("x", 17<<20)}}}
		case "returned-savepoint":
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{
				{Mode: plain, Sql: "SAVEPOINT hostile"}, {Mode: plain, Sql: effect(job)}}}
		case "returned-query":
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{
				{Mode: query, Sql: effect(job) + " RETURNING job_id"}}}
		case "holdable-cursor":
			// A query that would run at COMMIT, after the host's checks.
			s.exec(h, query, "DECLARE h CURSOR WITH HOLD FOR "+enqueueAny)
		case "savepoint":
			s.exec(h, plain, "SAVEPOINT hostile", "ROLLBACK TO SAVEPOINT hostile")
		case "secrets":
			// Whatever of the host's secrets it can see, it reports.
			if found := secrets(); found != "" {
				return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT, Error: "found the host's secrets: " + found}
			}
		case "siblings":
			// Another plugin's process, and its host's, through the OS.
			if r := remember(job.GetId(), func() *usherv1.Result {
				done, err := siblings()
				switch {
				case err != nil:
					return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT, Error: "siblings: " + err.Error()}
				case done != "":
					return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT, Error: "siblings: " + done}
				}
				return nil
			}); r != nil {
				return r
			}
		case "rewrite-redis":
			// Another plugin's jobs, through Redis, with the host's secrets.
			if r := remember(job.GetId(), func() *usherv1.Result {
				if done := rewrite(); len(done) > 0 {
					return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT, Error: "rewrite: " + strings.Join(done, ", ")}
				}
				return nil
			}); r != nil {
				return r
			}
		case "stall":
			s.exec(h, plain, "SET LOCAL statement_timeout = 0", "SELECT pg_sleep(600)")
		case "flood":
			// As many sessions of its own as the server gives it, held
			// through the job; how many it got is its effect.
			conns := flood(50)
			// Long enough for the test to see them.
			time.Sleep(2 * time.Second)
			defer func() {
				for _, c := range conns {
					_ = c.Close(context.Background())
				}
			}()
			s.exec(h, plain, fmt.Sprintf("INSERT INTO hostile_effects (job_id, n) VALUES ('%s', %d)", job.GetId(), len(conns)))
			return ok
		case "own-password", "own-password-do":
			// Its own password, then a login with it: outside any host
			// transaction it would hold a row lock of the application's
			// for as long as it likes.
			set := attacks["alter-password"]
			if a.Case == "own-password-do" {
				set = attacks["alter-password-do"]
			}
			s.exec(h, plain, set...)
			go s.loginAndLock("hostile")
		default:
			s.exec(h, plain, attacks[a.Case]...)
		}
		s.exec(h, plain, effect(job))
		return ok
	case usherv1.Phase_PHASE_CHECK:
		if a.Case == "readonly-commit" {
			// One statement a batch, sent with the host's write check,
			// ROLLBACK and reset after it: end the transaction with it
			// (refused), then try to write (the broken handle refuses
			// it before it reaches the database).
			s.exec(h, query, "COMMIT")
			s.exec(h, query, effect(job))
		}
		if a.Case == "readonly-write" {
			// One batch, one transaction: lift READ ONLY, then write.
			_, _ = s.broker.Client().Exec(context.Background(), &usherv1.ExecRequest{Handle: h, Statements: []*usherv1.Statement{
				{Mode: query, Sql: "SET TRANSACTION READ WRITE"}, {Mode: query, Sql: effect(job)}}})
		}
		return ok
	case usherv1.Phase_PHASE_PREPARE:
		return ok
	case usherv1.Phase_PHASE_COMMIT:
		switch a.Case {
		case "write-before-win":
			s.exec(h, query, effect(job))
			s.exec(h, writeIf, "UPDATE hostile_effects SET n = n + 1 WHERE job_id = 'none' RETURNING job_id")
		case "fake-returning":
			s.exec(h, writeIf, "SELECT 1 -- RETURNING")
			_, _ = s.broker.Client().Enqueue(context.Background(), &usherv1.EnqueueRequest{Handle: h,
				Messages: []*usherv1.OutboxMessage{{Kind: "hostile_apply", Payload: []byte(`{"case":"clean"}`)}}})
		case "holdable-cursor":
			// Lose the conditional write, but leave a query to run at
			// COMMIT that enqueues a job (allowed only after a win).
			s.exec(h, query, "DECLARE h CURSOR WITH HOLD FOR "+enqueueAny)
			s.exec(h, writeIf, "UPDATE hostile_effects SET n = n + 1 WHERE job_id = 'none' RETURNING job_id")
		case "returned-writes":
			// Only an apply phase may return writes.
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Writes: []*usherv1.Statement{{Mode: plain, Sql: effect(job)}}}
		case "write-after-loss":
			s.exec(h, writeIf, "UPDATE hostile_effects SET n = n + 1 WHERE job_id = 'none' RETURNING job_id")
			s.exec(h, query, effect(job))
		default:
			s.exec(h, writeIf, effect(job)+" RETURNING job_id")
		}
		return ok
	}
	return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT, Error: fmt.Sprintf("unexpected phase %v", c.GetPhase())}
}

// secrets lists the host's configuration it finds in its environment and
// the files named in HOSTILE_SECRET_FILES it can read.
func secrets() string {
	var found []string
	for _, kv := range os.Environ() {
		name, val, _ := strings.Cut(kv, "=")
		if name == "DATABASE_URL" || name == "REDIS_URL" || name == "PGPASSFILE" || strings.HasPrefix(name, "USHER_ADMIN") ||
			strings.Contains(val, "postgres://") || strings.Contains(val, "redis://") {
			found = append(found, "env "+name)
		}
	}
	for _, f := range strings.Split(os.Getenv("HOSTILE_SECRET_FILES"), ":") {
		if f == "" {
			continue
		}
		if _, err := os.ReadFile(f); err == nil {
			found = append(found, "file "+f)
		}
	}
	return strings.Join(found, ", ")
}

// flood opens up to n sessions of its own at HOSTILE_DSN.
func flood(n int) []*pgx.Conn {
	var conns []*pgx.Conn
	for range n {
		c, err := pgx.Connect(context.Background(), os.Getenv("HOSTILE_DSN"))
		if err != nil {
			continue
		}
		conns = append(conns, c)
	}
	return conns
}

// loginAndLock tries for 5s to log in at HOSTILE_DSN with password; once
// in, it records that it got in (a row 'direct-login' in hostile_effects)
// and holds a row lock on event 1 for a minute. It says how it went in the
// host's log: "hostile: direct login", or "hostile: no direct login".
func (s *server) loginAndLock(password string) {
	say := func(msg string) {
		_, _ = s.broker.Client().Log(context.Background(), &usherv1.LogRequest{Records: []*usherv1.LogRecord{{Level: 4, Message: msg}}})
	}
	var err error
	for range 10 {
		time.Sleep(500 * time.Millisecond)
		var cfg *pgx.ConnConfig
		if cfg, err = pgx.ParseConfig(os.Getenv("HOSTILE_DSN")); err != nil {
			break
		}
		cfg.Password = password
		cfg.RuntimeParams["application_name"] = "hostile-direct"
		var c *pgx.Conn
		if c, err = pgx.ConnectConfig(context.Background(), cfg); err != nil {
			continue
		}
		ctx := context.Background()
		_, _ = c.Exec(ctx, "INSERT INTO hostile_effects (job_id) VALUES ('direct-login')")
		tx, err := c.Begin(ctx)
		if err == nil {
			_, _ = tx.Exec(ctx, "SET LOCAL statement_timeout = 0")
			_, err = tx.Exec(ctx, "SELECT 1 FROM events WHERE id = 1 FOR UPDATE")
		}
		say(fmt.Sprintf("hostile: direct login (lock: %v)", err))
		time.Sleep(time.Minute)
		_ = c.Close(ctx)
		return
	}
	say(fmt.Sprintf("hostile: no direct login: %v", err))
}

// query returns the first column of the first row, or the error's text.
func (s *server) query(handle, sql string) string {
	res, err := s.broker.Client().Exec(context.Background(), &usherv1.ExecRequest{Handle: handle,
		Statements: []*usherv1.Statement{{Mode: query, Sql: sql}}})
	if err != nil {
		return "query failed: " + err.Error()
	}
	return res.GetResults()[0].GetRows()[0].GetValues()[0].GetText()
}

func main() {
	rawcontract.Serve(func(b *rawcontract.Broker) usherv1.PluginServer { return &server{broker: b} })
}
