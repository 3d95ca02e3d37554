// Package mailproc starts the fake mail provider (cmd/mailprovider) as a
// process of its own on a free port, for the demo and the benchmark: the
// real provider lives outside our network, so its stand-in is a separate
// process with the real provider's semantics.
package mailproc

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"syscall"
)

// Proc is a running mail provider.
type Proc struct {
	// URL is its base URL, http://127.0.0.1:PORT.
	URL string
	cmd *exec.Cmd
}

// Start runs bin with its data in dataDir; its log goes to stderr.
func Start(bin, dataDir string, stderr io.Writer) (*Proc, error) {
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-data", dataDir)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start mail provider %s: %w (run `make build`)", bin, err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("mail provider did not start: %w", err)
	}
	url := strings.TrimSpace(strings.TrimPrefix(line, "mailprovider listening on "))
	return &Proc{URL: url, cmd: cmd}, nil
}

// Pid is the provider's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Stop asks the provider to stop and waits for it.
func (p *Proc) Stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()
}
