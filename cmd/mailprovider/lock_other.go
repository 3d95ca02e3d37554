//go:build !unix

package main

import "os"

// lockFile is a no-op where flock is not available: do not point two
// processes at the same data directory there.
func lockFile(*os.File) error { return nil }
