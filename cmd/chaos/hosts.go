package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// hostSlot keeps one `host run` process alive under a fixed consumer name:
// a host chaos killed is started again after the delay the fault chose; a
// host that exited by itself is recorded (a finding) and started again.
type hostSlot struct {
	c    *chaos
	name string
	logf *os.File

	mu           sync.Mutex
	p            *proc
	admin        string
	up           bool // /healthz answered since the last start
	stopped      bool // SIGSTOPped by a fault
	killed       bool // the next exit was caused by chaos
	restartDelay time.Duration
	starts       int
	crashes      []string // exits chaos did not cause, after the host was up
	startFails   int      // exits before the host was up (e.g. Postgres down)
	ready        chan struct{}
}

func (c *chaos) newHostSlot(i int) (*hostSlot, error) {
	name := fmt.Sprintf("host-%d", i+1)
	logf, err := openLog(c.path(name + ".log"))
	if err != nil {
		return nil, err
	}
	return &hostSlot{c: c, name: name, logf: logf, ready: make(chan struct{})}, nil
}

// keep runs the host until ctx is done, then stops it with SIGTERM.
func (h *hostSlot) keep(ctx context.Context) {
	defer h.logf.Close()
	readyOnce := sync.Once{}
	for ctx.Err() == nil {
		p, admin, err := h.spawn()
		if err != nil {
			h.c.say("%s: %v; retrying", h.name, err)
			sleepCtx(ctx, time.Second)
			continue
		}
		go func() {
			if !h.waitHealthy(ctx, p, admin) {
				return
			}
			h.mu.Lock()
			h.up = h.p == p && !p.exited()
			h.mu.Unlock()
			readyOnce.Do(func() { close(h.ready) })
		}()
		select {
		case <-ctx.Done():
			p.stop(syscall.SIGTERM, 20*time.Second)
			return
		case <-p.done:
		}
		h.mu.Lock()
		wasUp, killed, delay := h.up, h.killed, h.restartDelay
		h.up, h.stopped, h.killed, h.restartDelay = false, false, false, 0
		if !killed {
			if wasUp {
				h.crashes = append(h.crashes, fmt.Sprintf("%s exited by itself at %s: %s", h.name, h.c.since(), p.exitStatus()))
			} else {
				h.startFails++
			}
		}
		h.mu.Unlock()
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL) // its plugins, should any outlive it
		if !killed && wasUp {
			h.c.say("%s (pid %d) exited by itself: %s; restarting (see %s)", h.name, p.pid(), p.exitStatus(), h.logf.Name())
		}
		if delay <= 0 {
			delay = time.Second
		}
		sleepCtx(ctx, delay)
	}
}

func (h *hostSlot) spawn() (*proc, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	admin := "127.0.0.1:" + strconv.Itoa(port)
	c := h.c
	args := []string{"run",
		"--consumer", h.name,
		"--plugin-dir", c.cfg.pluginDir,
		"--reclaim-idle", c.cfg.reclaimIdle.String(),
		"--job-timeout", c.cfg.jobTimeout.String(),
		"--admin-addr", admin,
		// Nothing else of the host's environment reaches its plugins.
		"--plugin-env", "USHER_BLOB_DIR", "--plugin-env", "MAILPROVIDER_URL",
		"--plugin-env", "TICKETS_CLAIM_LEASE", "--plugin-env", "USHER_FAULT_DIR",
		"--stream-shards", strconv.Itoa(c.cfg.streamShards),
		"--max-deliveries", strconv.FormatInt(c.cfg.maxDeliveries, 10)}
	if c.cluster != nil {
		// A batch is marked published only once a replica holds it, so
		// a failover loses no entry the outbox no longer has.
		args = append(args, "--relay-replicas", "1")
	}
	cmd := exec.Command(c.cfg.hostBin, args...)
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+c.dbURL,
		"REDIS_URL="+c.redisURL,
		"USHER_BLOB_DIR="+c.blobDir,
		"MAILPROVIDER_URL="+c.mailURL,
		"TICKETS_CLAIM_LEASE="+c.cfg.lease.String(),
		"USHER_FAULT_DIR="+c.faultDir,
		"USHER_ADMIN_TOKEN="+c.adminToken,
	)
	h.mu.Lock()
	h.starts++
	n := h.starts
	h.mu.Unlock()
	fmt.Fprintf(h.logf, "\n=== chaos: start #%d of %s at %s ===\n", n, h.name, c.since())
	p, err := spawn(h.name, cmd, h.logf)
	if err != nil {
		return nil, "", err
	}
	h.mu.Lock()
	h.p, h.admin, h.up, h.stopped = p, admin, false, false
	h.mu.Unlock()
	return p, admin, nil
}

// waitHealthy polls the admin endpoint until the host serves (plugins
// started, loops running) or the process exits.
func (h *hostSlot) waitHealthy(ctx context.Context, p *proc, admin string) bool {
	client := &http.Client{Timeout: time.Second}
	for ctx.Err() == nil && !p.exited() {
		resp, err := client.Get("http://" + admin + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	return false
}

// running returns the process when the host is up and not stopped.
func (h *hostSlot) running() *proc {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.up || h.stopped || h.p == nil || h.p.exited() {
		return nil
	}
	return h.p
}

// kill9 kills the host with -9; keep starts it again after delay.
func (h *hostSlot) kill9(p *proc, delay time.Duration) bool {
	h.mu.Lock()
	if h.p != p || !h.up || h.stopped {
		h.mu.Unlock()
		return false
	}
	h.killed, h.restartDelay = true, delay
	h.mu.Unlock()
	return p.signal(syscall.SIGKILL) == nil
}

// stop SIGSTOPs the host (group: with its plugins) and reports whether it
// did; cont resumes it.
func (h *hostSlot) stop(p *proc, group bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.p != p || !h.up || h.stopped {
		return false
	}
	var err error
	if group {
		err = p.signalGroup(syscall.SIGSTOP)
	} else {
		err = p.signal(syscall.SIGSTOP)
	}
	if err != nil {
		return false
	}
	h.stopped = true
	return true
}

func (h *hostSlot) cont(p *proc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_ = p.signalGroup(syscall.SIGCONT)
	if h.p == p {
		h.stopped = false
	}
}

// plugins maps the plugin names of a host process to their pids.
func plugins(p *proc) map[string]int {
	out := map[string]int{}
	for _, pid := range childPids(p.pid()) {
		if n := procName(pid); n != "" {
			out[n] = pid
		}
	}
	return out
}

// summary reports the slot's starts and the exits chaos did not cause.
func (h *hostSlot) summary() (starts, startFails int, crashes []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.starts, h.startFails, append([]string(nil), h.crashes...)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
