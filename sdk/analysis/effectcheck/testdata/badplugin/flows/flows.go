// Package flows registers workflows whose decisions reach the world, beside
// clean ones.
package flows

import (
	"context"
	"os"
	"time"

	"github.com/usherhq/usher/sdk"
	"github.com/usherhq/usher/sdk/analysis/effectcheck/testdata/badplugin/audit"
	"github.com/usherhq/usher/sdk/analysis/effectcheck/testdata/badplugin/flowlib"
)

// clocked reads the machine's clock: time is the history's Now.
func clocked(_ context.Context, h sdk.WorkflowHistory[flowlib.Trip]) (sdk.Decision, error) { // want clocked:`impure: clock read time.Since`
	if time.Since(h.Now) > time.Hour { // want `flows.clocked \(HandleWorkflow\): a decision reaches a clock read: time.Since`
		return sdk.Fail("late"), nil
	}
	return sdk.Decision{Timers: []sdk.Timer{{Name: "grace", After: time.Minute}}}, nil
}

// Register registers the workflows.
func Register(p *sdk.Plugin) { // want Register:`effect: marked effect audit.Record -> //usher:effect`
	sdk.HandleWorkflow(p, "clocked", clocked)
	sdk.HandleWorkflow(p, "audited", func(_ context.Context, h sdk.WorkflowHistory[flowlib.Trip]) (sdk.Decision, error) {
		audit.Record("decided " + h.ID) // want `a decision literal \(HandleWorkflow\): a decision reaches a marked effect: audit.Record -> //usher:effect`
		return sdk.Decision{}, nil
	})
	sdk.HandleWorkflow(p, "opened", flowlib.Decide) // want `flowlib.Decide \(HandleWorkflow\): a decision reaches a database call: flowlib.Decide -> sql.Open`
	sdk.HandleWorkflow(p, "clean", flowlib.Clean,
		sdk.AcceptMigration(func(_ context.Context, h sdk.WorkflowHistory[flowlib.Trip], from string) error {
			return os.WriteFile("/tmp/migrated-"+h.ID, []byte(from), 0o600) // want `a decision literal \(AcceptMigration\): a decision reaches a file write: os.WriteFile`
		}))
}
