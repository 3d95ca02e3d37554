package pipeline

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/usherhq/usher/host/deadletter"
	"github.com/usherhq/usher/host/internal/route"
	"github.com/usherhq/usher/host/internal/settle"
	"github.com/usherhq/usher/host/outcome"
	"github.com/usherhq/usher/host/pluginhost"
	"github.com/usherhq/usher/host/stream"
	"github.com/usherhq/usher/internal/entry"
)

// Dead-letter causes decided before any plugin sees the entry.
const (
	causeBadInput = "bad_input"
	causeForged   = "forged"
	// causeWaitForKind is refuse's verdict on an entry whose kind no
	// plugin here serves and which is younger than UnknownKindWait: not a
	// dead letter, a wait for a host that serves it (the new kind of a
	// rolling deploy).
	causeWaitForKind = "wait_for_kind"
)

// refuse checks what can be checked before any plugin sees the entry and
// returns the dead letter's cause and reason, causeWaitForKind to leave it
// pending (see unknownKind), or "" to run it. The signature comes first:
// an entry no relay of this cluster signed is forged whatever else it
// holds, and nothing it claims (its job id, its outbox id) is trusted.
func (p *Pipeline) refuse(e stream.Entry) (cause, reason string) {
	if e.Cut {
		// Only prefixes were read: nothing can verify it, and no relay
		// of ours publishes an entry this large (outbox.Add refuses the
		// payload), so it is handled as a forgery would be.
		return causeForged, fmt.Sprintf("entry %s of %d bytes is over the %d-byte limit and cannot be verified: no relay of this cluster publishes one (%v)",
			e.StreamID, e.Size, entry.MaxBytes, e.Err)
	}
	if !e.Signed.Verify(p.cfg.Key, e.Sig) {
		why := "its signature does not match its fields"
		if e.Sig == "" {
			why = "it has no signature"
		}
		return causeForged, fmt.Sprintf("entry %s is not signed by a relay of this cluster: forged or altered (%s; it claims job %.64q, outbox id %.32q, kind %.64q)",
			e.StreamID, why, e.JobID, e.Signed.OutboxID, e.Kind)
	}
	if e.Err != nil {
		return causeBadInput, "malformed entry: " + e.Err.Error()
	}
	if e.Size > entry.MaxBytes {
		return causeBadInput, fmt.Sprintf("entry of %d bytes exceeds the %d-byte limit", e.Size, entry.MaxBytes)
	}
	if _, known := p.cfg.Routes.Get(e.Kind); !known {
		return p.unknownKind(e) // waits for a host that serves it, up to UnknownKindWait
	}
	if !json.Valid(e.Payload) {
		return causeBadInput, fmt.Sprintf("payload of %s job %s is not valid JSON", e.Kind, e.JobID)
	}
	return "", ""
}

// unknownKind decides on an entry whose kind no loaded plugin serves: it
// waits while younger than UnknownKindWait, then is dead-lettered.
func (p *Pipeline) unknownKind(e stream.Entry) (cause, reason string) {
	served := strings.Join(p.cfg.Routes.Kinds(), ", ")
	if p.cfg.UnknownKindWait < 0 {
		return causeBadInput, fmt.Sprintf("unknown kind %q: no loaded plugin serves it (served: %s)", e.Kind, served)
	}
	age, ok := EntryAge(e.StreamID, time.Now())
	if ok && age < p.cfg.UnknownKindWait {
		return causeWaitForKind, ""
	}
	return causeBadInput, fmt.Sprintf("unknown kind %q: no host served it within UnknownKindWait (%s; the entry is %s old): deploy a plugin that serves it, then requeue (served here: %s)",
		e.Kind, p.cfg.UnknownKindWait, age.Round(time.Second), served)
}

// EntryAge is how long ago the stream entry id was added (its millisecond
// timestamp).
func EntryAge(id string, now time.Time) (time.Duration, bool) {
	ms, _, found := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !found || err != nil {
		return 0, false
	}
	return now.Sub(time.UnixMilli(n)), true
}

// waitForKind leaves the entry pending with its delivery given back (it
// does not count towards MaxDeliveries), and has the wait recorded on its
// outbox row (settle.Settler.WaitedForKind). The reclaimer of whichever
// host takes it next, within ReclaimIdle, runs it if that host serves the
// kind, or makes it wait again.
func (p *Pipeline) waitForKind(ctx context.Context, e stream.Entry) {
	p.cfg.Metrics.WaitedForKind.WithLabelValues(e.Kind).Inc()
	first, err := p.cfg.Settler.WaitedForKind(ctx, e.OutboxID, e.Kind)
	if err != nil {
		p.log.Warn("could not record an entry's wait for its kind", "stream_id", e.StreamID, "outbox_id", e.OutboxID, "err", err)
	}
	n, ok := p.giveBack(ctx, e)
	if !ok {
		return
	}
	log := p.log.Debug
	if first {
		log = p.log.Info
	}
	log("no plugin here serves the entry's kind: it waits for a host that does", "stream_id", e.StreamID,
		"job_id", e.JobID, "kind", e.Kind, "deliveries", n, "unknown_kind_wait", p.cfg.UnknownKindWait)
}

