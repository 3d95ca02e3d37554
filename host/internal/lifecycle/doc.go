// Package lifecycle gives every host service one shape: a named Run(ctx)
// that blocks until ctx is done, grouped in ordered phases that a Group starts
// phase by phase and stops in reverse.
//
// It owns: the start order (phase N+1 starts once every service of phase N
// is started), the stop order (reverse phases, each phase's goroutines ended
// before the previous phase is cancelled), every goroutine it starts (Run
// returns only after all of them ended), and turning a service's failure or
// panic into an error that names the service and stops all the others.
//
// It must not: log, retry or restart a service, time out a stop (a service
// that ignores its ctx hangs Run, visibly, in a goroutine dump), keep global
// state, or know what any service does. Goroutines a service starts itself
// belong to that service: it tracks them in a Tasks and waits for them before
// its Run returns.
package lifecycle
