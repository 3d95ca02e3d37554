package pluginhost

import (
	"context"
	"fmt"
	"math"

	"golang.org/x/sync/semaphore"
)

// A Gate lets the calls to one plugin's process run together, or one job's
// calls run with nothing else in flight (Alone): a crash then is that
// job's own doing.
//
// A job holds the gate for its whole run (Hold), before it takes any of
// the plugin's database connections, not once per call. Taken per call,
// a job that had opened its transaction waited at the gate for its next
// phase behind a job waiting to run alone, which waited for a job in
// flight, whose check needed the connection the first job held: a cycle
// that only the statement timeout and the job's deadline broke (and the
// hang limit then killed a healthy plugin). Waiting is bounded by ctx.
type Gate struct{ sem *semaphore.Weighted }

// gateAll is an alone job's weight: every other holder's and more.
const gateAll = math.MaxInt32

// NewGate returns an open gate.
func NewGate() *Gate { return &Gate{sem: semaphore.NewWeighted(gateAll)} }

type heldKey struct{}

// Hold waits until ctx's job may call the plugin (every other holder gone
// when ctx is marked Alone; no alone job holding or waiting otherwise) and
// returns ctx marked as holding g, and the release. A ctx already holding
// g holds it again at no cost.
func (g *Gate) Hold(ctx context.Context) (context.Context, func(), error) {
	if ctx.Value(heldKey{}) == g {
		return ctx, func() {}, nil
	}
	n, what := int64(1), "for a job running alone on the plugin's process"
	if IsAlone(ctx) {
		n, what = gateAll, "to run alone on the plugin's process"
	}
	if err := g.sem.Acquire(ctx, n); err != nil {
		return ctx, nil, fmt.Errorf("waited %s until %w", what, context.Cause(ctx))
	}
	return context.WithValue(ctx, heldKey{}, g), func() { g.sem.Release(n) }, nil
}
