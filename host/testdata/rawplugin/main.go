// Command rawplugin is a plugin written against the protobuf contract with
// no SDK, for tests that prove the host enforces what the SDK's types
// promise. RAW_MODE picks its misbehaviour:
//
//	noguard        manifest declares raw_job without a guard
//	garbage        Invoke answers with no results
//	badoutcome     Invoke answers an unknown outcome
//	check-write    the check phase runs an UPDATE through its read-only handle
//	exec-first     the commit phase runs a plain write before any conditional write
//	enqueue-first  the commit phase enqueues before any conditional write
//	no-write-if    the commit phase makes no conditional write at all
//	stale-handle   the commit phase reuses the check phase's handle
//	panic          the process panics in Invoke (crashes)
//	hang           Invoke never returns
//	stdout         writes to stdout before the handshake
//	sql            the commit phase's conditional write is RAW_SQL
//	whoami         check and commit each query current_user and
//	               statement_timeout; the commit fails permanently with both
//	bigerror       the commit fails (transient) with a 200 KiB error
//	retry-later    the check phase asks to run later, in RAW_RETRY_MS
//	               milliseconds (any int64: 0, negative, huge)
//	workflow       the manifest also declares workflow type "raw"
//	               (usher.workflow.raw); its decision answers what the
//	               workflow's input {"answer": ...} names (decide below)
//
// RAW_PROTOCOL (comma-separated, default contract.ProtocolVersion) lists the
// protocol versions it advertises in its VersionedPlugins map. The name
// ("raw"), version ("0.0.1") and a default mode can be set at build time:
// -X main.name=counters -X main.version=2.0.0 -X main.buildMode=noguard.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/usherhq/usher/host/testdata/rawcontract"
	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

var (
	name      = "raw"
	version   = "0.0.1"
	buildMode string
	mode      = modeFromEnv()
)

func modeFromEnv() string {
	if m := os.Getenv("RAW_MODE"); m != "" {
		return m
	}
	return buildMode
}

type server struct {
	usherv1.UnimplementedPluginServer
	broker    *rawcontract.Broker
	lastCheck string
	checkedAs string
}

func (s *server) Manifest(context.Context, *usherv1.ManifestRequest) (*usherv1.ManifestResponse, error) {
	g := usherv1.Guard_GUARD_STATE_FIRST
	if mode == "noguard" {
		g = usherv1.Guard_GUARD_UNSPECIFIED
	}
	kinds := []*usherv1.KindInfo{{Kind: "raw_job", Guard: g}}
	if mode == "workflow" {
		kinds = append(kinds, &usherv1.KindInfo{Kind: contract.WorkflowKind("raw"), Guard: usherv1.Guard_GUARD_WORKFLOW})
	}
	return &usherv1.ManifestResponse{Name: name, Version: version, ProtocolVersion: contract.ProtocolVersion, Kinds: kinds}, nil
}

func (s *server) Invoke(ctx context.Context, req *usherv1.InvokeRequest) (*usherv1.InvokeResponse, error) {
	if _, err := s.broker.Host(req.GetHostBrokerId()); err != nil {
		return nil, err
	}
	switch mode {
	case "garbage":
		return &usherv1.InvokeResponse{}, nil
	case "badoutcome":
		return &usherv1.InvokeResponse{Results: []*usherv1.Result{{Outcome: 99}}}, nil
	case "panic":
		panic("rawplugin: panic in Invoke")
	case "hang":
		select {}
	}
	call := req.GetCalls()[0]
	res := s.phase(ctx, call)
	return &usherv1.InvokeResponse{Results: []*usherv1.Result{res}}, nil
}

func fail(err error) *usherv1.Result {
	return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_PERMANENT, Error: err.Error()}
}

func (s *server) exec(ctx context.Context, handle string, mode usherv1.Mode, sql string) error {
	_, err := s.broker.Client().Exec(ctx, &usherv1.ExecRequest{Handle: handle, Statements: []*usherv1.Statement{{Mode: mode, Sql: sql}}})
	return err
}

// whoami reports the role and statement timeout a handle's statements run
// under.
func (s *server) whoami(ctx context.Context, handle string) (string, error) {
	res, err := s.broker.Client().Exec(ctx, &usherv1.ExecRequest{Handle: handle, Statements: []*usherv1.Statement{{
		Mode: usherv1.Mode_MODE_QUERY, Sql: "SELECT current_user::text || ' (statement_timeout ' || current_setting('statement_timeout') || ')'"}}})
	if err != nil {
		return "", err
	}
	return res.GetResults()[0].GetRows()[0].GetValues()[0].GetText(), nil
}

