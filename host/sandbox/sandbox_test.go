package sandbox

import "testing"

// Only names already in their role's form are accepted, so no two plugins
// share a role.
func TestCheckPluginName(t *testing.T) {
	for _, ok := range []string{"counters", "tickets", "a", "x_2", "latecomer0a1b2c"} {
		if err := CheckPluginName(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Tickets", "TICKETS", "tick-ets", "2fast", "_x", "tickets ", "ünï",
		"a234567890123456789012345678901234567890123456789012"} {
		if err := CheckPluginName(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
