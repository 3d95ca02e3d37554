package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/usherhq/usher/host"
	"github.com/usherhq/usher/internal/procstat"
)

// sample is what a process has used so far: this process (the host) and
// each plugin process.
type sample struct {
	hostCPU time.Duration
	plugins map[string]procSample
	phases  map[string]host.PhaseTotal
}

type procSample struct {
	pid      int
	cpu      time.Duration
	restarts int
}

// takeSample reads CPU time so far and resets the peak RSS (VmHWM) of this
// process and every plugin, so the next sample's peak is the window's.
func takeSample(h *host.Host) sample {
	s := sample{hostCPU: procstat.SelfCPU(), plugins: map[string]procSample{}, phases: h.BatchPhaseTotals()}
	procstat.ResetPeak("self")
	for _, p := range h.Plugins() {
		if p.Pid == os.Getpid() {
			continue // in-process: its CPU is the host's
		}
		cpu, _ := procstat.CPU(p.Pid)
		procstat.ResetPeak(strconv.Itoa(p.Pid))
		s.plugins[p.Name] = procSample{pid: p.Pid, cpu: cpu, restarts: p.Restarts}
	}
	return s
}

// usage fills r's CPU and peak RSS from two samples around its window.
func (r *levelResult) usage(before, after sample) {
	r.HostCPUSeconds = (after.hostCPU - before.hostCPU).Seconds()
	r.Batches = stepsBetween(before.phases, after.phases)
	r.HostPeakRSSBytes, _ = procstat.PeakRSS("self")
	r.CPUSeconds = r.HostCPUSeconds
	for name, a := range after.plugins {
		b, ok := before.plugins[name]
		pr := procResult{Name: name, Pid: a.pid}
		pr.PeakRSSBytes, _ = procstat.PeakRSS(strconv.Itoa(a.pid))
		if ok && b.pid == a.pid {
			pr.CPUSeconds = (a.cpu - b.cpu).Seconds()
		} else {
			// Restarted during the window: only the new process's time is known.
			pr.CPUSeconds = a.cpu.Seconds()
			r.Notes = append(r.Notes, fmt.Sprintf("plugin %s restarted during the run (%d restarts)", name, a.restarts))
		}
		r.CPUSeconds += pr.CPUSeconds
		r.Plugins = append(r.Plugins, pr)
	}
	slices.SortFunc(r.Plugins, func(a, b procResult) int { return strings.Compare(a.Name, b.Name) })
}

// progress prints one line a second to stderr: the phase, how far it got.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	name  string
	done  int64
	total int64
	since time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, stop: make(chan struct{}), since: time.Now()}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.print()
			}
		}
	}()
	return p
}

func (p *progress) phase(name string, total int64) {
	p.mu.Lock()
	p.name, p.done, p.total, p.since = name, 0, total, time.Now()
	p.mu.Unlock()
	fmt.Fprintf(p.w, "bench: %s\n", name)
}

func (p *progress) set(done int64) {
	p.mu.Lock()
	p.done = done
	p.mu.Unlock()
}

func (p *progress) print() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.name == "" {
		return
	}
	el := time.Since(p.since)
	if p.total == 0 {
		// A phase that counts nothing (or reports its own progress).
		if int(el.Seconds())%10 == 0 {
			fmt.Fprintf(p.w, "bench: %s (%s)\n", p.name, el.Round(time.Second))
		}
		return
	}
	fmt.Fprintf(p.w, "bench: %s: %d/%d (%.0f/s, %s)\n", p.name, p.done, p.total, float64(p.done)/el.Seconds(), el.Round(time.Second))
}

func (p *progress) close() {
	close(p.stop)
	p.wg.Wait()
}

// batchSteps is the mean time of each step of a window's committed batches
// (usher_job_batch_phase_seconds): BEGIN with the records, the plugin's
// call, the writes, the commit.
type batchSteps struct {
	Batches  uint64  `json:"batches"`
	RecordMs float64 `json:"record_ms"`
	InvokeMs float64 `json:"invoke_ms"`
	WritesMs float64 `json:"writes_ms"`
	CommitMs float64 `json:"commit_ms"`
}

// stepsBetween is the batch steps between two readings of
// Host.BatchPhaseTotals; nil when no batch committed.
func stepsBetween(before, after map[string]host.PhaseTotal) *batchSteps {
	mean := func(phase string) float64 {
		n := after[phase].Count - before[phase].Count
		if n == 0 {
			return 0
		}
		return 1000 * (after[phase].Seconds - before[phase].Seconds) / float64(n)
	}
	n := after["commit"].Count - before["commit"].Count
	if n == 0 {
		return nil
	}
	return &batchSteps{Batches: n, RecordMs: mean("record"), InvokeMs: mean("invoke"), WritesMs: mean("writes"), CommitMs: mean("commit")}
}

func (b *batchSteps) String() string {
	return fmt.Sprintf("%d batches: BEGIN with the records %.2f ms, the plugin's call %.2f ms, writes %.2f ms, commit %.2f ms",
		b.Batches, b.RecordMs, b.InvokeMs, b.WritesMs, b.CommitMs)
}