func (s *server) phase(ctx context.Context, call *usherv1.Call) *usherv1.Result {
	ok := &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK}
	switch call.GetPhase() {
	case usherv1.Phase_PHASE_DECIDE:
		return decide(call.GetWorkflow())
	case usherv1.Phase_PHASE_CHECK:
		s.lastCheck = call.GetHandle()
		if mode == "retry-later" {
			ms, err := strconv.ParseInt(os.Getenv("RAW_RETRY_MS"), 10, 64)
			if err != nil {
				return fail(err)
			}
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_RETRY_LATER, RetryAfterMs: ms, Error: "not yet"}
		}
		if mode == "whoami" {
			who, err := s.whoami(ctx, call.GetHandle())
			if err != nil {
				return fail(err)
			}
			s.checkedAs = who
		}
		if mode == "check-write" {
			if err := s.exec(ctx, call.GetHandle(), usherv1.Mode_MODE_QUERY, "UPDATE events SET seats_sold = seats_sold + 1000"); err != nil {
				return fail(err)
			}
		}
		return ok
	case usherv1.Phase_PHASE_PREPARE:
		return ok
	case usherv1.Phase_PHASE_COMMIT:
		var err error
		switch mode {
		case "exec-first":
			err = s.exec(ctx, call.GetHandle(), usherv1.Mode_MODE_EXEC, "UPDATE events SET seats_sold = seats_sold + 1000")
		case "enqueue-first":
			_, err = s.broker.Client().Enqueue(ctx, &usherv1.EnqueueRequest{Handle: call.GetHandle(),
				Messages: []*usherv1.OutboxMessage{{Kind: "raw_job", Payload: []byte(`{}`)}}})
		case "stale-handle":
			err = s.exec(ctx, s.lastCheck, usherv1.Mode_MODE_QUERY, "SELECT 1")
		case "no-write-if":
			err = s.exec(ctx, call.GetHandle(), usherv1.Mode_MODE_QUERY, "SELECT 1")
		case "sql":
			err = s.exec(ctx, call.GetHandle(), usherv1.Mode_MODE_WRITE_IF, os.Getenv("RAW_SQL"))
		case "bigerror":
			return &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_ERROR,
				Error: "big error: " + strings.Repeat("0123456789abcdef", 200<<10/16)}
		case "whoami":
			who, werr := s.whoami(ctx, call.GetHandle())
			if werr != nil {
				return fail(werr)
			}
			return fail(fmt.Errorf("check ran as %s; commit ran as %s", s.checkedAs, who))
		default:
			err = s.exec(ctx, call.GetHandle(), usherv1.Mode_MODE_WRITE_IF, "UPDATE events SET seats_sold = seats_sold WHERE false RETURNING id")
		}
		if err != nil {
			return fail(err)
		}
		return ok
	}
	return fail(fmt.Errorf("unexpected phase %v", call.GetPhase()))
}

// decide answers a raw workflow's decision with what its input's "answer"
// names: garbage (an unknown finish), writes (a decision carrying
// writes), far-timer (a timer two years ahead), many-timers (101 timers),
// past-timer (a timer an hour before the decision's clock, then complete
// once it fired), reuse-step (a step id scheduled again after it ended),
// hang (never answers).
func decide(h *usherv1.WorkflowHistory) *usherv1.Result {
	var in struct {
		Answer string `json:"answer"`
	}
	_ = json.Unmarshal(h.GetInput(), &in)
	now := h.GetNowUnixNanos()
	fired, stepped := false, false
	for _, e := range h.GetEvents() {
		fired = fired || e.GetType() == "timer_fired"
		stepped = stepped || e.GetType() == "step_completed" || e.GetType() == "step_failed"
	}
	d := &usherv1.Decision{}
	res := &usherv1.Result{Outcome: usherv1.Outcome_OUTCOME_OK, Decision: d}
	switch in.Answer {
	case "garbage":
		d.Finish = 99
	case "hang":
		select {}
	case "writes":
		res.Writes = []*usherv1.Statement{{Mode: usherv1.Mode_MODE_EXEC, Sql: "DELETE FROM workflows"}}
	case "far-timer":
		d.Timers = []*usherv1.TimerCommand{{Name: "far", FireAtUnixNanos: now + int64(2*365*24*time.Hour)}}
	case "many-timers":
		for i := range 101 {
			d.Timers = append(d.Timers, &usherv1.TimerCommand{Name: fmt.Sprint("t", i), FireAtUnixNanos: now})
		}
	case "past-timer":
		if fired {
			d.Finish = usherv1.Finish_FINISH_COMPLETE
		} else if len(h.GetEvents()) == 1 {
			d.Timers = []*usherv1.TimerCommand{{Name: "past", FireAtUnixNanos: now - int64(time.Hour)}}
		}
	case "reuse-step":
		if len(h.GetEvents()) == 1 || stepped {
			d.Steps = []*usherv1.StepCommand{{Id: "once", Kind: "raw_job", Payload: []byte(`{}`)}}
		}
	}
	return res
}

func main() {
	if mode == "stdout" {
		fmt.Println("hello from a plugin that should not print here")
	}
	var versions []int
	for _, v := range strings.Split(os.Getenv("RAW_PROTOCOL"), ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
			versions = append(versions, n)
		}
	}
	rawcontract.Serve(func(b *rawcontract.Broker) usherv1.PluginServer { return &server{broker: b} }, versions...)
}
