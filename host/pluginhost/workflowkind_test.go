package pluginhost

import (
	"testing"

	"github.com/stretchr/testify/require"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// The workflow guard serves exactly the workflow kinds: a decision task is
// never run as an effect's guard, and no effect's kind as a decision.
func TestWorkflowKindsAndGuardGoTogether(t *testing.T) {
	t.Parallel()
	m := func(kind string, g usherv1.Guard) *usherv1.ManifestResponse {
		return &usherv1.ManifestResponse{Name: "p", Version: "1", Kinds: []*usherv1.KindInfo{{Kind: kind, Guard: g}}}
	}
	_, err := checkManifest(m("usher.workflow.trip", usherv1.Guard_GUARD_WORKFLOW))
	require.NoError(t, err)
	_, err = checkManifest(m("usher.workflow.trip", usherv1.Guard_GUARD_JOB_ID))
	require.ErrorContains(t, err, `declares kind "usher.workflow.trip" under GUARD_JOB_ID: the workflow guard serves exactly the kinds usher.workflow.<type>`)
	_, err = checkManifest(m("trip", usherv1.Guard_GUARD_WORKFLOW))
	require.ErrorContains(t, err, `declares kind "trip" under GUARD_WORKFLOW`)
}
