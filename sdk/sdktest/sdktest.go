package sdktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/hosttest"
	"github.com/usherhq/usher/host/plugindb"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/sandbox"
	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/internal/bridge"
)

// Case describes a handler to prove idempotent.
type Case[T sdk.Args] struct {
	// Plugin is the plugin's name. Its database role, usher_plugin_<name>,
	// is created (when missing) and its Migrations and Grants installed
	// before Schema and Start run, so Start may seed the plugin's own
	// tables and Schema may grant to its role. Without Plugin they are
	// installed after Start, under the name Start's plugin reports.
	Plugin string
	// Schema is extra SQL for the application's tables the handler uses,
	// run on every scenario's fresh database after usher's migrations, as
	// the database's owner. Optional.
	Schema string
	// Migrations are the plugin's own migrations, the directory its
	// manifest names (os.DirFS("db/migrations")): installed in its schema
	// plugin_<name> as a host installs them (host/plugindb), so the
	// handler names its tables unqualified. Optional.
	Migrations fs.FS
	// Grants are the plugin's grants on the application's tables, as its
	// manifest declares them (pluginhost.ReadGrants reads the file `host
	// plugins manifest --grants` takes). A column the handler uses and
	// the grants miss fails with "permission denied", as in production.
	Grants []pluginhost.Grant
	// Enqueues lists kinds of other plugins the handler enqueues, as its
	// manifest's "enqueues" would: the database refuses any other.
	Enqueues []string
	// Start prepares one scenario on its fresh database: seed rows, start
	// whatever the handler talks to (a fresh provider), and return the
	// plugin, the job's args, and how to read the effects. Required.
	Start func(tb testing.TB, pool *pgxpool.Pool) Setup[T]
}

// Setup is one scenario's plugin, job and effects.
type Setup[T sdk.Args] struct {
	// Plugin serves the job's kind.
	Plugin *sdk.Plugin
	// Args is the job's payload.
	Args T
	// Effects reads everything the job changes: rows in the database
	// (a query's rows) and what left the process (the messages at a
	// provider).
	Effects func(ctx context.Context) (any, error)
	// Want is what Effects must read after a single clean run: the kit
	// checks it after the clean run and after every scenario (equal by
	// reflect.DeepEqual, or once both are encoded as JSON, so a stated
	// [][]any{{4}} matches the int64 a query returns). Required, and it
	// must differ from what Effects reads before the job runs: a test
	// that states no effect, or one already there, cannot tell a handler
	// that does nothing from one that works.
	Want any
	// Race, when set, is a second job (job id sdktest-2, its own payload)
	// that reads and writes the same rows: the kit runs the two one after
	// the other, then at once with each held before its first write until
	// the other has done its reads, and checks Race.Want both times. A
	// read-modify-write with neither a conditional write nor a row lock
	// loses one job's update there. Optional.
	Race *Race[T]
}

// Race is the second job of [Setup.Race].
type Race[T sdk.Args] struct {
	// Args is the second job's payload: another order on the same event,
	// another credit to the same wallet.
	Args T
	// Want is what Effects must read once both jobs ran, as Setup.Want.
	Want any
}

// Run proves c's handler idempotent: a clean run first, then one subtest
// per scenario (named after it), each failing when its effects differ
// from what the test states (Setup.Want).
func Run[T sdk.Args](t *testing.T, c Case[T]) {
	t.Helper()
	c.each(t, func(name string, check func(testing.TB) string) {
		t.Run(name, func(t *testing.T) {
			if f := check(t); f != "" {
				t.Error(f)
			}
		})
	}, func(f string) { t.Fatal(f) })
}

// Check runs every scenario and returns one message per scenario whose
// effects differ from what the test states (empty when the handler is
// idempotent), or the one message of a clean run that failed or left
// other effects. Infrastructure errors (no database) fail tb.
func Check[T sdk.Args](tb testing.TB, c Case[T]) []string {
	tb.Helper()
	var failures []string
	note := func(f string) { failures = append(failures, f) }
	c.each(tb, func(_ string, check func(testing.TB) string) {
		if f := check(tb); f != "" {
			note(f)
		}
	}, note)
	return failures
}

