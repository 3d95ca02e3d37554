// Package wfmsg holds the limits of a workflow, shared by the host (which
// refuses a decision over one), the application's client (which checks
// before a round trip) and the migration's SQL functions (which restate
// them for callers in other languages). Every refusal names its limit.
package wfmsg

import (
	"encoding/json"
	"fmt"
)

// Limits. A start, a signal or a decision over one is refused with an
// error that names it; nothing is ever truncated.
const (
	// MaxTypeBytes bounds a workflow type, a signal's name, a step's id
	// and a timer's name.
	MaxTypeBytes = 100
	// MaxIDBytes bounds a workflow id and a signal id.
	MaxIDBytes = 256
	// MaxInputBytes bounds a workflow's input and its result.
	MaxInputBytes = 256 << 10
	// MaxSignalBytes bounds a signal's payload; MaxStepResultBytes the
	// result a step's handler records.
	MaxSignalBytes     = 64 << 10
	MaxStepResultBytes = 64 << 10
	// MaxEvents bounds a workflow's history.
	MaxEvents = 10000
	// MaxSteps bounds the steps of one workflow, over its whole life.
	MaxSteps = 1000
	// MaxStepsPerDecision and MaxTimersPerDecision bound one decision.
	MaxStepsPerDecision  = 100
	MaxTimersPerDecision = 100
	// MaxTimers bounds the timers of one workflow, over its whole life.
	MaxTimers = 1000
	// MaxChildren bounds the child workflows one workflow starts, over its
	// whole life (each is one of its steps too).
	MaxChildren = 100
)

// CheckStart refuses a start the host would refuse.
func CheckStart(typ, id string, input []byte) error {
	if err := checkName("workflow type", typ, MaxTypeBytes, "MaxTypeBytes"); err != nil {
		return err
	}
	if err := checkName("workflow id", id, MaxIDBytes, "MaxIDBytes"); err != nil {
		return err
	}
	if len(input) > MaxInputBytes {
		return fmt.Errorf("%s workflow %s input of %d bytes is over the %d-byte limit (wfmsg.MaxInputBytes)", typ, id, len(input), MaxInputBytes)
	}
	if !json.Valid(input) {
		return fmt.Errorf("%s workflow %s input is not valid JSON", typ, id)
	}
	return nil
}

// CheckSignal refuses a signal the host would refuse.
func CheckSignal(signalID, name string, payload []byte) error {
	if err := checkName("signal id", signalID, MaxIDBytes, "MaxIDBytes"); err != nil {
		return err
	}
	if err := checkName("signal name", name, MaxTypeBytes, "MaxTypeBytes"); err != nil {
		return err
	}
	if len(payload) > MaxSignalBytes {
		return fmt.Errorf("signal %s payload of %d bytes is over the %d-byte limit (wfmsg.MaxSignalBytes)", name, len(payload), MaxSignalBytes)
	}
	if !json.Valid(payload) {
		return fmt.Errorf("signal %s payload is not valid JSON", name)
	}
	return nil
}

// CheckName refuses an empty name (of what) or one over max bytes.
func CheckName(what, s string, max int) error {
	return checkName(what, s, max, "")
}

func checkName(what, s string, max int, limit string) error {
	if s == "" {
		return fmt.Errorf("the %s is empty", what)
	}
	if len(s) > max {
		if limit != "" {
			return fmt.Errorf("the %s of %d bytes is over the %d-byte limit (wfmsg.%s)", what, len(s), max, limit)
		}
		return fmt.Errorf("the %s of %d bytes is over the %d-byte limit", what, len(s), max)
	}
	return nil
}
