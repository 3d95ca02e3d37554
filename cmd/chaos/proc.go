package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is one child process. Every child runs in its own process group (a
// Ctrl-C at the terminal reaches only chaos, which stops them in order) and
// is killed by the kernel if chaos dies first (the parent-death signal).
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // Wait's error, set before done is closed
}

// spawn starts cmd with its output appended to logf.
func spawn(name string, cmd *exec.Cmd, logf *os.File) (*proc, error) {
	if cmd.Stdout == nil {
		cmd.Stdout = logf
	}
	if cmd.Stderr == nil {
		cmd.Stderr = logf
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (%s): %w", name, cmd.Path, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process alone.
func (p *proc) signal(sig syscall.Signal) error {
	if p.exited() {
		return nil
	}
	return syscall.Kill(p.pid(), sig)
}

// signalGroup sends sig to the process and everything in its group (a
// host's plugins are in the host's group).
func (p *proc) signalGroup(sig syscall.Signal) error {
	if p.exited() {
		return nil
	}
	return syscall.Kill(-p.pid(), sig)
}

// wait reports whether the process exited within d.
func (p *proc) wait(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// stop sends sig (after SIGCONT, should the process be stopped), waits up
// to grace, then kills the whole group.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	_ = p.signalGroup(syscall.SIGCONT)
	_ = p.signal(sig)
	if p.wait(grace) {
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL) // leftovers of the group
		return
	}
	_ = p.signalGroup(syscall.SIGKILL)
	<-p.done
}

// exitStatus describes how the process ended.
func (p *proc) exitStatus() string {
	if p.err == nil {
		return "exit status 0"
	}
	return p.err.Error()
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// openLog opens path for appending.
func openLog(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
}

// childPids lists the children of pid, from /proc/<pid>/task/*/children.
func childPids(pid int) []int {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// procName is the base name of pid's executable (its argv[0]).
func procName(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	argv0, _, _ := strings.Cut(string(b), "\x00")
	return filepath.Base(argv0)
}

// procState is pid's state letter in /proc/<pid>/stat (R, S, D, T, Z,
// ...), or 0 when there is no such process.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	st := procState(pid)
	return st != 0 && st != 'Z' && st != 'X'
}
