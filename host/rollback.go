package host

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/usherhq/usher/host/guard"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/swaps"
)

// Automatic rollback: a swap checks only that the new version starts and
// answers. What it does with jobs is judged afterwards, for
// Config.RollbackWindow: the version it replaced stays restartable from its
// verified binary, and if the new one crash-loops, or fails
// Config.RollbackFailureShare of its first Config.RollbackMinJobs jobs or
// more with errors (abandoned runs, crashes, transient errors; not the
// jobs' own permanent failures or the retries a handler asked for), the
// host swaps back by itself. The manifest rolled back from is refused
// until it changes, as a refused swap is: the watcher does not try it
// again behind the operator's back.

// Rollback causes, the label of usher_plugin_rollbacks_total.
const (
	rollbackCrashLoop = "crash_loop"
	rollbackFailures  = "failures"
	rollbackCrashes   = "crashes"
	rollbackRequested = "requested"
)

// previous is the version a swap replaced: how to start it again.
type previous struct {
	pcfg    pluginhost.Config
	file    *pluginhost.DirPlugin
	version string
}

// probation is the judgement of a version just swapped in.
type probation struct {
	version      string
	since, until time.Time
	jobs, failed atomic.Int64
	// decided: a rollback was asked for; the version is judged once.
	decided atomic.Bool
}

// RollbackStatus is a plugin's last rollback.
type RollbackStatus struct {
	At   time.Time `json:"at"`
	From string    `json:"from"`
	To   string    `json:"to"`
	// Cause is crash_loop, failures, crashes (an entry crashed the new
	// version PoisonCrashes times) or requested (plugins rollback).
	Cause  string `json:"cause"`
	Reason string `json:"reason"`
}

// judge counts a job's verdict against its plugin's version on probation.
// start is when the job was taken: a job that started before the swap ran
// on the old version, or partly, and says nothing of the new one.
func (h *Host) judge(ctx context.Context, rt route, start time.Time, out guard.Outcome) {
	if rt.l == nil || ctx.Err() != nil {
		return
	}
	h.mu.RLock()
	p := rt.l.prob
	h.mu.RUnlock()
	if p == nil || start.Before(p.since) || time.Now().After(p.until) || p.decided.Load() {
		return
	}
	failed := p.failed.Load()
	if out.Verdict == guard.Abandoned || (out.Verdict == guard.Retry && out.Err != nil) {
		failed = p.failed.Add(1)
	}
	jobs := p.jobs.Add(1)
	if jobs < int64(h.cfg.RollbackMinJobs) || float64(failed) < h.cfg.RollbackFailureShare*float64(jobs) {
		return
	}
	h.autoRollback(rt.l.name, p, rollbackFailures, fmt.Sprintf("%d of its first %d jobs failed with errors (crashes, abandoned runs, transient errors) within %s of the swap",
		failed, jobs, time.Since(p.since).Round(time.Millisecond)))
}

// onUnhealthy is the supervisor's news of a crash loop.
func (h *Host) onUnhealthy(name string, m pluginhost.Manifest) {
	h.mu.RLock()
	var p *probation
	if l := h.plugins[name]; l != nil {
		p = l.prob
	}
	h.mu.RUnlock()
	if p == nil || p.version != m.Version || time.Now().After(p.until) {
		return
	}
	h.autoRollback(name, p, rollbackCrashLoop, fmt.Sprintf("it crash-looped (marked unhealthy) %s after the swap",
		time.Since(p.since).Round(time.Millisecond)))
}

// probationOf returns the probation of the version serving kind, if it is
// on probation now.
func (h *Host) probationOf(kind string) (string, *probation) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	rt, ok := h.routes[kind]
	if !ok || rt.l == nil || rt.l.prob == nil || time.Now().After(rt.l.prob.until) {
		return "", nil
	}
	return rt.l.name, rt.l.prob
}