// each runs the clean run, then hands each scenario's check to each;
// a clean run that fails, or leaves what the test does not state, is
// given to failed instead, and nothing else runs.
func (c Case[T]) each(tb testing.TB, each func(name string, check func(testing.TB) string), failed func(string)) {
	tb.Helper()
	if c.Start == nil {
		tb.Fatal("sdktest: Case.Start is required")
	}
	var zero T
	kind := zero.Kind()
	base, err := c.scenario(tb, scenario{name: cleanRun})
	if err != nil {
		failed(fmt.Sprintf("%s: a single clean run failed: %v", kind, err))
		return
	}
	if msg := base.differs(kind, cleanRun); msg != "" {
		failed(msg)
		return
	}
	scenarios := scenariosFor(base.guard)
	if base.race {
		scenarios = append(scenarios, raceScenarios...)
	}
	for _, s := range scenarios {
		each(s.name, func(tb testing.TB) string {
			got, err := c.scenario(tb, s)
			if err != nil {
				return fmt.Sprintf("%s, %s: %v", kind, s.name, err)
			}
			return got.differs(kind, s.name)
		})
	}
}

// cleanRun names the run every scenario is checked beside.
const cleanRun = "a single clean run"

// ran is what one scenario left, beside what its test states.
type ran struct {
	guard   usherv1.Guard
	effects any
	want    any
	// race: the Setup has a second job; second: this scenario ran it.
	race, second bool
}

// differs explains how the effects of scenario name differ from the
// stated ones, or returns "".
func (r ran) differs(kind, name string) string {
	if sameEffects(r.effects, r.want) {
		return ""
	}
	what := "the effects differ from what the test states a single clean run leaves (Setup.Want)"
	if name == cleanRun {
		return fmt.Sprintf("%s: a single clean run left other effects than the test states (Setup.Want): a handler that does nothing, or does it twice, fails here\n  want:     %+v\n  this run: %+v",
			kind, r.want, r.effects)
	}
	if r.second {
		what = "the effects differ from what the test states two jobs leave (Setup.Race.Want)"
	}
	return fmt.Sprintf("%s is not idempotent %s: %s\n  want:     %+v\n  this run: %+v", kind, name, what, r.want, r.effects)
}

// sameEffects reports whether effects a and b are equal: by
// reflect.DeepEqual, or once both are encoded as JSON and decoded (the
// numbers a query reads are int64s, a test writes untyped constants).
func sameEffects(a, b any) bool {
	if reflect.DeepEqual(a, b) {
		return true
	}
	x, errX := json.Marshal(a)
	y, errY := json.Marshal(b)
	if errX != nil || errY != nil {
		return false
	}
	var u, v any
	if json.Unmarshal(x, &u) != nil || json.Unmarshal(y, &v) != nil {
		return false
	}
	return reflect.DeepEqual(u, v)
}

// stated checks what a test states before its job runs: a Want, and one
// the database (or provider) does not already show.
func stated(before, want any, field string) error {
	switch {
	case want == nil:
		return fmt.Errorf("%s is not set: state what a single clean run must leave (the value Effects reads after it), so that a handler that does nothing, or does it twice, fails", field)
	case sameEffects(before, want):
		return fmt.Errorf("%s (%+v) is what Effects reads before the job runs: the test cannot tell a handler that does nothing from one that works; state what the job changes", field, want)
	}
	return nil
}

// crash names a step boundary: the run dies there, as a kill -9 would.
type crash struct {
	phase usherv1.Phase
	// before: the process dies before the phase runs; after: the phase ran
	// and its answer never reached the host.
	before, after bool
	// beforeWrite/afterWrite: inside the phase, around its first
	// conditional write.
	beforeWrite, afterWrite bool
}

type scenario struct {
	name       string
	twice      bool
	concurrent bool
	// meet, with concurrent: both copies reach this phase before either
	// runs it (a barrier), so the interleaving is forced, not left to the
	// scheduler.
	meet  usherv1.Phase
	crash *crash
	// second: the Setup's Race job runs too, after the first, or with
	// concurrent at once, each held before its first write until the
	// other has read (a barrier).
	second bool
}

