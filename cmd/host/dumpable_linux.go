package main

import (
	"fmt"
	"syscall"
)

// undumpable marks the host's process non-dumpable: its /proc/PID files
// (environ, mem, maps, fd) then belong to root and no process of the
// host's own user can ptrace it, so a plugin that runs as the host's user
// still cannot read the secrets the host holds in its environment or
// memory. It also means no core dump, which would hold them too.
func undumpable() error {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", errno)
	}
	return nil
}
