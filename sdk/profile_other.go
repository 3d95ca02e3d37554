//go:build !unix

package sdk

// profileOnSignal profiles nothing where there is no SIGUSR1.
func profileOnSignal() (stop func()) { return func() {} }
