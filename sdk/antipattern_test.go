package sdk_test

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The anti-pattern of the reference text (check in one transaction, effect
// in another) cannot be written against the SDK: each attempt is a compile
// error. testdata/antipattern holds the attempts.
func TestAntiPatternDoesNotCompile(t *testing.T) {
	t.Parallel()
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-gcflags=-e", "-o", filepath.Join(t.TempDir(), "antipattern"), "./testdata/antipattern")
	cmd.Dir = filepath.Dir(file)
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "the anti-pattern compiled:\n%s", out)
	for what, msg := range map[string]string{
		"write in the check phase":           "db.Exec undefined (type *sdk.ReadOnly has no field or method Exec)",
		"plain write without WriteIf":        "tx.Exec undefined (type *sdk.CommitTx has no field or method Exec)",
		"enqueue without a won write":        "tx.Enqueue undefined (type *sdk.CommitTx has no field or method Enqueue)",
		"a per-attempt key":                  "cannot refer to unexported field value in struct literal of type sdk.IdempotencyKey",
		"a handler registered with no guard": "undefined: sdk.Handle",
	} {
		require.Contains(t, string(out), msg, "%s must not compile", what)
	}
	require.Equal(t, 2, strings.Count(string(out), "db.Exec undefined"), "neither the check nor the effect phase can write")
}