// raceScenarios run a Setup's second job (Setup.Race).
var raceScenarios = []scenario{
	{name: "when another job on the same rows runs after it", second: true},
	{name: "when another job on the same rows runs at once, both reading before either writes", second: true, concurrent: true},
}

func scenariosFor(g usherv1.Guard) []scenario {
	s := []scenario{
		{name: "when it runs twice", twice: true},
		{name: "when two copies run at once", concurrent: true},
	}
	at := func(name string, c crash) scenario {
		return scenario{name: "when the run crashes " + name + " and the job is redelivered", crash: &c}
	}
	meet := func(after string, phase usherv1.Phase) scenario {
		return scenario{name: "when two copies run at once, both past " + after + " before either goes on", concurrent: true, meet: phase}
	}
	switch g {
	case usherv1.Guard_GUARD_STATE_FIRST:
		s = append(s,
			meet("check", usherv1.Phase_PHASE_PREPARE),
			meet("prepare", usherv1.Phase_PHASE_COMMIT))
	case usherv1.Guard_GUARD_CLAIM:
		s = append(s, meet("the claim phase", usherv1.Phase_PHASE_EFFECT))
	case usherv1.Guard_GUARD_JOB_ID:
		s = append(s, meet("the record of the job id", usherv1.Phase_PHASE_APPLY))
	}
	switch g {
	case usherv1.Guard_GUARD_STATE_FIRST:
		s = append(s,
			at("after check", crash{phase: usherv1.Phase_PHASE_CHECK, after: true}),
			at("after prepare", crash{phase: usherv1.Phase_PHASE_PREPARE, after: true}),
			at("inside commit, before the conditional write", crash{phase: usherv1.Phase_PHASE_COMMIT, beforeWrite: true}),
			at("inside commit, after the conditional write", crash{phase: usherv1.Phase_PHASE_COMMIT, afterWrite: true}),
			at("after commit's phase, before the transaction commits", crash{phase: usherv1.Phase_PHASE_COMMIT, after: true}))
	case usherv1.Guard_GUARD_CLAIM:
		s = append(s,
			at("after the claim was declared", crash{phase: usherv1.Phase_PHASE_CLAIM, after: true}),
			at("after claiming, before the effect", crash{phase: usherv1.Phase_PHASE_EFFECT, before: true}),
			at("after the effect, before the mark", crash{phase: usherv1.Phase_PHASE_EFFECT, after: true}))
	case usherv1.Guard_GUARD_JOB_ID:
		s = append(s,
			at("before apply", crash{phase: usherv1.Phase_PHASE_APPLY, before: true}),
			at("after apply, before the transaction commits", crash{phase: usherv1.Phase_PHASE_APPLY, after: true}))
	}
	return s
}

var errCrashed = errors.New("sdktest: the plugin process crashed here")

