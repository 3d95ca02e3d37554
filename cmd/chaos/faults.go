package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherhq/usher/internal/localcluster"
	"github.com/usherhq/usher/plugins/stagedoor/faults"
	"github.com/usherhq/usher/plugins/stagedoor/orders"
	"github.com/usherhq/usher/plugins/tickets/mail"
)

// faultKind is one type of fault; each round of the schedule injects every
// enabled kind once.
type faultKind int

const (
	faultPluginKill faultKind = iota
	faultHostKill
	faultHostStop
	faultRedisRestart
	faultRedisFailover
	faultPostgresRestart
	faultRelayDuplicate
	faultMailError
	faultMailSlow
	numFaultKinds
)

// redisMode is the Redis a fault applies to.
type redisMode int

const (
	anyRedis     redisMode = iota // either
	singleRedis                   // the single node (no --redis-cluster)
	clusterRedis                  // the cluster (--redis-cluster)
)

var faultInfo = [numFaultKinds]struct {
	name, what string
	mode       redisMode
}{
	faultPluginKill:      {"plugin-kill", "kill -9 of a plugin process (its host restarts it)", anyRedis},
	faultHostKill:        {"host-kill", "kill -9 of a host process (restarted with the same consumer name)", anyRedis},
	faultHostStop:        {"host-stop", "SIGSTOP of a host past the reclaim threshold, then SIGCONT", anyRedis},
	faultRedisRestart:    {"redis-restart", "kill -9 of Redis, restarted on the same port and data", singleRedis},
	faultRedisFailover:   {"redis-failover", "kill -9 of a primary serving a shard, its replica promoted, the old one back as a replica", clusterRedis},
	faultPostgresRestart: {"postgres-restart", "Postgres restart -m fast / -m immediate", anyRedis},
	faultRelayDuplicate:  {"relay-dup", "stream entries published twice (XADD of a copy)", anyRedis},
	faultMailError:       {"mail-error", "mail provider errors (before the send, or after it)", anyRedis},
	faultMailSlow:        {"mail-slow", "mail provider slow answers (some past the client's timeout)", anyRedis},
}

func (k faultKind) String() string { return faultInfo[k].name }

// appliesTo says whether k can be injected on the Redis of cluster mode.
func (k faultKind) appliesTo(cluster bool) bool {
	switch faultInfo[k].mode {
	case singleRedis:
		return !cluster
	case clusterRedis:
		return cluster
	}
	return true
}

func faultNames() []string {
	var out []string
	for k := range numFaultKinds {
		out = append(out, k.String())
	}
	return out
}

// faultHelp lists the fault types, naming those of one Redis mode only.
func faultHelp() string {
	var out []string
	for k := range numFaultKinds {
		switch faultInfo[k].mode {
		case singleRedis:
			out = append(out, k.String()+" (single node only)")
		case clusterRedis:
			out = append(out, k.String()+" (--redis-cluster only)")
		default:
			out = append(out, k.String())
		}
	}
	return strings.Join(out, ", ")
}

