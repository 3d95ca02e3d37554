package host

import "github.com/usherhq/usher/host/limits"

// KindLimitForTest returns the limits this host's limiter holds for kind
// now.
func (h *Host) KindLimitForTest(kind string) (limits.Limit, bool) { return h.limits.Limit(kind) }
