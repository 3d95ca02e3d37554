package workflow

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// check refuses, with the limit or the rule named, every decision the host
// must not commit, before any database work.
func TestCheckRefuses(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	step := func(id, kind, payload string) *usherv1.StepCommand {
		return &usherv1.StepCommand{Id: id, Kind: kind, Payload: []byte(payload)}
	}
	many := func(n int) []*usherv1.StepCommand {
		var s []*usherv1.StepCommand
		for i := range n {
			s = append(s, step(strings.Repeat("s", 1+i%50)+string(rune('a'+i/50)), "k", `{}`))
		}
		return s
	}
	for name, tc := range map[string]struct {
		d    *usherv1.Decision
		want string
	}{
		"wait":             {&usherv1.Decision{}, ""},
		"fan-out":          {&usherv1.Decision{Steps: []*usherv1.StepCommand{step("a", "k", `{}`), step("b", "k", `{"x": 1}`)}}, ""},
		"complete":         {&usherv1.Decision{Finish: usherv1.Finish_FINISH_COMPLETE, Result: []byte(`{"ok": true}`)}, ""},
		"past timer":       {&usherv1.Decision{Timers: []*usherv1.TimerCommand{{Name: "p", FireAtUnixNanos: now.Add(-time.Hour).UnixNano()}}}, ""},
		"unknown finish":   {&usherv1.Decision{Finish: 7}, "unknown finish 7"},
		"finish and steps": {&usherv1.Decision{Finish: usherv1.Finish_FINISH_FAIL, Steps: many(1)}, "schedules no step"},
		"result, no end":   {&usherv1.Decision{Result: []byte(`1`)}, "does not finish the workflow carries a result"},
		"bad result":       {&usherv1.Decision{Finish: usherv1.Finish_FINISH_COMPLETE, Result: []byte(`{`)}, "not valid JSON"},
		"big result":       {&usherv1.Decision{Finish: usherv1.Finish_FINISH_COMPLETE, Result: []byte(`"` + strings.Repeat("x", 300<<10) + `"`)}, "wfmsg.MaxInputBytes"},
		"big reason":       {&usherv1.Decision{Finish: usherv1.Finish_FINISH_FAIL, Error: strings.Repeat("x", 3000)}, "workflow.MaxErrorBytes"},
		"too many steps":   {&usherv1.Decision{Steps: many(101)}, "wfmsg.MaxStepsPerDecision"},
		"step twice":       {&usherv1.Decision{Steps: []*usherv1.StepCommand{step("a", "k", `{}`), step("a", "k", `{}`)}}, `step "a" is scheduled twice`},
		"no step id":       {&usherv1.Decision{Steps: []*usherv1.StepCommand{step("", "k", `{}`)}}, "step id is empty"},
		"long step id":     {&usherv1.Decision{Steps: []*usherv1.StepCommand{step(strings.Repeat("i", 101), "k", `{}`)}}, "over the 100-byte limit"},
		"workflow kind":    {&usherv1.Decision{Steps: []*usherv1.StepCommand{step("a", "usher.workflow.trip", `{}`)}}, "is a workflow's decision task"},
		"no kind":          {&usherv1.Decision{Steps: []*usherv1.StepCommand{step("a", "", `{}`)}}, "has no kind"},
		"bad payload":      {&usherv1.Decision{Steps: []*usherv1.StepCommand{step("a", "k", `{`)}}, "not valid JSON"},
		"timer twice":      {&usherv1.Decision{Timers: []*usherv1.TimerCommand{{Name: "t"}, {Name: "t"}}}, `timer "t" is set twice`},
		"far timer":        {&usherv1.Decision{Timers: []*usherv1.TimerCommand{{Name: "t", FireAtUnixNanos: now.Add(400 * 24 * time.Hour).UnixNano()}}}, "workflow.MaxTimerDelay"},
	} {
		err := check(tc.d, now)
		if tc.want == "" {
			require.NoError(t, err, name)
			continue
		}
		require.ErrorContains(t, err, tc.want, name)
	}
}