// poison dead-letters e after n crashes; crash is the last (nil when the
// count was reached earlier and its letter not written then).
//
// Poison entries: an entry whose run crashes its plugin's process would,
// left pending, crash it at every redelivery, and a crash loop parks
// every job of the plugin. Every call in flight on a process that crashes
// is charged one crash; an entry charged once runs alone on the plugin
// from then on (pluginhost.Alone), so its next crash is its own: an
// innocent entry caught in a poison entry's crash is charged once, runs
// alone, succeeds and is cleared; the poison entry is charged at every
// run, and dead-lettered at PoisonCrashes.
//
// A version on probation (just swapped in) that an entry crashes this often is
// suspected first: the fleet is told (and rolls it back), and the entry
// keeps one crash short of the limit, to run alone on the version before,
// which dead-letters it if it crashes that one too.
func (p *Pipeline) poison(ctx context.Context, e stream.Entry, d *settle.Delivery, rt route.Route, n int64, crash *pluginhost.CrashError) step {
	last := "counted earlier"
	if crash != nil {
		last = crash.Error()
	}
	if p.cfg.Fleet.OnProbation(e.Kind) {
		p.cfg.Fleet.Observe(Observation{Plugin: rt.Name, Kind: e.Kind, JobID: e.JobID, Start: time.Now(), Crashes: n, Last: settle.ShortError(last)})
		if err := p.cfg.Pending.SetCrashes(ctx, e, int64(p.cfg.PoisonCrashes-1)); err != nil {
			p.log.Warn("could not set back an entry's crash count", "stream_id", e.StreamID, "err", err)
		}
		p.redispatch(e, rt)
		return pending
	}
	reason := fmt.Sprintf("poison: its runs crashed the plugin's process %d times (max %d; last: %s); dead-lettered so the plugin's other jobs go on",
		n, p.cfg.PoisonCrashes, last)
	s := p.deadLetter(ctx, e, d, "poison", reason, "")
	if s.ack {
		p.clearCrashes(ctx, e)
	}
	return s
}

// deadLetter has the entry's dead letter committed; only then may it be
// acked. lastErr (reason when empty) is the full error, stored once in
// last_error; the reason, the history and the log line carry it cut short.
// An entry refused before any plugin saw it (e.Err) keeps its fields'
// bytes as received in raw; its text columns hold them escaped. d is nil
// for a forged entry, which is no job's delivery.
func (p *Pipeline) deadLetter(ctx context.Context, e stream.Entry, d *settle.Delivery, cause, reason, lastErr string) step {
	if lastErr == "" {
		lastErr = reason
	}
	reason = settle.ShortError(reason)
	hist, _ := json.Marshal([]map[string]any{{
		"at": time.Now().UTC(), "consumer": p.cfg.Consumer, "deliveries": e.Deliveries, "attempt": e.Attempt, "error": settle.ShortError(lastErr),
	}})
	jobID := deadletter.Text(e.JobID)
	if jobID == "" {
		jobID = "entry:" + e.StreamID
	}
	kind := deadletter.Text(e.Kind)
	if kind == "" {
		kind = "(none)"
	}
	if cause == causeForged {
		// Never under the identity or kind it claims: those belong to a
		// real job, and a requeue by kind must not pick it up; and no
		// outcome on the outbox row whose id it claims, which would let
		// that real job rest unrun.
		jobID, kind = "forged:"+e.StreamID, deadletter.ForgedKind
	}
	if d != nil {
		d.Record.JobID, d.Record.Kind = jobID, kind
		d.Verdict(outcome.DeadLettered, cause+": "+reason, lastErr)
	}
	var raw []deadletter.RawField
	if e.Err != nil {
		raw = make([]deadletter.RawField, 0, len(e.Fields))
		for _, f := range e.Fields {
			raw = append(raw, deadletter.RawField{Name: []byte(f.Name), Value: []byte(f.Value), NameBytes: f.NameLen, ValueBytes: f.ValueLen})
		}
	}
	err := p.cfg.Settler.DeadLetter(ctx, d, deadletter.Letter{
		JobID: jobID, Kind: kind, Payload: e.Payload, RequestID: e.RequestID, Trace: e.Trace,
		Reason: reason, LastError: settle.StoredError(lastErr), Attempts: e.Attempt + 1, StreamID: e.StreamID, History: hist, Raw: raw,
		Priority: e.Priority,
	})
	if err != nil {
		p.log.Error("could not write dead letter; entry left pending", "stream_id", e.StreamID, "err", err)
		return pending
	}
	// A kind no plugin serves is whatever the entry said: one series
	// for all of them, not one per hostile string.
	label := "(unknown)"
	if _, known := p.cfg.Routes.Get(e.Kind); known {
		label = e.Kind
	}
	p.cfg.Metrics.DeadLetters.WithLabelValues(label, cause).Inc()
	p.cfg.Metrics.Jobs.WithLabelValues(label, "dead_letter").Inc()
	p.log.Warn("job dead-lettered", "job_id", settle.ShortError(jobID), "kind", settle.ShortError(kind), "stream_id", e.StreamID,
		"cause", cause, "reason", reason)
	return settled(outcome.DeadLettered)
}
