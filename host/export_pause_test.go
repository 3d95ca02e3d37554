package host

// KindPausedForTest reports whether this host's pause watcher holds kind
// paused now.
func (h *Host) KindPausedForTest(kind string) bool { return h.pauses.Paused(kind) }
