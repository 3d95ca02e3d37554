package host

import "github.com/usherhq/usher/host/limits"

// KindPausedForTest reports whether this host's pause watcher holds kind
// paused now.
func (h *Host) KindPausedForTest(kind string) bool { return h.pauses.Paused(kind) }

// KindLimitForTest returns the limits this host's limiter holds for kind
// now.
func (h *Host) KindLimitForTest(kind string) (limits.Limit, bool) { return h.limits.Limit(kind) }
