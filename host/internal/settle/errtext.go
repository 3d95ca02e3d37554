package settle

import (
	"fmt"
	"unicode/utf8"

	"github.com/usherhq/usher/host/deadletter"
)

// A handler's error can be as long as a plugin's answer (contract.MaxMessageBytes).
// It is stored once, whole up to maxStoredError (last_error, or the
// scheduled run's reason); every other copy (a dead letter's reason and
// history, log lines) is cut to maxShortError.
const (
	maxStoredError = 64 << 10
	maxShortError  = 512
)

// StoredError is s as stored: valid text, cut at maxStoredError with a
// note of its full length.
func StoredError(s string) string {
	return clip(deadletter.Text(s), maxStoredError, "… (truncated; %d bytes in all)")
}

// ShortError is s as logged or repeated: valid text, cut at maxShortError.
func ShortError(s string) string { return clip(deadletter.Text(s), maxShortError, "… (%d bytes)") }

// clip cuts s to at most n bytes on a rune boundary and appends note,
// formatted with len(s).
func clip(s string, n int, note string) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf(note, len(s))
}