// parseFaults reads --faults for the Redis mode: "all" is every type that
// applies to it; a named type that does not is an error.
func parseFaults(s string, cluster bool) ([]faultKind, error) {
	if s == "" || s == "all" {
		var all []faultKind
		for k := range numFaultKinds {
			if k.appliesTo(cluster) {
				all = append(all, k)
			}
		}
		return all, nil
	}
	var out []faultKind
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		i := slices.Index(faultNames(), name)
		if i < 0 {
			return nil, fmt.Errorf("unknown fault type %q (known: %s)", name, faultHelp())
		}
		k := faultKind(i)
		switch {
		case !k.appliesTo(cluster) && cluster:
			return nil, fmt.Errorf("fault %s applies to the single Redis node, not to --redis-cluster (its primaries fail over: redis-failover)", k)
		case !k.appliesTo(cluster):
			return nil, fmt.Errorf("fault %s needs --redis-cluster: the single Redis node has no replica to promote (it restarts: redis-restart)", k)
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

// injection is one planned fault.
type injection struct {
	at   time.Duration // after the load started
	kind faultKind
	nth  int    // its index among the injections of its kind
	seed uint64 // of the rng choosing its targets and parameters
}

// plan spreads rounds × kinds injections evenly over [from, to): each round
// is a random permutation of the kinds, each slot gets a random jitter.
// Everything comes from the seed, so a run's schedule can be replayed (the
// targets are chosen from the seed too, among the processes alive then).
func plan(seed uint64, kinds []faultKind, rounds int, from, to time.Duration) []injection {
	rng := rand.New(rand.NewPCG(seed, 2))
	total := rounds * len(kinds)
	slot := (to - from) / time.Duration(total)
	var out []injection
	nth := map[faultKind]int{}
	for r := range rounds {
		for j, p := range rng.Perm(len(kinds)) {
			k := kinds[p]
			s := r*len(kinds) + j
			at := from + time.Duration(s)*slot + time.Duration(rng.Int64N(int64(slot)/2+1))
			out = append(out, injection{at: at, kind: k, nth: nth[k], seed: rng.Uint64()})
			nth[k]++
		}
	}
	return out
}

// injector runs the plan and counts what it injected.
type injector struct {
	c    *chaos
	plan []injection

	mu        sync.Mutex
	counts    [numFaultKinds]int
	variants  map[string]int
	missed    []string
	findings  []string
	failovers []failover
	// pluginKills records recent kills per host and plugin, so the
	// injector does not push a plugin into its supervisor's crash-loop
	// state (5 crashes in a minute), which is a different test.
	pluginKills map[string][]time.Time

	recover  sync.WaitGroup // SIGCONTs and other delayed repairs in flight
	pgMu     sync.Mutex
	redisMu  sync.Mutex
	pluginMu sync.Mutex
}

func (c *chaos) newInjector() *injector {
	warm := min(max(3*time.Second, c.cfg.duration/40), 15*time.Second)
	return &injector{c: c, plan: plan(c.cfg.seed, c.cfg.faults, c.cfg.rounds, warm, c.cfg.duration-c.cfg.duration/20),
		variants: map[string]int{}, pluginKills: map[string][]time.Time{}}
}

func (in *injector) count(k faultKind, variant string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.counts[k]++
	in.variants[k.String()+": "+variant]++
}

func (in *injector) finding(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	in.mu.Lock()
	in.findings = append(in.findings, msg)
	in.mu.Unlock()
	in.c.say("FINDING: %s", msg)
}

// run injects the plan, starting each injection at its time; injections of
// different kinds may overlap, as faults do.
func (in *injector) run(ctx context.Context, start time.Time) {
	var wg sync.WaitGroup
	for _, inj := range in.plan {
		sleepCtx(ctx, time.Until(start.Add(inj.at)))
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			in.inject(ctx, inj)
		}()
	}
	wg.Wait()
}

// inject tries an injection until it finds a target (a fault on a host
// needs a host that is up), for up to 20 seconds.
func (in *injector) inject(ctx context.Context, inj injection) {
	rng := rand.New(rand.NewPCG(inj.seed, uint64(inj.nth)))
	deadline := time.Now().Add(20 * time.Second)
	for {
		msg, err := in.try(ctx, inj, rng)
		if err == nil {
			in.c.say("fault %-16s #%-2d %s", inj.kind, inj.nth+1, msg)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if time.Now().After(deadline) {
			in.mu.Lock()
			in.missed = append(in.missed, fmt.Sprintf("%s #%d: %v", inj.kind, inj.nth+1, err))
			in.mu.Unlock()
			in.c.say("fault %-16s #%-2d NOT injected: %v", inj.kind, inj.nth+1, err)
			return
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
}

var errNoTarget = errors.New("no eligible target")

func (in *injector) try(ctx context.Context, inj injection, rng *rand.Rand) (string, error) {
	switch inj.kind {
	case faultPluginKill:
		return in.pluginKill(ctx, inj, rng)
	case faultHostKill:
		return in.hostKill(ctx, inj, rng)
	case faultHostStop:
		return in.hostStop(ctx, inj, rng)
	case faultRedisRestart:
		return in.redisRestart(ctx, rng)
	case faultRedisFailover:
		return in.redisFailover(ctx, rng)
	case faultPostgresRestart:
		return in.postgresRestart(ctx, inj, rng)
	case faultRelayDuplicate:
		return in.relayDuplicate(ctx, inj, rng)
	case faultMailError:
		return in.mailError(ctx, inj, rng)
	case faultMailSlow:
		return in.mailSlow(ctx, rng)
	}
	return "", fmt.Errorf("unknown fault %d", inj.kind)
}

// runningHosts lists the hosts that are up and not stopped, in slot order.
func (in *injector) runningHosts() []*hostSlot {
	var out []*hostSlot
	for _, h := range in.c.hosts {
		if h.running() != nil {
			out = append(out, h)
		}
	}
	return out
}

// pickHost picks a running host, keeping at least keep others running.
func (in *injector) pickHost(rng *rand.Rand, keep int) (*hostSlot, *proc, error) {
	hs := in.runningHosts()
	if len(hs) <= keep {
		return nil, nil, fmt.Errorf("%w: %d host(s) running, %d must stay up", errNoTarget, len(hs), keep)
	}
	h := hs[rng.IntN(len(hs))]
	p := h.running()
	if p == nil {
		return nil, nil, errNoTarget
	}
	return h, p, nil
}

// pluginKill kills a plugin with -9, in one of three ways by turn: a
// random plugin under load; the plugin holding a chosen job at a chosen
// point (stalled there through the fault package, then killed while it
// holds it); or the tickets plugin exiting right after the mail provider
// accepted a send, before the host could mark it sent.
func (in *injector) pluginKill(ctx context.Context, inj injection, rng *rand.Rand) (string, error) {
	in.pluginMu.Lock()
	defer in.pluginMu.Unlock()
	switch inj.nth % 3 {
	case 1:
		msg, err := in.pluginKillMidJob(ctx, inj, rng)
		if err == nil {
			return msg, nil
		}
		in.c.say("fault plugin-kill #%d: mid-job variant did not happen (%v); killing a random plugin instead", inj.nth+1, err)
	case 2:
		msg, err := in.pluginCrashAfterSend(ctx)
		if err == nil {
			return msg, nil
		}
		in.c.say("fault plugin-kill #%d: crash-after-send variant did not happen (%v); killing a random plugin instead", inj.nth+1, err)
	}
	return in.pluginKillRandom(rng)
}

func (in *injector) pluginKillRandom(rng *rand.Rand) (string, error) {
	hs := in.runningHosts()
	type target struct {
		h    *hostSlot
		p    *proc
		name string
		pid  int
	}
	var ts []target
	for _, h := range hs {
		p := h.running()
		if p == nil {
			continue
		}
		names := plugins(p)
		keys := make([]string, 0, len(names))
		for n := range names {
			keys = append(keys, n)
		}
		sort.Strings(keys)
		for _, n := range keys {
			if in.recentKills(h.name+"/"+n) < 3 {
				ts = append(ts, target{h, p, n, names[n]})
			}
		}
	}
	if len(ts) == 0 {
		return "", fmt.Errorf("%w: no running plugin", errNoTarget)
	}
	t := ts[rng.IntN(len(ts))]
	if err := syscall.Kill(t.pid, syscall.SIGKILL); err != nil {
		return "", err
	}
	in.notePluginKill(t.h.name + "/" + t.name)
	in.count(faultPluginKill, "random plugin under load")
	return fmt.Sprintf("kill -9 of %s's %s plugin (pid %d) under load", t.h.name, t.name, t.pid), nil
}

func (in *injector) recentKills(key string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	n := 0
	for _, t := range in.pluginKills[key] {
		if time.Since(t) < 70*time.Second {
			n++
		}
	}
	return n
}

func (in *injector) notePluginKill(key string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.pluginKills[key] = append(in.pluginKills[key], time.Now())
}

// midJobPoints are where the mid-job variant holds a job before the kill.
var midJobPoints = []struct {
	point string
	job   int // index into the order's outbox ids: 0 counter, 1 render
	what  string
}{
	{"counter.before_apply", 0, "inside update_sales_counter's transaction, job id inserted, not committed"},
	{"render.after_check", 1, "after render_tickets' check"},
	{"render.after_prepare", 1, "after the PDF was stored, before the commit"},
	{"render.before_commit", 1, "in render_tickets' commit transaction, before the conditional write"},
	{"render.after_commit", 1, "after the conditional write and the send_tickets enqueue, before the host commits"},
}

func (in *injector) pluginKillMidJob(ctx context.Context, inj injection, rng *rand.Rand) (string, error) {
	mp := midJobPoints[(inj.nth/3)%len(midJobPoints)]
	dir := in.c.faultDir
	var jobID string
	// The order and the fault are armed in one transaction: its jobs cannot
	// reach the stream before the fault is in place.
	_, err := in.c.load.place(ctx, in.c.load.order(rng, "chaos-midjob-"+strconv.Itoa(inj.nth)), func(p orders.Placed) error {
		jobID = strconv.FormatInt(p.OutboxIDs[mp.job], 10)
		return faults.Arm(dir, mp.point, faults.Spec{Action: "stall", Duration: "1h", JobIDs: []string{jobID}, Once: true})
	})
	if err != nil {
		return "", err
	}
	defer func() { _ = faults.Disarm(dir, mp.point) }()
	hit := filepath.Join(dir, mp.point+"."+jobID+".hit")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if raw, err := os.ReadFile(hit); err == nil && len(raw) > 0 {
			pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
			if err != nil {
				return "", fmt.Errorf("hit file %s: %w", hit, err)
			}
			host := in.hostOf(pid)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				return "", fmt.Errorf("kill plugin %d: %w", pid, err)
			}
			in.notePluginKill(host + "/" + procName(pid))
			in.count(faultPluginKill, "mid-job at "+mp.point)
			return fmt.Sprintf("kill -9 of %s's plugin pid %d holding job %s at %s (%s)", host, pid, jobID, mp.point, mp.what), nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("job %s did not reach %s within 30s", jobID, mp.point)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pluginCrashAfterSend arms send.after_effect to crash the tickets plugin
// (os.Exit, as kill -9) after the provider accepted a send, until one did.
func (in *injector) pluginCrashAfterSend(ctx context.Context) (string, error) {
	dir := in.c.faultDir
	const point = "send.after_effect"
	before := hits(dir, point)
	if err := faults.Arm(dir, point, faults.Spec{Action: "crash", Every: 4, Once: true}); err != nil {
		return "", err
	}
	defer func() { _ = faults.Disarm(dir, point) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		now := hits(dir, point)
		if len(now) > len(before) {
			_ = faults.Disarm(dir, point)
			var jobs []string
			for h := range now {
				if !before[h] {
					jobs = append(jobs, h)
				}
			}
			sort.Strings(jobs)
			in.count(faultPluginKill, "crash after the provider accepted a send, before sent_at")
			return fmt.Sprintf("tickets plugin crashed after the provider accepted send_tickets job(s) %s, before the host marked them sent", strings.Join(jobs, ", ")), nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		if time.Now().After(deadline) {
			return "", errors.New("no send_tickets job reached send.after_effect within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hits lists the job ids that hit point.
func hits(dir, point string) map[string]bool {
	m, _ := filepath.Glob(filepath.Join(dir, point+".*.hit"))
	out := map[string]bool{}
	for _, f := range m {
		out[strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), point+"."), ".hit")] = true
	}
	return out
}

// hostOf names the host whose plugin pid is.
func (in *injector) hostOf(pid int) string {
	for _, h := range in.c.hosts {
		h.mu.Lock()
		p := h.p
		h.mu.Unlock()
		if p != nil && slices.Contains(childPids(p.pid()), pid) {
			return h.name
		}
	}
	return "unknown host"
}

// hostKill kills a host with -9 and lets keep restart it 1-4 s later under
// the same consumer name; every other time right after a burst of orders,
// so its relay is likely between publishing a batch and marking it.
func (in *injector) hostKill(ctx context.Context, inj injection, rng *rand.Rand) (string, error) {
	h, p, err := in.pickHost(rng, 1)
	if err != nil {
		return "", err
	}
	delay := time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
	variant, note := "plain", ""
	if inj.nth%2 == 1 {
		variant = "right after a burst of orders"
		n := 20 + rng.IntN(30)
		var wg sync.WaitGroup
		for i := range n {
			o := in.c.load.order(rng, fmt.Sprintf("chaos-burst-%d-%d", inj.nth, i))
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = in.c.load.place(ctx, o, nil)
			}()
		}
		wg.Wait()
		note = fmt.Sprintf(" right after a burst of %d orders", n)
	}
	kids := plugins(p)
	if !h.kill9(p, delay) {
		return "", fmt.Errorf("%w: %s changed state", errNoTarget, h.name)
	}
	in.count(faultHostKill, variant)
	// The SDK promises that a plugin exits by itself once its host is gone.
	in.recover.Add(1)
	go func() {
		defer in.recover.Done()
		sleepCtx(ctx, 3*time.Second)
		if ctx.Err() != nil {
			return
		}
		for name, pid := range kids {
			if alive(pid) && !slices.Contains(childPids(p.pid()), pid) && procName(pid) == name {
				in.finding("%s plugin (pid %d) still running 3s after its host %s was killed", name, pid, h.name)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}()
	return fmt.Sprintf("kill -9 of %s (pid %d)%s; restart in %s", h.name, p.pid(), note, delay.Round(100*time.Millisecond)), nil
}

// hostStop freezes a host for 2-3 reclaim thresholds: by turns the host
// alone (its plugins run on and block on callbacks) or its whole process
// group, as a paused VM would be.
func (in *injector) hostStop(ctx context.Context, inj injection, rng *rand.Rand) (string, error) {
	h, p, err := in.pickHost(rng, 1)
	if err != nil {
		return "", err
	}
	idle := in.c.cfg.reclaimIdle
	d := 2*idle + time.Duration(rng.Int64N(int64(idle)))
	group := inj.nth%2 == 1
	if !h.stop(p, group) {
		return "", fmt.Errorf("%w: %s changed state", errNoTarget, h.name)
	}
	what := "host process alone"
	if group {
		what = "host and its plugins"
	}
	in.count(faultHostStop, what)
	in.recover.Add(1)
	go func() {
		defer in.recover.Done()
		sleepCtx(ctx, d)
		h.cont(p)
	}()
	return fmt.Sprintf("SIGSTOP of %s (pid %d, %s) for %s, %.1fx the reclaim threshold", h.name, p.pid(), what, d.Round(100*time.Millisecond), float64(d)/float64(idle)), nil
}

func (in *injector) redisRestart(ctx context.Context, rng *rand.Rand) (string, error) {
	in.redisMu.Lock()
	defer in.redisMu.Unlock()
	r := in.c.redis
	down := 500*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond)))
	pid := r.p.pid()
	r.crash()
	sleepCtx(ctx, down)
	if err := r.start(ctx); err != nil {
		return "", fmt.Errorf("redis did not come back: %w", err)
	}
	mode := "appendonly yes, appendfsync always"
	if !r.aof {
		mode = "no persistence: the stream is gone"
	}
	in.count(faultRedisRestart, "kill -9, "+mode)
	return fmt.Sprintf("kill -9 of Redis (pid %d), down %s, restarted (%s)", pid, down.Round(100*time.Millisecond), mode), nil
}

// failoverBound bounds each wait of a failover: the replica's promotion,
// the shards taking writes again, the old primary's rejoining.
const failoverBound = 60 * time.Second

// failover is one redis-failover, its times counted from the kill.
type failover struct {
	primary, replica string   // the killed primary, the replica promoted in its place
	shards           []string // the shards the primary served
	// promoted: until every live node names the replica the primary of
	// each shard; pause: until a write to each shard's slot through a
	// client like the hosts' succeeded again; rejoined: until the old
	// primary was back as the replica, in sync.
	promoted, pause, rejoined time.Duration
}

// redisFailover kills (-9) a primary that serves at least one shard,
// chosen from the seed among the current primaries, waits for its replica
// to be promoted and for its shards to take writes again, then starts the
// old node on its port and files, to rejoin as the new primary's replica.
// It starts only on a healthy cluster (the last failover's node rejoined
// and in sync), so a replica that can be promoted is always there.
func (in *injector) redisFailover(ctx context.Context, rng *rand.Rand) (string, error) {
	in.redisMu.Lock()
	defer in.redisMu.Unlock()
	cl := in.c.cluster
	if ok, why := cl.Healthy(); !ok || len(cl.LiveAddrs()) < localcluster.Nodes {
		return "", fmt.Errorf("%w: the cluster is not whole and healthy: %s", errNoTarget, why)
	}
	owners, err := in.c.shardOwners(ctx)
	if err != nil {
		return "", err
	}
	primaries := slices.Sorted(maps.Keys(owners))
	f := failover{primary: primaries[rng.IntN(len(primaries))]}
	f.shards = owners[f.primary]
	pid := cl.Node(f.primary).Cmd.Process.Pid
	killed := time.Now()
	if err := cl.Kill(f.primary); err != nil {
		return "", err
	}
	for f.promoted == 0 || f.pause == 0 {
		if f.promoted == 0 {
			if r, ok := in.promoted(ctx, f); ok {
				f.replica, f.promoted = r, time.Since(killed)
			}
		}
		if f.pause == 0 && in.writable(ctx, f.shards) {
			f.pause = time.Since(killed)
		}
		if time.Since(killed) > failoverBound || ctx.Err() != nil {
			break
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
	// Whatever happened, the old node comes back: without a promotion it
	// serves its shards again itself.
	restartErr := cl.Restart(f.primary)
	if restartErr == nil && f.promoted == 0 {
		restartErr = cl.WaitHealthy(failoverBound)
	} else if restartErr == nil {
		restartErr = cl.WaitReplica(f.primary, failoverBound)
	}
	f.rejoined = time.Since(killed)
	in.count(faultRedisFailover, fmt.Sprintf("primary of %d shard(s) killed", len(f.shards)))
	in.mu.Lock()
	in.failovers = append(in.failovers, f)
	in.mu.Unlock()
	msg := fmt.Sprintf("kill -9 of primary %s (pid %d) serving %s", f.primary, pid, strings.Join(f.shards, ", "))
	switch {
	case f.promoted == 0:
		in.finding("redis-failover: no replica of %s promoted within %s (see %s)", f.primary, failoverBound, cl.Dir(f.primary))
	case f.pause == 0:
		in.finding("redis-failover: %s promoted after %s, but %s took no write within %s", f.replica, dur(f.promoted), strings.Join(f.shards, ", "), failoverBound)
	default:
		msg += fmt.Sprintf("; replica %s promoted after %s, the shards took writes again after %s", f.replica, dur(f.promoted), dur(f.pause))
	}
	if restartErr != nil {
		in.finding("redis-failover: %s did not rejoin: %v", f.primary, restartErr)
		return msg, nil
	}
	return msg + fmt.Sprintf("; the old primary rejoined as a replica, cluster healthy after %s", dur(f.rejoined)), nil
}

// promoted reports the replica that now serves every shard f's primary
// served, once every live node agrees it does.
func (in *injector) promoted(ctx context.Context, f failover) (string, bool) {
	var replica string
	for _, key := range f.shards {
		p, err := in.c.cluster.PrimaryFor(ctx, key)
		if err != nil || p == f.primary || replica != "" && p != replica {
			return "", false
		}
		replica = p
	}
	return replica, true
}

// writable reports whether a write to each shard's slot (a key of chaos'
// own beside the stream, in its hash tag) succeeds through chaos' client,
// which finds a new primary as the hosts' clients do.
func (in *injector) writable(ctx context.Context, shards []string) bool {
	for _, key := range shards {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		err := in.c.rdb.Set(wctx, key+":chaos-failover-probe", time.Now().UnixMilli(), time.Minute).Err()
		cancel()
		if err != nil {
			return false
		}
	}
	return true
}

// dur is a failover's time from the kill; 0 is one that never came.
func dur(d time.Duration) string {
	if d == 0 {
		return "never"
	}
	return d.Round(10 * time.Millisecond).String()
}

func (in *injector) postgresRestart(ctx context.Context, inj injection, rng *rand.Rand) (string, error) {
	in.pgMu.Lock()
	defer in.pgMu.Unlock()
	sig, mode := syscall.SIGINT, "fast"
	if inj.nth%2 == 1 {
		sig, mode = syscall.SIGQUIT, "immediate"
	}
	down := time.Duration(rng.Int64N(int64(1500 * time.Millisecond)))
	start := time.Now()
	if err := in.c.pg.restart(ctx, sig, down); err != nil {
		return "", fmt.Errorf("postgres did not come back: %w", err)
	}
	in.count(faultPostgresRestart, "-m "+mode)
	return fmt.Sprintf("Postgres restart -m %s, unavailable %s", mode, time.Since(start).Round(100*time.Millisecond)), nil
}

// relayDuplicate publishes copies of existing entries: what a relay that
// crashed between XADD and marking its rows published does. By turns the
// newest entries (likely still in flight) or a random stretch, of a shard
// chosen at random; the copies go to the shard they came from.
func (in *injector) relayDuplicate(ctx context.Context, inj injection, rng *rand.Rand) (string, error) {
	rdb := in.c.rdb
	key := in.c.shards[rng.IntN(len(in.c.shards))]
	n := int64(5 + rng.IntN(36))
	var msgs []redis.XMessage
	var err error
	where := "newest"
	if inj.nth%2 == 0 {
		msgs, err = rdb.XRevRangeN(ctx, key, "+", "-", n).Result()
	} else {
		where = "random"
		var first, last []redis.XMessage
		if first, err = rdb.XRangeN(ctx, key, "-", "+", 1).Result(); err == nil {
			last, err = rdb.XRevRangeN(ctx, key, "+", "-", 1).Result()
		}
		if err == nil && len(first) == 1 && len(last) == 1 {
			lo, hi := streamMillis(first[0].ID), streamMillis(last[0].ID)
			from := lo + rng.Int64N(max(hi-lo, 0)+1)
			msgs, err = rdb.XRangeN(ctx, key, strconv.FormatInt(from, 10), "+", n).Result()
		}
	}
	if err != nil {
		return "", err
	}
	if len(msgs) == 0 {
		return "", fmt.Errorf("%w: %s is empty", errNoTarget, key)
	}
	pipe := rdb.Pipeline()
	for _, m := range msgs {
		pipe.XAdd(ctx, &redis.XAddArgs{Stream: key, Values: m.Values})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return "", err
	}
	in.count(faultRelayDuplicate, where+" entries")
	in.mu.Lock()
	in.variants["relay-dup: entries published twice"] += len(msgs)
	in.mu.Unlock()
	return fmt.Sprintf("published %d %s entries of %s a second time (%s .. %s)", len(msgs), where, key, msgs[0].ID, msgs[len(msgs)-1].ID), nil
}

func streamMillis(id string) int64 {
	ms, _, _ := strings.Cut(id, "-")
	n, _ := strconv.ParseInt(ms, 10, 64)
	return n
}

// mailError makes the provider fail the next few sends: by turns before
// sending (503, 500 or 429: nothing left) or after sending (the message
// left, the client sees a 500 and retries with the same key).
func (in *injector) mailError(ctx context.Context, inj injection, rng *rand.Rand) (string, error) {
	k := 3 + rng.IntN(6)
	f := mail.Faults{FailAfterSendNext: k}
	what := fmt.Sprintf("next %d sends are made, then answered 500", k)
	variant := "failure after the send (the message left)"
	if inj.nth%2 == 0 {
		status := []int{503, 500, 429}[rng.IntN(3)]
		f = mail.Faults{FailNext: k, FailStatus: status}
		what = fmt.Sprintf("next %d sends fail with %d before sending", k, status)
		variant = "failure before the send"
	}
	if err := in.c.mailer.SetFaults(ctx, f); err != nil {
		return "", err
	}
	in.count(faultMailError, variant)
	return what, nil
}

// mailSlow holds the next few sends 2-12 s: past the reclaim threshold and
// the claim lease, some past the plugin's 10 s client timeout.
func (in *injector) mailSlow(ctx context.Context, rng *rand.Rand) (string, error) {
	k := 2 + rng.IntN(5)
	ms := 2000 + rng.IntN(10001)
	if err := in.c.mailer.SetFaults(ctx, mail.Faults{DelayNext: k, DelayMS: ms}); err != nil {
		return "", err
	}
	variant := "slower than the reclaim threshold and the claim lease"
	if ms > 10000 {
		variant = "slower than the client's 10s timeout"
	}
	in.count(faultMailSlow, variant)
	return fmt.Sprintf("next %d sends held %dms", k, ms), nil
}

// settle waits for the delayed repairs and clears every fault.
func (in *injector) settle(ctx context.Context) {
	in.recover.Wait()
	for _, h := range in.c.hosts {
		h.mu.Lock()
		p, stopped := h.p, h.stopped
		h.mu.Unlock()
		if stopped && p != nil {
			h.cont(p)
		}
	}
	for _, mp := range midJobPoints {
		_ = faults.Disarm(in.c.faultDir, mp.point)
	}
	_ = faults.Disarm(in.c.faultDir, "send.after_effect")
	if in.c.mailer != nil {
		_ = in.c.mailer.SetFaults(ctx, mail.Faults{})
	}
}
