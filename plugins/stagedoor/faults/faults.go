// Package faults lets tests, the demo and the chaos suite stop a Stagedoor
// plugin at a chosen point: stall it (so it can be killed with -9 or
// overrun its deadline), crash it, panic, or fail. The shipped plugins do
// not import it: their chaos builds (plugins/counters/chaos,
// plugins/tickets/chaos, plugins/checkout/chaos) serve the same handlers wrapped in [Middleware],
// which has a point before and after every phase of every kind:
//
//	counter.before_apply   counter.after_apply                 update_sales_counter
//	render.before_check    render.after_check    ...           render_tickets (check, prepare, commit)
//	send.before_claim      send.after_effect     ...           send_tickets (claim, effect)
//	reserve.before_check   release.after_commit  ...           reserve_seats, release_seats (check, prepare, commit)
//
// An after point fires only when the phase succeeded. It is inert unless
// the host passes the plugin USHER_FAULT_DIR; each point is a JSON file in
// that directory, read on every call so a running test can arm and disarm
// it.
//
//	{"action": "stall", "duration": "30s", "job_ids": ["17"], "once": true}
//
// Actions: stall (sleep, ctx-aware), crash (exit the process at once, as
// kill -9 would), panic, error (a transient error), permanent. job_ids
// limits the fault to those jobs; "every": N fires for one job id in N
// (by a hash, so it is the same job on every run). "once" fires once per
// job and records that in a marker file. Before acting, the point writes
// "<point>.<job id>.hit", which a test can wait for.
package faults

import (
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"time"

	"github.com/usherhq/usher/sdk"
)

// DirEnv names the fault directory.
const DirEnv = "USHER_FAULT_DIR"

// Spec is one fault point's instructions.
type Spec struct {
	Action   string   `json:"action"`
	Duration string   `json:"duration,omitempty"`
	JobIDs   []string `json:"job_ids,omitempty"`
	Every    int      `json:"every,omitempty"`
	Once     bool     `json:"once,omitempty"`
}

// ShortNames are the Stagedoor kinds' point prefixes, which [Middleware]
// uses unless told otherwise.
var ShortNames = map[string]string{
	"update_sales_counter": "counter",
	"render_tickets":       "render",
	"send_tickets":         "send",
	"reserve_seats":        "reserve",
	"release_seats":        "release",
}

// Middleware injects the armed faults around every phase of every kind of
// the plugin it is used on (sdk.Use): at <name>.before_<phase> before the
// handler's phase, and at <name>.after_<phase> when the phase succeeded.
// A fault's error is the phase's error; an after point's error drops what
// the phase did (Apply's writes, Commit's transaction, an effect's kept
// result) as the handler's own error would.
type Middleware struct {
	// Names maps a kind to its points' prefix. Default ShortNames; a kind
	// in neither uses the kind itself.
	Names map[string]string
}

var _ sdk.Middleware = Middleware{}

// Wrap runs the phase between its two points.
func (m Middleware) Wrap(ctx context.Context, call *sdk.Call, next func(context.Context) error) error {
	name := m.name(call.Kind)
	if err := At(ctx, name+".before_"+string(call.Phase), call.JobID); err != nil {
		return err
	}
	if err := next(ctx); err != nil {
		return err
	}
	return At(ctx, name+".after_"+string(call.Phase), call.JobID)
}

func (m Middleware) name(kind string) string {
	names := m.Names
	if names == nil {
		names = ShortNames
	}
	if n, ok := names[kind]; ok {
		return n
	}
	return kind
}

// At applies the fault armed for point, if any, to jobID; [Middleware]
// calls it. The files it writes are the test's markers, not an effect of
// the job, and only when the host passed USHER_FAULT_DIR.
//
//usher:no-effect test hook: writes marker files in USHER_FAULT_DIR only
func At(ctx context.Context, point, jobID string) error {
	dir := os.Getenv(DirEnv)
	if dir == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(dir, point))
	if err != nil {
		return nil
	}
	var s Spec
	if err := json.Unmarshal(b, &s); err != nil {
		return nil
	}
	if !s.matches(jobID) {
		return nil
	}
	marker := filepath.Join(dir, point+"."+jobID+".done")
	if s.Once {
		if _, err := os.Stat(marker); err == nil {
			return nil
		}
	}
	// The hit before the once marker: a process killed between the two
	// (a batch-mate's crash) fires the fault again at the next run, and
	// never leaves it spent without its hit.
	_ = os.WriteFile(filepath.Join(dir, point+"."+jobID+".hit"), []byte(fmt.Sprint(os.Getpid())), 0o644)
	if s.Once {
		_ = os.WriteFile(marker, nil, 0o644)
	}
	switch s.Action {
	case "stall":
		d, err := time.ParseDuration(s.Duration)
		if err != nil {
			d = time.Hour
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return ctx.Err()
		}
	case "crash":
		os.Exit(137)
	case "panic":
		panic(fmt.Sprintf("fault %s for job %s", point, jobID))
	case "error":
		return fmt.Errorf("fault %s: injected transient error", point)
	case "permanent":
		return sdk.Permanent(errors.New("fault " + point + ": injected permanent error"))
	}
	return nil
}

func (s Spec) matches(jobID string) bool {
	if len(s.JobIDs) > 0 {
		for _, id := range s.JobIDs {
			if id == jobID {
				return true
			}
		}
		return false
	}
	if s.Every > 1 {
		h := fnv.New32a()
		_, _ = h.Write([]byte(jobID))
		return h.Sum32()%uint32(s.Every) == 0
	}
	return true
}

// RequireChaosBuilds returns an error naming the first of the plugins
// named (default counters and tickets) in dir that is not a chaos build
// (plugins/*/chaos, read from the binary's build info): the shipped
// plugins ignore armed faults and record no counter_applies, so a run that
// arms and counts them would wait for what never comes.
func RequireChaosBuilds(dir string, names ...string) error {
	if len(names) == 0 {
		names = []string{"counters", "tickets"}
	}
	for _, name := range names {
		bin := filepath.Join(dir, name)
		info, err := buildinfo.ReadFile(bin)
		if err != nil {
			return fmt.Errorf("%s: %w", bin, err)
		}
		if info.Path != module+"/plugins/"+name+"/chaos" {
			return fmt.Errorf("%s is built from %s, not the plugin's chaos build %s/plugins/%s/chaos, which injects faults and records counter_applies (make chaos-plugins; --plugin-dir bin/chaos-plugins)",
				bin, info.Path, module, name)
		}
	}
	return nil
}

const module = "github.com/usherhq/usher"

// Arm writes spec for point into dir (for tests and the demo).
func Arm(dir, point string, s Spec) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+point+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, point))
}

// Disarm removes point's fault.
func Disarm(dir, point string) error {
	err := os.Remove(filepath.Join(dir, point))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
