package badplugin

import (
	"testing"

	"github.com/usherhq/usher/sdk"
)

// A test may build the key the host would grant.
func TestKey(t *testing.T) {
	if !sdk.KeyForTest("order-1").Valid() {
		t.Fatal("invalid key")
	}
}