// scenario runs one scenario on a fresh database and returns its effects.
func (c Case[T]) scenario(tb testing.TB, s scenario) (ran, error) {
	ctx := context.Background()
	pool := c.kit().database(tb)
	setup := c.Start(tb, pool)
	if setup.Plugin == nil || setup.Effects == nil {
		tb.Fatal("sdktest: Start must return a Plugin and Effects")
	}
	if err := setup.Plugin.Err(); err != nil {
		tb.Fatalf("sdktest: plugin: %v", err)
	}
	r := ran{want: setup.Want, race: setup.Race != nil}
	before, err := setup.Effects(ctx)
	if err != nil {
		tb.Fatalf("sdktest: read effects before the run: %v", err)
	}
	if err := stated(before, setup.Want, "Setup.Want"); err != nil {
		return r, err
	}
	if s.second {
		if setup.Race == nil {
			return r, errors.New("sdktest: Start returned no Race for this scenario, though it did for the clean run")
		}
		r.second, r.want = true, setup.Race.Want
		if err := stated(before, r.want, "Setup.Race.Want"); err != nil {
			return r, err
		}
	}
	kind := setup.Args.Kind()
	handles := guard.NewHandles("public", hosttest.Logger(tb, 100))
	runner, err := guard.NewRunner(guard.Config{Handles: handles, Logger: hosttest.Logger(tb, 100)})
	if err != nil {
		tb.Fatal(err)
	}
	m, g, err := guardOf(setup.Plugin, kind, handles)
	r.guard = g
	if err != nil {
		return r, err
	}
	if c.Plugin != "" && m.GetName() != c.Plugin {
		tb.Fatalf("sdktest: Case.Plugin is %q, but Start's plugin is named %q", c.Plugin, m.GetName())
	}
	db, err := c.pluginDB(tb, pool, m)
	if err != nil {
		return r, err
	}
	defer db.Pool.Close()
	newJob := func(id string, args T) *usherv1.Job {
		payload, err := json.Marshal(args)
		if err != nil {
			tb.Fatalf("sdktest: encode args: %v", err)
		}
		return &usherv1.Job{Id: id, Kind: kind, Payload: payload, RequestId: "req-sdktest", Trace: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	}
	job := newJob("sdktest-1", setup.Args)

	// run runs job to its end; b, when set, holds it at s.meet or, for
	// a second job's race, before its first write.
	run := func(job *usherv1.Job, cr *crash, b *barrier) (guard.Outcome, error) {
		inv := newInvoker(setup.Plugin, handles, cr)
		if s.second {
			inv.race = b
		} else {
			inv.meet, inv.barrier = s.meet, b
		}
		defer b.leave()
		return runToEnd(ctx, pool, runner, inv, db, g, job, 0)
	}
	// together runs jobs at once, held together when b is set.
	together := func(b *barrier, jobs ...*usherv1.Job) error {
		var wg sync.WaitGroup
		errs := make([]error, len(jobs))
		for i, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = run(j, nil, b)
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	switch {
	case s.second:
		other := newJob("sdktest-2", setup.Race.Args)
		if s.concurrent {
			if err := together(newBarrier(2, pool), job, other); err != nil {
				return r, err
			}
			break
		}
		for _, j := range []*usherv1.Job{job, other} {
			if _, err := run(j, nil, nil); err != nil {
				return r, err
			}
		}
	case s.twice:
		for range 2 {
			if _, err := run(job, nil, nil); err != nil {
				return r, err
			}
		}
	case s.concurrent:
		var b *barrier
		if s.meet != usherv1.Phase_PHASE_UNSPECIFIED {
			b = newBarrier(2, pool)
		}
		if err := together(b, job, job); err != nil {
			return r, err
		}
	case s.crash != nil:
		inv := newInvoker(setup.Plugin, handles, s.crash)
		out := runner.Run(ctx, inv, db, g, job, guard.Delivery{})
		if !inv.crashed() {
			return r, fmt.Errorf("the crash point was never reached (the run ended %s: %s)", out.Verdict, out.Reason)
		}
		if out.Verdict != guard.Abandoned {
			return r, fmt.Errorf("the host did not treat the crash as an unfinished run (verdict %s)", out.Verdict)
		}
		if _, err := run(job, nil, nil); err != nil { // the redelivery
			return r, err
		}
	default:
		out, err := run(job, nil, nil)
		if err != nil {
			return r, err
		}
		if out.Verdict != guard.Applied {
			return r, fmt.Errorf("a clean run on a fresh database ended %s (%s), not applied", out.Verdict, out.Reason)
		}
	}
	if r.effects, err = setup.Effects(ctx); err != nil {
		tb.Fatalf("sdktest: read effects: %v", err)
	}
	return r, nil
}

func guardOf(p *sdk.Plugin, kind string, handles *guard.Handles) (*usherv1.ManifestResponse, usherv1.Guard, error) {
	srv := bridge.NewPluginServer(p, localHost{h: handles})
	m, err := srv.Manifest(context.Background(), &usherv1.ManifestRequest{})
	if err != nil {
		return nil, 0, err
	}
	for _, k := range m.GetKinds() {
		if k.GetKind() == kind {
			return m, k.GetGuard(), nil
		}
	}
	return nil, 0, fmt.Errorf("plugin %s does not serve kind %q", m.GetName(), kind)
}

// pluginDB is where the handler's statements run, as in the host: a pool
// logged in as the plugin's own role (created here when missing), with the
// role checked, the Case's migrations and grants installed as a host
// installs a manifest's, and its kinds pinned. A grant the handler needs and the
// role lacks fails here as it would in production.
func (c Case[T]) pluginDB(tb testing.TB, pool *pgxpool.Pool, m *usherv1.ManifestResponse) (guard.DB, error) {
	return c.kit().pluginDB(tb, pool, m)
}

// kit is what a Case and a Flow share: the plugin's name, its
// migrations, grants and enqueues.
type kit struct {
	plugin     string
	schema     string
	migrations fs.FS
	grants     []pluginhost.Grant
	enqueues   []string
}

func (c Case[T]) kit() kit {
	return kit{plugin: c.Plugin, schema: c.Schema, migrations: c.Migrations, grants: c.Grants, enqueues: c.Enqueues}
}

// database is one scenario's fresh database: the plugin's role made and
// its migrations and grants installed (when the plugin is named), then
// the schema run.
func (c kit) database(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, _ := hosttest.DB(tb)
	ctx := context.Background()
	if c.plugin != "" {
		hosttest.EnsureRoles(tb, c.plugin)
		if err := c.install(ctx, pool, c.plugin, "sdktest"); err != nil {
			tb.Fatalf("sdktest: install: %v", err)
		}
	}
	if c.schema != "" {
		if _, err := pool.Exec(ctx, c.schema); err != nil {
			tb.Fatalf("sdktest: schema: %v", err)
		}
	}
	return pool
}

func (c kit) pluginDB(tb testing.TB, pool *pgxpool.Pool, m *usherv1.ManifestResponse) (guard.DB, error) {
	ctx := context.Background()
	role := hosttest.PluginRole(m.GetName())
	hosttest.EnsureRoles(tb, m.GetName())
	var kinds []string
	for _, k := range m.GetKinds() {
		kinds = append(kinds, k.GetKind())
	}
	if err := sandbox.CheckPluginRole(ctx, pool, m.GetName(), role); err != nil {
		return guard.DB{}, err
	}
	if c.plugin == "" {
		if err := c.install(ctx, pool, m.GetName(), m.GetVersion()); err != nil {
			return guard.DB{}, err
		}
	}
	if err := sandbox.Prepare(ctx, pool, m.GetName(), role, kinds, c.enqueues); err != nil {
		return guard.DB{}, err
	}
	ppool, err := sandbox.OpenPluginPool(ctx, sandbox.PoolConfig{Base: pool.Config(), Role: role, Size: 4, Plugin: m.GetName()})
	if err != nil {
		return guard.DB{}, err
	}
	return guard.DB{Pool: ppool, Role: role}, nil
}

// runToEnd runs the job until it is applied or absorbed, as the host would
// over redeliveries and scheduled retries. A claim held by a crashed run is
// aged past its lease instead of waiting for it.
func runToEnd(ctx context.Context, pool *pgxpool.Pool, runner *guard.Runner, inv *invoker, db guard.DB, g usherv1.Guard, job *usherv1.Job, outboxID int64) (guard.Outcome, error) {
	for attempt := range 6 {
		j := proto.Clone(job).(*usherv1.Job)
		j.Attempt = int32(attempt)
		out := runner.Run(ctx, inv, db, g, j, guard.Delivery{OutboxID: outboxID})
		switch out.Verdict {
		case guard.Applied, guard.Absorbed:
			return out, nil
		case guard.Retry:
			if spec := inv.lastClaim(); spec != nil && strings.Contains(out.Reason, "claim held") {
				if err := ageClaim(ctx, pool, db.Role, spec); err != nil {
					return out, err
				}
			}
			continue
		default:
			return out, fmt.Errorf("the run ended %s: %s", out.Verdict, out.Reason)
		}
	}
	return guard.Outcome{}, errors.New("the job did not finish in 6 attempts")
}

// ageClaim moves a claim's timestamp back past its lease, as time would.
func ageClaim(ctx context.Context, pool *pgxpool.Pool, role string, spec *usherv1.ClaimSpec) error {
	// The plugin's name is its role's, less the deployment's prefix.
	plugin := strings.TrimPrefix(role, strings.TrimSuffix(hosttest.PluginRole("p"), "p"))
	// The table as the plugin's search_path finds it: its own schema first.
	var table string
	err := pool.QueryRow(ctx, `SELECT coalesce(to_regclass(quote_ident($1) || '.' || quote_ident($2)), to_regclass(quote_ident($2)))::text`,
		sandbox.Schema(plugin), spec.GetTable()).Scan(&table)
	if err != nil {
		return fmt.Errorf("sdktest: claim table %s: %w", spec.GetTable(), err)
	}
	var where []string
	args := []any{}
	for i, col := range spec.GetKeyColumns() {
		where = append(where, fmt.Sprintf("%s = $%d", pgx.Identifier{col}.Sanitize(), i+1))
		args = append(args, contract.FromValue(spec.GetKeyValues()[i]))
	}
	claimed := pgx.Identifier{spec.GetClaimedColumn()}.Sanitize()
	sql := fmt.Sprintf(`UPDATE %s SET %s = %s - make_interval(secs => %f) WHERE %s`,
		table, claimed, claimed,
		(time.Duration(spec.GetLeaseMs())*time.Millisecond + time.Second).Seconds(), strings.Join(where, " AND "))
	_, err = pool.Exec(ctx, sql, args...)
	return err
}

// barrier holds copies of a run at a phase until all have reached it, or
// ended, or one of them waits for a lock in the scenario's database (held
// by a copy the barrier holds: the guard itself forbids the interleaving
// then), or meetCeiling passed (a copy blocked outside the database).
// Being slow is not being blocked: a copy that takes its time to reach the
// phase is waited for, so the interleaving does not depend on the load.
type barrier struct {
	mu      sync.Mutex
	waiting int
	all     chan struct{}
	// pool is the scenario's database, asked whether a session in it
	// waits for a lock.
	pool *pgxpool.Pool
}

const (
	meetPoll    = 10 * time.Millisecond
	meetCeiling = 10 * time.Second
)

func newBarrier(n int, pool *pgxpool.Pool) *barrier {
	return &barrier{waiting: n, all: make(chan struct{}), pool: pool}
}

// arrive counts one copy in and waits for the others.
func (b *barrier) arrive(ctx context.Context) {
	b.leave()
	ceiling := time.NewTimer(meetCeiling)
	defer ceiling.Stop()
	poll := time.NewTicker(meetPoll)
	defer poll.Stop()
	for {
		select {
		case <-b.all:
			return
		case <-ctx.Done():
			return
		case <-ceiling.C:
			return
		case <-poll.C:
			if b.lockWait(ctx) {
				return
			}
		}
	}
}

// lockWait reports whether a session of the scenario's database waits for
// a lock. Each scenario has a database of its own, so the session is one
// of its copies, and the lock is one a held copy has.
func (b *barrier) lockWait(ctx context.Context) bool {
	var waits bool
	err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE NOT l.granted AND a.datname = current_database())`).Scan(&waits)
	return err == nil && waits
}

// leave counts one copy in without waiting (it arrived, or it ended
// without reaching the phase). Safe on a nil barrier and after release.
func (b *barrier) leave() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.waiting > 0 {
		b.waiting--
		if b.waiting == 0 {
			close(b.all)
		}
	}
}

// invoker calls the plugin in-process and crashes where told.
type invoker struct {
	srv   usherv1.PluginServer
	crash *crash
	// barrier, when set, holds this run before it first invokes meet.
	meet    usherv1.Phase
	barrier *barrier
	met     bool
	// race, when set, holds this run before its first write: a write
	// statement it sends, a follow-on job it enqueues, or the writes or
	// claim its phase hands the host.
	race *barrier
	held bool

	mu    sync.Mutex
	fired bool
	claim *usherv1.ClaimSpec
}

func newInvoker(p *sdk.Plugin, handles *guard.Handles, cr *crash) *invoker {
	inv := &invoker{crash: cr}
	inv.srv = bridge.NewPluginServer(p, localHost{h: handles, inv: inv})
	return inv
}

func (i *invoker) crashed() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.fired
}

func (i *invoker) fire() {
	i.mu.Lock()
	i.fired = true
	i.mu.Unlock()
}

func (i *invoker) lastClaim() *usherv1.ClaimSpec {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.claim
}

// inPhase reports whether the crash is set for phase and has not fired.
func (i *invoker) armed(phase usherv1.Phase) *crash {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.crash == nil || i.fired || i.crash.phase != phase {
		return nil
	}
	return i.crash
}

func (i *invoker) Invoke(ctx context.Context, calls []*usherv1.Call) ([]*usherv1.Result, error) {
	phase := calls[0].GetPhase()
	if i.barrier != nil && phase == i.meet && !i.met {
		i.met = true
		i.barrier.arrive(ctx)
	}
	c := i.armed(phase)
	if c != nil && c.before {
		i.fire()
		return nil, errCrashed
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res, err := i.srv.Invoke(ctx, &usherv1.InvokeRequest{Calls: calls})
	if err != nil {
		return nil, err
	}
	for _, r := range res.GetResults() {
		if r.GetClaim() != nil {
			i.mu.Lock()
			i.claim = r.GetClaim()
			i.mu.Unlock()
		}
		if r.GetClaim() != nil || len(r.GetWrites()) > 0 {
			i.beforeWrite(ctx)
		}
	}
	if c != nil && (c.after || c.crashed(i)) {
		i.fire()
		return nil, errCrashed
	}
	return res.GetResults(), nil
}

// beforeWrite holds a raced run before its first write until the other
// job has done its reads, or waits for a row lock this run holds (which
// forbids the lost update itself).
func (i *invoker) beforeWrite(ctx context.Context) {
	i.mu.Lock()
	hold := i.race != nil && !i.held
	i.held = i.held || hold
	i.mu.Unlock()
	if hold {
		i.race.arrive(ctx)
	}
}

// crashed reports whether a crash inside the phase fired during it.
func (c *crash) crashed(i *invoker) bool {
	return (c.beforeWrite || c.afterWrite) && i.crashed()
}

// localHost is the host's callback service called in-process. It crashes
// the run around a conditional write when told.
type localHost struct {
	h   *guard.Handles
	inv *invoker
}

func (l localHost) Exec(ctx context.Context, in *usherv1.ExecRequest, _ ...grpc.CallOption) (*usherv1.ExecResponse, error) {
	var c *crash
	if l.inv != nil {
		c = l.inv.armed(usherv1.Phase_PHASE_COMMIT)
	}
	conditional := len(in.GetStatements()) > 0 && in.GetStatements()[0].GetMode() == usherv1.Mode_MODE_WRITE_IF
	if l.inv != nil {
		for _, st := range in.GetStatements() {
			if st.GetMode() != usherv1.Mode_MODE_QUERY {
				l.inv.beforeWrite(ctx)
				break
			}
		}
	}
	if c != nil && c.beforeWrite && conditional {
		l.inv.fire()
		return nil, errCrashed
	}
	res, err := l.h.Exec(ctx, in)
	if c != nil && c.afterWrite && conditional {
		l.inv.fire()
		return nil, errCrashed
	}
	return res, err
}

func (l localHost) Enqueue(ctx context.Context, in *usherv1.EnqueueRequest, _ ...grpc.CallOption) (*usherv1.EnqueueResponse, error) {
	if l.inv != nil {
		l.inv.beforeWrite(ctx)
	}
	return l.h.Enqueue(ctx, in)
}

func (l localHost) Log(ctx context.Context, in *usherv1.LogRequest, _ ...grpc.CallOption) (*usherv1.LogResponse, error) {
	return l.h.Log(ctx, in)
}

var _ usherv1.HostClient = localHost{}

// install installs the kit's migrations and grants as a host installs a
// manifest's (host/plugindb).
func (c kit) install(ctx context.Context, pool *pgxpool.Pool, name, version string) error {
	if c.migrations == nil && c.grants == nil {
		return nil
	}
	spec := plugindb.Spec{Name: name, Version: version, Migrations: c.migrations, Grants: c.grants}
	if c.migrations != nil {
		sum, err := pluginhost.MigrationsSHA256(c.migrations)
		if err != nil {
			return err
		}
		spec.MigrationsSHA256 = sum
	}
	_, err := plugindb.Install(ctx, pool, spec)
	return err
}
