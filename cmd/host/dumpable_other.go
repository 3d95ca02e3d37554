//go:build !linux

package main

// undumpable does nothing where there is no prctl; run plugins as other
// OS users there (--plugin-user).
func undumpable() error { return nil }