// autoRollback rolls plugin name back from the version on probation p, in
// the background (it is decided on a job's path), once.
func (h *Host) autoRollback(name string, p *probation, cause, reason string) {
	if !p.decided.CompareAndSwap(false, true) {
		return
	}
	h.mu.RLock()
	ctx := h.runCtx
	h.mu.RUnlock()
	if ctx == nil || ctx.Err() != nil {
		return // stopping: the next start loads what the directory says
	}
	h.log.Warn("plugin version on probation fails; rolling back", "plugin", name, "version", p.version, "cause", cause, "reason", reason)
	go func() {
		h.reloadMu.Lock()
		defer h.reloadMu.Unlock()
		if _, err := h.rollback(context.WithoutCancel(ctx), name, p, cause, reason); err != nil {
			h.log.Error("automatic rollback failed; the new version keeps serving", "plugin", name, "version", p.version, "err", err)
		}
	}()
}

// Rollback swaps plugin name back to the version its last swap replaced,
// on request, and refuses the manifest it rolls back from until that
// changes (or a reload asks for it). A plugin that was not swapped since it
// loaded, or was rolled back already, has nothing to roll back to.
func (h *Host) Rollback(ctx context.Context, name string) (ReloadResult, error) {
	h.reloadMu.Lock()
	defer h.reloadMu.Unlock()
	return h.rollback(ctx, name, nil, rollbackRequested, "asked for (plugins rollback)")
}

// rollback swaps name back to its previous version; when p is set, only if
// that probation is still the plugin's (no swap came in between). The
// caller holds reloadMu.
func (h *Host) rollback(ctx context.Context, name string, p *probation, cause, reason string) (ReloadResult, error) {
	h.mu.RLock()
	l := h.plugins[name]
	var prev *previous
	var from *pluginhost.DirPlugin
	if l != nil {
		prev, from = l.prev, l.file
	}
	current := l != nil && (p == nil || l.prob == p)
	h.mu.RUnlock()
	switch {
	case l == nil:
		return ReloadResult{}, fmt.Errorf("host: no plugin %q is loaded", name)
	case !current:
		return ReloadResult{}, errors.New("host: another swap replaced the version on probation; not rolled back")
	case prev == nil:
		return ReloadResult{}, fmt.Errorf("host: plugin %s has no previous version to roll back to (none since it loaded, or rolled back already)", name)
	}
	res := ReloadResult{Plugin: name, From: l.sup.Manifest().Version, To: prev.version}
	sw, err := h.swapIn(ctx, l, prev.pcfg, prev.file, false)
	if err != nil {
		return res, fmt.Errorf("host: roll back %s to %s: %w", name, prev.version, err)
	}
	res.Action, res.StartTime, res.Drained, res.DrainTime = "rolled back", sw.StartTime, sw.Drained, sw.DrainTime
	st := &RollbackStatus{At: time.Now().UTC(), From: sw.From.Version, To: sw.To.Version, Cause: cause, Reason: reason}
	h.mu.Lock()
	l.lastRollback = st
	if from != nil {
		h.refusedManifests[name] = refusedManifest{p: *from, reason: fmt.Sprintf("rolled back from %s to %s (%s): %s", st.From, st.To, cause, reason)}
	}
	h.mu.Unlock()
	h.metrics.rollbacks.WithLabelValues(name, cause).Inc()
	sha := ""
	if prev.file != nil {
		sha = prev.file.Manifest.SHA256
	}
	h.recordSwap(ctx, swaps.Swap{Plugin: name, Action: swaps.RolledBack, From: st.From, To: st.To, Cause: cause, Reason: reason, SHA256: sha})
	h.log.Error("plugin rolled back; the version rolled back from is refused until its manifest changes or a reload asks for it",
		"plugin", name, "from", st.From, "to", st.To, "cause", cause, "reason", reason, "start_time", sw.StartTime, "drain_time", sw.DrainTime)
	return res, nil
}
