package counter_test

import (
	"testing"

	"github.com/usherhq/usher/host/hosttest"
)

// The package's databases (sdktest's) are copies of one migrated template.
func TestMain(m *testing.M) { hosttest.Main(m) }
