//go:build unix

package sdk

import (
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"

	"github.com/usherhq/usher/internal/contract"
)

// profileOnSignal, when contract.CPUProfileEnv names a file, profiles the
// plugin's CPU into it from one SIGUSR1 to the next; the returned stop
// writes a profile still running (the host stopped the plugin first).
func profileOnSignal() (stop func()) {
	path := os.Getenv(contract.CPUProfileEnv)
	if path == "" {
		return func() {}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	stopped := make(chan struct{})
	done := make(chan struct{})
	var f *os.File
	end := func() {
		if f != nil {
			pprof.StopCPUProfile()
			f.Close()
			f = nil
		}
	}
	go func() {
		defer close(done)
		for {
			select {
			case <-sig:
			case <-stopped:
				end()
				return
			}
			if f != nil {
				end()
				continue
			}
			var err error
			if f, err = os.Create(path); err != nil {
				fmt.Fprintf(os.Stderr, "sdk: cpu profile: %v\n", err)
				continue
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				fmt.Fprintf(os.Stderr, "sdk: cpu profile: %v\n", err)
				f.Close()
				f = nil
			}
		}
	}()
	return func() {
		signal.Stop(sig)
		close(stopped)
		<-done
	}
}
